package damper_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/damper-ai/damper-go/fleet"

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
		if _, err := fleet.NewWindowBudget(tt.ratio, tt.window, tt.minTokens); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("NewWindowBudget(%v, %v, %d) error = %v, want one naming %q", tt.ratio, tt.window, tt.minTokens, err, tt.want)
		}
	}
}

// wallStepped returns t with its wall reading moved by step and its
// monotonic reading kept: what time.Now returns after the system clock is
// stepped. No exported function builds such a time, so this one edits the
// wall seconds of time.Time's representation, and checks that it did.
func wallStepped(t *testing.T, tm time.Time, step time.Duration) time.Time {
	t.Helper()
	if step%time.Second != 0 {
		t.Fatalf("wallStepped(%v): whole seconds only", step)
	}
	const hasMonotonic = 1 << 63
	type timeRepr struct {
		wall uint64
		ext  int64
		loc  *time.Location
	}
	out := tm
	r := (*timeRepr)(unsafe.Pointer(&out))
	if r.wall&hasMonotonic == 0 {
		t.Fatal("wallStepped: the time has no monotonic reading")
	}
	r.wall = uint64(int64(r.wall) + int64(step/time.Second)<<30)
	if out.Sub(tm) != 0 || out.Round(0).Sub(tm.Round(0)) != step {
		t.Fatalf("wallStepped: time.Time's representation changed; got mono %v, wall %v", out.Sub(tm), out.Round(0).Sub(tm.Round(0)))
	}
	return out
}

// A wall clock stepped back an hour does not bring an exhausted window
// back: windows follow monotonic time, so the next one opens one window
// after the first, as measured by the monotonic clock.
func TestWindowBudgetFollowsMonotonicTime(t *testing.T) {
	const window = 10 * time.Second
	b := mustBudget(t, 0.1, window, 2)
	// The first window starts at a multiple of the window since the epoch;
	// t0, its first instant, keeps time.Now's monotonic reading.
	now := time.Now()
	t0 := now.Add(window - time.Duration(now.UnixNano()%int64(window)))
	if !b.TryAcquire(t0) || !b.TryAcquire(t0) || b.TryAcquire(t0) {
		t.Fatal("want exactly two units in the first window")
	}
	back := wallStepped(t, t0.Add(time.Second), -time.Hour)
	if b.TryAcquire(back) {
		t.Error("a unit was taken from the exhausted window after the wall clock stepped back")
	}
	if got := b.Balance(back); got != 0 {
		t.Errorf("balance after the wall step = %v, want 0 (the same window)", got)
	}
	next := wallStepped(t, t0.Add(10*time.Second), -time.Hour)
	if !b.TryAcquire(next) {
		t.Error("the next window, ten monotonic seconds on, has no unit")
	}
	ahead := wallStepped(t, t0.Add(11*time.Second), 24*time.Hour)
	if got := b.Balance(ahead); got != 1 {
		t.Errorf("balance after the wall clock jumped a day ahead = %v, want 1 (the window of the unit just taken)", got)
	}
}

// storeBudget is a budget whose store can fail: it records what it hears
// and answers Acquire with grant and err.
type storeBudget struct {
	mu        sync.Mutex
	observed  []fleet.AttemptOutcome
	grant     bool
	err       error
	available int // calls of Available
}

func (b *storeBudget) Observe(_ context.Context, _ time.Time, a fleet.AttemptOutcome) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.observed = append(b.observed, a)
	return b.err
}

func (b *storeBudget) Acquire(context.Context, time.Time) (bool, error) { return b.grant, b.err }

func (b *storeBudget) Available(context.Context, time.Time) (float64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.available++
	return 7, b.err
}

// A budget in a store is asked for its balance at a call's end only when
// someone reads the report: a round trip per answered call is not spent
// on a balance nobody sees.
func TestStoreBudgetBalanceAskedOnlyWhenRead(t *testing.T) {
	b := &storeBudget{grant: true}
	r := newRig(t, damper.Policy{}, damper.WithBudget(b))
	ctx := context.Background()
	if _, err := r.client.Messages.New(ctx, params("claude-sonnet-4-6")); err != nil || b.available != 0 {
		t.Fatalf("answered, no report read: err %v, Available asked %d times; want 0", err, b.available)
	}
	var rep damper.Report
	if _, err := r.client.Messages.New(ctx, params("claude-sonnet-4-6"), damper.ReportInto(&rep)); err != nil || b.available != 1 || rep.BudgetBalance != 7 {
		t.Fatalf("answered, ReportInto: err %v, Available asked %d times, balance %v; want 1, 7", err, b.available, rep.BudgetBalance)
	}
	r.srv.Script("", dampertest.Status(400))
	// A failed call's balance goes on its log line, and on its error's
	// report when a gate refused it.
	if _, err := r.client.Messages.New(ctx, params("claude-sonnet-4-6")); err == nil || b.available != 2 {
		t.Fatalf("failed: err %v, Available asked %d times; want 2", err, b.available)
	}
}

