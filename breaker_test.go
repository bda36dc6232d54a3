package damper_test

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
	"github.com/damper-ai/damper-go/fleet"
)

// holdGate stands in front of a handler and can keep the next request from
// reaching it until released: a request in flight for as long as a test
// needs.
type holdGate struct {
	next http.Handler

	mu      sync.Mutex
	n       int           // requests that reached the gate
	release chan struct{} // nil: requests pass
	arrived chan struct{} // gets a value when the request is held
}

func (g *holdGate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	g.n++
	release, arrived := g.release, g.arrived
	g.release = nil // only one is held
	g.mu.Unlock()
	if release != nil {
		arrived <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}
	g.next.ServeHTTP(w, r)
}

// hold holds the next request that arrives; release lets it through.
func (g *holdGate) hold() (arrived <-chan struct{}, release func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	rel, arr := make(chan struct{}), make(chan struct{}, 1)
	g.release, g.arrived = rel, arr
	return arr, func() { close(rel) }
}

func (g *holdGate) count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.n
}

// brkRig is a Damper on a virtual clock in front of the fake API, in
// memory, behind a holdGate; it records every change of its breaker.
type brkRig struct {
	clk    *dampertest.Clock
	srv    *dampertest.Server
	gate   *holdGate
	d      *damper.Damper
	client anthropic.Client

	mu      sync.Mutex
	changes []damper.CircuitChange
}

func newBrkRig(t *testing.T, p damper.Policy) *brkRig {
	t.Helper()
	clk := dampertest.NewClock(time.Now().Truncate(time.Minute).Add(time.Minute))
	srv := dampertest.NewServer(dampertest.InMemory(), dampertest.WithClock(clk))
	t.Cleanup(srv.Close)
	r := &brkRig{clk: clk, srv: srv, gate: &holdGate{next: srv.Handler()}}
	if p.Breaker != nil {
		bp := *p.Breaker
		user := bp.OnStateChange
		bp.OnStateChange = func(c damper.CircuitChange) {
			r.mu.Lock()
			r.changes = append(r.changes, c)
			r.mu.Unlock()
			if user != nil {
				user(c)
			}
		}
		p.Breaker = &bp
	}
	d, err := damper.New(p, damper.WithClock(clk), damper.WithRand(half))
	if err != nil {
		t.Fatal(err)
	}
	r.d = d
	r.client = memClient(d, r.gate)
	return r
}

// call makes one plain call answered by step, and returns its report: the
// one ReportInto received, or, for a call refused before any attempt, the
// one its error carries.
func (r *brkRig) call(t *testing.T, ctx context.Context, step dampertest.Step) (damper.Report, error) {
	t.Helper()
	r.srv.Script("", step)
	return r.send(ctx)
}

// send makes one plain call with the server's script as it is.
func (r *brkRig) send(ctx context.Context) (damper.Report, error) {
	var rep damper.Report
	_, err := r.client.Messages.New(ctx, params(dampertest.DefaultModel), damper.ReportInto(&rep))
	var de *damper.Error
	if rep.Outcome == "" && errors.As(err, &de) && de.Report != nil {
		rep = *de.Report
	}
	return rep, err
}

func (r *brkRig) changeLog() []damper.CircuitChange {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.changes)
}

