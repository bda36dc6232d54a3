package redisstore

import (
	"context"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/fleet/inorder"
)

// BreakerKey returns the Redis key that holds the circuit breaker of the
// store named name: damper:{name}:breaker.
func BreakerKey(name string) string { return "damper:{" + name + "}:breaker" }

// LocalTicket is the bit of [fleet.CircuitTicket].Generation that marks a
// ticket of the local breaker, which decides while Redis fails: Done gives
// such a ticket back to the local breaker, whatever the state of Redis.
// The shared breaker's generations never reach it.
const LocalTicket = uint64(1) << 63

// breakerSlack is the breaker in memory's ratioSlack (the root module's
// internal/breaker, which no other module may import), copied: it absorbs
// the rounding of FailureRatio × total, and the two must count alike.
const breakerSlack = 1 - 1e-12

// Breaker implements [fleet.BreakerStore]: a circuit breaker shared by every
// process that gives the same Name, with the state machine of
// fleet.MemoryStore's breaker (internal/breaker) for the whole fleet:
// failures reported by any process open it for all, the open period
// doubles after each failed probe up to MaxOpenFor, and, half-open, the
// fleet sends one probe at a time. A refusal tells when to ask again as
// in memory: when the open period ends, or when the probe in flight is
// due to answer (ProbeLimit after it started, or its caller's deadline if
// sooner), never later than the current open period from now.
//
// # Keys and round trips
//
// The breaker is one hash, damper:{<Name>}:breaker (see [BreakerKey]), on
// the Name's Cluster slot: its state, generation, open period, the end of
// the open period, the probe's start and when its answer is due, the 30
// buckets of the closed state's window with the slice each counts, the
// newest slice counted, and the key's incarnation (below). Each Allow, RefusesAt and State is one round
// trip, each failure's Done as well, before Done returns, and any other
// Done a record queued for the store's next batch (see the package
// documentation): one Lua script runs the state machine on it. Times are the
// Damper's clock's, never Redis's TIME, passed as whole microseconds since
// the Unix epoch (exact for dates within 142 years of 1970, since Lua's
// numbers are doubles); the window's slices are numbered in Window/30
// since the epoch, from the time to the nanosecond as internal/breaker
// does, which is exact while a slice is at least about 1 µs (a Window of
// at least 31 µs). A breaker in memory numbers its slices from the first
// attempt it counted instead: the two count alike when that attempt falls
// on a slice's edge. Clocks that disagree across the fleet move the
// state's times by their skew; a time before the newest slice counted is
// counted in that slice, as in memory.
//
// Every write sets the key to expire after 3 × max(MaxOpenFor, Window)
// (at least a second) of Redis's time: a breaker nobody uses disappears,
// and a missing key is a closed breaker that has counted nothing. Closed
// and idle, a breaker costs reads only.
//
// # Changes of state
//
// Every reply tells the state and generation after the operation, and
// each process keeps the newest it has seen. When a reply shows a newer
// generation, OnChange hears one change: From the state last seen, To the
// reply's, At the operation's now, and NextProbe the end of the open
// period for a change to open; in order, one at a time, with no lock held.
// Changes made by other processes between two replies collapse into one:
// a process that saw closed and then open heard nothing of the states in
// between, and a collapsed change that ends where it began is heard only
// when it ends open (a new open period). A key that expired or that a
// restarted Redis lost begins a new incarnation, ordered by the time it
// was made, so generations that start again from zero still count as
// newer.
//
// # When Redis fails
//
// While Redis fails (see [Store.State]) a local breaker, fleet.MemoryStore's,
// with the same settings decides, and the error is returned as well. It
// hears only what happens while it decides: its window starts empty, and
// the fleet's never hears of the attempts it admitted. Its tickets carry
// [LocalTicket] in their generation, so that Done gives them back to it
// even after Redis answers again, and its changes of state reach OnChange
// through the same queue. [Options.FailClosed] does not apply: refusing
// every attempt while Redis is down would turn an outage of Redis into an
// outage of the API.
func (s *Store) Breaker(st fleet.BreakerSettings) (fleet.Breaker, error) {
	b := &sharedBreaker{link: s.link, keys: []string{BreakerKey(s.link.name)}, onChange: st.OnChange, lastState: fleet.CircuitClosed}
	// The local breaker validates the settings, as damper does, and tells
	// its changes through b's queue.
	ls := st
	if st.OnChange != nil {
		ls.OnChange = func(c fleet.CircuitChange) {
			b.mu.Lock()
			b.changes.Add(c)
			b.unlockAndDeliver()
		}
	}
	local, err := fleet.MemoryStore{}.Breaker(ls)
	if err != nil {
		return nil, err
	}
	b.local = local
	p := st // MemoryStore has checked the values
	b.slice = max(int64(p.Window)/30, 1)
	ttl := time.Duration(math.MaxInt64)
	if longest := max(p.MaxOpenFor, p.Window); longest < ttl/3 {
		ttl = max(3*longest, time.Second)
	}
	b.settings = []any{
		brkMicros(p.OpenFor), brkMicros(p.MaxOpenFor), brkMicros(max(st.ProbeLimit, 0)),
		strconv.Itoa(p.MinAttempts),
		strconv.FormatFloat(p.FailureRatio, 'g', -1, 64),
		strconv.FormatFloat(breakerSlack, 'g', -1, 64),
		strconv.FormatInt(ttl.Milliseconds(), 10),
	}
	return b, nil
}

