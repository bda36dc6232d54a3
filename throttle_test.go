package damper

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/damper-ai/damper-go/fleet"

	"github.com/damper-ai/damper-go/dampertest"
)

// Attempt ends as the throttle hears them.
var (
	thrFailed    = attemptEvent{outcome: fleet.AttemptOutcome{Signal: ProviderHealth}, class: Retryable}
	thrLimited   = attemptEvent{outcome: fleet.AttemptOutcome{Signal: CallerTraffic}, class: Retryable}
	thrAnswered  = attemptEvent{outcome: fleet.AttemptOutcome{First: true, Success: true}}
	thrFinal     = attemptEvent{class: NotRetryable}
	thrSpend     = attemptEvent{outcome: fleet.AttemptOutcome{Signal: CallerTraffic}, class: NotRetryable}
	thrAmbiguous = attemptEvent{outcome: fleet.AttemptOutcome{Signal: ProviderHealth}, class: Ambiguous}
	thrCanceled  = attemptEvent{class: NotRetryable} // as the loop records the caller's own end
)

func thrEvents(seq string) []attemptEvent {
	var out []attemptEvent
	for _, c := range seq {
		switch c {
		case 'F':
			out = append(out, thrFailed)
		case 'L':
			out = append(out, thrLimited)
		case 'S':
			out = append(out, thrAnswered)
		case 'N':
			out = append(out, thrFinal)
		case 'P':
			out = append(out, thrSpend)
		case 'A':
			out = append(out, thrAmbiguous)
		case 'C':
			out = append(out, thrCanceled)
		}
	}
	return out
}

func repeat(s string, n int) string {
	out := ""
	for range n {
		out += s
	}
	return out
}

// The count starts at MaxTokens; every retryable failure takes one token,
// every answer gives TokenRatio back, within [0, MaxTokens]; a retry needs
// more than half of MaxTokens.
func TestRetryThrottleArithmetic(t *testing.T) {
	tests := []struct {
		name   string
		p      ThrottlePolicy
		seq    string // F, L: retryable failures; S: answer; N, P, A, C: others
		left   float64
		allows bool
	}{
		{"full", ThrottlePolicy{}, "", 10, true},
		{"one failure", ThrottlePolicy{}, "F", 9, true},
		{"a rate limit costs a token", ThrottlePolicy{}, "L", 9, true},
		{"four failures", ThrottlePolicy{}, "FFFF", 6, true},
		{"five failures: half left", ThrottlePolicy{}, "FFFFF", 5, false},
		{"above half again", ThrottlePolicy{}, "FFFFFS", 5.2, true},
		{"never above MaxTokens", ThrottlePolicy{}, "SSS", 10, true},
		{"capped, then a failure", ThrottlePolicy{}, "SSSF", 9, true},
		{"never below zero", ThrottlePolicy{}, repeat("F", 12), 0, false},
		{"from zero", ThrottlePolicy{}, repeat("F", 12) + "SSS", 0.6, false},
		{"back to half exactly", ThrottlePolicy{}, "FFFFFFSSSSS", 5, false},
		{"back above half", ThrottlePolicy{}, "FFFFFFSSSSSS", 5.2, true},
		{"k failures, s answers", ThrottlePolicy{}, "FFFFFFFF" + repeat("S", 17), 5.4, true},
		{"final failures take nothing", ThrottlePolicy{}, "FFF" + repeat("NPAC", 20), 7, true},
		{"one token, a failure", ThrottlePolicy{MaxTokens: 1}, "F", 0, false},
		{"one token, three answers", ThrottlePolicy{MaxTokens: 1}, "FSSS", 0.6, true},
		{"one token, two answers", ThrottlePolicy{MaxTokens: 1}, "FSS", 0.4, false},
		{"ratio 1", ThrottlePolicy{TokenRatio: 1}, "FFFFFS", 6, true},
		{"ratio rounded to thousandths", ThrottlePolicy{TokenRatio: 0.0015}, repeat("F", 10) + "SSS", 0.006, false},
		{"1000 tokens", ThrottlePolicy{MaxTokens: 1000, TokenRatio: 0.5}, repeat("F", 500) + "S", 500.5, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := filledPart(tt.p, "Throttle")
			if err != nil {
				t.Fatal(err)
			}
			tokens, err := fleet.MemoryStore{}.Throttle(fleet.ThrottleSettings{MaxTokens: p.MaxTokens, TokenRatio: p.TokenRatio})
			if err != nil {
				t.Fatal(err)
			}
			th := newRetryThrottle(p, tokens, nil)
			for _, e := range thrEvents(tt.seq) {
				th.observeAttempt(context.Background(), time.Time{}, e)
			}
			n, _ := tokens.Tokens(context.Background())
			c := &call{ctx: context.Background()}
			if got := float64(n) / 1000; got != tt.left || th.allows(c) != tt.allows {
				t.Fatalf("left %v, allows %v; want %v, %v", got, th.allows(c), tt.left, tt.allows)
			}
		})
	}
}

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
			setTokens(throttleOf(d).t, int64(tt.start*1000))
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

