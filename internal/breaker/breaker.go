// Package breaker is a circuit breaker driven by the caller's clock: every
// method is given the time, so that a virtual clock runs it exactly.
//
// Closed, it counts the attempts that ended in the last Window, in buckets,
// and opens on a failure that leaves at least MinAttempts of them with a
// verdict and at least FailureRatio of those failed. Open, it refuses every attempt until its
// open period has passed. Then it is half-open: it admits one attempt at a
// time, the probe. A probe that succeeds closes it; one that fails opens it
// again for twice as long, up to MaxOpenFor. An attempt with no verdict
// (the caller's own error, a rate limit) counts for nothing, and frees the
// probe's place if it was the probe.
//
// Every change of state starts a new generation; an attempt admitted in an
// older generation counts for nothing when it ends.
package breaker

import (
	"sync"
	"time"

	"github.com/damper-ai/damper-go/fleet/inorder"
)

// State is a breaker's state.
type State uint8

const (
	Closed State = iota + 1
	Open
	HalfOpen
)

func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case Open:
		return "open"
	case HalfOpen:
		return "half_open"
	}
	return "none"
}

// Verdict is what an ended attempt says of the provider's health.
type Verdict uint8

const (
	// Neutral: nothing (a 4xx, a rate limit, the caller's cancellation,
	// an attempt never sent).
	Neutral Verdict = iota
	Success
	Failure
)

// Change is one change of state.
type Change struct {
	From, To State
	At       time.Time
	// NextProbe is when the breaker admits a probe, for a change to Open.
	NextProbe time.Time
}

// Settings configure a breaker. Every field must be set: the caller
// validates them and fills in defaults.
type Settings struct {
	FailureRatio float64
	MinAttempts  int
	Window       time.Duration
	OpenFor      time.Duration
	MaxOpenFor   time.Duration
	// ProbeLimit is the longest a probe can take (the attempt timeout):
	// its answer is due by its start plus ProbeLimit, or by the deadline
	// AllowUntil was given, whichever comes first.
	ProbeLimit time.Duration
	// OnChange, when set, hears every change, in order, one at a time, with
	// no lock of the breaker held: it may call the breaker.
	OnChange func(Change)
}

// Buckets is the number of slices the closed state's window is counted
// in: a window must be at least this many nanoseconds.
const Buckets = 30

const buckets = Buckets

type bucket struct {
	start           int64 // index of the slice of time it counts: UnixNano / slice
	total, failures int
}

// Breaker is a circuit breaker. It is safe for concurrent use.
type Breaker struct {
	s     Settings
	slice time.Duration // the length of a bucket

	mu         sync.Mutex
	state      State
	origin     time.Time // where slice 0 starts: the first time counted
	counted    bool      // whether origin is set (a virtual clock may start at the zero time)
	newest     int64     // the newest slice counted
	generation uint64
	window     [buckets]bucket
	openFor    time.Duration // the current open period
	openUntil  time.Time
	probeDue   time.Time // when the probe in flight is due to answer
	probing    bool

	changes inorder.Delivery[Change] // for OnChange
}

// New returns a closed breaker.
func New(s Settings) *Breaker {
	return &Breaker{s: s, slice: max(s.Window/buckets, 1), state: Closed, openFor: s.OpenFor}
}

// Ticket is an admitted attempt, to give back to Done when it ends.
type Ticket struct {
	// Generation is the breaker's generation when it admitted the
	// attempt.
	Generation uint64
	// Probe is true for the one attempt admitted while half-open.
	Probe bool
}

// Admission is the answer of Allow.
type Admission struct {
	OK     bool
	Ticket Ticket
	// State is the breaker's state when it answered.
	State State
	// NextProbe is, for a refusal, when to ask again: when the open
	// period ends, or when the probe in flight is due to answer (see
	// OverdueWait), and never later than the current open period from
	// the refusal.
	NextProbe time.Time
}

