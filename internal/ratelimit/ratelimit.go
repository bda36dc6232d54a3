// Package ratelimit keeps the rate limits of one limit group of the
// Messages API (a model family) as three token buckets, requests, input
// tokens and output tokens per minute, driven by the caller's clock: every
// method is given the time, so that a virtual clock runs it exactly.
//
// A bucket of limit L holds at most L and refills continuously at L a
// minute, the bucket the API describes. Its limit is configured, or learned
// from the API's headers; until it is known the bucket admits everything
// and only counts.
//
// An interactive request takes from the three buckets at once, or from
// none: when one lacks room it takes all the same, driving the bucket below
// zero, and is due when the bucket has refilled. Later requests queue
// behind its debt, so interactive requests go first come, first served. A
// request that would be due after the latest time its caller can wait takes
// nothing and learns when it could be admitted.
//
// A batch request takes only while every bucket keeps a share of its limit
// for interactive requests, and never runs into debt: it waits for its
// slot in the batch line, then asks again. Interactive debt holds every
// batch request back, so interactive requests get through while batch
// requests fill the bucket.
//
// Every response corrects the buckets from the API's own count of what
// remains, less what this group took after the request it answers; a rate
// limit refusal empties the buckets it names until the API's delay.
//
// golang.org/x/time/rate is not used: its limiter cannot set its tokens
// from a count the API reports, cannot take from three limiters at once or
// from none, and admits no request larger than its burst.
package ratelimit

import (
	"sync"
	"time"
)

// Kind is one of a group's three buckets.
type Kind int

const (
	Requests Kind = iota
	InputTokens
	OutputTokens
)

// NumKinds is the number of buckets of a group.
const NumKinds = 3

// Kinds lists the buckets in order.
var Kinds = [NumKinds]Kind{Requests, InputTokens, OutputTokens}

func (k Kind) String() string {
	switch k {
	case Requests:
		return "requests"
	case InputTokens:
		return "input_tokens"
	case OutputTokens:
		return "output_tokens"
	}
	return "unknown"
}

// Amounts holds one number per bucket.
type Amounts [NumKinds]float64

// Priority is a request's place in line.
type Priority uint8

const (
	// Interactive requests may use all of a bucket.
	Interactive Priority = iota
	// Batch requests leave a share of each bucket to interactive ones.
	Batch
)

// Settings configure a group.
type Settings struct {
	// Limits are the configured limits per minute; 0 leaves a bucket's
	// limit to be learned.
	Limits Amounts
	// BatchShare is the share of each bucket batch requests may use, in
	// (0, 1].
	BatchShare float64
}

// Group is the three buckets of one limit group. It is safe for
// concurrent use.
type Group struct {
	mu         sync.Mutex
	b          [NumKinds]bucket
	batchShare float64
	// batchNext is when the next batch request to join the line may take
	// its turn: each waiting batch request holds a slot, spaced by the
	// time its cost takes to refill.
	batchNext time.Time
}

// bucket is one bucket. Its level may be negative: interactive requests
// due later have taken from it.
type bucket struct {
	limit      float64 // per minute; 0 while unknown
	configured bool
	level      float64   // tokens at at
	at         time.Time // when level held
	// taken is what this group took, net of what settled back: a
	// response's count of what remains excludes what was taken after its
	// request.
	taken       float64
	pausedUntil time.Time
}

// New returns a group: configured buckets start full, the others unknown.
func New(s Settings) *Group {
	g := &Group{batchShare: s.BatchShare}
	for k, l := range s.Limits {
		if l > 0 {
			g.b[k] = bucket{limit: l, configured: true, level: l}
		}
	}
	return g
}

// advance refills the bucket up to now; a paused bucket refills from the
// end of its pause.
func (b *bucket) advance(now time.Time) {
	if !now.After(b.at) {
		return
	}
	if b.limit > 0 {
		b.level = min(b.limit, b.level+b.limit*now.Sub(b.at).Seconds()/60)
	}
	b.at = now
}