// brkOverdue is fleet.CircuitOverdueWait, as the script reads it.
var brkOverdue = brkMicros(fleet.CircuitOverdueWait)

// brkMicros returns d in whole microseconds, rounded up, as the script reads
// it.
func brkMicros(d time.Duration) string {
	return strconv.FormatInt(int64((d+time.Microsecond-1)/time.Microsecond), 10)
}

// sharedBreaker is a circuit breaker kept in Redis.
type sharedBreaker struct {
	link     *link
	keys     []string
	slice    int64 // a window slice, in nanoseconds
	settings []any // ARGV[8:15] of breakerScript
	local    fleet.Breaker
	onChange func(fleet.CircuitChange)

	mu sync.Mutex
	// The newest state seen in a reply.
	lastInc   int64
	lastGen   int64
	lastState fleet.CircuitState
	changes   inorder.Delivery[fleet.CircuitChange] // for onChange
}

var _ fleet.Breaker = (*sharedBreaker)(nil)

// breakerReply is what breakerScript returns.
type breakerReply struct {
	ok, probe bool
	next      int64
	gen       int64
	state     fleet.CircuitState
	openUntil int64
	inc       int64
}

// run runs breakerScript for op at now; x, probe and verdict are ARGV[4:7],
// and ctx's deadline Allow's.
func (b *sharedBreaker) run(ctx context.Context, name, op string, now time.Time, x int64, probe bool, v fleet.CircuitVerdict) (breakerReply, error) {
	args := b.args(op, now, x, probe, v)
	if deadline, ok := ctx.Deadline(); ok && op == "a" {
		args[14] = deadline.UnixMicro()
	}
	raw, err := b.link.run(ctx, name, breakerScript, b.keys, args...)
	if err != nil {
		return breakerReply{}, err
	}
	return b.read(name, now, raw)
}

// args are breakerScript's arguments for op at now.
func (b *sharedBreaker) args(op string, now time.Time, x int64, probe bool, v fleet.CircuitVerdict) []any {
	b.mu.Lock()
	lastInc := b.lastInc
	b.mu.Unlock()
	p := "0"
	if probe {
		p = "1"
	}
	args := make([]any, 0, 16)
	args = append(args, op, now.UnixMicro(), brkFloorDiv(now.UnixNano(), b.slice), x, p, int(v), lastInc)
	args = append(args, b.settings...)
	return append(args, "", brkOverdue)
}

// read reads breakerScript's reply raw to an operation at now.
func (b *sharedBreaker) read(name string, now time.Time, raw any) (breakerReply, error) {
	r, err := b.link.ints(name, raw, 7)
	if err != nil {
		return breakerReply{}, err
	}
	reply := breakerReply{ok: r[0] == 1, probe: r[1] == 1, next: r[2], gen: r[3], state: fleet.CircuitState(r[4]), openUntil: r[5], inc: r[6]}
	b.saw(now, reply)
	return reply, nil
}

func brkFloorDiv(a, b int64) int64 {
	q := a / b
	if a%b < 0 {
		q--
	}
	return q
}

// brkTime returns the script's time t, in microseconds, in now's location.
func brkTime(t int64, now time.Time) time.Time { return time.UnixMicro(t).In(now.Location()) }

