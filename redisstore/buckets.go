package redisstore

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/damper-ai/damper-go/fleet"
	"github.com/redis/go-redis/v9"
)

// bucketsTTL is how long a group's hash outlives the time its buckets are
// full again, with no pause or batch slot pending.
const bucketsTTL = 5 * time.Minute

// farFuture is how far ahead the local mirror of a shared reservation may
// be due: it always takes.
const farFuture = 100 * 365 * 24 * time.Hour

// BucketsKey returns the Redis key that holds the rate-limit buckets of
// the limit group group (see [damper.RateLimitPolicy]) of the Damper named
// name: damper:{name}:ratelimit:group, with any byte of group outside
// printable ASCII, and '%', written as %XX. The braces make name the key's
// hash tag.
func BucketsKey(name, group string) string {
	return "damper:{" + name + "}:ratelimit:" + escapeGroup(group)
}

func escapeGroup(g string) string {
	const hex = "0123456789ABCDEF"
	out := make([]byte, 0, len(g))
	for i := 0; i < len(g); i++ {
		c := g[i]
		if c < 0x21 || c > 0x7e || c == '%' {
			out = append(out, '%', hex[c>>4], hex[c&15])
			continue
		}
		out = append(out, c)
	}
	return string(out)
}

// LimitBuckets implements [fleet.LimitStore]. It keeps one limit group's
// three buckets (requests, input tokens and output tokens per minute) in
// Redis, shared by every
// process that gives the same [Options.Name]: the fleet as a whole takes
// from one set of buckets, so it stays under the organisation's limits
// together, and learns a limit once, from the first response any of its
// processes gets.
//
// Keys. A group is one hash, damper:{<Name>}:ratelimit:<group> (see
// [BucketsKey]): per bucket its limit, whether the limit is configured,
// its level, the time the level held, the fleet's net take (taken) and the
// end of its pause; the batch line's next slot; and one field per batch
// request waiting in line (its slot and the end of its turn, in absolute
// time), dropped once the end of its turn has passed, or when it leaves
// ([fleet.LimitBuckets] Leave). Times are the now
// Damper passes in (its clock's, never Redis's TIME), kept as nanoseconds
// since an epoch of the group's, a whole second set when the hash is made
// and moved up every 30 days, so that a double holds them exactly; levels
// are doubles. The Name is the hash tag, so every key of one Damper lands
// on one Redis Cluster slot. A write sets the key to expire five minutes
// after the group would be full again with no pause or batch slot pending:
// a group nobody uses disappears, and comes back as a new one, its
// configured limits full and its learned ones unknown until the next
// response.
//
// Scripts and round trips. Each method is one Lua script, bounded by
// [Options.Timeout], with the arithmetic of the in-memory
// buckets (fleet.MemoryStore): continuous refill, interactive debt, the
// batch share kept for interactive requests, the batch line and leaving
// it, a request larger than a bucket waiting for a full one and taking no
// more than the bucket's limit, a refusal's rounding slack.
// Reserve, Admits, PausedUntil and State are decisions, a round trip
// each; Observe, Settle, Leave and Pause are records, queued for the
// store's next batch (see the package documentation). An attempt that
// finds room costs one round trip on its caller's path, Reserve, and two
// records, Observe (when the response carries rate-limit headers) and
// Settle, which go as one script when Settle finds Observe queued still;
// one that waits in line asks again at its due time (Reserve, or
// PausedUntil once it has taken), and a 429 for a rate limit adds a Pause
// per bucket it names. Configured limits go with every call and are never changed by a
// response; give every process the same Policy. Learned limits come from
// Observe. The fleet shares no clock but its members' own: a time earlier
// than the one a bucket holds counts as that time, as in memory, so the
// clocks' skew is the error.
//
// The arithmetic is the same double-precision operations on the same
// nanoseconds, so the Redis buckets decide as the in-memory ones to the
// bit, but for a level summed in other steps (the in-memory buckets bring
// a level up to date at every read) and the differences below:
//
//   - No estimate of other traffic: the in-memory buckets estimate, from
//     the responses' counts, the rate at which other processes take and
//     refill with what that leaves; the fleet's own traffic is all in the
//     shared buckets, so these refill at the limit, and a count below the
//     level (traffic outside the fleet) only lowers it.
//   - Observe learns a limit with the level the response's count allows
//     less what the fleet took after the request (its taken less the
//     reservation's mark), but not less what older reservations still
//     unanswered took, which only the in-memory buckets track: a response
//     to a request overtaken by older ones may teach a level a little
//     higher than the least the count allows, corrected by the next
//     response. What the fleet took after the request counts for one
//     limit at most (the in-memory buckets count each request taken before
//     the limit was known for one limit at most): a request of a huge
//     max_tokens taken meanwhile does not leave the bucket in debt for
//     ages.
//
// When Redis fails. Any error of a round trip (a failure, the timeout, an
// unexpected reply) makes buckets in memory decide instead for that
// operation, and the error is returned too, for Damper to log; while the
// store is in fallback only the due probe asks Redis (see
// [Options.ProbeInterval]), so no call waits.
//
// A share in a fault. With other processes in the store ([Store.Members]
// N above 1, the count last heard), the buckets in memory are this
// process's share: each bucket's limit last heard from Redis (rate and
// capacity) over N, holding its level last heard over N, refilled at that
// rate since (fleet.MemoryStore's LimitShare), made at the first local
// decision and kept until Redis decides again. A bucket whose limit Redis
// never told takes the local twin's (below) over N; one unknown to both
// admits everything. What the local decisions took, net of what their
// requests settled back, is taken from the shared buckets, in a record,
// with the first Reserve Redis answers: the fleet's books count what was
// admitted in the fault, and every process takes its full part again,
// Redis deciding. So in a fault of any length T the fleet admits at most
// the level the shared bucket held as each process last heard it (at most
// the limit L) plus L × T / 1 min, as the shared bucket would, when every
// process counts the same N; with counts N_i, the sum of each one's
// level_i / N_i + L × T / (N_i × 1 min). A process alone, or one that has
// never heard Redis, decides on its twin: the whole bucket.
//
// The local twin (fleet.MemoryStore's buckets) hears this process's
// traffic all along: every reservation Redis grants is also taken from
// it, observed, paused and settled there, so at a fallback it holds the
// learned limits and this process's view of the levels, and estimates the
// rest of the fleet's traffic from the responses as MemoryStore's buckets
// do. A reservation is settled by the side that made it: one Redis made,
// settled while Redis fails, is settled locally only and its error
// returned (Redis's bucket refills on its own; what the request did not
// use is lost to the fleet until then); one made during the fallback is
// settled locally even once Redis is back, and what it settles back is
// taken off what the next shared Reserve charges. A Redis that
// restarts empty starts every group anew: configured limits full, learned
// limits relearned from the next response. [Options.FailClosed] does not
// change the rate limiter: refusing every request while Redis fails would
// stop the fleet's traffic, not limit it; the local buckets decide.
//
// Leases. With [Options.Lease] above 1, an interactive Reserve that Redis
// admits at once, every limit of the group known, takes in the same script
// up to Lease-1 more calls' worth of its cost, from what the buckets hold
// then (never below 0), and the group's next interactive Reserves that the
// lease covers in every bucket take from it, due at now, without a round
// trip; a batch request, one that must wait, and a group with a limit
// unknown ask Redis as without leases. The bounds, the fleet's admissions
// against exact ones, are in the package documentation ("Leases of the
// rate limiter's tokens").
//
// It contacts no server. It returns an error, which keeps the group in
// memory, for a group without a name or one longer than 256 bytes.
func (s *Store) LimitBuckets(st fleet.LimitSettings) (fleet.LimitBuckets, error) {
	if st.Group == "" || len(st.Group) > 256 {
		return nil, fmt.Errorf("redisstore: LimitBuckets: group %q: must be 1 to 256 bytes", st.Group)
	}
	share := st.BatchShare
	local, err := fleet.MemoryStore{}.LimitBuckets(st)
	if err != nil {
		return nil, err
	}
	l := st.Limits
	limits := [3]int{l.RequestsPerMinute, l.InputTokensPerMinute, l.OutputTokensPerMinute}
	b := &buckets{
		link:   s.link,
		keys:   []string{BucketsKey(s.link.name, st.Group)},
		local:  local,
		leases: s.leases,
		batch:  share,
	}
	b.common = []any{bucketsTTL.Milliseconds()}
	for k, v := range limits {
		b.common = append(b.common, max(v, 0))
		b.configured[k] = v > 0
	}
	b.common = append(b.common, fmtFloat(share))
	return b, nil
}