// due is when the bucket, refilling from now, holds need: at once for an
// unknown limit; never before a pause ends. A now a little before the
// bucket's own time (another goroutine's clock reading) counts as that
// time.
func (b *bucket) due(now time.Time, need float64) time.Time {
	t := now
	if b.limit > 0 && b.level < need {
		if b.at.After(t) {
			t = b.at
		}
		t = t.Add(seconds((need - b.level) * 60 / b.limit))
	}
	if b.pausedUntil.After(t) {
		t = b.pausedUntil
	}
	return t
}

// need is what the bucket must hold for a request of cost to take it,
// leaving floor: a request larger than the whole bucket waits for a full
// bucket, then takes it all and more.
func (b *bucket) need(cost, floor float64) float64 {
	return min(cost+floor, b.limit)
}

// Reservation is what one request took; its zero value took nothing.
type Reservation struct {
	cost  Amounts
	mark  Amounts // each bucket's taken just after this request's take
	taken bool
	// seen marks the buckets a response has counted this request in as
	// the API will: its request and its input tokens. Settling leaves
	// them as the response left them.
	seen [NumKinds]bool
}

// Taken reports whether r took from the buckets and is not settled yet.
func (r Reservation) Taken() bool { return r.taken }

// Cost is what r asked for.
func (r Reservation) Cost() Amounts { return r.cost }

// Ticket is a batch request's place in the batch line, kept between its
// asks; the zero value is a request that has not joined it.
type Ticket struct {
	slot time.Time
}

// Reserve asks for cost at now for a request that can start no later than
// latest. The request either takes (taken true), and may be sent at due, no
// earlier than now; or takes nothing and can be admitted no sooner than
// due: when due is after latest, it is refused, else its caller waits
// until due and asks again with the same ticket.
func (g *Group) Reserve(now time.Time, cost Amounts, p Priority, latest time.Time, t *Ticket) (r Reservation, due time.Time, taken bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	due = now
	for k := range g.b {
		b := &g.b[k]
		b.advance(now)
		floor := 0.0
		if p == Batch {
			floor = (1 - g.batchShare) * b.limit
		}
		if d := b.due(now, b.need(cost[k], floor)); d.After(due) {
			due = d
		}
	}
	if p == Batch {
		inLine := t.slot.IsZero() || now.Before(t.slot)
		if inLine && g.batchNext.After(due) {
			due = g.batchNext
		}
		if due.After(now) {
			if !due.After(latest) && inLine {
				t.slot = due
				g.batchNext = due.Add(g.refillTime(cost))
			}
			return Reservation{}, due, false
		}
	} else if due.After(latest) {
		return Reservation{}, due, false
	}
	r = Reservation{cost: cost, taken: true}
	for k := range g.b {
		b := &g.b[k]
		b.level -= cost[k]
		b.taken += cost[k]
		r.mark[k] = b.taken
	}
	return r, due, true
}

// refillTime is how long cost takes to refill in its slowest known bucket.
func (g *Group) refillTime(cost Amounts) time.Duration {
	var longest time.Duration
	for k, b := range g.b {
		if b.limit > 0 {
			longest = max(longest, seconds(cost[k]*60/b.limit))
		}
	}
	return longest
}

// Admits reports, taking nothing, when a request of cost at priority p
// could take, asked at the later time at as far as can be told at now.
func (g *Group) Admits(now, at time.Time, cost Amounts, p Priority) time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	due := at
	for k := range g.b {
		b := &g.b[k]
		b.advance(now)
		floor := 0.0
		if p == Batch {
			floor = (1 - g.batchShare) * b.limit
		}
		if d := b.due(now, b.need(cost[k], floor)); d.After(due) {
			due = d
		}
	}
	return due
}

// Cancel gives back all that r took: its request was never sent.
func (g *Group) Cancel(r *Reservation, now time.Time) {
	g.Settle(r, now, Amounts{}, [NumKinds]bool{true, true, true})
}

