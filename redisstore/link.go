package redisstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// link is the way to Redis of a budget or a store, and what is known of
// Redis's health: every part made by one store shares it, so that they fall
// back together, probe once and come back together.
//
// It is up (shared), down (in fallback), or down with a probe in flight:
// one operation at a time, by compare-and-swap, and none sooner than
// probeEvery after the last one ended. A switch needs news of Redis: a
// failure switches to the fallback only when Redis has answered nothing
// since the failed operation began (an answer in between says that
// operation's connection or queue failed, not Redis), and only a probe,
// sent after the fallback began, switches back. So an answer or a failure
// that comes late from the state before moves nothing, and one outage
// makes one fallback and one return.
type link struct {
	client     redis.UniversalClient
	name       string // the namespace, for errors and logs
	subject    string // what falls back, for the log lines: "retry budget"
	attr       string // the log attribute that names it: "budget"
	timeout    time.Duration
	inline     bool // the client gives up at the context's deadline itself
	probeEvery time.Duration
	failClosed bool
	log        *slog.Logger

	// Times are in nanoseconds since start, with its monotonic reading.
	start     time.Time
	down      atomic.Bool  // in fallback
	probing   atomic.Bool  // a probe's round trip is in flight
	nextProbe atomic.Int64 // when the next probe may start
	answered  atomic.Int64 // when Redis last answered within the timeout

	// Membership (see members.go): this store's ID, the count last heard,
	// and when the next refresh may go.
	member   string
	members  atomic.Int64
	nextJoin atomic.Int64

	mu    sync.Mutex // orders the switches and their log lines
	since time.Time  // when the current fallback began
	cause error      // the failure that began it

	fallbacks, recoveries, failures, unasked, dropped atomic.Uint64

	// The queue of records, and of the decisions that wait for a batch in
	// flight: at most one batch is in flight, so that Redis runs every
	// operation in the order it was queued (see record and run).
	qmu     sync.Mutex
	queue   []*queued
	records int           // records in queue
	sending bool          // a batch is in flight, or being made
	settled chan struct{} // closed when sending ends
	loaded  sync.Map      // *redis.Script: Redis has run it by EVAL
}

// QueueLimit is how many records a store's queue holds: a record that
// finds it full is dropped and counted ([Stats].Dropped), and the caller
// never waits.
const QueueLimit = 4096

// queued is an operation waiting in the queue: a record, or a decision
// whose caller waits for its reply.
type queued struct {
	op    string
	s     *redis.Script
	keys  []string
	args  []any
	build func() []any // when set, makes args as the batch is sent
	note  *callNote
	done  func(v any, err error) // a record's: hears its reply, on the sender's goroutine
	reply chan reply             // a decision's
	sent  bool                   // taken from the queue (under qmu)
}

// amend applies f to q, under the queue's lock, if q waits in the queue
// still, and reports whether it did.
func (l *link) amend(q *queued, f func(*queued)) bool {
	l.qmu.Lock()
	defer l.qmu.Unlock()
	if q.sent {
		return false
	}
	f(q)
	return true
}

func newLink(client redis.UniversalClient, o Options, subject, attr string) *link {
	timeout := orDefault(o.Timeout, DefaultTimeout)
	if n := clientRetries(client); n > 0 && o.Logger != nil {
		o.Logger.Warn("redisstore: the Redis client retries a failed command: a batch of records cut by a failover may be applied twice; give the store a client with MaxRetries: -1",
			slog.String(attr, o.Name), slog.Int("max_retries", n))
	}
	return &link{
		client:     client,
		name:       o.Name,
		subject:    subject,
		attr:       attr,
		timeout:    timeout,
		inline:     boundsItself(client),
		probeEvery: orDefault(o.ProbeInterval, timeout),
		failClosed: o.FailClosed,
		log:        o.Logger,
		start:      time.Now(),
		member:     newMemberID(),
	}
}

type reply struct {
	v   any
	err error
}

// run runs script s on keys with args, for a decision: its caller waits
// for the reply, bounded by the timeout. During a fallback only the probe
// asks Redis, and after one operation of a call has failed, the call's
// others do not ask it; those not asked get an error that matches
// ErrUnavailable at once.
//
// Redis runs it after every record queued before it: with an empty queue
// and no batch in flight it is one round trip of its own; otherwise it
// joins the queue, and the next batch carries the records and it in one
// pipeline (one round trip, after the one in flight, if any, ends).
func (l *link) run(ctx context.Context, op string, s *redis.Script, keys []string, args ...any) (any, error) {
	return l.runBuilt(ctx, op, s, keys, args, nil)
}

