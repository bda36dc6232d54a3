package fleet

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/damper-ai/damper-go/internal/ratelimit"
)

// LimitStore is a [Store] that shares the rate limiter's buckets.
type LimitStore interface {
	LimitBuckets(LimitSettings) (LimitBuckets, error)
}

// LimitSettings are one limit group's values. A Damper drops a group it
// has not used for a while and asks for its buckets again at its next
// call: a store that keeps a group's state apart from the LimitBuckets it
// returned must let it expire on its own.
type LimitSettings struct {
	// Group is the group's name: a model family such as
	// "claude-sonnet-4", or "(other)".
	Group string
	// Limits are its configured limits; a zero field is learned.
	Limits RateLimits
	// BatchShare is the share of each bucket batch calls may use, in
	// (0, 1].
	BatchShare float64
}

// RateAmounts holds one number per bucket of a limit group: requests,
// input tokens and output tokens, in that order.
type RateAmounts [3]float64

// LimitBuckets are one limit group's three buckets: requests, input tokens
// and output tokens per minute, each of limit L holding at most L and
// refilling at L a minute, driven by the time Damper gives them. An
// interactive request takes from all three at once, or from none, and may
// drive a bucket below zero (it is then due when the bucket has refilled);
// a batch request takes only while every bucket keeps the share of its
// limit that BatchShare leaves to interactive requests. A bucket whose
// limit is neither configured nor learned yet admits everything.
//
// LimitBuckets may also have a method
//
//	KnownState(now time.Time) [3]RateLimitState
//
// returning what State would, as far as the buckets know without asking
// their store (for a store across a network, as last heard from it), at
// no cost. A Damper with spread routing reads it as each call starts, to
// choose the backend with the most headroom; buckets without it, unless
// in memory, count as knowing nothing of their limits. The buckets of
// [MemoryStore] have it.
type LimitBuckets interface {
	// Reserve asks for cost at now, for a request that can be sent no
	// later than latest. It either takes (r.Taken()) and the request may
	// be sent at due, no earlier than now and no earlier than the end of
	// a pause under way; or takes nothing and the request can be admitted
	// no sooner than due: after latest, it is refused; else its caller
	// waits until due and asks again, with the same ticket (nil for an
	// interactive request; a batch request's place in the batch line).
	Reserve(ctx context.Context, now time.Time, cost RateAmounts, p Priority, latest time.Time, t *RateTicket) (r RateReservation, due time.Time, err error)
	// Admits returns, taking nothing, when a request of cost at priority
	// p asked at the later time at could take, as far as can be told at
	// now.
	Admits(ctx context.Context, now, at time.Time, cost RateAmounts, p Priority) (time.Time, error)
	// Observe corrects the buckets from the headers of the response to the
	// request of r, before r is settled: a bucket not configured takes the
	// response's limit, and a count of what remains lowers a bucket that
	// holds more (it never raises one).
	Observe(ctx context.Context, now time.Time, r RateReservation, o RateObservation) error
	// Settle replaces what r took, for each bucket known marks, by what
	// its request used; the difference goes back to the bucket, or comes
	// out of it. r is settled once; settling it with nothing used and
	// every bucket known gives back all it took.
	Settle(ctx context.Context, now time.Time, r RateReservation, used RateAmounts, known [3]bool) error
	// PausedUntil is when the group's last pause ends, or the zero time
	// when none is under way at now.
	PausedUntil(ctx context.Context, now time.Time) (time.Time, error)
	// Pause empties the buckets named and admits nothing from them before
	// until: a 429 for a rate limit, whose delay every request waits out.
	Pause(ctx context.Context, now time.Time, named [3]bool, until time.Time) error
	// State returns the three buckets at now, Group left empty.
	State(ctx context.Context, now time.Time) ([3]RateLimitState, error)
	// Leave takes a batch request that gives up (refused, cancelled, past
	// its deadline, or its reservation given back) out of the batch line,
	// so that no request behind it waits for its turn; it leaves t as a
	// request that has not joined the line. A ticket with no slot changes
	// nothing.
	Leave(ctx context.Context, now time.Time, t *RateTicket) error
}

// RateReservation is what one request took from a group's buckets: a value
// of the LimitBuckets that made it, given back to it by Observe and Settle.
type RateReservation interface {
	// Taken reports whether it took and is not settled yet.
	Taken() bool
}

// RateTicket is a batch request's place in the batch line, kept between
// its asks; the zero value is a request that has not joined it.
type RateTicket struct {
	// Slot is when the request may take its turn.
	Slot time.Time
}

// RateObservation is what one response's anthropic-ratelimit-* headers say
// of a group's buckets, in the order of [RateAmounts].
type RateObservation struct {
	Has       [3]bool // the response carried the bucket's headers
	Limit     RateAmounts
	Remaining RateAmounts
}