// buckets is one limit group's buckets in Redis, with their local
// fallback.
type buckets struct {
	link   *link
	keys   []string
	common []any // the time to live, the configured limits, the batch share
	local  fleet.LimitBuckets

	configured [3]bool
	batch      float64      // the batch share
	leases     *limitLeases // the store's
	mu         sync.Mutex   // guards held, heard and share
	held       limitLease   // this process's lease, when held.on
	heard      heardBuckets // the shared buckets, as the last Reserve left them
	// share decides while Redis fails and the store has other members: this
	// process's share of the last limits and levels heard (see fallback),
	// made at the first local decision, dropped at the next shared one.
	share fleet.LimitBuckets
	// owed is what the local decisions took while Redis failed, net of
	// what their requests settled back: the next shared Reserve takes it
	// from the shared buckets, in a record, so that the fleet's books
	// count what was admitted in the fault.
	owed fleet.RateAmounts
}

// heardBuckets is what a Reserve's reply told of the shared buckets.
type heardBuckets struct {
	ok           bool
	at           time.Time
	level, limit fleet.RateAmounts
}

var _ fleet.LimitBuckets = (*buckets)(nil)

// reservation is what one request took, from Redis (shared) or, during a
// fallback, from the local buckets only.
type reservation struct {
	cost   fleet.RateAmounts
	mark   fleet.RateAmounts // each bucket's taken just after the take
	seen   [3]bool           // the bucket's level was set from a response's count
	taken  bool
	shared bool                  // Redis made it
	local  fleet.RateReservation // its local twin, or the local reservation itself
	owner  fleet.LimitBuckets    // the buckets that made local: nil for the twin
	// observe is its Observe in the store's queue: a Settle that finds it
	// there still goes in it (bkObserveSettleScript).
	observe *queued
}

