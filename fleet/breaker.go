package fleet

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/damper-ai/damper-go/internal/breaker"
)

// BreakerStore is a [Store] that shares the circuit breaker.
type BreakerStore interface {
	Breaker(BreakerSettings) (Breaker, error)
}

// BreakerSettings are a circuit breaker's values: it opens when at least
// FailureRatio of at least MinAttempts attempts with a verdict in the last
// Window failed, refuses every attempt for OpenFor, then admits one probe
// at a time; each failed probe doubles the open period, up to MaxOpenFor.
type BreakerSettings struct {
	// FailureRatio is in (0, 1].
	FailureRatio float64
	// MinAttempts is at least 1.
	MinAttempts int
	// Window is at least 30 ns (the breaker counts it in 30 slices).
	Window time.Duration
	// OpenFor is positive.
	OpenFor time.Duration
	// MaxOpenFor is at least OpenFor.
	MaxOpenFor time.Duration
	// ProbeLimit is the longest an attempt, and so a probe, can take: a
	// probe's answer is due by its start plus ProbeLimit, or by its
	// caller's deadline, whichever comes first.
	ProbeLimit time.Duration
	// OnChange, when set, hears every change of state the breaker sees, in
	// order, one at a time, with no lock held. A shared breaker tells each
	// replica the changes it sees, whichever replica caused them.
	OnChange func(CircuitChange)
}

// Breaker is a circuit breaker's state machine, driven by the time Damper
// gives it. Damper tells it, for every attempt it admitted, how the
// attempt ended, with the ticket Allow gave.
type Breaker interface {
	// Allow admits an attempt at now, or refuses it. ctx's deadline, if
	// any, is the caller's, on the clock that gives now: a probe Allow
	// admits is due to answer by it or by now plus ProbeLimit, whichever
	// comes first.
	Allow(ctx context.Context, now time.Time) (CircuitAdmission, error)
	// RefusesAt reports, admitting nothing, whether an attempt at the
	// later time at would be refused, as far as can be told at now: open,
	// until the open period ends; with a probe in flight, until the
	// probe's answer is due. Open or with a probe in flight, nextProbe is
	// when to ask again, as for Allow's refusal.
	RefusesAt(ctx context.Context, now, at time.Time) (refused bool, nextProbe time.Time, err error)
	// Done records the end of the attempt admitted with t.
	Done(ctx context.Context, t CircuitTicket, now time.Time, v CircuitVerdict) error
	// State returns the state at now.
	State(ctx context.Context, now time.Time) (CircuitState, error)
}

// CircuitAdmission is a [Breaker]'s answer to Allow.
type CircuitAdmission struct {
	// OK is whether the attempt may go.
	OK bool
	// Ticket goes back to Done when the attempt ends.
	Ticket CircuitTicket
	// State is the breaker's state when it answered.
	State CircuitState
	// NextProbe is, for a refusal, when to ask again: when the open
	// period ends; with a probe in flight, when its answer is due, or
	// [CircuitOverdueWait] from now once that has passed; and never later
	// than the current open period from now, so that a caller that honours
	// it neither waits for nothing nor spins.
	NextProbe time.Time
}

// CircuitOverdueWait is the wait a refusal tells of while the probe in
// flight is past the time its answer was due (its end is late, or lost),
// or the current open period if shorter.
const CircuitOverdueWait = breaker.OverdueWait

// CircuitTicket is an admitted attempt, as its breaker knows it.
type CircuitTicket struct {
	// Generation is the breaker's generation when it admitted the attempt:
	// every change of state starts a new one, and an attempt admitted in
	// an older generation counts for nothing when it ends.
	Generation uint64
	// Probe is true for the one attempt admitted while half-open.
	Probe bool
}

// CircuitVerdict is what an ended attempt says of the provider's health.
type CircuitVerdict uint8

const (
	// CircuitNeutral: nothing (a 4xx, a rate limit, the caller's
	// cancellation, an attempt never sent).
	CircuitNeutral CircuitVerdict = iota
	// CircuitSuccess: the provider answered.
	CircuitSuccess
	// CircuitFailure: a 5xx, a 529, a transport failure or an attempt
	// timeout.
	CircuitFailure
)

