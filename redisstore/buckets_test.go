package redisstore_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/ratelimit"
	"github.com/damper-ai/damper-go/internal/redistest"
	"github.com/damper-ai/damper-go/redisstore"
	"github.com/redis/go-redis/v9"
)

// newStore returns a store on client with a generous timeout: a slow
// answer on a loaded machine must not turn into a local decision.
func newStore(tb testing.TB, client redis.UniversalClient, name string) *redisstore.Store {
	tb.Helper()
	s, err := redisstore.New(client, redisstore.Options{Name: name, Timeout: 10 * time.Second})
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

func newBuckets(tb testing.TB, s *redisstore.Store, st fleet.LimitSettings) fleet.LimitBuckets {
	tb.Helper()
	b, err := s.LimitBuckets(st)
	if err != nil || b == nil {
		tb.Fatalf("LimitBuckets(%+v) = %v, %v", st, b, err)
	}
	return b
}

// equivCase is one configuration of the equivalence test.
type equivCase struct {
	limits fleet.RateLimits
	share  float64
	api    fleet.RateAmounts // the limits the responses report
}

// eqRun runs one random sequence of operations on the Redis buckets and on
// internal/ratelimit's group, side by side, at the same virtual times, and
// fails at the first difference.
type eqRun struct {
	t    *testing.T
	rng  *rand.Rand
	ctx  context.Context
	now  time.Time
	mem  *ratelimit.Group
	rb   fleet.LimitBuckets
	c    equivCase
	api  fleet.RateAmounts
	step int
	// counts of what happened, to check the sequence exercised each path
	taken, waited, refused, observed, paused, batchTaken, slots, debt, gaveUp int
	maxDiff                                                                   time.Duration // the largest difference of times seen
}

// timeTol is how far apart the two sides' times may be: the Redis buckets
// round a due time up to the microsecond, the in-memory group to the
// nanosecond.
const timeTol = time.Microsecond

func (e *eqRun) fatalf(format string, args ...any) {
	e.t.Helper()
	e.t.Fatalf("step %d at +%v: %s", e.step, e.now.Sub(base), fmt.Sprintf(format, args...))
}

func (e *eqRun) sameTime(what string, mem, red time.Time) {
	e.t.Helper()
	d := red.Sub(mem)
	e.maxDiff = max(e.maxDiff, d, -d)
	if mem.IsZero() != red.IsZero() || d < -timeTol || d > timeTol {
		e.fatalf("%s: memory %v, redis %v (%v apart)", what, mem.Sub(base), red.Sub(base), d)
	}
}

func closeTo(a, b, scale float64) bool {
	return math.Abs(a-b) <= 1e-6*math.Max(1, math.Max(scale, math.Max(math.Abs(a), math.Abs(b))))
}

// checkState compares the two sides' buckets.
func (e *eqRun) checkState() {
	e.t.Helper()
	ms := e.mem.State(e.now)
	rs, err := e.rb.State(e.ctx, e.now)
	if err != nil {
		e.fatalf("State: %v", err)
	}
	for k := range ms {
		m, r := ms[k], rs[k]
		if r.Bucket != m.Kind.String() || !closeTo(m.Limit, r.Limit, 0) || !closeTo(m.Remaining, r.Remaining, m.Limit) ||
			r.Learned != (m.Limit > 0 && !m.Configured) {
			e.fatalf("bucket %d: memory %+v, redis %+v", k, m, r)
		}
		e.sameTime(fmt.Sprintf("bucket %d paused until", k), m.PausedUntil, r.PausedUntil)
	}
	mp := e.mem.PausedUntil(e.now)
	rp, err := e.rb.PausedUntil(e.ctx, e.now)
	if err != nil {
		e.fatalf("PausedUntil: %v", err)
	}
	e.sameTime("PausedUntil", mp, rp)
}

// advance moves the virtual time on by a random whole number of
// microseconds, often none.
func (e *eqRun) advance() {
	switch e.rng.IntN(4) {
	case 0:
	case 1:
		e.now = e.now.Add(time.Duration(e.rng.Int64N(2_000_000)) * time.Microsecond)
	case 2:
		e.now = e.now.Add(time.Duration(e.rng.Int64N(20_000)) * time.Millisecond)
	case 3:
		e.now = e.now.Add(time.Duration(e.rng.Int64N(100)) * time.Millisecond)
	}
}

func (e *eqRun) cost() fleet.RateAmounts {
	c := fleet.RateAmounts{1, float64(1 + e.rng.IntN(3000)), float64(e.rng.IntN(2500))}
	if e.rng.IntN(20) == 0 {
		c[1] *= 10 // larger than a bucket: it waits for a full one
	}
	if e.rng.IntN(40) == 0 {
		c[2] = 1e12 // far larger: it takes one bucket at most
	}
	if e.rng.IntN(10) == 0 {
		c[1] += 0.5 // costs need not be whole
	}
	return c
}

// observation is a response's headers: the API's limits, now and then
// changed, and a count somewhere below them.
func (e *eqRun) observation() fleet.RateObservation {
	var o fleet.RateObservation
	if e.rng.IntN(15) == 0 {
		k := e.rng.IntN(3)
		e.api[k] = math.Round(e.api[k] * (0.7 + 0.6*e.rng.Float64()))
	}
	for k := range o.Has {
		o.Has[k] = e.rng.IntN(8) != 0
		o.Limit[k] = e.api[k]
		o.Remaining[k] = math.Floor(e.api[k] * e.rng.Float64())
	}
	return o
}

// request reserves one request at priority p, waiting in line (at the
// later of the two sides' due times) as long as both say so, and then
// observes and settles it, or not.
func (e *eqRun) request(p fleet.Priority) {
	e.t.Helper()
	cost := e.cost()
	latest := e.now
	if e.rng.IntN(4) != 0 {
		latest = e.now.Add(time.Duration(e.rng.Int64N(40_000)) * time.Millisecond)
	}
	var mt *ratelimit.Ticket
	var rt *fleet.RateTicket
	if p == fleet.Batch {
		mt, rt = new(ratelimit.Ticket), new(fleet.RateTicket)
	}
	for range 20 {
		mr, mdue, mtaken := e.mem.Reserve(e.now, ratelimit.Amounts(cost), ratelimit.Priority(p), latest, mt)
		rr, rdue, err := e.rb.Reserve(e.ctx, e.now, cost, p, latest, rt)
		if err != nil {
			e.fatalf("Reserve: %v", err)
		}
		if mtaken != rr.Taken() {
			e.fatalf("Reserve %v of %v, latest +%v: memory taken %v due +%v, redis taken %v due +%v",
				p, cost, latest.Sub(e.now), mtaken, mdue.Sub(base), rr.Taken(), rdue.Sub(base))
		}
		e.sameTime("Reserve's due", mdue, rdue)
		if mt != nil {
			e.sameTime("ticket's slot", mt.Slot, rt.Slot)
		}
		if mtaken {
			e.taken++
			if mdue.After(e.now) {
				e.debt++ // an interactive request taken ahead of its tokens
			}
			if p == fleet.Batch {
				e.batchTaken++
			}
			e.finish(&mr, rr)
			return
		}
		if mdue.After(latest) {
			e.refused++
			e.leave(mt, rt)
			return
		}
		if p == fleet.Batch {
			e.slots++
			if e.rng.IntN(5) == 0 { // it gives up
				e.gaveUp++
				e.leave(mt, rt)
				return
			}
		}
		e.waited++
		e.now = later(mdue, rdue)
		e.checkState()
	}
	e.fatalf("a %v request still waits after 20 asks", p)
}

// leave takes a batch request out of the line on both sides.
func (e *eqRun) leave(mt *ratelimit.Ticket, rt *fleet.RateTicket) {
	e.t.Helper()
	if mt == nil {
		return
	}
	e.mem.Leave(mt)
	if err := e.rb.Leave(e.ctx, e.now, rt); err != nil {
		e.fatalf("Leave: %v", err)
	}
	if !mt.Slot.IsZero() || !rt.Slot.IsZero() {
		e.fatalf("slots after Leave: memory %v, redis %v", mt.Slot, rt.Slot)
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// finish observes (or not) and settles (or not) a reservation on both
// sides, the time moving on in between.
func (e *eqRun) finish(mr *ratelimit.Reservation, rr fleet.RateReservation) {
	e.t.Helper()
	e.advance()
	if e.rng.IntN(4) != 0 {
		o := e.observation()
		e.observed++
		e.mem.Observe(e.now, mr, ratelimit.Observation{Has: o.Has, Limit: ratelimit.Amounts(o.Limit), Remaining: ratelimit.Amounts(o.Remaining)})
		if err := e.rb.Observe(e.ctx, e.now, rr, o); err != nil {
			e.fatalf("Observe: %v", err)
		}
		e.checkState()
		e.advance()
	}
	var used fleet.RateAmounts
	var known [3]bool
	switch e.rng.IntN(5) {
	case 0: // never sent: everything back
		known = [3]bool{true, true, true}
	case 1: // failed: the output back
		known[2] = true
	case 2: // no usage: stands as taken
	default:
		c := mr.Cost()
		used = fleet.RateAmounts{1, math.Floor(c[1] * (0.5 + e.rng.Float64())), math.Floor(c[2] * e.rng.Float64())}
		known = [3]bool{true, true, true}
	}
	e.mem.Settle(mr, e.now, ratelimit.Amounts(used), known)
	if err := e.rb.Settle(e.ctx, e.now, rr, used, known); err != nil {
		e.fatalf("Settle: %v", err)
	}
	if rr.Taken() {
		e.fatalf("a settled reservation is still taken")
	}
	// A second settle changes nothing.
	if err := e.rb.Settle(e.ctx, e.now, rr, fleet.RateAmounts{}, [3]bool{true, true, true}); err != nil {
		e.fatalf("second Settle: %v", err)
	}
	e.checkState()
}

// TestBucketsMatchInMemory runs random sequences of operations, at
// virtual times, on the Redis buckets and on internal/ratelimit's group
// (without its estimate of other traffic), each reservation observed and
// settled before the next is made: every decision must be the same, every
// due time, slot and pause within a microsecond, every level and limit
// within a millionth.
func TestBucketsMatchInMemory(t *testing.T) {
	srv := redistest.Start(t)
	client := newClient1(t, srv.Addr)
	store := newStore(t, client, "equiv")
	ctx := context.Background()
	cases := []equivCase{
		{fleet.RateLimits{RequestsPerMinute: 50, InputTokensPerMinute: 40000, OutputTokensPerMinute: 8000}, 0.8, fleet.RateAmounts{50, 40000, 8000}},
		{fleet.RateLimits{}, 0.8, fleet.RateAmounts{50, 30000, 9000}},
		{fleet.RateLimits{RequestsPerMinute: 7}, 1, fleet.RateAmounts{20, 25000, 7000}},
		{fleet.RateLimits{OutputTokensPerMinute: 3000}, 0.5, fleet.RateAmounts{37, 45000, 16000}},
		{fleet.RateLimits{}, 0.3, fleet.RateAmounts{13, 17000, 6000}},
	}
	var total eqRun
	for i, c := range cases {
		for seed := range 4 {
			t.Run(fmt.Sprintf("case%d/seed%d", i, seed), func(t *testing.T) {
				st := fleet.LimitSettings{Group: fmt.Sprintf("eq-%d-%d", i, seed), Limits: c.limits, BatchShare: c.share}
				l := c.limits
				e := &eqRun{
					t: t, rng: rand.New(rand.NewPCG(uint64(i), uint64(seed))), ctx: ctx,
					now: base.Add(time.Duration(seed) * time.Hour),
					mem: ratelimit.New(ratelimit.Settings{
						Limits:     ratelimit.Amounts{float64(l.RequestsPerMinute), float64(l.InputTokensPerMinute), float64(l.OutputTokensPerMinute)},
						BatchShare: c.share,
					}),
					rb: newBuckets(t, store, st), c: c, api: c.api,
				}
				e.checkState()
				for e.step = range 250 {
					switch n := e.rng.IntN(20); {
					case n < 9:
						e.request(fleet.Interactive)
					case n < 15:
						e.request(fleet.Batch)
					case n < 17:
						at := e.now.Add(time.Duration(e.rng.Int64N(5000)) * time.Millisecond)
						cost := e.cost()
						p := fleet.Priority(e.rng.IntN(2))
						md := e.mem.Admits(e.now, at, ratelimit.Amounts(cost), ratelimit.Priority(p))
						rd, err := e.rb.Admits(ctx, e.now, at, cost, p)
						if err != nil {
							e.fatalf("Admits: %v", err)
						}
						e.sameTime(fmt.Sprintf("Admits(%v, +%v)", p, at.Sub(e.now)), md, rd)
					case n < 18:
						var named [3]bool
						for k := range named {
							named[k] = e.rng.IntN(2) == 0
						}
						until := e.now.Add(time.Duration(e.rng.Int64N(15_000)) * time.Millisecond)
						e.paused++
						e.mem.Pause(e.now, named, until)
						if err := e.rb.Pause(ctx, e.now, named, until); err != nil {
							e.fatalf("Pause: %v", err)
						}
					default:
						e.advance()
					}
					e.checkState()
				}
				total.taken += e.taken
				total.waited += e.waited
				total.refused += e.refused
				total.observed += e.observed
				total.paused += e.paused
				total.batchTaken += e.batchTaken
				total.slots += e.slots
				total.debt += e.debt
				total.gaveUp += e.gaveUp
				total.maxDiff = max(total.maxDiff, e.maxDiff)
			})
		}
	}
	t.Logf("%d taken (%d batch, %d into debt), %d waits (%d batch slots, %d given up), %d refused, %d observed, %d pauses; times at most %v apart",
		total.taken, total.batchTaken, total.debt, total.waited, total.slots, total.gaveUp, total.refused, total.observed, total.paused, total.maxDiff)
	if !t.Failed() && (total.taken < 500 || total.batchTaken < 100 || total.waited < 100 || total.slots < 50 || total.gaveUp < 10 || total.debt < 50 || total.refused < 50 || total.paused < 50) {
		t.Fatalf("the sequences left a path little exercised")
	}
}

// TestBucketsRedisKilledAndRestarted kills Redis in the middle of a run and
// starts it again, empty, on the same port. No call waits past the
// timeout; while Redis is gone the local buckets decide, and they heard
// this process's traffic all along: they know the limit learned through
// Redis and what was taken. A reservation Redis made and settled during
// the outage fails to settle there, and is settled all the same. Once
// Redis answers again the group is shared again, as a new one.
func TestBucketsRedisKilledAndRestarted(t *testing.T) {
	eachClientKind(t, func(t *testing.T, ctxTimeout bool) {
		srv := redistest.Start(t)
		client := newClientWith(t, &redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: ctxTimeout})
		store, err := redisstore.New(client, redisstore.Options{Name: "killed-rl", Timeout: outageTimeout})
		mustNil(t, err)
		b := newBuckets(t, store, fleet.LimitSettings{Group: "claude-sonnet-4", BatchShare: 0.8})
		ctx, now := context.Background(), base.Add(3*time.Second)
		cost := fleet.RateAmounts{1, 100, 50}

		// Shared: the first response teaches the limit, 10 a minute, 9 left.
		r, _, err := b.Reserve(ctx, now, cost, fleet.Interactive, now, nil)
		if err != nil || !r.Taken() {
			t.Fatalf("shared Reserve = %v, %v", r.Taken(), err)
		}
		mustNil(t, b.Observe(ctx, now, r, fleet.RateObservation{Has: [3]bool{true}, Limit: fleet.RateAmounts{10}, Remaining: fleet.RateAmounts{9}}))
		mustNil(t, b.Settle(ctx, now, r, cost, [3]bool{true, true, true}))
		open, _, err := b.Reserve(ctx, now, cost, fleet.Interactive, now, nil) // settled during the outage
		if err != nil || !open.Taken() {
			t.Fatalf("shared Reserve = %v, %v", open.Taken(), err)
		}
		st, err := b.State(ctx, now)
		if err != nil || st[0].Limit != 10 || !st[0].Learned || st[0].Remaining != 8 {
			t.Fatalf("shared State = %+v, %v; want 10 learned, 8 left", st[0], err)
		}

		srv.Kill()
		bound := outageTimeout + slack
		// Settling is queued: the batch that carries it fails, and the
		// store falls back.
		timed(t, "Settle with Redis down", bound, func() { err = b.Settle(ctx, now, open, cost, [3]bool{true, true, true}) })
		mustNil(t, err)
		timed(t, "Flush with Redis down", bound, func() { mustNil(t, store.Flush(ctx)) })
		if open.Taken() || store.State() != redisstore.StateFallback {
			t.Fatalf("Settle with Redis down: taken %v, state %v; want settled, fallback", open.Taken(), store.State())
		}
		taken := 0
		for i := range 12 {
			var r fleet.RateReservation
			var due time.Time
			timed(t, "Reserve with Redis down", bound, func() { r, due, err = b.Reserve(ctx, now, cost, fleet.Interactive, now, nil) })
			if err == nil {
				t.Fatalf("Reserve %d with Redis down returned no error", i)
			}
			if r.Taken() {
				taken++
				if due.After(now) {
					t.Fatalf("Reserve %d with Redis down took, due %v", i, due.Sub(now))
				}
				timed(t, "Observe with Redis down", bound, func() { err = b.Observe(ctx, now, r, fleet.RateObservation{}) })
				timed(t, "Settle with Redis down", bound, func() { err = b.Settle(ctx, now, r, cost, [3]bool{true, true, true}) })
				if err != nil || r.Taken() {
					t.Fatalf("Settle of a local reservation = %v, taken %v", err, r.Taken())
				}
			}
		}
		// The local buckets learned the limit with Redis's first response,
		// and heard the reservation that was open: 8 left.
		if taken != 8 {
			t.Fatalf("%d reservations took with Redis down, want 8, what the local buckets had left", taken)
		}
		timed(t, "State with Redis down", bound, func() { st, err = b.State(ctx, now) })
		if err == nil || st[0].Limit != 10 || !st[0].Learned {
			t.Fatalf("State with Redis down = %+v, %v; want the local buckets' learned limit and an error", st[0], err)
		}
		timed(t, "Pause with Redis down", bound, func() { err = b.Pause(ctx, now, [3]bool{true}, now.Add(time.Second)) })
		if err == nil {
			t.Fatal("Pause with Redis down returned no error")
		}
		var until time.Time
		timed(t, "PausedUntil with Redis down", bound, func() { until, err = b.PausedUntil(ctx, now) })
		if err == nil || !until.Equal(now.Add(time.Second)) {
			t.Fatalf("PausedUntil with Redis down = %v, %v; want the local pause and an error", until, err)
		}
		timed(t, "Admits with Redis down", bound, func() { _, err = b.Admits(ctx, now, now, cost, fleet.Batch) })
		if err == nil {
			t.Fatal("Admits with Redis down returned no error")
		}
		if s := store.Stats(); s.State != redisstore.StateFallback || s.Fallbacks != 1 {
			t.Fatalf("Stats with Redis down = %+v", s)
		}

		srv.Restart()
		later := now.Add(2 * time.Second)
		deadline := time.Now().Add(5 * time.Second)
		for {
			st, err = b.State(ctx, later)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("State still fails 5 s after Redis restarted: %v", err)
			}
			time.Sleep(outageTimeout / 5) // a real server is awaited
		}
		// Redis came back empty: a new group, its limit unknown.
		if st[0].Limit != 0 || store.State() != redisstore.StateShared {
			t.Fatalf("State after the restart = %+v, store %v; want a new group, shared", st[0], store.State())
		}
		r, _, err = b.Reserve(ctx, later, cost, fleet.Interactive, later, nil)
		if err != nil || !r.Taken() {
			t.Fatalf("Reserve after the restart = %v, %v", r.Taken(), err)
		}
		mustNil(t, b.Settle(ctx, later, r, cost, [3]bool{true, true, true}))
	})
}

// TestBucketsKeys checks the key of a group, its escaping, its expiry and
// that a group made with configured limits starts full.
func TestBucketsKeys(t *testing.T) {
	if got, want := redisstore.BucketsKey("app", "claude sonnet%4"), "damper:{app}:ratelimit:claude%20sonnet%254"; got != want {
		t.Fatalf("BucketsKey = %q, want %q", got, want)
	}
	srv := redistest.Start(t)
	client := newClient1(t, srv.Addr)
	store := newStore(t, client, "keys")
	if _, err := store.LimitBuckets(fleet.LimitSettings{}); err == nil {
		t.Fatal("LimitBuckets without a group returned no error")
	}
	b := newBuckets(t, store, fleet.LimitSettings{Group: "g", Limits: fleet.RateLimits{RequestsPerMinute: 30}, BatchShare: 0.8})
	ctx, now := context.Background(), base
	st, err := b.State(ctx, now)
	if err != nil || st[0].Limit != 30 || st[0].Remaining != 30 || st[0].Learned {
		t.Fatalf("a new configured group: %+v, %v", st[0], err)
	}
	r, _, err := b.Reserve(ctx, now, fleet.RateAmounts{1}, fleet.Interactive, now, nil)
	if err != nil || !r.Taken() {
		t.Fatalf("Reserve = %v, %v", r.Taken(), err)
	}
	// A configured limit is not changed by a response.
	mustNil(t, b.Observe(ctx, now, r, fleet.RateObservation{Has: [3]bool{true, true}, Limit: fleet.RateAmounts{50, 1000}, Remaining: fleet.RateAmounts{20, 900}}))
	st, err = b.State(ctx, now)
	if err != nil || st[0].Limit != 30 || st[0].Remaining != 20 || st[1].Limit != 1000 || !st[1].Learned {
		t.Fatalf("after Observe: %+v, %v", st, err)
	}
	ttl, err := client.PTTL(ctx, redisstore.BucketsKey("keys", "g")).Result()
	// 10 requests to refill at 30 a minute: 20 s, then 5 minutes.
	if err != nil || ttl <= 5*time.Minute || ttl > 5*time.Minute+25*time.Second {
		t.Fatalf("the key expires in %v (%v), want about 5m20s", ttl, err)
	}
}

// TestBucketsHugeRequestHoldsOneLimit checks that a request asking for far
// more than a shared bucket (a max_tokens of 1e12) takes the bucket's limit
// and no more: the fleet's ordinary requests after it wait for their own
// tokens, and settling it by what it used leaves exactly that taken. A
// limit learned while such a request is open counts it for one limit.
func TestBucketsHugeRequestHoldsOneLimit(t *testing.T) {
	srv := redistest.Start(t)
	store := newStore(t, newClient1(t, srv.Addr), "huge")
	ctx, now := context.Background(), base
	b := newBuckets(t, store, fleet.LimitSettings{Group: "g", Limits: fleet.RateLimits{OutputTokensPerMinute: 12000}, BatchShare: 0.8})
	huge, due, err := b.Reserve(ctx, now, fleet.RateAmounts{1, 100, 1e12}, fleet.Interactive, now, nil)
	if err != nil || !huge.Taken() || !due.Equal(now) {
		t.Fatalf("huge Reserve = %v at %v, %v", huge.Taken(), due.Sub(now), err)
	}
	small := fleet.RateAmounts{1, 100, 200}
	var rs []fleet.RateReservation
	for i := range 10 {
		r, due, err := b.Reserve(ctx, now, small, fleet.Interactive, now.Add(30*time.Second), nil)
		if want := now.Add(time.Duration(i+1) * time.Second); err != nil || !r.Taken() || !due.Equal(want) {
			t.Fatalf("request %d: taken %v due +%v, %v; want due +%v", i, r.Taken(), due.Sub(now), err, want.Sub(now))
		}
		rs = append(rs, r)
	}
	// It used 500: of the 12000 it held, all but those go back.
	now = now.Add(5 * time.Second)
	mustNil(t, b.Settle(ctx, now, huge, fleet.RateAmounts{1, 100, 500}, [3]bool{true, true, true}))
	for _, r := range rs {
		mustNil(t, b.Settle(ctx, now, r, small, [3]bool{true, true, true}))
	}
	st, err := b.State(ctx, now)
	if err != nil || st[2].Remaining != 12000-2000+1000-500 {
		t.Fatalf("output bucket %+v, %v; want 10500", st[2], err)
	}

	// Learning: r's response counts nothing taken after it; the huge one
	// taken after it, while the limit was unknown, counts for 20000.
	l := newBuckets(t, store, fleet.LimitSettings{Group: "learn", BatchShare: 0.8})
	r, _, err := l.Reserve(ctx, now, fleet.RateAmounts{1, 100, 1000}, fleet.Interactive, now, nil)
	mustNil(t, err)
	_, _, err = l.Reserve(ctx, now, fleet.RateAmounts{1, 100, 1e12}, fleet.Interactive, now, nil)
	mustNil(t, err)
	mustNil(t, l.Observe(ctx, now, r, fleet.RateObservation{Has: [3]bool{true, true, true},
		Limit: fleet.RateAmounts{50, 10000, 20000}, Remaining: fleet.RateAmounts{40, 9000, 15000}}))
	due, err = l.Admits(ctx, now, now, fleet.RateAmounts{1, 100, 200}, fleet.Interactive)
	// 15000 less 20000 leaves -5000: 5200 refill in 15.6 s.
	if err != nil || !due.Equal(now.Add(15600*time.Millisecond)) {
		t.Fatalf("Admits after learning = +%v, %v; want +15.6s", due.Sub(now), err)
	}
}

// TestBucketsBatchLeave checks that batch requests that give up leave the
// shared batch line: after twenty waiting requests leave, first to last,
// the next waits for its own tokens only; one leaving from the middle
// keeps the slots behind it.
func TestBucketsBatchLeave(t *testing.T) {
	srv := redistest.Start(t)
	store := newStore(t, newClient1(t, srv.Addr), "leave")
	ctx, now := context.Background(), base
	b := newBuckets(t, store, fleet.LimitSettings{Group: "g", Limits: fleet.RateLimits{RequestsPerMinute: 60}, BatchShare: 0.8})
	cost := fleet.RateAmounts{1, 0, 0}
	for range 48 { // down to the interactive reserve, 12
		r, _, err := b.Reserve(ctx, now, cost, fleet.Batch, now, new(fleet.RateTicket))
		if err != nil || !r.Taken() {
			t.Fatalf("Reserve = %v, %v", r.Taken(), err)
		}
	}
	wait := func(want time.Duration) *fleet.RateTicket {
		t.Helper()
		tk := new(fleet.RateTicket)
		r, due, err := b.Reserve(ctx, now, cost, fleet.Batch, now.Add(time.Hour), tk)
		if err != nil || r.Taken() || !due.Equal(now.Add(want)) || !tk.Slot.Equal(due) {
			t.Fatalf("Reserve = taken %v due +%v slot %v, %v; want a slot at +%v", r.Taken(), due.Sub(now), tk.Slot, err, want)
		}
		return tk
	}
	var tks []*fleet.RateTicket
	for i := range 20 {
		tks = append(tks, wait(time.Duration(i+1)*time.Second))
	}
	for _, tk := range tks {
		mustNil(t, b.Leave(ctx, now, tk))
		if !tk.Slot.IsZero() {
			t.Fatalf("slot after Leave: %v", tk.Slot)
		}
	}
	first := wait(time.Second)
	mid := wait(2 * time.Second)
	last := wait(3 * time.Second)
	mustNil(t, b.Leave(ctx, now, mid))
	wait(4 * time.Second)
	_ = first
	_ = last
}

// TestBucketsKnownState: KnownState answers from the shared buckets as
// the last Reserve heard them, refilled since, with no round trip; before
// any, from the local twin.
func TestBucketsKnownState(t *testing.T) {
	srv := redistest.Start(t)
	ctx, now := context.Background(), base
	settings := fleet.LimitSettings{Group: "g", Limits: fleet.RateLimits{RequestsPerMinute: 60}, BatchShare: 0.8}
	known := func(b fleet.LimitBuckets, at time.Time) fleet.RateLimitState {
		t.Helper()
		kb, ok := b.(interface {
			KnownState(time.Time) [3]fleet.RateLimitState
		})
		if !ok {
			t.Fatalf("%T has no KnownState", b)
		}
		return kb.KnownState(at)[0]
	}
	one := newBuckets(t, newStore(t, newClient1(t, srv.Addr), "known"), settings)
	other := newBuckets(t, newStore(t, newClient1(t, srv.Addr), "known"), settings)
	if st := known(one, now); st.Limit != 60 || st.Remaining != 60 || st.Learned {
		t.Fatalf("before any Reserve: %+v; want the twin's, 60 of 60, configured", st)
	}
	if _, _, err := other.Reserve(ctx, now, fleet.RateAmounts{10, 0, 0}, fleet.Interactive, now, nil); err != nil {
		t.Fatal(err)
	}
	if st := known(one, now); st.Remaining != 60 {
		t.Fatalf("after the other's Reserve: %v remaining; want 60, as nothing was heard", st.Remaining)
	}
	if _, _, err := one.Reserve(ctx, now, fleet.RateAmounts{5, 0, 0}, fleet.Interactive, now, nil); err != nil {
		t.Fatal(err)
	}
	if st := known(one, now); st.Limit != 60 || st.Remaining != 45 {
		t.Fatalf("after its own Reserve: %+v; want the fleet's 45 of 60", st)
	}
	// Refilled at the limit: 10 s of 60 a minute.
	if st := known(one, now.Add(10*time.Second)); st.Remaining != 55 {
		t.Fatalf("10 s on: %v remaining; want 55", st.Remaining)
	}
	if st := known(one, now.Add(time.Minute)); st.Remaining != 60 {
		t.Fatalf("a minute on: %v remaining; want 60, the limit", st.Remaining)
	}
}
