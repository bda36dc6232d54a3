package damper_test

import (
	"context"
	"errors"
	"testing"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// TestCostCeilingDeniesSecondRetry: each attempt of a 1,024-token
// reservation on Sonnet 4.6 costs about $0.0155, so a $0.02 ceiling admits
// one retry and refuses the second.
func TestCostCeilingDeniesSecondRetry(t *testing.T) {
	r := newRig(t, damper.Policy{MaxRetryCostUSD: 0.02})
	r.srv.Script("", dampertest.Status(529))
	var rep damper.Report
	_, err := r.client.Messages.New(context.Background(), params("claude-sonnet-4-6"), damper.ReportInto(&rep))
	if !errors.Is(err, damper.ErrRetryCostCeiling) || rep.Outcome != damper.OutcomeCostCeiling {
		t.Fatalf("err = %v, outcome %q; want the cost ceiling", err, rep.Outcome)
	}
	if got := r.srv.Count(""); got != 2 {
		t.Errorf("attempts = %d, want 2 (one retry admitted)", got)
	}
	if c := rep.EstimatedCostUSD; c < 0.0154 || c > 0.0156 {
		t.Errorf("estimated attempt cost = %v, want about 0.0155", c)
	}
	if rep.RetryCostUSD != rep.EstimatedCostUSD {
		t.Errorf("retry cost = %v, want one attempt's %v", rep.RetryCostUSD, rep.EstimatedCostUSD)
	}
}

func TestUnpricedModel(t *testing.T) {
	t.Run("ceiling on: denied", func(t *testing.T) {
		r := newRig(t, damper.Policy{MaxRetryCostUSD: 1})
		r.srv.Script("", dampertest.Status(529), dampertest.OK())
		_, err := r.client.Messages.New(context.Background(), params("claude-unknown-9"))
		if !errors.Is(err, damper.ErrRetryCostCeiling) || r.srv.Count("") != 1 {
			t.Fatalf("err = %v after %d attempts; want ErrRetryCostCeiling after 1", err, r.srv.Count(""))
		}
	})
	t.Run("ceiling off: retried", func(t *testing.T) {
		r := newRig(t, damper.Policy{})
		r.srv.Script("", dampertest.Status(529), dampertest.OK())
		var rep damper.Report
		_, err := r.client.Messages.New(context.Background(), params("claude-unknown-9"), damper.ReportInto(&rep))
		if err != nil || r.srv.Count("") != 2 {
			t.Fatalf("err = %v after %d attempts; want success after 2", err, r.srv.Count(""))
		}
		if rep.Priced || rep.EstimatedCostUSD != 0 {
			t.Errorf("report prices an unknown model: %+v", rep)
		}
	})
}
