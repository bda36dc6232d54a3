package engine

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"

	"github.com/damper-ai/damper-go/internal/core"
)

// Price is what one model costs, in US dollars per million tokens.
type Price struct {
	InputPerMTok  float64
	OutputPerMTok float64
	// LongContextTokens, when above zero, is the prompt size past which the
	// LongInput and LongOutput prices apply to the whole request.
	LongContextTokens int
	LongInputPerMTok  float64
	LongOutputPerMTok float64
	// Unconfirmed marks a price, known in November 2026, that was not
	// checked against Anthropic's published pricing.
	Unconfirmed bool
}

// PriceTable maps model families to prices. It is used only to estimate
// the cost of retries; it is not billing data. A table is read-only once
// built and safe for concurrent use.
type PriceTable struct {
	// Version and Date name the snapshot; Source says where it came from.
	Version string
	Date    string
	Source  string
	prices  map[string]Price

	// resolved remembers the answer for model IDs that are not keys of
	// prices (dated, platform), so that the regular expressions of
	// modelFamily run once per ID, for at most maxResolved IDs.
	resolved      sync.Map // model ID → priceLookup
	resolvedCount atomic.Int32
}

type priceLookup struct {
	p  Price
	ok bool
}

// maxResolved bounds the IDs a table remembers: callers can name any
// model, and a table must not grow without end. An ID longer than
// maxLabelBytes, which no model ID is, is not remembered at all.
const maxResolved = 1024

// NewPriceTable returns a table with the given prices, keyed by model
// family ("claude-sonnet-4-6") or exact model ID. It rejects negative, NaN
// or infinite prices, naming the model and the value.
func NewPriceTable(version string, prices map[string]Price) (*PriceTable, error) {
	t := &PriceTable{Version: version, prices: make(map[string]Price, len(prices))}
	for model, p := range prices {
		for _, f := range []struct {
			name string
			v    float64
		}{{"InputPerMTok", p.InputPerMTok}, {"OutputPerMTok", p.OutputPerMTok}, {"LongInputPerMTok", p.LongInputPerMTok}, {"LongOutputPerMTok", p.LongOutputPerMTok}} {
			if math.IsNaN(f.v) || math.IsInf(f.v, 0) || f.v < 0 {
				return nil, fmt.Errorf("damper: price of %q: %s = %v: must be a finite number of dollars, at least 0", model, f.name, f.v)
			}
		}
		if p.LongContextTokens < 0 {
			return nil, fmt.Errorf("damper: price of %q: LongContextTokens = %d: must be at least 0", model, p.LongContextTokens)
		}
		t.prices[model] = p
	}
	return t, nil
}

// Lookup returns the price of model: an exact entry first, else the entry
// of its family, found by dropping a date suffix ("-20251001", "@20251001"),
// a "-latest" or "-v1:0" suffix, and a Bedrock region or "anthropic."
// prefix.
func (t *PriceTable) Lookup(model string) (Price, bool) {
	if t == nil || model == "" {
		return Price{}, false
	}
	if p, ok := t.prices[model]; ok {
		return p, true
	}
	if r, ok := t.resolved.Load(model); ok {
		r := r.(priceLookup)
		return r.p, r.ok
	}
	p, ok := t.prices[modelFamily(model)]
	if len(model) <= maxLabelBytes && t.resolvedCount.Load() < maxResolved {
		if _, loaded := t.resolved.LoadOrStore(model, priceLookup{p, ok}); !loaded {
			t.resolvedCount.Add(1)
		}
	}
	return p, ok
}

// Models returns the keys of the table, for listing.
func (t *PriceTable) Models() []string {
	out := make([]string, 0, len(t.prices))
	for m := range t.prices {
		out = append(out, m)
	}
	return out
}

// modelFamily returns the family of a model ID (core.ModelFamily).
func modelFamily(model string) string { return core.ModelFamily(model) }

// DefaultPriceTable returns the built-in snapshot. Entries marked
// Unconfirmed are prices known in November 2026 that were not checked
// against the published price list.
func DefaultPriceTable() *PriceTable { return defaultPrices }

var defaultPrices = mustPriceTable("2026-11.1", "2026-11-30",
	"Anthropic's published model pricing (platform.claude.com/docs/en/about-claude/pricing), with the entries marked Unconfirmed not checked against it",
	map[string]Price{
		"claude-opus-5-5":   {InputPerMTok: 4, OutputPerMTok: 20, Unconfirmed: true},
		"claude-opus-5":     {InputPerMTok: 5, OutputPerMTok: 25, Unconfirmed: true},
		"claude-opus-4-8":   {InputPerMTok: 5, OutputPerMTok: 25, Unconfirmed: true},
		"claude-opus-4-7":   {InputPerMTok: 5, OutputPerMTok: 25, Unconfirmed: true},
		"claude-opus-4-6":   {InputPerMTok: 5, OutputPerMTok: 25, Unconfirmed: true},
		"claude-opus-4-5":   {InputPerMTok: 5, OutputPerMTok: 25},
		"claude-opus-4-1":   {InputPerMTok: 15, OutputPerMTok: 75},
		"claude-opus-4":     {InputPerMTok: 15, OutputPerMTok: 75},
		"claude-sonnet-5-5": {InputPerMTok: 2, OutputPerMTok: 10, Unconfirmed: true},
		"claude-sonnet-5":   {InputPerMTok: 2, OutputPerMTok: 10, Unconfirmed: true},
		"claude-sonnet-4-6": {InputPerMTok: 3, OutputPerMTok: 15, Unconfirmed: true},
		"claude-sonnet-4-5": {InputPerMTok: 3, OutputPerMTok: 15},
		"claude-sonnet-4":   {InputPerMTok: 3, OutputPerMTok: 15},
		"claude-haiku-5-5": {InputPerMTok: 0.10, OutputPerMTok: 0.50, Unconfirmed: true,
			LongContextTokens: 100_000, LongInputPerMTok: 0.50, LongOutputPerMTok: 2.50},
		"claude-haiku-4-5":  {InputPerMTok: 1, OutputPerMTok: 5},
		"claude-3-5-haiku":  {InputPerMTok: 0.80, OutputPerMTok: 4},
		"claude-fable-5":    {InputPerMTok: 10, OutputPerMTok: 50, Unconfirmed: true},
		"claude-fable-5-1":  {InputPerMTok: 10, OutputPerMTok: 50, Unconfirmed: true},
		"claude-fable-5-2":  {InputPerMTok: 8, OutputPerMTok: 40, Unconfirmed: true},
		"claude-mythos-5":   {InputPerMTok: 10, OutputPerMTok: 50, Unconfirmed: true},
		"claude-mythos-5-1": {InputPerMTok: 10, OutputPerMTok: 50, Unconfirmed: true},
	})

func mustPriceTable(version, date, source string, prices map[string]Price) *PriceTable {
	t, err := NewPriceTable(version, prices)
	if err != nil {
		panic(err)
	}
	t.Date, t.Source = date, source
	return t
}
