package engine

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/gates/breaker"
	"github.com/damper-ai/damper-go/internal/gates/budget"
	"github.com/damper-ai/damper-go/internal/gates/throttle"

	"github.com/damper-ai/damper-go/dampertest"
)

// thrRig is a Damper with policy p on a virtual clock in front of the fake
// API, in memory.
func thrRig(t *testing.T, p Policy) (*dampertest.Clock, *dampertest.Server, *Damper, anthropic.Client) {
	t.Helper()
	clk := dampertest.NewClock(time.Now().Truncate(time.Minute).Add(time.Minute))
	srv := dampertest.NewServer(dampertest.InMemory(), dampertest.WithClock(clk))
	t.Cleanup(srv.Close)
	d, err := New(p, WithClock(clk), WithRand(func() float64 { return 0.5 }))
	if err != nil {
		t.Fatal(err)
	}
	return clk, srv, d, anthropic.NewClient(append([]option.RequestOption{d.Option()}, srv.Options()...)...)
}

func available(t *testing.T, d *Damper, now time.Time) float64 {
	t.Helper()
	n, err := d.primary.budget.Available(context.Background(), now)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Against a provider that answers nothing, the throttle lets exactly the
// retries its tokens allow: 10 tokens, one per failed attempt, no retry
// at 5 or fewer. Its refusal spends no unit of the budget, and starts no
// wait.
func TestThrottleThroughEngine(t *testing.T) {
	clk, srv, d, client := thrRig(t, Policy{Throttle: &ThrottlePolicy{MaxTokens: 10, TokenRatio: 0.2}})
	const ms = time.Millisecond
	type want struct {
		steps    []dampertest.Step
		attempts int
		outcome  Outcome
		waits    []time.Duration
		left     float64
		budget   float64
	}
	fail := []dampertest.Step{dampertest.Status(529)}
	calls := []want{
		{fail, 3, OutcomeAttemptsExhausted, []time.Duration{500 * ms, time.Second}, 7, 8},
		{fail, 2, OutcomeRetryThrottled, []time.Duration{500 * ms}, 5, 7},
		{fail, 1, OutcomeRetryThrottled, nil, 4, 7},
		{fail, 1, OutcomeRetryThrottled, nil, 3, 7},
		{fail, 1, OutcomeRetryThrottled, nil, 2, 7},
		{fail, 1, OutcomeRetryThrottled, nil, 1, 7},
		{fail, 1, OutcomeRetryThrottled, nil, 0, 7},
		{fail, 1, OutcomeRetryThrottled, nil, 0, 7},
	}
	for range 31 {
		calls = append(calls, want{[]dampertest.Step{dampertest.OK()}, 1, OutcomeSuccess, nil, -1, -1})
	}
	calls[len(calls)-1].left = 6.2
	calls = append(calls,
		want{[]dampertest.Step{dampertest.Status(529), dampertest.OK()}, 2, OutcomeSuccess, []time.Duration{500 * ms}, 5.4, -1},
		want{fail, 1, OutcomeRetryThrottled, nil, 4.4, -1},
	)
	sent := 0
	for i, w := range calls {
		srv.Script("", w.steps...)
		sleeps := len(clk.Sleeps())
		var rep Report
		_, err := client.Messages.New(context.Background(), hookParams(), ReportInto(&rep))
		sent += w.attempts
		if rep.Attempts != w.attempts || rep.Outcome != w.outcome || srv.Count("") != sent {
			t.Fatalf("call %d: %d attempts (server %d), %q; want %d, %q", i+1, rep.Attempts, srv.Count("")-sent+w.attempts, rep.Outcome, w.attempts, w.outcome)
		}
		if got := clk.Sleeps()[sleeps:]; !slices.Equal(got, w.waits) {
			t.Errorf("call %d: waits %v, want %v", i+1, got, w.waits)
		}
		if w.left >= 0 && throttleLeft(throttleOf(d)) != w.left {
			t.Errorf("call %d: %v tokens left, want %v", i+1, throttleLeft(throttleOf(d)), w.left)
		}
		if w.budget >= 0 && available(t, d, clk.Now()) != w.budget {
			t.Errorf("call %d: budget %v, want %v", i+1, available(t, d, clk.Now()), w.budget)
		}
		if w.outcome == OutcomeRetryThrottled {
			var de *Error
			var apiErr *anthropic.Error
			if !errors.Is(err, ErrRetryThrottled) || !errors.As(err, &de) || de.Report == nil || de.Report.Outcome != OutcomeRetryThrottled ||
				!errors.As(err, &apiErr) || apiErr.StatusCode != 529 {
				t.Fatalf("call %d: err %v, want an *Error matching ErrRetryThrottled, wrapping the 529", i+1, err)
			}
		}
	}
}

// Only failures that could be retried take a token; answers give back
// TokenRatio, up to MaxTokens, whatever becomes of a stream after its
// first content.
func TestThrottleTokensByAttempt(t *testing.T) {
	cut := dampertest.Stream{Text: "a long enough answer to span several deltas", Fault: dampertest.FaultReset}
	cut.At = cut.ContentIndex() + 1
	tests := []struct {
		name   string
		step   dampertest.Step
		stream bool
		cancel bool    // the caller cancels during the attempt
		start  float64 // tokens before the call
		left   float64
	}{
		{"400", dampertest.Status(400), false, false, 5, 5},
		{"401", dampertest.Status(401), false, false, 5, 5},
		{"404", dampertest.Status(404), false, false, 5, 5},
		{"spend limit", dampertest.SpendLimit(), false, false, 5, 5},
		{"500 with x-should-retry false", dampertest.Status(500).ShouldRetry(false), false, false, 5, 5},
		{"caller cancels", dampertest.OK().WithDelay(20 * time.Millisecond), false, true, 5, 5},
		{"529", dampertest.Status(529), false, false, 5, 4},
		{"500", dampertest.Status(500), false, false, 5, 4},
		{"429", dampertest.Status(429), false, false, 5, 4},
		{"400 with x-should-retry true", dampertest.Status(400).ShouldRetry(true), false, false, 5, 4},
		{"connection dropped", dampertest.OK().WithDrop(dampertest.DropBeforeHeaders), false, false, 5, 4},
		{"attempt timeout", dampertest.OK().WithDelay(2 * time.Second), false, false, 5, 4},
		{"answer", dampertest.OK(), false, false, 5, 5.2},
		{"answer at MaxTokens", dampertest.OK(), false, false, 10, 10},
		{"answer near MaxTokens", dampertest.OK(), false, false, 9.9, 10},
		{"stream answered", dampertest.OK(), true, false, 5, 5.2},
		{"stream cut after content", dampertest.OK().WithStream(cut), true, false, 5, 5.2},
		{"stream overloaded before content", dampertest.OK().WithStream(dampertest.Stream{Fault: dampertest.FaultErrorEvent, At: 1}), true, false, 5, 4},
		{"stream invalid request before content", dampertest.OK().WithStream(dampertest.Stream{Fault: dampertest.FaultErrorEvent, At: 1, ErrorType: "invalid_request_error"}), true, false, 5, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk, srv, d, client := thrRig(t, Policy{MaxAttempts: 1, PerAttemptTimeout: time.Second, Throttle: &ThrottlePolicy{}})
			setTokens(throttleOf(d), int64(tt.start*1000))
			srv.Script("", tt.step)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tt.cancel {
				clk.AfterFunc(10*time.Millisecond, cancel)
			}
			var err error
			if tt.stream {
				s := client.Messages.NewStreaming(ctx, hookParams())
				for s.Next() {
				}
				err = s.Err()
				_ = s.Close()
			} else {
				_, err = client.Messages.New(ctx, hookParams())
			}
			if tt.cancel && !errors.Is(err, context.Canceled) {
				t.Fatalf("err = %v, want context.Canceled", err)
			}
			if srv.Count("") != 1 {
				t.Fatalf("server got %d requests, want 1", srv.Count(""))
			}
			if got := throttleLeft(throttleOf(d)); got != tt.left {
				t.Fatalf("%v tokens left, want %v (err %v)", got, tt.left, err)
			}
		})
	}
}

