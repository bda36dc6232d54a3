package damper_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

func TestCustomPriceTableReplaces(t *testing.T) {
	table, err := damper.NewPriceTable("test", map[string]damper.Price{"claude-custom-1": {InputPerMTok: 1, OutputPerMTok: 1}})
	if err != nil {
		t.Fatal(err)
	}
	r := newRig(t, damper.Policy{PriceTable: table, MaxRetryCostUSD: 1})
	r.srv.Script("", dampertest.Status(529), dampertest.OK())
	// Sonnet is in the built-in table but not in this one: refused.
	if _, err := r.client.Messages.New(context.Background(), params("claude-sonnet-4-6")); !errors.Is(err, damper.ErrRetryCostCeiling) {
		t.Errorf("built-in model with a custom table: err = %v, want ErrRetryCostCeiling", err)
	}
	r.srv.Script("", dampertest.Status(529), dampertest.OK())
	if _, err := r.client.Messages.New(context.Background(), params("claude-custom-1-20261101")); err != nil {
		t.Errorf("custom model: %v", err)
	}
}

func TestNewPriceTableRejectsBadPrices(t *testing.T) {
	for _, p := range []damper.Price{{InputPerMTok: -1}, {OutputPerMTok: math.NaN()}, {LongInputPerMTok: math.Inf(1)}, {LongContextTokens: -5}} {
		_, err := damper.NewPriceTable("v", map[string]damper.Price{"m": p})
		if err == nil || !strings.Contains(err.Error(), `"m"`) {
			t.Errorf("NewPriceTable(%+v) error = %v, want one naming the model", p, err)
		}
	}
}

func TestModelFamily(t *testing.T) {
	for in, want := range map[string]string{
		"claude-sonnet-4-6":                            "claude-sonnet-4-6",
		"claude-sonnet-4-5-20250929":                   "claude-sonnet-4-5",
		"claude-sonnet-4-5@20250929":                   "claude-sonnet-4-5",
		"us.anthropic.claude-sonnet-4-5-20250929-v1:0": "claude-sonnet-4-5",
		"anthropic.claude-haiku-4-5-20251001-v1:0":     "claude-haiku-4-5",
		"claude-opus-4-5-latest":                       "claude-opus-4-5",
		"Claude-Opus-5":                                "claude-opus-5",
	} {
		if got := damper.ModelFamily(in); got != want {
			t.Errorf("ModelFamily(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestDefaultPrices(t *testing.T) {
	table := damper.DefaultPriceTable()
	if table.Version == "" || table.Date == "" || table.Source == "" {
		t.Errorf("the built-in table must be dated and sourced: %+v", table)
	}
	for model, want := range map[string][2]float64{
		"claude-opus-5-5": {4, 20}, "claude-opus-4-5": {5, 25}, "claude-opus-4-8": {5, 25}, "claude-opus-5": {5, 25},
		"claude-sonnet-5": {2, 10}, "claude-sonnet-5-5": {2, 10}, "claude-sonnet-4-5": {3, 15}, "claude-sonnet-4-6": {3, 15},
		"claude-haiku-5-5": {0.10, 0.50}, "claude-haiku-4-5": {1, 5},
		"claude-fable-5": {10, 50}, "claude-fable-5-1": {10, 50}, "claude-mythos-5": {10, 50}, "claude-mythos-5-1": {10, 50},
		"claude-fable-5-2": {8, 40},
	} {
		p, ok := table.Lookup(model + "-20261101")
		if !ok || p.InputPerMTok != want[0] || p.OutputPerMTok != want[1] {
			t.Errorf("%s: got %+v (found %v), want %v", model, p, ok, want)
		}
	}
	if p, _ := table.Lookup("claude-haiku-5-5"); p.LongContextTokens != 100_000 || p.LongInputPerMTok != 0.5 || p.LongOutputPerMTok != 2.5 {
		t.Errorf("Haiku 5.5 long-context prices: %+v", p)
	}
}
