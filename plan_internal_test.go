package damper

import (
	"context"
	"math"
	"net/http"
	"testing"
	"time"
)

// FuzzPlan: whatever the provider's headers, the retry number and the
// random draw, a wait the retry gates admit is never negative, never longer
// than the longest wait the policy allows, and never runs past the
// deadline.
func FuzzPlan(f *testing.F) {
	f.Add("2", "", 1, 0.5, int64(10*time.Second))
	f.Add("", "300", 2, 0.99, int64(time.Second))
	f.Add("1e308", "", 60, 0.0, int64(time.Hour))
	f.Add("NaN", "-5", 1000, -3.0, int64(0))
	f.Add("Sun, 30 Nov 2026 12:00:30 GMT", "", 3, 1.5, int64(90*time.Second))
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	p, err := Policy{}.withDefaults()
	if err != nil {
		f.Fatal(err)
	}
	p.MaxAttempts = math.MaxInt // every retry number reaches the other gates
	longest := max(p.MaxRetryAfter, p.BackoffMax)
	budget, err := NewWindowBudget(0, time.Hour, math.MaxInt32)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, retryAfter, retryAfterMs string, n int, rnd float64, untilDeadline int64) {
		ctx := context.Background()
		if untilDeadline > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, now.Add(time.Duration(untilDeadline)))
			defer cancel()
		}
		h := http.Header{}
		h.Set("retry-after", retryAfter)
		h.Set("retry-after-ms", retryAfterMs)
		c := &call{d: &Damper{policy: p, budget: budget}, ctx: ctx}
		wait, refused := c.admitRetry(n, &Failure{StatusCode: 429, Header: h}, now, 0, rnd)
		if refused != nil {
			if wait != 0 || !isDenial(refused.gate.outcome) {
				t.Fatalf("refused (%v) with wait %v", refused.gate.outcome, wait)
			}
			return
		}
		if wait < 0 || wait > longest {
			t.Fatalf("wait %v outside [0, %v]", wait, longest)
		}
		if d, ok := ctx.Deadline(); ok && now.Add(wait).After(d) {
			t.Fatalf("wait %v runs past the deadline %v", wait, d.Sub(now))
		}
	})
}

func TestBackoffFullJitter(t *testing.T) {
	const s = time.Second
	tests := []struct {
		retry int
		rnd   float64
		want  time.Duration
	}{
		{1, 0.5, s / 2}, {2, 0.5, s}, {3, 0.5, 2 * s}, {6, 0.5, 15 * s}, {7, 0.5, 15 * s},
		{1, 0, 0}, {100, 0.5, 15 * s}, {1, math.NaN(), 0}, {1, 7, s - 1},
	}
	for _, tt := range tests {
		if got := backoff(tt.retry, s, 30*s, 0, false, time.Minute, tt.rnd); got != tt.want {
			t.Errorf("backoff(retry %d, rnd %v) = %v, want %v", tt.retry, tt.rnd, got, tt.want)
		}
	}
	// A hint is a floor; the spread is at most a tenth of it, within the cap.
	if got := backoff(1, s, 30*s, 2*s, true, time.Minute, 0.999); got < 2*s || got > 2200*time.Millisecond {
		t.Errorf("hinted wait = %v, want in [2s, 2.2s]", got)
	}
	if got := backoff(1, s, 30*s, time.Minute, true, time.Minute, 0.999); got != time.Minute {
		t.Errorf("hinted wait at the cap = %v, want 1m0s", got)
	}
}