// A zero Policy has neither breaker nor throttle: no attempt gate, the
// budget alone observing, and no circuit state in its reports.
func TestZeroPolicyHasNoBreakerNorThrottle(t *testing.T) {
	_, srv, d, client := thrRig(t, Policy{})
	if d.primary.attemptGates != nil || hasBreaker(d) || throttleOf(d) != nil || len(d.primary.observers) != 1 || d.policy.Breaker != nil || d.policy.Throttle != nil {
		t.Fatalf("gates %v, breaker %v, throttle %v, %d observers; want none but the budget", d.primary.attemptGates, hasBreaker(d), throttleOf(d), len(d.primary.observers))
	}
	if budget.TenantBudget(d.primary.parts, nil) == nil || partOf(d.primary, budget.Gate).Observe != d.primary.observers[0] {
		t.Fatalf("observer %T, want the budget's", d.primary.observers[0])
	}
	srv.Script("", dampertest.Status(529), dampertest.Status(529), dampertest.Status(529))
	var rep Report
	_, err := client.Messages.New(context.Background(), hookParams(), ReportInto(&rep))
	if err == nil || rep.Attempts != 3 || rep.Outcome != OutcomeAttemptsExhausted || rep.Circuit != 0 || rep.Circuit.String() != "" {
		t.Fatalf("err %v, report %+v; want 3 attempts and no circuit", err, rep)
	}
	for _, a := range rep.AttemptLog {
		if a.Probe {
			t.Errorf("attempt %+v is a probe", a)
		}
	}

	_, _, rd, _ := thrRig(t, RecommendedPolicy())
	if len(rd.primary.attemptGates) != 1 || !hasBreaker(rd) || throttleOf(rd) == nil || len(rd.primary.observers) != 2 {
		t.Fatalf("recommended: %d gates, breaker %v, throttle %v, %d observers", len(rd.primary.attemptGates), hasBreaker(rd), throttleOf(rd), len(rd.primary.observers))
	}
}