// recordNow sends a record that must reach Redis before the caller goes
// on, as a decision is sent, and returns its reply: at once, or in the
// batch after the one in flight. As for record, Redis is not asked in a
// fallback, and build, when set, makes the arguments as it is sent. The
// caller's cancellation does not cut it: the wait is the timeout's.
func (l *link) recordNow(ctx context.Context, op string, s *redis.Script, keys []string, build func() []any) (any, error) {
	if l.down.Load() {
		l.unasked.Add(1)
		return nil, l.unavailable(op)
	}
	return l.runBuilt(context.WithoutCancel(ctx), op, s, keys, nil, build)
}

// runBuilt is run, with build, when set, making the arguments as the
// operation is sent.
func (l *link) runBuilt(ctx context.Context, op string, s *redis.Script, keys []string, args []any, build func() []any) (any, error) {
	call, _ := ctx.Value(callKey{l}).(*callNote)
	if call != nil {
		if err := call.failed.Load(); err != nil {
			l.unasked.Add(1)
			return nil, fmt.Errorf("%w: %s on %q, after an earlier operation of the call failed: %w", ErrUnavailable, op, l.name, *err)
		}
	}
	if l.down.Load() {
		if !l.startProbe() {
			l.unasked.Add(1)
			return nil, l.unavailable(op)
		}
		// The records queued before the fallback are dropped: the probe
		// needs no order.
		if build != nil {
			args = build()
		}
		return l.roundTrip(ctx, call, op, s, keys, args, true)
	}
	l.qmu.Lock()
	if !l.sending && len(l.queue) == 0 {
		l.qmu.Unlock()
		if build != nil {
			args = build()
		}
		return l.roundTrip(ctx, call, op, s, keys, args, false)
	}
	if join := l.joinLocked(); join != nil {
		// The membership's refresh goes in the batch the decision joins.
		l.queue = append(l.queue, join)
	}
	q := &queued{op: op, s: s, keys: keys, args: args, build: build, note: call, reply: make(chan reply, 1)}
	l.queue = append(l.queue, q)
	lead := !l.sending
	if lead {
		l.startSending()
	}
	l.qmu.Unlock()
	began := l.now()
	if lead && l.inline {
		// The client bounds the batch itself: this goroutine sends it.
		l.pump(true)
	} else if lead {
		go l.pump(false)
	}
	var r reply
	// Bounded by two timeouts: the batch in flight, then its own.
	timer := time.NewTimer(2 * l.timeout)
	defer timer.Stop()
	select {
	case r = <-q.reply:
	case <-ctx.Done():
		return nil, fmt.Errorf("redisstore: %s on %q: %w", op, l.name, ctx.Err())
	case <-timer.C:
		r.err = fmt.Errorf("no answer within %v (the batch ahead of it, then its own): %w", 2*l.timeout, context.DeadlineExceeded)
		l.failSince(op, r.err, began)
	}
	if r.err != nil {
		err := r.err
		if !errors.Is(err, ErrUnavailable) {
			err = fmt.Errorf("redisstore: %s on %q: %w", op, l.name, r.err)
		}
		if call != nil {
			call.failed.CompareAndSwap(nil, &err)
		}
		return nil, err
	}
	return r.v, nil
}

// record queues script s on keys with args, for a record whose result no
// decision of the call waits on: the queue's next batch sends it, on a
// goroutine of the link's, and done, when set, hears its reply there. It
// returns at once: an error matching ErrUnavailable when Redis is not
// asked (as for run), or one saying the queue was full and the record
// dropped. build, when set, makes the arguments as the batch is sent.
func (l *link) record(ctx context.Context, op string, s *redis.Script, keys []string, args []any, build func() []any, done func(any, error)) error {
	return l.enqueue(ctx, &queued{op: op, s: s, keys: keys, args: args, build: build, done: done})
}

