package throttle

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/conf"
	"github.com/damper-ai/damper-go/internal/core"
	"github.com/damper-ai/damper-go/internal/core/coretest"
)

// Attempt ends as the throttle hears them.
var (
	thrFailed    = core.Event{Outcome: fleet.AttemptOutcome{Signal: fleet.ProviderHealth}, Class: core.Retryable}
	thrLimited   = core.Event{Outcome: fleet.AttemptOutcome{Signal: fleet.CallerTraffic}, Class: core.Retryable}
	thrAnswered  = core.Event{Outcome: fleet.AttemptOutcome{First: true, Success: true}}
	thrFinal     = core.Event{Class: core.NotRetryable}
	thrSpend     = core.Event{Outcome: fleet.AttemptOutcome{Signal: fleet.CallerTraffic}, Class: core.NotRetryable}
	thrAmbiguous = core.Event{Outcome: fleet.AttemptOutcome{Signal: fleet.ProviderHealth}, Class: core.Ambiguous}
	thrCanceled  = core.Event{Class: core.NotRetryable} // as the loop records the caller's own end
)

func thrEvents(seq string) []core.Event {
	var out []core.Event
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
		p      Policy
		seq    string // F, L: retryable failures; S: answer; N, P, A, C: others
		left   float64
		allows bool
	}{
		{"full", Policy{}, "", 10, true},
		{"one failure", Policy{}, "F", 9, true},
		{"a rate limit costs a token", Policy{}, "L", 9, true},
		{"four failures", Policy{}, "FFFF", 6, true},
		{"five failures: half left", Policy{}, "FFFFF", 5, false},
		{"above half again", Policy{}, "FFFFFS", 5.2, true},
		{"never above MaxTokens", Policy{}, "SSS", 10, true},
		{"capped, then a failure", Policy{}, "SSSF", 9, true},
		{"never below zero", Policy{}, repeat("F", 12), 0, false},
		{"from zero", Policy{}, repeat("F", 12) + "SSS", 0.6, false},
		{"back to half exactly", Policy{}, "FFFFFFSSSSS", 5, false},
		{"back above half", Policy{}, "FFFFFFSSSSSS", 5.2, true},
		{"k failures, s answers", Policy{}, "FFFFFFFF" + repeat("S", 17), 5.4, true},
		{"final failures take nothing", Policy{}, "FFF" + repeat("NPAC", 20), 7, true},
		{"one token, a failure", Policy{MaxTokens: 1}, "F", 0, false},
		{"one token, three answers", Policy{MaxTokens: 1}, "FSSS", 0.6, true},
		{"one token, two answers", Policy{MaxTokens: 1}, "FSS", 0.4, false},
		{"ratio 1", Policy{TokenRatio: 1}, "FFFFFS", 6, true},
		{"ratio rounded to thousandths", Policy{TokenRatio: 0.0015}, repeat("F", 10) + "SSS", 0.006, false},
		{"1000 tokens", Policy{MaxTokens: 1000, TokenRatio: 0.5}, repeat("F", 500) + "S", 500.5, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := tt.p
			if err := conf.Fill(&p); err != nil {
				t.Fatal(err)
			}
			tokens, err := fleet.MemoryStore{}.Throttle(fleet.ThrottleSettings{MaxTokens: p.MaxTokens, TokenRatio: p.TokenRatio})
			if err != nil {
				t.Fatal(err)
			}
			th := newRetryThrottle(&p, tokens, coretest.Env(nil))
			for _, e := range thrEvents(tt.seq) {
				th.ObserveAttempt(context.Background(), time.Time{}, e)
			}
			n, _ := tokens.Tokens(context.Background())
			c := &coretest.Call{}
			if got := float64(n) / 1000; got != tt.left || th.allows(c) != tt.allows {
				t.Fatalf("left %v, allows %v; want %v, %v", got, th.allows(c), tt.left, tt.allows)
			}
		})
	}
}

// Concurrent observers and readers: with -race, no data race, and the
// count ends exactly where the arithmetic puts it.
func TestRetryThrottleConcurrent(t *testing.T) {
	ctx, now := context.Background(), time.Time{}
	p := &Policy{MaxTokens: 1000, TokenRatio: 0.2}
	tokens, _ := fleet.MemoryStore{}.Throttle(fleet.ThrottleSettings{MaxTokens: p.MaxTokens, TokenRatio: p.TokenRatio})
	th := newRetryThrottle(p, tokens, coretest.Env(nil))
	for range 400 {
		th.ObserveAttempt(ctx, now, thrFailed)
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
				_ = th.allows(&coretest.Call{Ctx: ctx})
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
		th.ObserveAttempt(ctx, now, thrFailed)
		for range 5 {
			th.ObserveAttempt(ctx, now, thrAnswered)
		}
		th.ObserveAttempt(ctx, now, thrFinal)
	})
	if got := throttleLeft(th); got != 600 || !th.allows(&coretest.Call{Ctx: ctx}) {
		t.Errorf("after balanced rounds: %v left, want 600", got)
	}
	run(50, 200, func() { th.ObserveAttempt(ctx, now, thrAnswered) })
	if got := throttleLeft(th); got != 1000 {
		t.Errorf("after 10000 answers: %v left, want 1000", got)
	}
	run(50, 50, func() { th.ObserveAttempt(ctx, now, thrLimited) })
	if got := throttleLeft(th); got != 0 || th.allows(&coretest.Call{Ctx: ctx}) {
		t.Errorf("after 2500 failures: %v left, want 0", got)
	}
	stop.Store(true)
	readers.Wait()
	if bad.Load() != 0 {
		t.Errorf("%d reads outside [0, 1000]", bad.Load())
	}
}

// throttleLeft returns the tokens a throttle in memory has left.
func throttleLeft(th *retryThrottle) float64 {
	n, _ := th.t.Tokens(context.Background())
	return float64(n) / 1000
}
