package fleettest

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/damper-ai/damper-go/fleet"
)

func (e *env) breaker(t *testing.T) {
	t.Run("Settings", e.breakerSettings)
	t.Run("Transitions", e.breakerTransitions)
	t.Run("Window", e.breakerWindow)
	t.Run("MaxOpenFor", e.breakerMaxOpenFor)
	t.Run("Shared", e.breakerShared)
}

// breakerValues open after 2 failures of 4 verdicts in 10 s, for 5 s,
// doubling to at most 20 s; a probe is due within 2 s.
func breakerValues() fleet.BreakerSettings {
	return fleet.BreakerSettings{FailureRatio: 0.5, MinAttempts: 4, Window: 10 * time.Second, OpenFor: 5 * time.Second, MaxOpenFor: 20 * time.Second, ProbeLimit: 2 * time.Second}
}

func newBreaker(t *testing.T, s fleet.Store, set fleet.BreakerSettings) fleet.Breaker {
	t.Helper()
	b, err := s.(fleet.BreakerStore).Breaker(set)
	if err != nil || b == nil {
		t.Fatalf("Breaker = %v, %v; want a breaker", b, err)
	}
	return b
}

func (e *env) breakerSettings(t *testing.T) {
	s := e.new(t).(fleet.BreakerStore)
	for _, c := range []struct {
		edit         func(*fleet.BreakerSettings)
		field, value string
	}{
		{func(b *fleet.BreakerSettings) { b.FailureRatio = 0 }, "FailureRatio", "0"},
		{func(b *fleet.BreakerSettings) { b.FailureRatio = 1.5 }, "FailureRatio", "1.5"},
		{func(b *fleet.BreakerSettings) { b.FailureRatio = math.NaN() }, "FailureRatio", "NaN"},
		{func(b *fleet.BreakerSettings) { b.MinAttempts = 0 }, "MinAttempts", "0"},
		{func(b *fleet.BreakerSettings) { b.Window = 29 }, "Window", "29ns"},
		{func(b *fleet.BreakerSettings) { b.OpenFor = 0 }, "OpenFor", "0s"},
		{func(b *fleet.BreakerSettings) { b.MaxOpenFor = time.Second }, "MaxOpenFor", "1s"},
	} {
		set := breakerValues()
		c.edit(&set)
		_, err := s.Breaker(set)
		wantFieldError(t, "Breaker", err, c.field, c.value)
	}
}

// changes records what OnChange hears.
type changes struct {
	mu   sync.Mutex
	seen []fleet.CircuitChange
}

func (c *changes) add(ch fleet.CircuitChange) {
	c.mu.Lock()
	c.seen = append(c.seen, ch)
	c.mu.Unlock()
}

// allow admits or refuses at now, failing t on an error.
func allow(t *testing.T, b fleet.Breaker, now time.Time) fleet.CircuitAdmission {
	t.Helper()
	a, err := b.Allow(context.Background(), now)
	must(t, "Allow", err)
	return a
}

func done(t *testing.T, s fleet.Store, b fleet.Breaker, tk fleet.CircuitTicket, now time.Time, v fleet.CircuitVerdict) {
	t.Helper()
	must(t, "Done", b.Done(context.Background(), tk, now, v))
	flush(t, s)
}

func wantState(t *testing.T, b fleet.Breaker, now time.Time, want fleet.CircuitState) {
	t.Helper()
	got, err := b.State(context.Background(), now)
	if err != nil || got != want {
		t.Fatalf("State at %v = %v, %v; want %v", now.Sub(Base), got, err, want)
	}
}