// OverdueWait is the wait a refusal tells of while the probe in flight is
// past the time its answer was due: its end is late (a timer's lag, a
// store's batch) or lost. The answer is expected any moment, but a wait
// of zero would have the clients that honour it spin. Like every wait a
// refusal tells of, it is bounded by the current open period.
const OverdueWait = 100 * time.Millisecond

// Allow admits an attempt at now whose answer is due within ProbeLimit,
// or refuses it.
func (b *Breaker) Allow(now time.Time) Admission { return b.AllowUntil(now, time.Time{}) }

// AllowUntil admits an attempt at now, or refuses it. The attempt's answer
// is due by deadline (the caller's, on the clock of now; zero for none)
// or within ProbeLimit, whichever comes first: if it is the probe, the
// attempts refused while it is in flight are told to ask again then.
func (b *Breaker) AllowUntil(now, deadline time.Time) Admission {
	b.mu.Lock()
	b.tick(now)
	a := Admission{State: b.state}
	switch {
	case b.state == Closed:
		a.OK = true
	case b.state == HalfOpen && !b.probing:
		b.probing, b.probeDue = true, now.Add(b.s.ProbeLimit)
		if !deadline.IsZero() && deadline.Before(b.probeDue) {
			b.probeDue = deadline
		}
		a.OK, a.Ticket.Probe = true, true
	default:
		a.NextProbe = b.nextProbe(now)
	}
	a.Ticket.Generation = b.generation
	b.unlockAndDeliver()
	return a
}

// RefusesAt reports whether an attempt at the later time at would be
// refused, as far as can be told at now, without admitting anything: it
// lets a caller spend nothing on a retry that would be refused. Open, it
// refuses until the open period ends; half-open with a probe in flight,
// until the probe's answer is due, since the probe may well fail. Open or
// with a probe in flight, nextProbe is when to ask again, as for Allow's
// refusal: it may come before at, since the probe may answer sooner.
func (b *Breaker) RefusesAt(now, at time.Time) (refused bool, nextProbe time.Time) {
	b.mu.Lock()
	b.tick(now)
	switch {
	case b.state == Open:
		refused, nextProbe = b.openUntil.After(at), b.nextProbe(now)
	case b.state == HalfOpen && b.probing:
		refused, nextProbe = b.probeDue.After(at), b.nextProbe(now)
	}
	b.unlockAndDeliver()
	return refused, nextProbe
}

// nextProbe is when an attempt refused at now should ask again: open,
// when the open period ends; with a probe in flight, when its answer is
// due, or OverdueWait from now once that has passed; never later than the
// current open period from now, however far ahead a lagging clock put the
// rest. Requires mu, and the breaker open or probing.
func (b *Breaker) nextProbe(now time.Time) time.Time {
	next := b.openUntil
	if b.state == HalfOpen {
		next = b.probeDue
		if !next.After(now) {
			next = now.Add(OverdueWait)
		}
	}
	if bound := now.Add(b.openFor); next.After(bound) {
		next = bound
	}
	return next
}

// Done records the end of the attempt admitted with t.
func (b *Breaker) Done(t Ticket, now time.Time, v Verdict) {
	b.mu.Lock()
	b.tick(now)
	if t.Generation != b.generation {
		// tick may have moved the breaker to half-open: deliver that.
		b.unlockAndDeliver()
		return
	}
	switch b.state {
	case Closed:
		if v != Neutral {
			i := b.count(now, v == Failure)
			// Only a failure opens it: a success never does, even one that
			// brings the window to MinAttempts.
			if v == Failure && b.tripped(i) {
				b.open(now, b.s.OpenFor)
			}
		}
	case HalfOpen:
		if !t.Probe {
			break
		}
		b.probing = false
		switch v {
		case Success:
			b.change(Closed, now)
		case Failure:
			b.open(now, min(2*b.openFor, b.s.MaxOpenFor))
		}
	}
	b.unlockAndDeliver()
}