func (r *brkRig) available(t *testing.T) float64 {
	t.Helper()
	n, err := r.d.Budget().Available(context.Background(), r.clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// checkChanges asserts the breaker's changes so far, exactly.
func (r *brkRig) checkChanges(t *testing.T, want ...damper.CircuitChange) {
	t.Helper()
	got := r.changeLog()
	if len(got) != len(want) {
		t.Fatalf("changes:\n got %s\nwant %s", fmtChanges(got), fmtChanges(want))
	}
	for i := range want {
		if got[i].From != want[i].From || got[i].To != want[i].To || !got[i].At.Equal(want[i].At) || !got[i].NextProbe.Equal(want[i].NextProbe) {
			t.Fatalf("changes:\n got %s\nwant %s", fmtChanges(got), fmtChanges(want))
		}
	}
}

func fmtChanges(cs []damper.CircuitChange) string {
	var b strings.Builder
	for _, c := range cs {
		b.WriteString(c.From.String() + "→" + c.To.String() + " at " + c.At.Format("15:04:05.000"))
		if !c.NextProbe.IsZero() {
			b.WriteString(" probe " + c.NextProbe.Format("15:04:05.000"))
		}
		b.WriteString("; ")
	}
	return b.String()
}

func change(from, to damper.CircuitState, at, next time.Time) damper.CircuitChange {
	return damper.CircuitChange{From: from, To: to, At: at, NextProbe: next}
}

const (
	closed   = fleet.CircuitClosed
	open     = fleet.CircuitOpen
	halfOpen = fleet.CircuitHalfOpen
)

// wantRefused asserts that err is the breaker's refusal of a call that sent
// nothing, made at now while the breaker was in state, with its next probe
// at next.
func wantRefused(t *testing.T, err error, now time.Time, state damper.CircuitState, next time.Time) {
	t.Helper()
	var de *damper.Error
	if !errors.Is(err, damper.ErrCircuitOpen) || !errors.As(err, &de) {
		t.Fatalf("err = %v, want an *Error matching ErrCircuitOpen", err)
	}
	if !de.NextProbe.Equal(next) || de.RetryAfter != next.Sub(now) {
		t.Errorf("NextProbe %v, RetryAfter %v; want %v, %v", de.NextProbe.Sub(now), de.RetryAfter, next.Sub(now), next.Sub(now))
	}
	if de.Last != nil {
		t.Errorf("Last = %v, want none: nothing was sent", de.Last)
	}
	rep := de.Report
	if rep == nil || rep.Attempts != 0 || len(rep.AttemptLog) != 0 || rep.Outcome != damper.OutcomeCircuitOpen || rep.Circuit != state {
		t.Errorf("report %+v; want 0 attempts, outcome circuit_open, circuit %v", rep, state)
	}
}

// wantSent asserts that a call was admitted, in state, and sent once.
func wantSent(t *testing.T, rep damper.Report, err error, state damper.CircuitState, probe bool, kind string) {
	t.Helper()
	if errors.Is(err, damper.ErrCircuitOpen) || rep.Attempts != 1 || len(rep.AttemptLog) != 1 {
		t.Fatalf("err %v, report %+v; want one attempt sent", err, rep)
	}
	if rep.Circuit != state || rep.AttemptLog[0].Probe != probe || rep.AttemptLog[0].Kind != kind {
		t.Fatalf("circuit %v, probe %v, kind %q; want %v, %v, %q", rep.Circuit, rep.AttemptLog[0].Probe, rep.AttemptLog[0].Kind, state, probe, kind)
	}
}

// Every failure of the provider's health opens the breaker once half of at
// least MinAttempts attempts failed. Open, it refuses every call at once,
// sends nothing, and spends nothing of the retry budget.
func TestBreakerOpensOnProviderHealthFailures(t *testing.T) {
	tests := []struct {
		name string
		step dampertest.Step
		kind string
	}{
		{"529", dampertest.Status(529), "overloaded"},
		{"500", dampertest.Status(500), "server_error"},
		{"503", dampertest.Status(503), "server_error"},
		{"connection dropped before headers", dampertest.OK().WithDrop(dampertest.DropBeforeHeaders), "transport"},
		{"connection reset mid-body", dampertest.OK().WithDrop(dampertest.DropMidBody), "transport"},
		{"attempt timeout", dampertest.OK().WithDelay(2 * time.Second), "timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newBrkRig(t, damper.Policy{
				MaxAttempts: 1, PerAttemptTimeout: time.Second,
				Breaker: &damper.BreakerPolicy{MinAttempts: 4, OpenFor: 10 * time.Second},
			})
			ctx := context.Background()
			// Two answers, then two failures: the second failure makes 2 of
			// 4, the ratio of 0.5 at the minimum of 4.
			for i, step := range []dampertest.Step{dampertest.OK(), dampertest.OK(), tt.step, tt.step} {
				rep, err := r.call(t, ctx, step)
				kind := ""
				if i >= 2 {
					kind = tt.kind
				}
				wantSent(t, rep, err, closed, false, kind)
				if i < 3 && len(r.changeLog()) != 0 {
					t.Fatalf("after %d calls: changes %s, want none", i+1, fmtChanges(r.changeLog()))
				}
			}
			opened := r.clk.Now()
			r.checkChanges(t, change(closed, open, opened, opened.Add(10*time.Second)))

			r.clk.Advance(time.Second)
			before := r.available(t)
			for range 3 {
				_, err := r.call(t, ctx, dampertest.OK())
				wantRefused(t, err, r.clk.Now(), open, opened.Add(10*time.Second))
			}
			if n, m := r.srv.Count(""), r.gate.count(); n != 4 || m != 4 {
				t.Errorf("server got %d requests (%d at the gate), want 4: nothing sent while open", n, m)
			}
			if after := r.available(t); after != before {
				t.Errorf("budget %v after the refusals, %v before: want it untouched", after, before)
			}
		})
	}
}

