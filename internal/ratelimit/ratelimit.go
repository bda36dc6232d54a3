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
// nothing and learns when it could be admitted. No request takes more than
// a bucket's limit from it (a larger one waits for a full bucket and takes
// it whole), so none puts a bucket more than one limit further in debt;
// settling it by what it used corrects the difference.
//
// A batch request takes only while every bucket keeps a share of its limit
// for interactive requests, and runs into no debt but that of a request
// larger than its share (which waits for a full bucket): it waits for its
// slot in the batch line, then asks again. A batch request that gives up
// (refused, cancelled, past its deadline) leaves the line (Leave), and the
// line ends again where the last one still in it ends. Interactive debt
// holds every batch request back, so interactive requests get through while
// batch requests fill the bucket.
//
// A group's own accounting is exact for its own traffic; a response's count
// of what remains lowers a bucket that holds more (other traffic on the same
// limits), and teaches it its limit and any change of it. A rate limit
// refusal empties the buckets it names until the API's delay.
//
// golang.org/x/time/rate is not used: its limiter cannot set its tokens
// from a count the API reports, cannot take from three limiters at once or
// from none, and admits no request larger than its burst.
package ratelimit

import (
	"cmp"
	"slices"
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
	// FollowOthers makes the group estimate, from the gaps between the
	// responses' counts and what its own traffic leaves, the rate at which
	// other traffic on the same limits takes tokens, and refill its
	// buckets with only what that leaves (at least a 64th of the limit):
	// several processes that each learn an organisation's limits then
	// share them, each refilling at about the rate the others leave it.
	FollowOthers bool
}

// Group is the three buckets of one limit group. It is safe for
// concurrent use.
type Group struct {
	mu           sync.Mutex
	b            [NumKinds]bucket
	batchShare   float64
	followOthers bool
	// line is the batch line, by slot: each batch request that waits
	// holds a slot, spaced from the one before by the time its cost takes
	// to refill (its end), and keeps it until that end has passed or it
	// leaves. The next to join takes its turn at the last end. Slots
	// are distinct, so a slot names its holder.
	line []lineSlot
	// open holds, in order, the reservations taken and neither answered
	// nor settled: a response to a request taken after one of them may
	// not count it yet (see Observe).
	seq  uint64
	open []openReservation
}

// lineSlot is one place in the batch line: when its holder may take, and
// when the next may.
type lineSlot struct{ slot, end time.Time }

// openReservation is a reservation on the open list: its number and what
// it took.
type openReservation struct {
	seq  uint64
	cost Amounts
	due  time.Time // when it may be sent
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
	// others is the rate, in tokens a second, at which traffic the group
	// does not see (other processes on the same limits) takes from the
	// API's bucket, as the responses tell it (see Settings.FollowOthers);
	// the bucket refills at its limit's rate less that.
	others float64
}

// othersWindow is how fast the estimate of other traffic follows what the
// responses show, in seconds: a gap of n tokens between what a response
// counts and what the group's own traffic leaves moves the estimate by
// n / othersWindow tokens a second.
const othersWindow = 0.25

// perMinute is what the bucket refills a minute.
func (b *bucket) perMinute() float64 {
	if b.others == 0 {
		return b.limit
	}
	return max(b.limit-60*b.others, b.limit/64)
}

// New returns a group: configured buckets start full, the others unknown.
func New(s Settings) *Group {
	g := &Group{batchShare: s.BatchShare, followOthers: s.FollowOthers}
	for k, l := range s.Limits {
		if l > 0 {
			g.b[k] = bucket{limit: l, configured: true, level: l}
		}
	}
	return g
}

// SetLevels sets each known bucket's level to levels' (no more than its
// limit, possibly below 0) as of at: a group made to carry on from levels
// known elsewhere.
func (g *Group) SetLevels(at time.Time, levels Amounts) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for k := range g.b {
		if b := &g.b[k]; b.limit > 0 {
			b.level, b.at = min(levels[k], b.limit), at
		}
	}
}

// advance refills the bucket up to now.
func (b *bucket) advance(now time.Time) {
	if !now.After(b.at) {
		return
	}
	if b.limit > 0 {
		b.level = min(b.limit, b.level+b.perMinute()*now.Sub(b.at).Seconds()/60)
	}
	b.at = now
}

// due is when the bucket, refilling from now, holds need: at once for an
// unknown limit; never before a pause ends. A now a little before the
// bucket's own time (another goroutine's clock reading) counts as that
// time.
func (b *bucket) due(now time.Time, need float64) time.Time {
	t := now
	if b.limit > 0 && b.level < need-b.limit*roundingSlack {
		if b.at.After(t) {
			t = b.at
		}
		t = t.Add(seconds((need - b.level) * 60 / b.perMinute()))
	}
	if b.pausedUntil.After(t) {
		t = b.pausedUntil
	}
	return t
}

// roundingSlack is how far short of need, in limits, a level may be and
// still hold it: the refill summed up to a due time, in one step or in
// several, can fall an ulp or so short of need. It is far above that
// rounding, and far below what a nanosecond refills (1/6e10 of the limit).
const roundingSlack = 1e-12

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
	seq  uint64 // its number among the group's reservations
	open bool   // in the group's open list
}

