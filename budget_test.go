package damper_test

import (
	"context"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func TestWindowBudgetArithmetic(t *testing.T) {
	b := mustBudget(t, 0.1, time.Minute, 10)
	for i := range 10 {
		if !b.TryAcquire(t0) {
			t.Fatalf("retry %d refused; the window starts with 10 units", i+1)
		}
	}
	if b.TryAcquire(t0) {
		t.Fatal("11th retry admitted with no success in the window")
	}
	for range 9 {
		b.FirstAttemptSucceeded(t0)
	}
	if b.TryAcquire(t0) {
		t.Fatal("0.9 units made a whole retry")
	}
	b.FirstAttemptSucceeded(t0)
	if !b.TryAcquire(t0) {
		t.Fatal("10 successes at ratio 0.1 did not add a unit")
	}
	if got := b.Balance(t0); got != 0 {
		t.Errorf("balance = %v, want 0", got)
	}
	// A new window starts afresh; the old one's successes do not carry.
	next := t0.Add(time.Minute)
	if got := b.Balance(next); got != 10 {
		t.Errorf("balance in the next window = %v, want 10", got)
	}
}

// TestBudgetBoundAllFailing: with the default policy and a provider that
// always fails, N logical requests make exactly N + 10 attempts in one
// window.
func TestBudgetBoundAllFailing(t *testing.T) {
	const n = 200
	r := newRig(t, damper.Policy{})
	r.srv.Script("", dampertest.Status(529))
	exhausted := 0
	for range n {
		var rep damper.Report
		if _, err := r.client.Messages.New(context.Background(), params("claude-sonnet-4-6"), damper.ReportInto(&rep)); err == nil {
			t.Fatal("a call succeeded against a provider that always fails")
		}
		if rep.Outcome == damper.OutcomeBudgetExhausted {
			exhausted++
		}
	}
	if got := r.srv.Count(""); got != n+10 {
		t.Errorf("provider attempts = %d, want %d", got, n+10)
	}
	// Five requests take two units each and use up their attempts.
	if exhausted != n-5 {
		t.Errorf("budget-exhausted requests = %d, want %d", exhausted, n-5)
	}
}

// TestBudgetBoundConcurrent: under 1,000 goroutines with first-attempt
// successes interleaved, the retries authorized are exactly
// 10 + 0.1 × successes when demand exceeds it.
func TestBudgetBoundConcurrent(t *testing.T) {
	const goroutines = 1000
	b := mustBudget(t, 0.1, time.Hour, 10)
	var granted atomic.Int64
	var wg sync.WaitGroup
	for i := range goroutines {
		wg.Go(func() {
			if i%2 == 0 {
				b.FirstAttemptSucceeded(t0)
			}
			for range 3 {
				if b.TryAcquire(t0) {
					granted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	// Units granted before all successes landed can only be fewer; top up
	// with one pass now that the window holds all 500 successes.
	for b.TryAcquire(t0) {
		granted.Add(1)
	}
	if got, want := granted.Load(), int64(10+0.1*goroutines/2); got != want {
		t.Errorf("retries authorized = %d, want %d", got, want)
	}
}

// TestBudgetSharedAcrossCalls: calls through one Damper share its budget,
// through another Damper they do not.
func TestBudgetSharedAcrossCalls(t *testing.T) {
	srv := dampertest.NewServer()
	defer srv.Close()
	srv.Script("", dampertest.Status(529))
	newClient := func(d *damper.Damper) anthropic.Client {
		return anthropic.NewClient(append([]option.RequestOption{d.Option()}, srv.Options()...)...)
	}
	// The clock starts on a whole minute, so that the calls' few seconds of
	// waits stay in one window: a new one would refill d1's budget.
	clk := dampertest.NewClock(time.Now().Truncate(time.Minute).Add(time.Minute))
	newDamper := func() *damper.Damper {
		d, err := damper.New(damper.Policy{RetryBudgetMinTokens: 1}, damper.WithClock(clk))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	d1, d2 := newDamper(), newDamper()
	a, b, c := newClient(d1), newClient(d1), newClient(d2)
	// d1's one unit serves a's first retry and leaves b none; d2 has its
	// own for c. Every call ends refused by its budget.
	for i, tt := range []struct {
		client anthropic.Client
		tries  int
	}{{a, 2}, {b, 1}, {c, 2}} {
		var rep damper.Report
		if _, err := tt.client.Messages.New(context.Background(), params("claude-sonnet-4-6"), damper.ReportInto(&rep)); err == nil {
			t.Fatalf("call %d succeeded against a provider that always fails", i+1)
		}
		if rep.Attempts != tt.tries || rep.Outcome != damper.OutcomeBudgetExhausted {
			t.Errorf("call %d: %d attempts, outcome %s; want %d, %s", i+1, rep.Attempts, rep.Outcome, tt.tries, damper.OutcomeBudgetExhausted)
		}
	}
	if got := srv.Count(""); got != 2+1+2 {
		t.Errorf("provider attempts = %d, want 5", got)
	}
}

func BenchmarkBudgetTryAcquireParallel(b *testing.B) {
	budget := mustBudget(b, 0.1, time.Minute, 10)
	now := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			budget.FirstAttemptSucceeded(now)
			budget.TryAcquire(now)
		}
	})
}

func TestNewWindowBudgetRejectsBadValues(t *testing.T) {
	for _, tt := range []struct {
		ratio     float64
		window    time.Duration
		minTokens int
		want      string
	}{
		{-0.1, time.Minute, 10, "ratio = -0.1"},
		{math.NaN(), time.Minute, 10, "ratio = NaN"},
		{0.1, 0, 10, "window = 0s"},
		{0.1, -time.Second, 10, "window = -1s"},
		{0.1, time.Minute, -1, "minTokens = -1"},
	} {
		if _, err := damper.NewWindowBudget(tt.ratio, tt.window, tt.minTokens); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("NewWindowBudget(%v, %v, %d) error = %v, want one naming %q", tt.ratio, tt.window, tt.minTokens, err, tt.want)
		}
	}
}