// Taken implements [fleet.RateReservation].
func (r *reservation) Taken() bool { return r.taken }

// Reserve implements [fleet.LimitBuckets].
func (b *buckets) Reserve(ctx context.Context, now time.Time, cost fleet.RateAmounts, p fleet.Priority, latest time.Time, t *fleet.RateTicket) (fleet.RateReservation, time.Time, error) {
	// Only an interactive request leases: a batch one keeps its place in
	// the line, and its share, as without leases.
	leased := b.leases.lease > 1 && p == fleet.Interactive && t == nil
	if leased {
		if r, ok := b.fromLease(ctx, now, cost, latest); ok {
			return r, now, nil
		}
	}
	var slot time.Time
	if t != nil {
		slot = t.Slot
	}
	ls, ln := timeArgs(latest)
	ss, sn := timeArgs(slot)
	script := bkReserveScript
	args := []any{fmtFloat(cost[0]), fmtFloat(cost[1]), fmtFloat(cost[2]), priorityArg(p), ls, ln, ss, sn}
	if leased {
		script = bkReserveLeaseScript
		args = append(args, b.leases.lease-1)
	}
	v, err := b.run(ctx, "reserve", script, now, args...)
	var rep reserveReply
	if err == nil {
		rep, err = b.parseReserve(v, now)
	}
	if err != nil {
		if leased {
			b.mu.Lock()
			b.dropLocked()
			b.mu.Unlock()
		}
		fb := b.fallback(ctx, now)
		lr, due, _ := fb.Reserve(ctx, now, cost, p, latest, t)
		if !lr.Taken() {
			return &reservation{}, due, err
		}
		b.mu.Lock()
		for k := range cost {
			b.owed[k] += cost[k]
		}
		b.mu.Unlock()
		return &reservation{cost: cost, taken: true, local: lr, owner: fb}, due, err
	}
	b.mu.Lock()
	b.heard = heardBuckets{ok: true, at: now, level: rep.level, limit: rep.limit}
	b.share = nil
	owed := b.owed
	b.owed = fleet.RateAmounts{}
	b.mu.Unlock()
	b.payOwed(ctx, now, owed)
	if t != nil {
		t.Slot = rep.slot
	}
	if !rep.taken {
		return &reservation{}, rep.due, nil
	}
	if leased {
		b.keepLease(ctx, now, rep)
	}
	// The local twin always takes, whatever its own view: it only follows.
	lr, _, _ := b.local.Reserve(context.WithoutCancel(ctx), now, cost, fleet.Interactive, now.Add(farFuture), nil)
	return &reservation{cost: rep.held, mark: rep.mark, taken: true, shared: true, local: lr}, rep.due, nil
}