// The budget hears every attempt, failed ones with their signal, not only
// a successful first attempt.
func TestBudgetHearsEveryAttempt(t *testing.T) {
	b := &storeBudget{grant: true}
	r := newRig(t, damper.Policy{}, damper.WithBudget(b))
	r.srv.Script("", dampertest.Status(529), dampertest.Status(429), dampertest.OK())
	if _, err := r.client.Messages.New(context.Background(), params("claude-sonnet-4-6")); err != nil {
		t.Fatal(err)
	}
	want := []fleet.AttemptOutcome{
		{First: true, Signal: damper.ProviderHealth},
		{Signal: damper.CallerTraffic},
		{Success: true},
	}
	if len(b.observed) != len(want) {
		t.Fatalf("observed %+v, want %+v", b.observed, want)
	}
	for i := range want {
		if b.observed[i] != want[i] {
			t.Errorf("attempt %d: observed %+v, want %+v", i+1, b.observed[i], want[i])
		}
	}
}

// A budget whose store fails still decides, fail open or fail closed as
// it was built; Damper follows the decision and logs the errors, one line
// per ten seconds with the count of errors since the last line: a store
// that is down fails every operation of every call.
func TestBudgetStoreErrorIsLoggedAndDecisionKept(t *testing.T) {
	errStore := errors.New("store: i/o timeout")
	for _, grant := range []bool{true, false} {
		var logs bytes.Buffer
		b := &storeBudget{grant: grant, err: errStore}
		r := newRig(t, damper.Policy{}, damper.WithBudget(b), damper.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))))
		call := func() {
			t.Helper()
			r.srv.Script("", dampertest.Status(529), dampertest.OK())
			var rep damper.Report
			_, err := r.client.Messages.New(context.Background(), params("claude-sonnet-4-6"), damper.ReportInto(&rep))
			if grant && (err != nil || rep.Attempts != 2) {
				t.Errorf("fail open: err %v, %d attempts; want a retried success", err, rep.Attempts)
			}
			if !grant && (!errors.Is(err, damper.ErrRetryBudgetExhausted) || rep.Attempts != 1) {
				t.Errorf("fail closed: err %v, %d attempts; want the budget's refusal", err, rep.Attempts)
			}
		}
		// Each call's errors: observe of every attempt, acquire, available.
		perCall := 4
		if !grant {
			perCall = 3
		}
		call()
		lines := func() []string {
			var out []string
			for l := range strings.Lines(logs.String()) {
				if strings.Contains(l, `"msg":"damper: retry budget error"`) {
					out = append(out, l)
				}
			}
			return out
		}
		want := []string{`"op":"observe","error":"` + errStore.Error() + `","errors":1`}
		if got := lines(); len(got) != 1 || !strings.Contains(got[0], want[0]) {
			t.Fatalf("grant %v: lines %q, want one with %s", grant, got, want[0])
		}
		r.clock.Advance(5 * time.Second)
		call()
		if got := lines(); len(got) != 1 {
			t.Fatalf("grant %v: lines %q within ten seconds, want one", grant, got)
		}
		r.clock.Advance(10 * time.Second)
		call()
		want = append(want, fmt.Sprintf(`"op":"observe","error":%q,"errors":%d`, errStore.Error(), 2*perCall-1+1))
		got := lines()
		if len(got) != 2 || !strings.Contains(got[1], want[1]) {
			t.Fatalf("grant %v: lines %q, want the second with %s", grant, got, want[1])
		}
	}
}

// knownBudget is a storeBudget that knows its balance without asking.
type knownBudget struct{ storeBudget }

func (b *knownBudget) KnownBalance(time.Time) float64 { return 4 }

// A budget that knows its balance tells a report's at no cost: Available
// is never asked, whoever reads the report.
func TestKnownBalanceNeverAsks(t *testing.T) {
	b := &knownBudget{storeBudget{grant: true}}
	r := newRig(t, damper.Policy{}, damper.WithBudget(b))
	var rep damper.Report
	if _, err := r.client.Messages.New(context.Background(), params("claude-sonnet-4-6"), damper.ReportInto(&rep)); err != nil {
		t.Fatal(err)
	}
	r.srv.Script("", dampertest.Status(400))
	if _, err := r.client.Messages.New(context.Background(), params("claude-sonnet-4-6")); err == nil {
		t.Fatal("a 400 answered")
	}
	if b.available != 0 || rep.BudgetBalance != 4 {
		t.Fatalf("Available asked %d times, balance %v; want 0, 4", b.available, rep.BudgetBalance)
	}
}

// WithBudget's budget has its own values: a Policy that sets the budget's
// fields as well is refused, naming them, rather than left unused.
func TestWithBudgetRefusesBudgetFields(t *testing.T) {
	b := damper.WithBudget(&storeBudget{grant: true})
	for _, c := range []struct {
		p    damper.Policy
		want string
	}{
		{damper.Policy{RetryBudgetRatio: 0.2}, "Policy.RetryBudgetRatio = 0.2"},
		{damper.Policy{RetryBudgetWindow: time.Second}, "Policy.RetryBudgetWindow = 1s"},
		{damper.Policy{RetryBudgetMinTokens: damper.None}, "Policy.RetryBudgetMinTokens = -1"},
		{damper.Policy{RetryBudgetRatio: 0.2, RetryBudgetMinTokens: 3}, "Policy.RetryBudgetRatio = 0.2, Policy.RetryBudgetMinTokens = 3"},
	} {
		_, err := damper.New(c.p, b)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "the budget given to WithBudget has its own") {
			t.Errorf("New(%+v, WithBudget): %v; want an error naming %q", c.p, err, c.want)
		}
	}
	if _, err := damper.New(damper.Policy{MaxAttempts: 2}, b); err != nil {
		t.Errorf("New without the budget's fields: %v", err)
	}
}