// Concurrent observers and readers: with -race, no data race, and the
// count ends exactly where the arithmetic puts it.
func TestRetryThrottleConcurrent(t *testing.T) {
	ctx, now := context.Background(), time.Time{}
	p := &ThrottlePolicy{MaxTokens: 1000, TokenRatio: 0.2}
	tokens, _ := fleet.MemoryStore{}.Throttle(fleet.ThrottleSettings{MaxTokens: p.MaxTokens, TokenRatio: p.TokenRatio})
	th := newRetryThrottle(p, tokens, nil)
	for range 400 {
		th.observeAttempt(ctx, now, thrFailed)
	}
	var stop atomic.Bool
	var bad atomic.Int64
	var readers sync.WaitGroup
	for range 4 {
		readers.Go(func() {
			for !stop.Load() {
				if l := throttleLeft(th); l < 0 || l > 1000 {
					bad.Add(1)
				}
				_ = th.allows(&call{ctx: ctx})
			}
		})
	}
	run := func(goroutines, rounds int, round func()) {
		var wg sync.WaitGroup
		for range goroutines {
			wg.Go(func() {
				for range rounds {
					round()
				}
			})
		}
		wg.Wait()
	}
	// One failure and five answers cost nothing; from 600, 400 rounds keep
	// the count within [200, 1000] whatever the order, so it is never
	// clamped and ends where it started.
	run(20, 20, func() {
		th.observeAttempt(ctx, now, thrFailed)
		for range 5 {
			th.observeAttempt(ctx, now, thrAnswered)
		}
		th.observeAttempt(ctx, now, thrFinal)
	})
	if got := throttleLeft(th); got != 600 || !th.allows(&call{ctx: ctx}) {
		t.Errorf("after balanced rounds: %v left, want 600", got)
	}
	run(50, 200, func() { th.observeAttempt(ctx, now, thrAnswered) })
	if got := throttleLeft(th); got != 1000 {
		t.Errorf("after 10000 answers: %v left, want 1000", got)
	}
	run(50, 50, func() { th.observeAttempt(ctx, now, thrLimited) })
	if got := throttleLeft(th); got != 0 || th.allows(&call{ctx: ctx}) {
		t.Errorf("after 2500 failures: %v left, want 0", got)
	}
	stop.Store(true)
	readers.Wait()
	if bad.Load() != 0 {
		t.Errorf("%d reads outside [0, 1000]", bad.Load())
	}
}

// A zero Policy has neither breaker nor throttle: no attempt gate, the
// budget alone observing, and no circuit state in its reports.
func TestZeroPolicyHasNoBreakerNorThrottle(t *testing.T) {
	_, srv, d, client := thrRig(t, Policy{})
	if d.primary.attemptGates != nil || hasBreaker(d) || throttleOf(d) != nil || len(d.primary.observers) != 1 || d.policy.Breaker != nil || d.policy.Throttle != nil {
		t.Fatalf("gates %v, breaker %v, throttle %v, %d observers; want none but the budget", d.primary.attemptGates, hasBreaker(d), throttleOf(d), len(d.primary.observers))
	}
	if _, ok := d.primary.observers[0].(budgetGate); !ok {
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
		setTokens(throttleOf(d).t, 5500) // one failure leaves 4.5: refused
		srv.Script("", dampertest.Status(529))
		_, err := client.Messages.New(context.Background(), hookParams())
		if !errors.Is(err, ErrCircuitOpen) || errors.Is(err, ErrRetryThrottled) {
			t.Fatalf("err = %v, want the breaker's refusal", err)
		}
	})
	t.Run("throttle before budget", func(t *testing.T) {
		clk, srv, d, client := thrRig(t, Policy{Breaker: &BreakerPolicy{}, Throttle: &ThrottlePolicy{}, RetryBudgetMinTokens: 1})
		setTokens(throttleOf(d).t, 5500)
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
		if _, ok := g.(circuitGate); ok {
			return true
		}
	}
	return false
}

// throttleLeft returns the tokens a throttle in memory has left.
func throttleLeft(th *retryThrottle) float64 {
	n, _ := th.t.Tokens(context.Background())
	return float64(n) / 1000
}

// setTokens sets a throttle's count to n thousandths of a token.
func setTokens(th fleet.Throttle, n int64) {
	ctx := context.Background()
	cur, _ := th.Tokens(ctx)
	_ = th.Add(ctx, n-cur)
}

// throttleOf returns d's primary throttle, or nil.
func throttleOf(d *Damper) *retryThrottle {
	for _, o := range d.primary.observers {
		if t, ok := o.(*retryThrottle); ok {
			return t
		}
	}
	return nil
}