// reserveReply is bkReserveScript's reply.
type reserveReply struct {
	taken     bool
	due, slot time.Time
	mark      fleet.RateAmounts
	held      fleet.RateAmounts // what it took: no more than a known limit
	// The buckets' levels and limits after it: a fallback's share starts
	// from them.
	level, limit fleet.RateAmounts
	// bkReserveLeaseScript's: the calls' worth of held it took as a lease,
	// and the limits it took them under.
	lease  int64
	limits fleet.RateAmounts
}

func (b *buckets) parseReserve(v any, now time.Time) (reserveReply, error) {
	var r reserveReply
	vs, ok := v.([]any)
	if ok && (len(vs) == 17 || len(vs) == 21) {
		var taken int64
		taken, ok = asInt(vs[0])
		r.taken = taken == 1
		r.due, ok = asTime(vs[1:3], now, ok)
		r.slot, ok = asTime(vs[3:5], now, ok)
		for k := range r.mark {
			r.mark[k], ok = asFloatOK(vs[5+k], ok)
			r.held[k], ok = asFloatOK(vs[8+k], ok)
			r.level[k], ok = asFloatOK(vs[11+k], ok)
			r.limit[k], ok = asFloatOK(vs[14+k], ok)
		}
		if len(vs) == 21 {
			r.lease, ok = asIntOK(vs[17], ok)
			for k := range r.limits {
				r.limits[k], ok = asFloatOK(vs[18+k], ok)
			}
		}
		if ok {
			return r, nil
		}
	}
	return r, b.unexpected("reserve", v)
}

// Admits implements [fleet.LimitBuckets].
func (b *buckets) Admits(ctx context.Context, now, at time.Time, cost fleet.RateAmounts, p fleet.Priority) (time.Time, error) {
	as, an := timeArgs(at)
	v, err := b.run(ctx, "admits", bkAdmitsScript, now,
		fmtFloat(cost[0]), fmtFloat(cost[1]), fmtFloat(cost[2]), priorityArg(p), as, an)
	if err == nil {
		vs, _ := v.([]any)
		if due, ok := asTime(vs, at, len(vs) == 2); ok {
			b.answered()
			return due, nil
		}
		err = b.unexpected("admits", v)
	}
	due, _ := b.fallback(ctx, now).Admits(ctx, now, at, cost, p)
	return due, err
}

// Observe implements [fleet.LimitBuckets]: the local twin of a shared
// reservation is observed too.
func (b *buckets) Observe(ctx context.Context, now time.Time, rr fleet.RateReservation, o fleet.RateObservation) error {
	r, ok := rr.(*reservation)
	if !ok || !r.taken {
		return nil
	}
	if r.local != nil {
		_ = r.buckets(b).Observe(ctx, now, r.local, o)
	}
	if !r.shared {
		return nil
	}
	b.leaseObserved(ctx, now, o)
	args := make([]any, 0, 12)
	for k := range 3 {
		has := 0
		if o.Has[k] {
			has = 1
		}
		args = append(args, has, fmtFloat(o.Limit[k]), fmtFloat(o.Remaining[k]), fmtFloat(r.mark[k]))
	}
	q := &queued{op: "observe", s: bkObserveScript, keys: b.keys, args: b.args(now, args...)}
	q.done = func(v any, err error) {
		if err != nil {
			return
		}
		if seen, err := b.link.ints(q.op, v, 3); err == nil {
			for k, s := range seen {
				if s == 1 {
					r.seen[k] = true
				}
			}
		}
	}
	err := b.link.enqueue(ctx, q)
	if err == nil {
		r.observe = q
	}
	return err
}