// The breaker opens exactly when at least FailureRatio of at least
// MinAttempts attempts in Window failed, and not one attempt sooner.
func TestBreakerTripsAtRatioAndMinimum(t *testing.T) {
	tests := []struct {
		name  string
		ratio float64
		min   int
		seq   string // F: a 529, S: an answer, W: the window passes
		opens int    // the call (1-based) after which it opens; 0: never
	}{
		{"below the minimum", 0.5, 4, "FFF", 0},
		{"at the minimum", 0.5, 4, "FFFF", 4},
		{"ratio reached at 3 of 6", 0.5, 4, "SSSFFF", 6},
		{"ratio not reached", 0.5, 4, "SSSSSFFFF", 0},
		{"three quarters", 0.75, 4, "SFFF", 4},
		{"below three quarters", 0.75, 4, "SSFFFF", 0},
		{"every attempt", 1, 4, "FFFSFFFF", 0},
		{"every attempt, after a success leaves the window", 1, 4, "SFFFWFFFF", 8},
		{"old failures leave the window", 0.5, 4, "FFFWF", 0},
		{"the default ratio", 0, 4, "SSFF", 4},
		{"a success never opens it", 0.5, 4, "FFFS", 0},
		{"the next failure does", 0.5, 4, "FFFSF", 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newBrkRig(t, damper.Policy{MaxAttempts: 1, Breaker: &damper.BreakerPolicy{FailureRatio: tt.ratio, MinAttempts: tt.min}})
			n, opened := 0, 0
			for _, c := range tt.seq {
				step := dampertest.OK()
				switch c {
				case 'W':
					r.clk.Advance(defaults.Breaker.Window)
					continue
				case 'F':
					step = dampertest.Status(529)
				}
				n++
				rep, err := r.call(t, context.Background(), step)
				if errors.Is(err, damper.ErrCircuitOpen) || rep.Circuit != closed {
					t.Fatalf("call %d: err %v, circuit %v; want it sent while closed", n, err, rep.Circuit)
				}
				if len(r.changeLog()) > 0 && opened == 0 {
					opened = n
				}
			}
			if opened != tt.opens {
				t.Fatalf("opened after call %d (%s), want %d", opened, fmtChanges(r.changeLog()), tt.opens)
			}
			_, err := r.call(t, context.Background(), dampertest.OK())
			if refused := errors.Is(err, damper.ErrCircuitOpen); refused != (tt.opens > 0) {
				t.Fatalf("next call: err %v, want refused %v", err, tt.opens > 0)
			}
		})
	}
}

// The defaults: 20 attempts with a verdict, half of them failed, open the
// breaker for 30 s; then one probe that succeeds closes it.
func TestBreakerDefaults(t *testing.T) {
	r := newBrkRig(t, damper.Policy{MaxAttempts: 1, Breaker: &damper.BreakerPolicy{}})
	ctx := context.Background()
	for i := range 19 {
		step := dampertest.Status(500)
		if i < 10 {
			step = dampertest.OK()
		}
		if _, err := r.call(t, ctx, step); errors.Is(err, damper.ErrCircuitOpen) {
			t.Fatalf("call %d refused", i+1)
		}
	}
	if len(r.changeLog()) != 0 {
		t.Fatalf("after 9 failures of 19: changes %s, want none", fmtChanges(r.changeLog()))
	}
	rep, err := r.call(t, ctx, dampertest.Status(500))
	wantSent(t, rep, err, closed, false, "server_error")
	t0 := r.clk.Now()
	r.checkChanges(t, change(closed, open, t0, t0.Add(30*time.Second)))
	_, err = r.call(t, ctx, dampertest.OK())
	wantRefused(t, err, t0, open, t0.Add(30*time.Second))

	r.clk.Advance(30 * time.Second)
	rep, err = r.call(t, ctx, dampertest.OK())
	wantSent(t, rep, err, halfOpen, true, "")
	rep, err = r.call(t, ctx, dampertest.OK())
	wantSent(t, rep, err, closed, false, "")
	t1 := t0.Add(30 * time.Second)
	r.checkChanges(t,
		change(closed, open, t0, t0.Add(30*time.Second)),
		change(open, halfOpen, t1, time.Time{}),
		change(halfOpen, closed, t1, time.Time{}))
	if n := r.srv.Count(""); n != 22 {
		t.Errorf("server got %d requests, want 22", n)
	}
}