// CircuitState is the state of a circuit breaker. The zero value means
// that no breaker is configured.
type CircuitState uint8

const (
	// CircuitClosed: attempts go through and are counted.
	CircuitClosed CircuitState = CircuitState(breaker.Closed)
	// CircuitOpen: every attempt is refused.
	CircuitOpen CircuitState = CircuitState(breaker.Open)
	// CircuitHalfOpen: one attempt at a time, the probe, goes through.
	CircuitHalfOpen CircuitState = CircuitState(breaker.HalfOpen)
)

// String returns "closed", "open", "half_open", or "" for the zero value.
func (s CircuitState) String() string {
	if s == 0 {
		return ""
	}
	return breaker.State(s).String()
}

// CircuitChange is one change of a breaker's state.
type CircuitChange struct {
	// Backend is the backend whose breaker it is: "primary" for the
	// client's own. A Breaker leaves it empty: Damper names the backend.
	Backend  string
	From, To CircuitState
	At       time.Time
	// NextProbe is, for a change to CircuitOpen, when a probe is admitted.
	NextProbe time.Time
}

// Breaker returns a breaker in memory.
func (MemoryStore) Breaker(s BreakerSettings) (Breaker, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	settings := breaker.Settings{
		FailureRatio: s.FailureRatio,
		MinAttempts:  s.MinAttempts,
		Window:       s.Window,
		OpenFor:      s.OpenFor,
		MaxOpenFor:   s.MaxOpenFor,
		ProbeLimit:   s.ProbeLimit,
	}
	if onChange := s.OnChange; onChange != nil {
		settings.OnChange = func(c breaker.Change) {
			onChange(CircuitChange{From: CircuitState(c.From), To: CircuitState(c.To), At: c.At, NextProbe: c.NextProbe})
		}
	}
	return memoryBreaker{breaker.New(settings)}, nil
}

// check returns an error naming the first field that cannot be used.
func (s BreakerSettings) check() error {
	switch {
	case math.IsNaN(s.FailureRatio) || s.FailureRatio <= 0 || s.FailureRatio > 1:
		return fieldError("BreakerSettings.FailureRatio", s.FailureRatio, "must be in (0, 1]")
	case s.MinAttempts < 1:
		return fieldError("BreakerSettings.MinAttempts", s.MinAttempts, "must be at least 1")
	case s.Window < breaker.Buckets:
		return fieldError("BreakerSettings.Window", s.Window, fmt.Sprintf("must be at least %v", time.Duration(breaker.Buckets)))
	case s.OpenFor <= 0:
		return fieldError("BreakerSettings.OpenFor", s.OpenFor, "must be positive")
	case s.MaxOpenFor < s.OpenFor:
		return fieldError("BreakerSettings.MaxOpenFor", s.MaxOpenFor, fmt.Sprintf("must not be shorter than OpenFor (%v)", s.OpenFor))
	}
	return nil
}

// memoryBreaker is internal/breaker as a [Breaker].
type memoryBreaker struct{ b *breaker.Breaker }

func (memoryBreaker) inMemory() {}

var _ BreakerStore = MemoryStore{}

func (m memoryBreaker) Allow(ctx context.Context, now time.Time) (CircuitAdmission, error) {
	deadline, _ := ctx.Deadline()
	a := m.b.AllowUntil(now, deadline)
	return CircuitAdmission{
		OK:        a.OK,
		Ticket:    CircuitTicket{Generation: a.Ticket.Generation, Probe: a.Ticket.Probe},
		State:     CircuitState(a.State),
		NextProbe: a.NextProbe,
	}, nil
}

func (m memoryBreaker) RefusesAt(_ context.Context, now, at time.Time) (bool, time.Time, error) {
	refused, next := m.b.RefusesAt(now, at)
	return refused, next, nil
}

func (m memoryBreaker) Done(_ context.Context, t CircuitTicket, now time.Time, v CircuitVerdict) error {
	m.b.Done(breaker.Ticket{Generation: t.Generation, Probe: t.Probe}, now, breaker.Verdict(v))
	return nil
}

func (m memoryBreaker) State(_ context.Context, now time.Time) (CircuitState, error) {
	return CircuitState(m.b.State(now)), nil
}