// enqueue queues record q, as record does.
func (l *link) enqueue(ctx context.Context, q *queued) error {
	op := q.op
	call, _ := ctx.Value(callKey{l}).(*callNote)
	q.note = call
	if call != nil {
		if err := call.failed.Load(); err != nil {
			l.unasked.Add(1)
			return fmt.Errorf("%w: %s on %q, after an earlier operation of the call failed: %w", ErrUnavailable, op, l.name, *err)
		}
	}
	if l.down.Load() {
		l.unasked.Add(1)
		return l.unavailable(op)
	}
	l.qmu.Lock()
	if l.records >= QueueLimit {
		l.qmu.Unlock()
		l.dropped.Add(1)
		return fmt.Errorf("redisstore: %s on %q: the queue holds %d records already: dropped", op, l.name, QueueLimit)
	}
	if join := l.joinLocked(); join != nil {
		l.queue = append(l.queue, join)
	}
	l.queue = append(l.queue, q)
	l.records++
	if !l.sending {
		l.startSending()
		go l.pump(false)
	}
	l.qmu.Unlock()
	return nil
}

// startSending claims the sending of batches; qmu held.
func (l *link) startSending() {
	l.sending = true
	l.settled = make(chan struct{})
}

// pump sends the queue's batches, one at a time, until the queue is
// empty; once, if once is set, handing the rest to a goroutine of its own.
func (l *link) pump(once bool) {
	for {
		l.qmu.Lock()
		batch := l.queue
		l.queue, l.records = nil, 0
		for _, q := range batch {
			q.sent = true
		}
		if len(batch) == 0 {
			l.sending = false
			close(l.settled)
			l.qmu.Unlock()
			return
		}
		l.qmu.Unlock()
		l.send(batch)
		if once {
			l.qmu.Lock()
			if len(l.queue) == 0 {
				l.sending = false
				close(l.settled)
			} else {
				go l.pump(false)
			}
			l.qmu.Unlock()
			return
		}
	}
}

// flush sends what is queued and waits for it, and for the batch in
// flight.
func (l *link) flush(ctx context.Context) error {
	for {
		l.qmu.Lock()
		if !l.sending && len(l.queue) == 0 {
			l.qmu.Unlock()
			return nil
		}
		settled := l.settled
		if !l.sending {
			l.startSending()
			settled = l.settled
			go l.pump(false)
		}
		l.qmu.Unlock()
		select {
		case <-settled:
		case <-ctx.Done():
			return fmt.Errorf("redisstore: Flush on %q: %w", l.name, ctx.Err())
		}
	}
}

// send sends batch as one pipeline (a second for the scripts Redis did not
// hold), bounded by the timeout, and hands each operation its reply. A
// failure counts against Redis as one operation's does.
func (l *link) send(batch []*queued) {
	replies := make([]reply, len(batch))
	live := make([]int, 0, len(batch)) // the operations that ask Redis
	for i, q := range batch {
		switch {
		case q.note != nil && q.note.failed.Load() != nil:
			l.unasked.Add(1)
			replies[i].err = fmt.Errorf("%w: %s on %q, after an earlier operation of the call failed: %w", ErrUnavailable, q.op, l.name, *q.note.failed.Load())
		case l.down.Load():
			l.unasked.Add(1)
			replies[i].err = l.unavailable(q.op)
		default:
			if q.build != nil {
				q.args = q.build()
			}
			live = append(live, i)
		}
	}
	if len(live) > 0 {
		began := l.now()
		ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
		cmds := l.pipeline(ctx, batch, live, false)
		var again []int // NOSCRIPT: Redis lost the script, or never had it
		for j, i := range live {
			if redis.HasErrorPrefix(cmds[j].Err(), "NOSCRIPT") {
				again = append(again, i)
			}
		}
		if len(again) > 0 {
			evals := l.pipeline(ctx, batch, again, true)
			for j, k := 0, 0; j < len(live) && k < len(again); j++ {
				if live[j] == again[k] {
					cmds[j] = evals[k]
					k++
				}
			}
		}
		cancel()
		answered := false
		for j, i := range live {
			v, err := cmds[j].Result()
			if err == nil {
				answered = true
			}
			replies[i] = reply{v, err}
		}
		if answered {
			l.answer()
		}
		for _, i := range live {
			if err := replies[i].err; err != nil {
				q := batch[i]
				l.failSince(q.op, err, began)
				werr := fmt.Errorf("redisstore: %s on %q: %w", q.op, l.name, err)
				if q.note != nil {
					q.note.failed.CompareAndSwap(nil, &werr)
				}
				if !answered {
					break // one failure of Redis, counted once
				}
			}
		}
	}
	for i, q := range batch {
		if q.reply != nil {
			q.reply <- replies[i]
		} else if q.done != nil {
			q.done(replies[i].v, replies[i].err)
		}
	}
}