// Failures of the caller's traffic or request, and the caller's own
// cancellation, count for nothing: neither failures nor successes.
func TestBreakerIgnoresCallerFailures(t *testing.T) {
	tests := []struct {
		name   string
		step   dampertest.Step
		cancel bool // the caller cancels while the attempt is in flight
		kind   string
	}{
		{"rate limit 429", dampertest.Status(429), false, "rate_limited"},
		{"rate limit 429 with retry-after", dampertest.Status(429).RetryAfter("1"), false, "rate_limited"},
		{"spend limit 429", dampertest.SpendLimit(), false, "spend_limit"},
		{"contract spend limit 429", dampertest.Status(429).WithError("rate_limit_error", "contract_spend_limit_reached"), false, "spend_limit"},
		{"400", dampertest.Status(400), false, "client_error"},
		{"401", dampertest.Status(401), false, "client_error"},
		{"403", dampertest.Status(403), false, "client_error"},
		{"404", dampertest.Status(404), false, "client_error"},
		{"413", dampertest.Status(413), false, "client_error"},
		{"caller cancels mid-attempt", dampertest.OK().WithDelay(20 * time.Millisecond), true, "canceled"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newBrkRig(t, damper.Policy{MaxAttempts: 1, Breaker: &damper.BreakerPolicy{MinAttempts: 4}})
			// Three failures of the provider: one short of opening.
			for range 3 {
				rep, err := r.call(t, context.Background(), dampertest.Status(529))
				wantSent(t, rep, err, closed, false, "overloaded")
			}
			for i := range 50 {
				ctx, cancel := context.WithCancel(context.Background())
				if tt.cancel {
					// Fires while the server holds the response.
					r.clk.AfterFunc(10*time.Millisecond, cancel)
				}
				rep, err := r.call(t, ctx, tt.step)
				cancel()
				if err == nil || errors.Is(err, damper.ErrCircuitOpen) {
					t.Fatalf("call %d: err %v, want the failure itself", i+1, err)
				}
				wantSent(t, rep, err, closed, false, tt.kind)
				if tt.cancel && (rep.Outcome != damper.OutcomeCanceled || !errors.Is(err, context.Canceled)) {
					t.Fatalf("call %d: outcome %q, err %v; want canceled", i+1, rep.Outcome, err)
				}
			}
			if cs := r.changeLog(); len(cs) != 0 {
				t.Fatalf("changes %s, want none", fmtChanges(cs))
			}
			if n := r.srv.Count(""); n != 53 {
				t.Fatalf("server got %d requests, want 53", n)
			}
			// Had they counted as successes, 4 failures of 54 would not
			// open it; as failures, it would have opened long ago.
			rep, err := r.call(t, context.Background(), dampertest.Status(529))
			wantSent(t, rep, err, closed, false, "overloaded")
			r.checkChanges(t, change(closed, open, r.clk.Now(), r.clk.Now().Add(defaults.Breaker.OpenFor)))
		})
	}
}