// saw records the state a reply shows, and delivers the change it makes.
func (b *sharedBreaker) saw(now time.Time, r breakerReply) {
	b.mu.Lock()
	if r.inc < b.lastInc || r.inc == b.lastInc && r.gen <= b.lastGen {
		b.mu.Unlock()
		return
	}
	from := b.lastState
	b.lastInc, b.lastGen, b.lastState = r.inc, r.gen, r.state
	if b.onChange != nil && (from != r.state || r.state == fleet.CircuitOpen) {
		c := fleet.CircuitChange{From: from, To: r.state, At: now}
		if r.state == fleet.CircuitOpen {
			c.NextProbe = brkTime(r.openUntil, now)
		}
		b.changes.Add(c)
	}
	b.unlockAndDeliver()
}

// unlockAndDeliver releases mu and delivers the pending changes to
// onChange, in order (see inorder.Delivery).
func (b *sharedBreaker) unlockAndDeliver() { b.changes.UnlockAndDeliver(&b.mu, b.onChange) }

// Allow implements [fleet.Breaker]: one round trip, or, while Redis
// fails, the local breaker's answer, with a ticket marked [LocalTicket].
func (b *sharedBreaker) Allow(ctx context.Context, now time.Time) (fleet.CircuitAdmission, error) {
	r, err := b.run(ctx, "breaker_allow", "a", now, 0, false, 0)
	if err != nil {
		a, _ := b.local.Allow(ctx, now)
		a.Ticket.Generation |= LocalTicket
		return a, err
	}
	a := fleet.CircuitAdmission{OK: r.ok, State: r.state, Ticket: fleet.CircuitTicket{Generation: uint64(r.gen), Probe: r.probe}}
	if !r.ok {
		a.NextProbe = brkTime(r.next, now)
	}
	return a, nil
}

// RefusesAt implements [fleet.Breaker]: one round trip, or, while Redis
// fails, the local breaker's answer.
func (b *sharedBreaker) RefusesAt(ctx context.Context, now, later time.Time) (bool, time.Time, error) {
	r, err := b.run(ctx, "breaker_refuses_at", "r", now, later.UnixMicro(), false, 0)
	if err != nil {
		refused, next, _ := b.local.RefusesAt(ctx, now, later)
		return refused, next, err
	}
	var next time.Time
	if r.probe {
		next = brkTime(r.next, now)
	}
	return r.ok, next, nil
}

// Done implements [fleet.Breaker]: a ticket of the local breaker goes
// back to it. A failure reaches Redis before Done returns (one round trip,
// or the batch after the one in flight, bounded by the timeout), so that
// the next Allow of any process counts it: a fleet's breaker opens after
// the attempts one breaker admits, not up to one more per process. Any
// other verdict, which can only delay opening, is queued for the store's
// next batch (see the package documentation). Either is lost if Redis
// fails. The reply's change of state reaches OnChange from Done's
// goroutine for a failure, from the goroutine that sent the batch
// otherwise.
func (b *sharedBreaker) Done(ctx context.Context, t fleet.CircuitTicket, now time.Time, v fleet.CircuitVerdict) error {
	if t.Generation&LocalTicket != 0 {
		t.Generation &^= LocalTicket
		return b.local.Done(ctx, t, now, v)
	}
	gen, probe := int64(t.Generation), t.Probe
	// The incarnation goes as the batch is sent: the newest heard by then.
	build := func() []any { return b.args("d", now, gen, probe, v) }
	if v == fleet.CircuitFailure {
		raw, err := b.link.recordNow(ctx, "breaker_done", breakerScript, b.keys, build)
		if err != nil {
			return err
		}
		_, err = b.read("breaker_done", now, raw)
		return err
	}
	return b.link.record(ctx, "breaker_done", breakerScript, b.keys, nil, build, func(raw any, err error) {
		if err == nil {
			_, _ = b.read("breaker_done", now, raw)
		}
	})
}

// State implements [fleet.Breaker]: one round trip, or, while Redis
// fails, the local breaker's state.
func (b *sharedBreaker) State(ctx context.Context, now time.Time) (fleet.CircuitState, error) {
	r, err := b.run(ctx, "breaker_state", "s", now, 0, false, 0)
	if err != nil {
		s, _ := b.local.State(ctx, now)
		return s, err
	}
	return r.state, nil
}