// Settle replaces what r took, for each bucket known says, by what its
// request used; the difference goes back to the bucket, or comes out of it.
// r is settled once: a later call changes nothing.
func (g *Group) Settle(r *Reservation, now time.Time, used Amounts, known [NumKinds]bool) {
	if !r.taken {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for k := range g.b {
		if !known[k] || r.seen[k] {
			continue
		}
		b := &g.b[k]
		b.advance(now)
		back := r.cost[k] - used[k]
		b.taken -= back
		b.level += back
		if b.limit > 0 {
			b.level = min(b.level, b.limit)
		}
		r.cost[k] = used[k]
	}
	r.taken = false
}

// Observation is what one response's headers say of the buckets.
type Observation struct {
	Has       [NumKinds]bool // the response carried the bucket's headers
	Limit     Amounts
	Remaining Amounts
}

// Observe corrects the buckets from a response to the request of r, which
// must have taken, before r is settled. The response counts r's request and
// input tokens as the API does, and its output as the max_tokens reserved,
// which settling r then corrects. A
// bucket whose limit is not configured takes the response's limit; its
// level becomes the response's count of what remains, less what the group
// took after r. A configured bucket only lowers its level to that count,
// as does a paused one.
func (g *Group) Observe(now time.Time, r *Reservation, o Observation) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for k := range g.b {
		if !o.Has[k] {
			continue
		}
		b := &g.b[k]
		b.advance(now)
		if !b.configured && o.Limit[k] > 0 && o.Limit[k] != b.limit {
			if b.limit == 0 {
				b.level = o.Limit[k]
			}
			b.limit = o.Limit[k]
			b.level = min(b.level, b.limit)
		}
		if b.limit == 0 {
			continue
		}
		if Kind(k) != OutputTokens {
			r.seen[k] = true
		}
		seen := o.Remaining[k] - (b.taken - r.mark[k])
		if b.configured || b.pausedUntil.After(now) {
			b.level = min(b.level, seen)
		} else {
			b.level = min(seen, b.limit)
		}
	}
}

// Pause empties the buckets named and admits nothing from them before
// until, the API's delay: every request of the group waits for it. They
// refill meanwhile, so that at until they hold what the API would.
func (g *Group) Pause(now time.Time, named [NumKinds]bool, until time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for k := range g.b {
		if !named[k] {
			continue
		}
		b := &g.b[k]
		b.advance(now)
		b.level = min(b.level, 0)
		if until.After(b.pausedUntil) {
			b.pausedUntil = until
		}
	}
}

// PausedUntil is when the group's last pause ends, or the zero time when
// none is under way at now.
func (g *Group) PausedUntil(now time.Time) time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	var until time.Time
	for _, b := range g.b {
		if b.pausedUntil.After(now) && b.pausedUntil.After(until) {
			until = b.pausedUntil
		}
	}
	return until
}

// BucketState is one bucket as seen at a time.
type BucketState struct {
	Kind       Kind
	Limit      float64 // per minute; 0 while unknown
	Remaining  float64 // what an interactive request could take; 0 while requests wait
	Configured bool
	// PausedUntil is when a pause ends, if one is under way.
	PausedUntil time.Time
}

// State returns the buckets as they are at now.
func (g *Group) State(now time.Time) [NumKinds]BucketState {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out [NumKinds]BucketState
	for k := range g.b {
		b := &g.b[k]
		b.advance(now)
		s := BucketState{Kind: Kind(k), Limit: b.limit, Configured: b.configured}
		if b.pausedUntil.After(now) {
			s.PausedUntil = b.pausedUntil
		} else if b.limit > 0 {
			s.Remaining = max(b.level, 0)
		}
		out[k] = s
	}
	return out
}

// seconds converts a count of seconds to a Duration, rounded up to the
// nanosecond so that a request due at it finds its tokens.
func seconds(s float64) time.Duration {
	d := time.Duration(s * float64(time.Second))
	if float64(d) < s*float64(time.Second) {
		d++
	}
	return d
}