// Half-open, the breaker lets one probe through at a time: while it is in
// flight every other call is refused until the probe's attempt limit; a
// probe that fails opens it again for twice as long, up to MaxOpenFor; one
// with no verdict leaves the place to the next call; one that succeeds
// closes it, and the open period starts over.
func TestBreakerHalfOpenProbe(t *testing.T) {
	const (
		openFor = 10 * time.Second
		maxOpen = 35 * time.Second
		limit   = 5 * time.Second
	)
	r := newBrkRig(t, damper.Policy{
		MaxAttempts: 1, PerAttemptTimeout: limit,
		Breaker: &damper.BreakerPolicy{MinAttempts: 4, OpenFor: openFor, MaxOpenFor: maxOpen},
	})
	ctx := context.Background()
	for range 4 {
		_, _ = r.call(t, ctx, dampertest.Status(529))
	}
	t0 := r.clk.Now()
	want := []damper.CircuitChange{change(closed, open, t0, t0.Add(openFor))}
	r.checkChanges(t, want...)

	// The open period passes; the probe is held in flight.
	r.clk.Advance(openFor)
	t1 := r.clk.Now()
	r.srv.Script("", dampertest.Status(529))
	arrived, release := r.gate.hold()
	type result struct {
		rep damper.Report
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := r.send(ctx)
		done <- result{rep, err}
	}()
	<-arrived
	for range 3 {
		_, err := r.send(ctx)
		wantRefused(t, err, t1, halfOpen, t1.Add(limit))
	}
	if n := r.gate.count(); n != 5 {
		t.Fatalf("%d requests sent, want 5: the 4 failures and the one probe", n)
	}
	release()
	res := <-done
	wantSent(t, res.rep, res.err, halfOpen, true, "overloaded")
	want = append(want, change(open, halfOpen, t1, time.Time{}), change(halfOpen, open, t1, t1.Add(2*openFor)))
	r.checkChanges(t, want...)

	// Reopened for 20 s: refused until the last instant.
	_, err := r.call(t, ctx, dampertest.OK())
	wantRefused(t, err, t1, open, t1.Add(2*openFor))
	r.clk.Advance(2*openFor - time.Nanosecond)
	_, err = r.call(t, ctx, dampertest.OK())
	wantRefused(t, err, r.clk.Now(), open, t1.Add(2*openFor))

	// A probe that times out fails too: 40 s, capped at 35 s.
	r.clk.Advance(time.Nanosecond)
	t2 := r.clk.Now()
	rep, err := r.call(t, ctx, dampertest.OK().WithDelay(2*limit))
	wantSent(t, rep, err, halfOpen, true, "timeout")
	t2end := t2.Add(limit)
	want = append(want, change(open, halfOpen, t2, time.Time{}), change(halfOpen, open, t2end, t2end.Add(maxOpen)))
	r.checkChanges(t, want...)

	// Still capped.
	r.clk.Advance(maxOpen)
	t3 := r.clk.Now()
	rep, err = r.call(t, ctx, dampertest.Status(503))
	wantSent(t, rep, err, halfOpen, true, "server_error")
	want = append(want, change(open, halfOpen, t3, time.Time{}), change(halfOpen, open, t3, t3.Add(maxOpen)))
	r.checkChanges(t, want...)

	// A probe with no verdict (a rate limit) leaves the breaker half-open
	// and its place free: the next call is the probe.
	r.clk.Advance(maxOpen)
	t4 := r.clk.Now()
	rep, err = r.call(t, ctx, dampertest.Status(429))
	wantSent(t, rep, err, halfOpen, true, "rate_limited")
	rep, err = r.call(t, ctx, dampertest.OK())
	wantSent(t, rep, err, halfOpen, true, "")
	want = append(want, change(open, halfOpen, t4, time.Time{}), change(halfOpen, closed, t4, time.Time{}))
	r.checkChanges(t, want...)

	// Closed: calls go through, and the open period is back to OpenFor.
	rep, err = r.call(t, ctx, dampertest.OK())
	wantSent(t, rep, err, closed, false, "")
	for range 3 { // 3 failures of 4 attempts
		rep, err = r.call(t, ctx, dampertest.Status(529))
		wantSent(t, rep, err, closed, false, "overloaded")
	}
	want = append(want, change(closed, open, t4, t4.Add(openFor)))
	r.checkChanges(t, want...)
}

// A retry that the open breaker would refuse is not waited for, and takes
// no unit of the budget; one that would come after the open period is
// waited for, and is the probe.
func TestBreakerRefusesRetryBeforeWaiting(t *testing.T) {
	t.Run("refused", func(t *testing.T) {
		r := newBrkRig(t, damper.Policy{MaxAttempts: 3, Breaker: &damper.BreakerPolicy{MinAttempts: 4, OpenFor: 10 * time.Second}})
		ctx := context.Background()
		rep, _ := r.call(t, ctx, dampertest.Status(529))
		if rep.Attempts != 3 || rep.Outcome != damper.OutcomeAttemptsExhausted {
			t.Fatalf("first call: %+v, want 3 attempts", rep)
		}
		sleeps, before := r.clk.Sleeps(), r.available(t)
		if !slices.Equal(sleeps, []time.Duration{500 * time.Millisecond, time.Second}) || before != 8 {
			t.Fatalf("first call: waits %v, budget %v; want 2 retries", sleeps, before)
		}

		// The 4th failure opens the breaker: its retry is refused.
		rep, err := r.call(t, ctx, dampertest.Status(529))
		now := r.clk.Now()
		var de *damper.Error
		var apiErr *anthropic.Error
		if !errors.Is(err, damper.ErrCircuitOpen) || !errors.As(err, &de) || !errors.As(err, &apiErr) || apiErr.StatusCode != 529 {
			t.Fatalf("err = %v, want ErrCircuitOpen wrapping the 529", err)
		}
		if !de.NextProbe.Equal(now.Add(10*time.Second)) || de.RetryAfter != 10*time.Second {
			t.Errorf("NextProbe in %v, RetryAfter %v; want 10s", de.NextProbe.Sub(now), de.RetryAfter)
		}
		if rep.Attempts != 1 || rep.Outcome != damper.OutcomeCircuitOpen || rep.Circuit != fleet.CircuitOpen || rep.AttemptLog[0].Backoff != 0 {
			t.Errorf("report %+v; want 1 attempt, circuit_open, no backoff", rep)
		}
		if got := r.clk.Sleeps(); !slices.Equal(got, sleeps) {
			t.Errorf("waits %v, want no new wait (had %v)", got, sleeps)
		}
		if after := r.available(t); after != before {
			t.Errorf("budget %v, want %v: a refused retry spends nothing", after, before)
		}
		if n := r.srv.Count(""); n != 4 {
			t.Errorf("server got %d requests, want 4", n)
		}
	})
	t.Run("after the open period", func(t *testing.T) {
		r := newBrkRig(t, damper.Policy{MaxAttempts: 3, Breaker: &damper.BreakerPolicy{MinAttempts: 4, OpenFor: 100 * time.Millisecond}})
		ctx := context.Background()
		_, _ = r.call(t, ctx, dampertest.Status(529))
		r.srv.Script("", dampertest.Status(529), dampertest.OK())
		rep, err := r.send(ctx)
		if err != nil || rep.Attempts != 2 || rep.Outcome != damper.OutcomeSuccess || !rep.AttemptLog[1].Probe || rep.Circuit != halfOpen {
			t.Fatalf("err %v, report %+v; want the retry sent as the probe", err, rep)
		}
		if got := r.clk.Sleeps(); !slices.Equal(got, []time.Duration{500 * time.Millisecond, time.Second, 500 * time.Millisecond}) {
			t.Errorf("waits %v", got)
		}
		if got := r.available(t); got != 7 {
			t.Errorf("budget %v, want 7: three retries", got)
		}
		t0 := r.clk.Now().Add(-500 * time.Millisecond)
		t1 := r.clk.Now()
		r.checkChanges(t,
			change(closed, open, t0, t0.Add(100*time.Millisecond)),
			change(open, halfOpen, t1, time.Time{}),
			change(halfOpen, closed, t1, time.Time{}))
	})
}