// pipeline runs the operations of batch at idx in one pipeline, by
// EVALSHA, or by EVAL when eval is set or the script has not been sent by
// EVAL yet. So a script new to Redis never fails in the middle of a batch,
// which a second pipeline would run out of order; one that Redis lost (a
// restart, SCRIPT FLUSH) is sent again by EVAL, after the others.
func (l *link) pipeline(ctx context.Context, batch []*queued, idx []int, eval bool) []*redis.Cmd {
	pipe := l.client.Pipeline()
	cmds := make([]*redis.Cmd, len(idx))
	var fresh []*redis.Script
	for j, i := range idx {
		q := batch[i]
		if _, ok := l.loaded.Load(q.s); !ok && !eval {
			cmds[j] = q.s.Eval(ctx, pipe, q.keys, q.args...)
			fresh = append(fresh, q.s)
		} else if eval {
			cmds[j] = q.s.Eval(ctx, pipe, q.keys, q.args...)
		} else {
			cmds[j] = q.s.EvalSha(ctx, pipe, q.keys, q.args...)
		}
	}
	_, _ = pipe.Exec(ctx) // each command holds its own error
	for j, i := range idx {
		if eval || slices.Contains(fresh, batch[i].s) {
			if err := cmds[j].Err(); err == nil || redis.HasErrorPrefix(err, "ERR") {
				l.loaded.Store(batch[i].s, true)
			}
		}
	}
	return cmds
}

// roundTrip runs script s on keys with args: one round trip of its own,
// bounded by the timeout.
func (l *link) roundTrip(ctx context.Context, call *callNote, op string, s *redis.Script, keys []string, args []any, probe bool) (any, error) {
	began := l.now()
	tctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	var r reply
	if l.inline {
		r.v, r.err = s.Run(tctx, l.client, keys, args...).Result()
		if probe {
			l.endProbe(r.err)
		}
	} else {
		// The round trip runs apart so that the timeout holds all the same:
		// without ContextTimeoutEnabled, go-redis waits for its socket by
		// its own ReadTimeout, seconds by default.
		done := make(chan reply, 1)
		go func() {
			v, err := s.Run(tctx, l.client, keys, args...).Result()
			if probe {
				l.endProbe(err) // only now: one stuck probe at a time
			}
			done <- reply{v, err}
		}()
		select {
		case r = <-done:
		case <-tctx.Done():
			r.err = ctx.Err()
			if r.err == nil {
				r.err = fmt.Errorf("no answer within %v: %w", l.timeout, tctx.Err())
			}
		}
	}
	if r.err != nil {
		err := fmt.Errorf("redisstore: %s on %q: %w", op, l.name, r.err)
		if ctx.Err() == nil { // the caller's own end says nothing of Redis
			l.failSince(op, r.err, began)
			if call != nil {
				call.failed.CompareAndSwap(nil, &err)
			}
		}
		return nil, err
	}
	l.answer()
	if probe {
		l.recover()
	}
	return r.v, nil
}

// now returns the time since the link was made.
func (l *link) now() int64 { return int64(time.Since(l.start)) }

// answer records that Redis answered now.
func (l *link) answer() {
	now := l.now()
	for {
		last := l.answered.Load()
		if last >= now || l.answered.CompareAndSwap(last, now) {
			return
		}
	}
}

// callKey is the context key of a call's note on link l.
type callKey struct{ l *link }

// callNote is what a link knows of one call.
type callNote struct {
	failed atomic.Pointer[error] // the first failure of one of its operations
}

// callContext returns ctx with a note of its own for l, for one call.
func (l *link) callContext(ctx context.Context) context.Context {
	return context.WithValue(ctx, callKey{l}, &callNote{})
}

// ints reads a script's reply of n integers.
func (l *link) ints(op string, v any, n int) ([]int64, error) {
	vs, ok := v.([]any)
	if ok && len(vs) == n {
		out := make([]int64, n)
		for i, x := range vs {
			if out[i], ok = x.(int64); !ok {
				break
			}
		}
		if ok {
			return out, nil
		}
	}
	err := fmt.Errorf("unexpected reply %v", v)
	l.fail(op, err)
	return nil, fmt.Errorf("redisstore: %s on %q: %w", op, l.name, err)
}