// Before a retry the breaker is asked first, then the throttle, then the
// budget.
func TestRetryGatesOrder(t *testing.T) {
	t.Run("breaker before throttle", func(t *testing.T) {
		_, srv, d, client := thrRig(t, Policy{Breaker: &BreakerPolicy{MinAttempts: 1}, Throttle: &ThrottlePolicy{}})
		setTokens(throttleOf(d), 5500) // one failure leaves 4.5: refused
		srv.Script("", dampertest.Status(529))
		_, err := client.Messages.New(context.Background(), hookParams())
		if !errors.Is(err, ErrCircuitOpen) || errors.Is(err, ErrRetryThrottled) {
			t.Fatalf("err = %v, want the breaker's refusal", err)
		}
	})
	t.Run("throttle before budget", func(t *testing.T) {
		clk, srv, d, client := thrRig(t, Policy{Breaker: &BreakerPolicy{}, Throttle: &ThrottlePolicy{}, RetryBudgetMinTokens: 1})
		setTokens(throttleOf(d), 5500)
		srv.Script("", dampertest.Status(529))
		_, err := client.Messages.New(context.Background(), hookParams())
		if !errors.Is(err, ErrRetryThrottled) {
			t.Fatalf("err = %v, want the throttle's refusal", err)
		}
		if got := available(t, d, clk.Now()); got != 1 {
			t.Fatalf("budget %v, want its one unit kept", got)
		}
	})
}

// hasBreaker reports whether d gates its attempts with a circuit breaker.
func hasBreaker(d *Damper) bool {
	for _, g := range d.primary.attemptGates {
		if _, ok := g.(*breaker.Circuit); ok {
			return true
		}
	}
	return false
}

// throttleLeft returns the tokens a throttle in memory has left.
func throttleLeft(th fleet.Throttle) float64 {
	n, _ := th.Tokens(context.Background())
	return float64(n) / 1000
}

// setTokens sets a throttle's count to n thousandths of a token.
func setTokens(th fleet.Throttle, n int64) {
	ctx := context.Background()
	cur, _ := th.Tokens(ctx)
	_ = th.Add(ctx, n-cur)
}

// throttleOf returns d's primary throttle, or nil.
func throttleOf(d *Damper) fleet.Throttle { return throttle.Of(d.primary.parts) }

// partOf is the hooks gate g's part made on b.
func partOf(b *backend, g *gate) hooks {
	for i, e := range gateList {
		if e.Gate == g {
			return b.parts[i]
		}
	}
	return hooks{}
}