// OnStateChange hears every change in order, with no lock held: it may
// read the Damper's policy and make calls through it.
func TestBreakerOnStateChangeCallsBack(t *testing.T) {
	var r *brkRig
	type nested struct {
		to  damper.CircuitState
		err error
		rep damper.Report
	}
	var calls []nested
	r = newBrkRig(t, damper.Policy{MaxAttempts: 1, Breaker: &damper.BreakerPolicy{
		MinAttempts: 2, OpenFor: 10 * time.Second,
		OnStateChange: func(c damper.CircuitChange) {
			if r.d.Policy().Breaker.OpenFor != 10*time.Second {
				t.Error("the policy read from the callback is wrong")
			}
			rep, err := r.send(context.Background())
			calls = append(calls, nested{c.To, err, rep})
		},
	}})
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.srv.Script("", dampertest.Status(529), dampertest.Status(529), dampertest.OK())
		_, _ = r.send(context.Background())
		_, _ = r.send(context.Background()) // opens; the nested call is refused
		r.clk.Advance(10 * time.Second)
		_, _ = r.send(context.Background()) // the probe: half-open, then closed
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("deadlock: a call from OnStateChange did not return")
	}
	t0 := r.clk.Now().Add(-10 * time.Second)
	t1 := r.clk.Now()
	r.checkChanges(t,
		change(closed, open, t0, t0.Add(10*time.Second)),
		change(open, halfOpen, t1, time.Time{}),
		change(halfOpen, closed, t1, time.Time{}))
	if len(calls) != 3 {
		t.Fatalf("%d nested calls, want 3", len(calls))
	}
	wantRefused(t, calls[0].err, t0, open, t0.Add(10*time.Second))
	// Half-open, the place is the probe's, whose call caused the change:
	// it may take PerAttemptTimeout (60 s), but the wait is bounded by the
	// open period.
	wantRefused(t, calls[1].err, t1, halfOpen, t1.Add(10*time.Second))
	wantSent(t, calls[2].rep, calls[2].err, closed, false, "")
	if n := r.srv.Count(""); n != 4 {
		t.Errorf("server got %d requests, want 4", n)
	}
}