// RateLimits are the per-minute limits of one limit group; zero means
// learned from the API's headers. Each is at most 1,000,000,000.
type RateLimits struct {
	// The tags declare the fields in a Damper's policy file.
	RequestsPerMinute     int `key:"requests_per_minute" min:"0" max:"1000000000" zero:"learned"`
	InputTokensPerMinute  int `key:"input_tokens_per_minute" min:"0" max:"1000000000" zero:"learned"`
	OutputTokensPerMinute int `key:"output_tokens_per_minute" min:"0" max:"1000000000" zero:"learned"`
}

// Priority is a call's place in the rate limiter's line.
type Priority uint8

const (
	// Interactive calls may use all of every bucket: someone is waiting.
	Interactive Priority = iota
	// Batch calls leave a share of every bucket to interactive calls (see
	// [LimitSettings.BatchShare]), and wait behind interactive calls that
	// wait.
	Batch
)

// String returns "interactive" or "batch".
func (p Priority) String() string {
	switch p {
	case Interactive:
		return "interactive"
	case Batch:
		return "batch"
	}
	return fmt.Sprintf("Priority(%d)", int(p))
}

// RateLimitState is one bucket of the rate limiter, as a Damper's
// RateLimits method reads it.
type RateLimitState struct {
	Group string // the limit group
	// Bucket is "requests", "input_tokens" or "output_tokens".
	Bucket string
	// Limit is per minute; 0 while it is not known yet.
	Limit float64
	// Remaining is what an interactive attempt could take now; 0 while
	// attempts wait in line.
	Remaining float64
	// Learned is true for a limit learned from the API's headers, false
	// for a configured one.
	Learned bool
	// PausedUntil is when a pause after a rate-limit 429 ends, if one is
	// under way.
	PausedUntil time.Time
}

// LimitBuckets returns a group's buckets in memory. Besides the arithmetic
// every LimitBuckets keeps, they estimate, from the gaps between the
// responses' counts and what their own traffic leaves, the rate at which
// other processes on the same limits take, and refill with only what that
// leaves them: processes that each keep their buckets in memory then share
// the limits the API reports, roughly.
func (MemoryStore) LimitBuckets(s LimitSettings) (LimitBuckets, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	l := s.Limits
	return memoryBuckets{ratelimit.New(ratelimit.Settings{
		Limits:     ratelimit.Amounts{float64(l.RequestsPerMinute), float64(l.InputTokensPerMinute), float64(l.OutputTokensPerMinute)},
		BatchShare: s.BatchShare, FollowOthers: true,
	})}, nil
}

// LimitShare returns a group's buckets in memory for one process's share
// of a fleet's limits, for a store to decide with while the fleet's state
// cannot be reached: limits per minute (0: unknown, which admits
// everything), kept as configured ones, each bucket holding levels' (no
// more than its limit) at at and refilling from then. Unlike
// [MemoryStore.LimitBuckets] they estimate no other traffic: the share is
// the estimate. It returns an error naming a limit that is negative or
// not finite, or a batchShare outside (0, 1].
func (MemoryStore) LimitShare(limits, levels RateAmounts, at time.Time, batchShare float64) (LimitBuckets, error) {
	for k, l := range limits {
		if l < 0 || math.IsNaN(l) || math.IsInf(l, 0) {
			return nil, fieldError(fmt.Sprintf("LimitShare limits[%d]", k), l, "must be finite and at least 0 (0: unknown)")
		}
		if math.IsNaN(levels[k]) || math.IsInf(levels[k], 0) {
			return nil, fieldError(fmt.Sprintf("LimitShare levels[%d]", k), levels[k], "must be finite")
		}
	}
	if math.IsNaN(batchShare) || batchShare <= 0 || batchShare > 1 {
		return nil, fieldError("LimitShare batchShare", batchShare, "must be in (0, 1]")
	}
	g := ratelimit.New(ratelimit.Settings{Limits: ratelimit.Amounts(limits), BatchShare: batchShare})
	g.SetLevels(at, ratelimit.Amounts(levels))
	return memoryBuckets{g}, nil
}

// check returns an error naming the first field that cannot be used.
func (s LimitSettings) check() error {
	l := s.Limits
	for _, f := range []struct {
		name string
		v    int
	}{{"RequestsPerMinute", l.RequestsPerMinute}, {"InputTokensPerMinute", l.InputTokensPerMinute}, {"OutputTokensPerMinute", l.OutputTokensPerMinute}} {
		if f.v < 0 {
			return fieldError("LimitSettings.Limits."+f.name, f.v, "must be at least 0 (0: learned)")
		}
	}
	if math.IsNaN(s.BatchShare) || s.BatchShare <= 0 || s.BatchShare > 1 {
		return fieldError("LimitSettings.BatchShare", s.BatchShare, "must be in (0, 1]")
	}
	return nil
}

// memoryBuckets is internal/ratelimit's Group as [LimitBuckets].
type memoryBuckets struct{ g *ratelimit.Group }

func (memoryBuckets) inMemory() {}

var _ LimitStore = MemoryStore{}

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

// KnownState is State, which asks no store.
func (m memoryBuckets) KnownState(now time.Time) [3]RateLimitState {
	out, _ := m.State(context.Background(), now)
	return out
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

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