// State returns the state at now.
func (b *Breaker) State(now time.Time) State {
	b.mu.Lock()
	b.tick(now)
	s := b.state
	b.unlockAndDeliver()
	return s
}

// tick moves an open breaker whose period has passed to half-open.
// Requires mu.
func (b *Breaker) tick(now time.Time) {
	if b.state == Open && !now.Before(b.openUntil) {
		b.change(HalfOpen, now)
	}
}

// open opens the breaker for d. Requires mu.
func (b *Breaker) open(now time.Time, d time.Duration) {
	b.openFor = d
	b.openUntil = now.Add(d)
	b.change(Open, now)
}

// change moves to state to, starting a new generation. Requires mu.
func (b *Breaker) change(to State, now time.Time) {
	c := Change{From: b.state, To: to, At: now}
	if to == Open {
		c.NextProbe = b.openUntil
	}
	if to == Closed {
		b.openFor = b.s.OpenFor
		b.window = [buckets]bucket{}
	}
	b.state = to
	b.generation++
	b.probing = false
	if b.s.OnChange != nil {
		b.changes.Add(c)
	}
}

// count adds an attempt with a verdict to the bucket of now, and returns
// the index of its slice. Requires mu.
func (b *Breaker) count(now time.Time, failed bool) int64 {
	i := b.sliceOf(now)
	bk := &b.window[i%buckets]
	if bk.start != i {
		*bk = bucket{start: i}
	}
	bk.total++
	if failed {
		bk.failures++
	}
	return i
}

// rebaseAfter is how far past origin a time moves origin forward: t.Sub
// saturates at about 292 years, and would then put every later count in
// one slice that never expires.
const rebaseAfter = time.Duration(1 << 62) // about 146 years

// sliceOf returns the index of the slice of time that holds t, counted
// from origin. A time before the newest slice counted (a clock going
// backwards, or callers that read the clock in one order and lock in
// another) counts in the newest slice: it neither evicts newer counts nor
// leaves them out of the decision to open. Requires mu.
func (b *Breaker) sliceOf(t time.Time) int64 {
	if !b.counted {
		b.origin, b.counted = t, true
	}
	if t.Sub(b.origin) >= rebaseAfter {
		b.rebase(t)
	}
	i := max(int64(max(t.Sub(b.origin), 0)/b.slice), b.newest)
	b.newest = i
	return i
}

// rebase moves origin forward to near t, by a whole number of windows so
// that every live bucket keeps its place and its edges; when t is that far
// past every count, they have all expired, and origin starts again at t.
// Requires mu.
func (b *Breaker) rebase(t time.Time) {
	k := max(b.newest-buckets, 0) / buckets * buckets
	b.origin = b.origin.Add(time.Duration(k) * b.slice)
	b.newest -= k
	for i := range b.window {
		b.window[i].start -= k
	}
	if t.Sub(b.origin) >= rebaseAfter {
		b.origin, b.newest, b.window = t, 0, [buckets]bucket{}
	}
}

// ratioSlack absorbs the rounding of FailureRatio*total: a ratio of 0.07
// opens at 7 failures of 100, though 0.07*100 is 7.000000000000001.
const ratioSlack = 1 - 1e-12

// tripped reports whether the window's attempts, up to slice i, open the
// breaker. Requires mu.
func (b *Breaker) tripped(i int64) bool {
	var total, failures int
	for _, bk := range b.window {
		if bk.start > i-buckets && bk.start <= i {
			total += bk.total
			failures += bk.failures
		}
	}
	return total >= b.s.MinAttempts && float64(failures) >= b.s.FailureRatio*float64(total)*ratioSlack
}

// unlockAndDeliver releases mu and delivers the pending changes to
// OnChange (see inorder.Delivery).
func (b *Breaker) unlockAndDeliver() { b.changes.UnlockAndDeliver(&b.mu, b.s.OnChange) }