// A stream is a success for the breaker once its first content arrives,
// whatever comes after; one that fails before its content with an
// overloaded_error event is a failure.
func TestBreakerStreams(t *testing.T) {
	r := newBrkRig(t, damper.Policy{MaxAttempts: 1, Breaker: &damper.BreakerPolicy{MinAttempts: 4, OpenFor: 10 * time.Second}})
	overloaded := dampertest.OK().WithStream(dampertest.Stream{Fault: dampertest.FaultErrorEvent, At: 1})
	cut := dampertest.Stream{Text: "a long enough answer to span several deltas", Fault: dampertest.FaultReset}
	cut.At = cut.ContentIndex() + 1
	afterContent := dampertest.OK().WithStream(cut)
	stream := func(step dampertest.Step) (damper.Report, error) {
		r.srv.Script("", step)
		var rep damper.Report
		s := r.client.Messages.NewStreaming(context.Background(), params(dampertest.DefaultModel), damper.ReportInto(&rep))
		for s.Next() {
		}
		err := s.Err()
		_ = s.Close()
		var de *damper.Error
		if rep.Outcome == "" && errors.As(err, &de) && de.Report != nil {
			rep = *de.Report
		}
		return rep, err
	}
	// As successes, the three cut streams make 3 failures of 6 on the
	// sixth call; as nothing, the breaker would open on none of these; as
	// failures, on the fourth.
	steps := []struct {
		step    dampertest.Step
		outcome damper.Outcome
	}{
		{overloaded, damper.OutcomeAttemptsExhausted},
		{afterContent, damper.OutcomeAmbiguous},
		{afterContent, damper.OutcomeAmbiguous},
		{afterContent, damper.OutcomeAmbiguous},
		{overloaded, damper.OutcomeAttemptsExhausted},
		{overloaded, damper.OutcomeAttemptsExhausted},
	}
	for i, s := range steps {
		rep, err := stream(s.step)
		if err == nil || rep.Outcome != s.outcome || rep.Circuit != closed || rep.Attempts != 1 {
			t.Fatalf("stream %d: err %v, report %+v; want %q while closed", i+1, err, rep, s.outcome)
		}
		if opened := len(r.changeLog()) > 0; opened != (i == 5) {
			t.Fatalf("after stream %d: changes %s", i+1, fmtChanges(r.changeLog()))
		}
	}
	now := r.clk.Now()
	r.checkChanges(t, change(closed, open, now, now.Add(10*time.Second)))
	_, err := stream(dampertest.OK())
	wantRefused(t, err, now, open, now.Add(10*time.Second))
	if n := r.srv.Count(""); n != 6 {
		t.Errorf("server got %d requests, want 6", n)
	}
}

// Attempts admitted before the breaker opened count for nothing when they
// end, whatever its state by then; if the open period has passed, the
// change to half-open that such an end makes is heard at once.
func TestBreakerStaleAttempt(t *testing.T) {
	r := newBrkRig(t, damper.Policy{MaxAttempts: 1, Breaker: &damper.BreakerPolicy{MinAttempts: 4, OpenFor: 10 * time.Second}})
	ctx := context.Background()
	r.srv.Script("", dampertest.Status(529))
	// Two attempts admitted while closed, held in flight.
	var stale [2]chan error
	var release [2]func()
	for i := range stale {
		var arrived <-chan struct{}
		arrived, release[i] = r.gate.hold()
		stale[i] = make(chan error, 1)
		go func() {
			_, err := r.send(ctx)
			stale[i] <- err
		}()
		<-arrived
	}
	for range 4 {
		_, _ = r.send(ctx)
	}
	t0 := r.clk.Now()
	t1 := t0.Add(10 * time.Second)
	want := []damper.CircuitChange{change(closed, open, t0, t1)}
	r.checkChanges(t, want...)

	// The first ends after the open period: the breaker is half-open, and
	// the failure does not reopen it.
	r.clk.Advance(10 * time.Second)
	release[0]()
	if err := <-stale[0]; err == nil || errors.Is(err, damper.ErrCircuitOpen) {
		t.Fatalf("err = %v, want the 529", err)
	}
	want = append(want, change(open, halfOpen, t1, time.Time{}))
	r.checkChanges(t, want...)
	rep, err := r.call(t, ctx, dampertest.OK())
	wantSent(t, rep, err, halfOpen, true, "")
	want = append(want, change(halfOpen, closed, t1, time.Time{}))
	r.checkChanges(t, want...)

	// Closed again, with 3 failures of 3: the second ends, a failure that
	// would make it 4 of 4, and counts for nothing.
	for range 3 {
		rep, err = r.call(t, ctx, dampertest.Status(529))
		wantSent(t, rep, err, closed, false, "overloaded")
	}
	release[1]()
	if err := <-stale[1]; err == nil || errors.Is(err, damper.ErrCircuitOpen) {
		t.Fatalf("err = %v, want the 529", err)
	}
	r.checkChanges(t, want...)
	rep, err = r.call(t, ctx, dampertest.Status(529))
	wantSent(t, rep, err, closed, false, "overloaded")
	r.checkChanges(t, append(want, change(closed, open, t1, t1.Add(10*time.Second)))...)
}