// Taken reports whether r took from the buckets and is not settled yet.
func (r Reservation) Taken() bool { return r.taken }

// Cost is what r holds: what it asked for, no more than each bucket's limit
// when it took, until it is settled; then what its request used.
func (r Reservation) Cost() Amounts { return r.cost }

// Ticket is a batch request's place in the batch line, kept between its
// asks; the zero value is a request that has not joined it.
type Ticket struct {
	Slot time.Time
}

// Reserve asks for cost at now for a request that can start no later than
// latest. The request either takes (taken true), and may be sent at due, no
// earlier than now; or takes nothing and can be admitted no sooner than
// due: when due is after latest, it is refused, else its caller waits
// until due and asks again with the same ticket (nil for an interactive
// request, which holds no place in the batch line). A batch request that
// asks before its slot gives its place up and joins the line again at its
// end. A batch request that gives up waiting must Leave.
func (g *Group) Reserve(now time.Time, cost Amounts, p Priority, latest time.Time, t *Ticket) (r Reservation, due time.Time, taken bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	due = g.due(now, now, cost, p)
	if p == Batch {
		if t == nil {
			t = new(Ticket)
		}
		inLine := t.Slot.IsZero() || now.Before(t.Slot)
		if inLine {
			g.leave(t)
			if end := g.lineEnd(); end.After(due) {
				due = end
			}
		}
		if due.After(now) {
			if !due.After(latest) && inLine {
				g.join(t, now, due, g.refillTime(cost))
			}
			return Reservation{}, due, false
		}
	} else if due.After(latest) {
		return Reservation{}, due, false
	}
	g.seq++
	held := g.held(cost)
	r = Reservation{cost: held, taken: true, seq: g.seq, open: true}
	g.open = append(g.open, openReservation{g.seq, held, due})
	for k := range g.b {
		b := &g.b[k]
		b.level -= held[k]
		b.taken += held[k]
		r.mark[k] = b.taken
	}
	return r, due, true
}

// held is what a request of cost takes: no more than a known bucket's
// limit from it, so that no request puts a bucket more than one limit
// further in debt.
func (g *Group) held(cost Amounts) Amounts {
	for k, b := range g.b {
		if b.limit > 0 {
			cost[k] = min(cost[k], b.limit)
		}
	}
	return cost
}

// refillTime is how long what a request of cost takes refills in its
// slowest known bucket, at least a nanosecond, so that slots are distinct.
func (g *Group) refillTime(cost Amounts) time.Duration {
	longest := time.Duration(1)
	for k, b := range g.b {
		if b.limit > 0 {
			longest = max(longest, seconds(min(cost[k], b.limit)*60/b.limit))
		}
	}
	return longest
}

// lineEnd is when the next batch request to join the line may take its
// turn: the end of the last slot; it requires g.mu.
func (g *Group) lineEnd() time.Time {
	if n := len(g.line); n > 0 {
		return g.line[n-1].end
	}
	return time.Time{}
}

// join gives t the slot at due, the line's last, held for refill; slots
// whose end has passed at now are dropped first. It requires g.mu.
func (g *Group) join(t *Ticket, now, due time.Time, refill time.Duration) {
	i := 0
	for i < len(g.line) && !g.line[i].end.After(now) {
		i++
	}
	g.line = append(g.line[:0], g.line[i:]...)
	g.line = append(g.line, lineSlot{due, due.Add(refill)})
	t.Slot = due
}

// leave takes t's slot out of the line, if it is still there; it requires
// g.mu.
func (g *Group) leave(t *Ticket) {
	if t.Slot.IsZero() {
		return
	}
	if i, found := slices.BinarySearchFunc(g.line, t.Slot, func(s lineSlot, at time.Time) int {
		return s.slot.Compare(at)
	}); found {
		g.line = slices.Delete(g.line, i, i+1)
	}
	t.Slot = time.Time{}
}

// Leave takes a batch request that gives up waiting (refused, cancelled,
// past its deadline, or its reservation given back) out of the batch line:
// the requests behind it keep their slots, and when it held the last the
// line ends where the one before it ends. t is left as a request that has
// not joined the line; Leave with such a ticket changes nothing.
func (g *Group) Leave(t *Ticket) {
	if t == nil || t.Slot.IsZero() {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.leave(t)
}

// Admits reports, taking nothing, when a request of cost at priority p
// could take, asked at the later time at as far as can be told at now.
func (g *Group) Admits(now, at time.Time, cost Amounts, p Priority) time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	due := g.due(now, at, cost, p)
	if end := g.lineEnd(); p == Batch && end.After(due) {
		due = end
	}
	return due
}

// due is when every bucket, brought up to now, holds what a request of
// cost at priority p needs, no earlier than from; it requires g.mu.
func (g *Group) due(now, from time.Time, cost Amounts, p Priority) time.Time {
	due := from
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
	g.answered(r)
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

// answered takes r off the open list.
func (g *Group) answered(r *Reservation) {
	if !r.open {
		return
	}
	r.open = false
	if i, found := slices.BinarySearchFunc(g.open, r.seq, func(o openReservation, seq uint64) int {
		return cmp.Compare(o.seq, seq)
	}); found {
		g.open = slices.Delete(g.open, i, i+1)
	}
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
