package damper

import (
	"cmp"
	"context"
	"sync/atomic"
	"time"

	"github.com/damper-ai/damper-go/internal/breaker"
	"github.com/damper-ai/damper-go/internal/ratelimit"
)

// MemoryStore keeps a Damper's state in the memory of its process: the
// [Store] a Damper uses when none is given. A store shared by a fleet can
// fall back on it when the fleet's store cannot be reached. Each part it
// makes is new and its own; its methods never fail.
type MemoryStore struct{}

// Budget returns a [WindowBudget].
func (MemoryStore) Budget(s BudgetSettings) (Budget, error) {
	return NewWindowBudget(s.Ratio, s.Window, s.MinTokens)
}

// Throttle returns a count of MaxTokens, full, in one atomic integer.
func (MemoryStore) Throttle(p ThrottlePolicy) (Throttle, error) {
	p2, err := p.withDefaults()
	if err != nil {
		return nil, err
	}
	t := &memoryThrottle{max: int64(p2.MaxTokens) * 1000}
	t.tokens.Store(t.max)
	return t, nil
}

// Breaker returns a breaker in memory.
func (MemoryStore) Breaker(s BreakerSettings) (Breaker, error) {
	p, err := s.BreakerPolicy.withDefaults()
	if err != nil {
		return nil, err
	}
	onChange := s.OnChange
	settings := breaker.Settings{
		FailureRatio: p.FailureRatio,
		MinAttempts:  p.MinAttempts,
		Window:       p.Window,
		OpenFor:      p.OpenFor,
		MaxOpenFor:   p.MaxOpenFor,
		ProbeLimit:   s.ProbeLimit,
	}
	if onChange != nil {
		settings.OnChange = func(c breaker.Change) {
			onChange(CircuitChange{From: CircuitState(c.From), To: CircuitState(c.To), At: c.At, NextProbe: c.NextProbe})
		}
	}
	return memoryBreaker{breaker.New(settings)}, nil
}

// LimitBuckets returns a group's buckets in memory. Besides the arithmetic
// every LimitBuckets keeps, they estimate, from the gaps between the
// responses' counts and what their own traffic leaves, the rate at which
// other processes on the same limits take, and refill with only what that
// leaves them: processes that each keep their buckets in memory then share
// the limits the API reports, roughly.
func (MemoryStore) LimitBuckets(s LimitSettings) (LimitBuckets, error) {
	l := s.Limits
	return memoryBuckets{ratelimit.New(ratelimit.Settings{
		Limits:     ratelimit.Amounts{float64(l.RequestsPerMinute), float64(l.InputTokensPerMinute), float64(l.OutputTokensPerMinute)},
		BatchShare: cmp.Or(s.BatchShare, policyDefaults().RateLimit.BatchShare), FollowOthers: true,
	})}, nil
}

// memoryThrottle is a throttle's count in one atomic integer.
type memoryThrottle struct {
	max    int64
	tokens atomic.Int64
}

func (t *memoryThrottle) Add(_ context.Context, delta int64) error {
	for {
		old := t.tokens.Load()
		n := min(max(old+delta, 0), t.max)
		if n == old || t.tokens.CompareAndSwap(old, n) {
			return nil
		}
	}
}

func (t *memoryThrottle) Tokens(context.Context) (int64, error) { return t.tokens.Load(), nil }

// memoryBreaker is internal/breaker as a [Breaker].
type memoryBreaker struct{ b *breaker.Breaker }

func (m memoryBreaker) Allow(_ context.Context, now time.Time) (CircuitAdmission, error) {
	a := m.b.Allow(now)
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

// memoryBuckets is internal/ratelimit's Group as [LimitBuckets].
type memoryBuckets struct{ g *ratelimit.Group }

func (m memoryBuckets) Reserve(_ context.Context, now time.Time, cost RateAmounts, p Priority, latest time.Time, t *RateTicket) (RateReservation, time.Time, error) {
	var tk *ratelimit.Ticket
	if t != nil {
		tk = &ratelimit.Ticket{Slot: t.Slot}
	}
	r, due, taken := m.g.Reserve(now, ratelimit.Amounts(cost), ratelimit.Priority(p), latest, tk)
	if tk != nil {
		t.Slot = tk.Slot
	}
	if !taken {
		return noReservation{}, due, nil
	}
	return &r, later(due, m.g.PausedUntil(now)), nil
}

func (m memoryBuckets) Admits(_ context.Context, now, at time.Time, cost RateAmounts, p Priority) (time.Time, error) {
	return m.g.Admits(now, at, ratelimit.Amounts(cost), ratelimit.Priority(p)), nil
}

func (m memoryBuckets) Observe(_ context.Context, now time.Time, r RateReservation, o RateObservation) error {
	if r, ok := r.(*ratelimit.Reservation); ok {
		m.g.Observe(now, r, ratelimit.Observation{Has: o.Has, Limit: ratelimit.Amounts(o.Limit), Remaining: ratelimit.Amounts(o.Remaining)})
	}
	return nil
}

func (m memoryBuckets) Settle(_ context.Context, now time.Time, r RateReservation, used RateAmounts, known [3]bool) error {
	if r, ok := r.(*ratelimit.Reservation); ok {
		m.g.Settle(r, now, ratelimit.Amounts(used), known)
	}
	return nil
}

func (m memoryBuckets) Pause(_ context.Context, now time.Time, named [3]bool, until time.Time) error {
	m.g.Pause(now, named, until)
	return nil
}

func (m memoryBuckets) PausedUntil(_ context.Context, now time.Time) (time.Time, error) {
	return m.g.PausedUntil(now), nil
}

func (m memoryBuckets) State(_ context.Context, now time.Time) ([3]RateLimitState, error) {
	var out [3]RateLimitState
	for k, b := range m.g.State(now) {
		out[k] = RateLimitState{
			Bucket: b.Kind.String(), Limit: b.Limit, Remaining: b.Remaining,
			Learned: b.Limit > 0 && !b.Configured, PausedUntil: b.PausedUntil,
		}
	}
	return out, nil
}

func (m memoryBuckets) Leave(_ context.Context, _ time.Time, t *RateTicket) error {
	if t != nil && !t.Slot.IsZero() {
		tk := ratelimit.Ticket{Slot: t.Slot}
		m.g.Leave(&tk)
		t.Slot = tk.Slot
	}
	return nil
}

// noReservation is a request that took nothing.
type noReservation struct{}

func (noReservation) Taken() bool { return false }