// Of many calls made at once when the open period has passed, exactly one
// is sent, as the probe; every other is refused until its attempt limit.
func TestBreakerOneProbeAmongConcurrentCalls(t *testing.T) {
	r := newBrkRig(t, damper.Policy{MaxAttempts: 1, PerAttemptTimeout: 5 * time.Second, Breaker: &damper.BreakerPolicy{MinAttempts: 4, OpenFor: 10 * time.Second}})
	ctx := context.Background()
	for range 4 {
		_, _ = r.call(t, ctx, dampertest.Status(529))
	}
	r.clk.Advance(10 * time.Second)
	t1 := r.clk.Now()
	r.srv.Script("", dampertest.OK())
	arrived, release := r.gate.hold()
	const n = 32
	results := make(chan error, n)
	var probe damper.Report
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			rep, err := r.send(ctx)
			if err == nil {
				probe = rep
			}
			results <- err
		})
	}
	<-arrived
	for range n - 1 {
		wantRefused(t, <-results, t1, halfOpen, t1.Add(5*time.Second))
	}
	release()
	if err := <-results; err != nil {
		t.Fatalf("the probe: %v", err)
	}
	wg.Wait()
	wantSent(t, probe, nil, halfOpen, true, "")
	if n := r.gate.count(); n != 5 {
		t.Errorf("%d requests sent, want 5: the 4 failures and the probe", n)
	}
}

// A refusal while the probe is in flight tells the caller to come back
// when the probe is due to answer (its PerAttemptTimeout, or its caller's
// deadline if sooner), and never later than the open period: with the
// recommended open period of 2 s and an attempt timeout of 60 s, 2 s, not
// the 60 s the probe could take.
func TestBreakerProbeInFlightWaitBoundedByOpenPeriod(t *testing.T) {
	const openFor = 2 * time.Second
	type check struct{ after, want time.Duration } // a refusal this long after the probe started, and its wait
	cases := []struct {
		name     string
		timeout  time.Duration // PerAttemptTimeout
		deadline time.Duration // the probe's caller's deadline, from its start; 0: none
		checks   []check
	}{
		{"attempt timeout longer than the open period", 60 * time.Second, 0,
			[]check{{0, openFor}, {1500 * time.Millisecond, openFor}, {58 * time.Second, openFor}, {58500 * time.Millisecond, 1500 * time.Millisecond}, {59900 * time.Millisecond, 100 * time.Millisecond}}},
		{"attempt timeout shorter than the open period", 1500 * time.Millisecond, 0,
			[]check{{0, 1500 * time.Millisecond}, {time.Second, 500 * time.Millisecond}, {1499 * time.Millisecond, time.Millisecond}}},
		{"caller's deadline before the attempt timeout", 60 * time.Second, 30 * time.Second,
			[]check{{0, openFor}, {28 * time.Second, openFor}, {28500 * time.Millisecond, 1500 * time.Millisecond}, {29900 * time.Millisecond, 100 * time.Millisecond}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := damper.RecommendedPolicy()
			p.MaxAttempts, p.PerAttemptTimeout = 1, tc.timeout
			p.Breaker.MinAttempts = 2
			r := newBrkRig(t, p)
			ctx := context.Background()
			for range 2 {
				_, _ = r.call(t, ctx, dampertest.Status(529))
			}
			t0 := r.clk.Now()
			r.checkChanges(t, change(closed, open, t0, t0.Add(openFor)))
			r.clk.Advance(500 * time.Millisecond)
			_, err := r.call(t, ctx, dampertest.OK())
			wantRefused(t, err, r.clk.Now(), open, t0.Add(openFor))

			// The open period passes; the probe is held in flight.
			r.clk.Advance(openFor - 500*time.Millisecond)
			start := r.clk.Now()
			r.srv.Script("", dampertest.OK())
			probeCtx := ctx
			if tc.deadline > 0 {
				var cancel context.CancelFunc
				probeCtx, cancel = context.WithDeadline(ctx, start.Add(tc.deadline))
				defer cancel()
			}
			arrived, release := r.gate.hold()
			done := make(chan error, 1)
			go func() {
				_, err := r.send(probeCtx)
				done <- err
			}()
			<-arrived
			for _, c := range tc.checks {
				r.clk.Advance(start.Add(c.after).Sub(r.clk.Now()))
				now := r.clk.Now()
				_, err := r.send(ctx)
				wantRefused(t, err, now, halfOpen, now.Add(c.want))
			}
			release()
			if err := <-done; err != nil {
				t.Fatalf("the probe: %v", err)
			}
			if n := r.gate.count(); n != 3 {
				t.Errorf("%d requests sent, want 3: the 2 failures and the probe", n)
			}
		})
	}
}