// breakerTransitions walks a breaker through every state on given times.
func (e *env) breakerTransitions(t *testing.T) {
	s := e.new(t)
	var heard changes
	set := breakerValues()
	set.OnChange = heard.add
	b := newBreaker(t, s, set)
	ctx := context.Background()

	// Four attempts, two failures: the ratio is reached with the fourth.
	var tickets []fleet.CircuitTicket
	for range 4 {
		a := allow(t, b, Base)
		if !a.OK || a.State != fleet.CircuitClosed {
			t.Fatalf("closed: Allow = %+v, want admitted, closed", a)
		}
		tickets = append(tickets, a.Ticket)
	}
	for i, v := range []fleet.CircuitVerdict{fleet.CircuitSuccess, fleet.CircuitFailure, fleet.CircuitSuccess} {
		done(t, s, b, tickets[i], ms(time.Second), v)
	}
	wantState(t, b, ms(time.Second), fleet.CircuitClosed)
	done(t, s, b, tickets[3], ms(time.Second), fleet.CircuitFailure)
	wantState(t, b, ms(time.Second), fleet.CircuitOpen)

	// Open for OpenFor from the failure that opened it.
	if a := allow(t, b, ms(2*time.Second)); a.OK || a.State != fleet.CircuitOpen || !a.NextProbe.Equal(ms(6*time.Second)) {
		t.Fatalf("open: Allow at 2s = ok %v, %v, next probe %s; want refused, open, next probe 6s", a.OK, a.State, since(a.NextProbe))
	}
	refused, next, err := b.RefusesAt(ctx, ms(2*time.Second), ms(6*time.Second-time.Millisecond))
	if err != nil || !refused || !next.Equal(ms(6*time.Second)) {
		t.Errorf("RefusesAt(2s, 5.999s) = %v, %s, %v; want refused, next probe 6s", refused, since(next), err)
	}
	if refused, _, err := b.RefusesAt(ctx, ms(2*time.Second), ms(6*time.Second)); err != nil || refused {
		t.Errorf("RefusesAt(2s, 6s) = %v, %v; want not refused: the open period has ended", refused, err)
	}

	// Half-open: one probe; the next is refused until the probe is due.
	probe := allow(t, b, ms(6*time.Second))
	if !probe.OK || !probe.Ticket.Probe || probe.State != fleet.CircuitHalfOpen {
		t.Fatalf("Allow at 6s = %+v; want the probe, half-open", probe)
	}
	if a := allow(t, b, ms(6500*time.Millisecond)); a.OK || !a.NextProbe.Equal(ms(8*time.Second)) {
		t.Fatalf("Allow at 6.5s with the probe in flight = ok %v, next probe %s; want refused, next probe 8s (the probe's due time)", a.OK, since(a.NextProbe))
	}
	// A failed probe opens it again for twice as long.
	done(t, s, b, probe.Ticket, ms(7*time.Second), fleet.CircuitFailure)
	if a := allow(t, b, ms(16*time.Second)); a.OK || a.State != fleet.CircuitOpen || !a.NextProbe.Equal(ms(17*time.Second)) {
		t.Fatalf("Allow at 16s after a failed probe at 7s = ok %v, %v, next probe %s; want refused, open, next probe 17s", a.OK, a.State, since(a.NextProbe))
	}
	// A good probe closes it.
	probe = allow(t, b, ms(17*time.Second))
	if !probe.OK || !probe.Ticket.Probe {
		t.Fatalf("Allow at 17s = %+v; want the probe", probe)
	}
	done(t, s, b, probe.Ticket, ms(17500*time.Millisecond), fleet.CircuitSuccess)
	wantState(t, b, ms(18*time.Second), fleet.CircuitClosed)
	if a := allow(t, b, ms(18*time.Second)); !a.OK || a.Ticket.Probe {
		t.Fatalf("Allow at 18s, closed = %+v; want admitted, no probe", a)
	}
	// An attempt admitted before the breaker opened counts for nothing
	// once it has changed state: its failure does not reopen it.
	stale := tickets[0]
	for range 4 {
		done(t, s, b, stale, ms(18*time.Second), fleet.CircuitFailure)
	}
	wantState(t, b, ms(18*time.Second), fleet.CircuitClosed)

	want := []struct {
		from, to fleet.CircuitState
		at, next time.Duration
	}{
		{fleet.CircuitClosed, fleet.CircuitOpen, time.Second, 6 * time.Second},
		{fleet.CircuitOpen, fleet.CircuitHalfOpen, 6 * time.Second, 0},
		{fleet.CircuitHalfOpen, fleet.CircuitOpen, 7 * time.Second, 17 * time.Second},
		{fleet.CircuitOpen, fleet.CircuitHalfOpen, 17 * time.Second, 0},
		{fleet.CircuitHalfOpen, fleet.CircuitClosed, 17500 * time.Millisecond, 0},
	}
	heard.mu.Lock()
	defer heard.mu.Unlock()
	ok := len(heard.seen) == len(want)
	for i := 0; ok && i < len(want); i++ {
		c, w := heard.seen[i], want[i]
		ok = c.From == w.from && c.To == w.to && c.At.Equal(ms(w.at)) && (w.to != fleet.CircuitOpen || c.NextProbe.Equal(ms(w.next)))
	}
	if !ok {
		t.Errorf("OnChange heard %+v; want %+v (times from Base)", heard.seen, want)
	}
}