// Settle implements [fleet.LimitBuckets]. A shared reservation settled
// while Redis fails is settled locally only, and the error returned.
// Settling a shared one is queued for the store's next batch: in its
// Observe's script when that is queued still, else after its reply.
func (b *buckets) Settle(ctx context.Context, now time.Time, rr fleet.RateReservation, used fleet.RateAmounts, known [3]bool) error {
	r, ok := rr.(*reservation)
	if !ok || !r.taken {
		return nil
	}
	r.taken = false
	if r.local != nil {
		_ = r.buckets(b).Settle(ctx, now, r.local, used, known)
	}
	if !r.shared {
		b.mu.Lock()
		for k := range known {
			if known[k] {
				if r.owner != nil {
					b.owed[k] += used[k] - r.cost[k]
				}
				r.cost[k] = used[k]
			}
		}
		b.mu.Unlock()
		return nil
	}
	if r.observe != nil && b.link.amend(r.observe, func(q *queued) {
		// The script leaves alone the buckets the response counted.
		args := slices.Clone(q.args)
		for k := range 3 {
			if known[k] {
				args = append(args, 1, fmtFloat(r.cost[k]-used[k]))
			} else {
				args = append(args, 0, "0")
			}
		}
		q.s, q.args = bkObserveSettleScript, args
	}) {
		return nil
	}
	// Made as the batch is sent, after the Observe's reply, if any.
	build := func() []any {
		args := make([]any, 0, 6)
		for k := range 3 {
			if known[k] && !r.seen[k] {
				args = append(args, 1, fmtFloat(r.cost[k]-used[k]))
				r.cost[k] = used[k]
			} else {
				args = append(args, 0, "0")
			}
		}
		return b.args(now, args...)
	}
	return b.link.record(ctx, "settle", bkSettleScript, b.keys, nil, build, nil)
}

// Leave implements [fleet.LimitBuckets]: the request leaves the shared
// line, and the local one, where a fallback may have given it its slot.
func (b *buckets) Leave(ctx context.Context, now time.Time, t *fleet.RateTicket) error {
	if t == nil || t.Slot.IsZero() {
		return nil
	}
	slot := t.Slot
	b.mu.Lock()
	share := b.share
	b.mu.Unlock()
	if share != nil {
		_ = share.Leave(ctx, now, &fleet.RateTicket{Slot: slot})
	}
	_ = b.local.Leave(ctx, now, t)
	t.Slot = time.Time{}
	ss, sn := timeArgs(slot)
	return b.link.record(ctx, "leave", bkLeaveScript, b.keys, b.args(now, ss, sn), nil, nil)
}

// PausedUntil implements [fleet.LimitBuckets].
func (b *buckets) PausedUntil(ctx context.Context, now time.Time) (time.Time, error) {
	v, err := b.run(ctx, "paused_until", bkPausedUntilScript, now)
	if err == nil {
		vs, _ := v.([]any)
		if until, ok := asTime(vs, now, len(vs) == 2); ok {
			if !until.IsZero() {
				// Another process's 429 paused the group after the lease
				// was taken: the pause emptied the buckets, so the lease
				// is dropped, not given back to them.
				b.mu.Lock()
				b.dropLocked()
				b.mu.Unlock()
			}
			b.answered()
			return until, nil
		}
		err = b.unexpected("paused_until", v)
	}
	until, _ := b.fallback(ctx, now).PausedUntil(ctx, now)
	return until, err
}

// Pause implements [fleet.LimitBuckets]: the local buckets pause too.
func (b *buckets) Pause(ctx context.Context, now time.Time, named [3]bool, until time.Time) error {
	_ = b.local.Pause(ctx, now, named, until)
	b.mu.Lock()
	share := b.share
	b.mu.Unlock()
	if share != nil {
		_ = share.Pause(ctx, now, named, until)
	}
	// Given back before the pause, which then empties what it names.
	b.giveBack(ctx, now)
	args := make([]any, 0, 4)
	for _, n := range named {
		if n {
			args = append(args, 1)
		} else {
			args = append(args, 0)
		}
	}
	us, un := timeArgs(until)
	args = append(args, us, un)
	return b.link.record(ctx, "pause", bkPauseScript, b.keys, b.args(now, args...), nil, nil)
}

// run runs script s at now with the common arguments and args.
func (b *buckets) run(ctx context.Context, op string, s *redis.Script, now time.Time, args ...any) (any, error) {
	return b.link.run(ctx, op, s, b.keys, b.args(now, args...)...)
}

// args are a script's arguments at now: the common ones, then args.
func (b *buckets) args(now time.Time, args ...any) []any {
	all := make([]any, 0, 2+len(b.common)+len(args))
	ns, nn := timeArgs(now)
	all = append(all, ns, nn)
	all = append(all, b.common...)
	return append(all, args...)
}

// unexpected records a reply that cannot be read as a failure.
func (b *buckets) unexpected(op string, v any) error {
	err := fmt.Errorf("unexpected reply %v", v)
	b.link.fail(op, err)
	return fmt.Errorf("redisstore: %s on %q: %w", op, b.link.name, err)
}