// breakerWindow: verdicts older than the window count for nothing.
func (e *env) breakerWindow(t *testing.T) {
	s := e.new(t)
	b := newBreaker(t, s, breakerValues())
	for range 3 {
		a := allow(t, b, Base)
		done(t, s, b, a.Ticket, Base, fleet.CircuitFailure)
	}
	wantState(t, b, Base, fleet.CircuitClosed) // 3 verdicts, fewer than MinAttempts
	a := allow(t, b, ms(11*time.Second))
	done(t, s, b, a.Ticket, ms(11*time.Second), fleet.CircuitFailure)
	wantState(t, b, ms(11*time.Second), fleet.CircuitClosed)
	for range 3 {
		a := allow(t, b, ms(12*time.Second))
		done(t, s, b, a.Ticket, ms(12*time.Second), fleet.CircuitFailure)
	}
	wantState(t, b, ms(12*time.Second), fleet.CircuitOpen)
}

// breakerMaxOpenFor: each failed probe doubles the open period, up to
// MaxOpenFor.
func (e *env) breakerMaxOpenFor(t *testing.T) {
	s := e.new(t)
	b := newBreaker(t, s, breakerValues())
	for range 4 {
		a := allow(t, b, Base)
		done(t, s, b, a.Ticket, Base, fleet.CircuitFailure)
	}
	at := Base
	for i, open := range []time.Duration{5 * time.Second, 10 * time.Second, 20 * time.Second, 20 * time.Second} {
		if a := allow(t, b, at); a.OK || !a.NextProbe.Equal(at.Add(open)) {
			t.Fatalf("open period %d: Allow at %s = ok %v, next probe %s; want refused, next probe %s", i+1, since(at), a.OK, since(a.NextProbe), since(at.Add(open)))
		}
		at = at.Add(open)
		p := allow(t, b, at)
		if !p.OK || !p.Ticket.Probe {
			t.Fatalf("Allow at %s = %+v; want the probe", since(at), p)
		}
		done(t, s, b, p.Ticket, at, fleet.CircuitFailure)
	}
}

// breakerShared: a breaker opened in one store is open in the others, and
// the fleet admits one probe.
func (e *env) breakerShared(t *testing.T) {
	if !e.o.Shared {
		t.Skip("the stores share no state")
	}
	stores := e.stores(t, fleetSize)
	bs := make([]fleet.Breaker, len(stores))
	heard := make([]changes, len(stores))
	for i, s := range stores {
		set := breakerValues()
		set.OnChange = heard[i].add
		bs[i] = newBreaker(t, s, set)
	}
	for range 4 {
		a := allow(t, bs[0], Base)
		done(t, stores[0], bs[0], a.Ticket, ms(time.Second), fleet.CircuitFailure)
	}
	for i, b := range bs {
		wantState(t, b, ms(2*time.Second), fleet.CircuitOpen)
		if a := allow(t, b, ms(2*time.Second)); a.OK || !a.NextProbe.Equal(ms(6*time.Second)) {
			t.Errorf("store %d: Allow at 2s = ok %v, next probe %s; want refused, next probe 6s", i, a.OK, since(a.NextProbe))
		}
	}
	const goroutines = 4 // per store
	var probes atomic.Int64
	var probe atomic.Pointer[fleet.CircuitAdmission]
	var by atomic.Int64
	parallel(len(stores)*goroutines, func(i int) {
		a, err := bs[i%len(stores)].Allow(context.Background(), ms(6*time.Second))
		if err != nil {
			t.Errorf("Allow: %v", err)
		}
		if a.OK {
			probes.Add(1)
			probe.Store(&a)
			by.Store(int64(i % len(stores)))
		}
	})
	if n := probes.Load(); n != 1 {
		t.Fatalf("the fleet admitted %d attempts at 6s, half-open; want one probe", n)
	}
	p := by.Load()
	done(t, stores[p], bs[p], probe.Load().Ticket, ms(6500*time.Millisecond), fleet.CircuitSuccess)
	for i, b := range bs {
		wantState(t, b, ms(7*time.Second), fleet.CircuitClosed)
		if a := allow(t, b, ms(7*time.Second)); !a.OK {
			t.Errorf("store %d: refused at 7s after store %d's probe closed the breaker", i, p)
		}
	}
	// Each store heard the changes it saw, whichever store made them.
	for i := range heard {
		heard[i].mu.Lock()
		var got []fleet.CircuitState
		for _, c := range heard[i].seen {
			got = append(got, c.To)
		}
		heard[i].mu.Unlock()
		want := []fleet.CircuitState{fleet.CircuitOpen, fleet.CircuitHalfOpen, fleet.CircuitClosed}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("store %d heard changes to %v; want %v: every store asked after each change", i, got, want)
		}
	}
}
