package redisstore

import (
	"context"
	"fmt"
	"log/slog"
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

	mu    sync.Mutex // orders the switches and their log lines
	since time.Time  // when the current fallback began
	cause error      // the failure that began it

	fallbacks, recoveries, failures, unasked atomic.Uint64
}

func newLink(client redis.UniversalClient, o Options, subject, attr string) *link {
	timeout := orDefault(o.Timeout, DefaultTimeout)
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
	}
}

type reply struct {
	v   any
	err error
}

// run runs script s on keys with args: one round trip, bounded by the
// timeout. During a fallback only the probe asks Redis, and after one
// operation of a call has failed, the call's others do not ask it; those
// not asked get an error that matches ErrUnavailable at once.
func (l *link) run(ctx context.Context, op string, s *redis.Script, keys []string, args ...any) (any, error) {
	call, _ := ctx.Value(callKey{l}).(*callNote)
	if call != nil {
		if err := call.failed.Load(); err != nil {
			l.unasked.Add(1)
			return nil, fmt.Errorf("%w: %s on %q, after an earlier operation of the call failed: %w", ErrUnavailable, op, l.name, *err)
		}
	}
	probe := false
	if l.down.Load() {
		if !l.startProbe() {
			l.unasked.Add(1)
			return nil, l.unavailable(op)
		}
		probe = true
	}
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

// boundsItself reports whether client gives up at a context's deadline in
// every wait (ContextTimeoutEnabled), so that a round trip can run on the
// caller's goroutine: handing it to another costs tens of microseconds.
func boundsItself(client redis.UniversalClient) bool {
	switch c := client.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// startProbe reports whether this operation is the probe: no other is in
// flight, and the last one ended at least probeEvery ago.
func (l *link) startProbe() bool {
	now := l.now()
	if now < l.nextProbe.Load() || !l.probing.CompareAndSwap(false, true) {
		return false
	}
	if now < l.nextProbe.Load() { // another probe ended in between
		l.probing.Store(false)
		return false
	}
	return true
}

// endProbe ends the probe in flight, whose round trip ended with err; the
// next may start probeEvery after a failed one.
func (l *link) endProbe(err error) {
	if err != nil {
		l.nextProbe.Store(l.now() + int64(l.probeEvery))
	}
	l.probing.Store(false)
}

func (l *link) unavailable(op string) error {
	l.mu.Lock()
	since, cause := l.since, l.cause
	l.mu.Unlock()
	return fmt.Errorf("%w: %s on %q, failing since %s: %w", ErrUnavailable, op, l.name, since.Format(time.RFC3339Nano), cause)
}

// fail records a failed operation, switching to the fallback if the link
// was up.
func (l *link) fail(op string, err error) { l.failSince(op, err, l.now()) }

// failSince records a failed operation that began at began (see now),
// switching to the fallback if the link was up and Redis has answered
// nothing since.
func (l *link) failSince(op string, err error, began int64) {
	l.failures.Add(1)
	if l.down.Load() {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.down.Load() || l.answered.Load() >= began {
		return
	}
	l.since, l.cause = time.Now(), err
	l.nextProbe.Store(l.now() + int64(l.probeEvery))
	l.down.Store(true)
	l.fallbacks.Add(1)
	if l.log != nil {
		decides := "the local budget decides"
		switch {
		case l.attr != "budget" && l.failClosed:
			decides = "retries are refused, and the rest is decided in memory"
		case l.attr != "budget":
			decides = "state kept in memory decides"
		case l.failClosed:
			decides = "retries are refused"
		}
		l.log.Warn("redisstore: Redis failed, "+l.subject+" falls back: "+decides,
			slog.String(l.attr, l.name), slog.String("op", op), slog.String("error", err.Error()))
	}
}

// recover switches back to Redis after a fallback: a probe was answered.
func (l *link) recover() {
	if !l.down.Load() {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.down.Load() {
		return
	}
	l.down.Store(false)
	l.recoveries.Add(1)
	if l.log != nil {
		l.log.Info("redisstore: Redis answers again, "+l.subject+" shared again",
			slog.String(l.attr, l.name), slog.Duration("after", time.Since(l.since)))
	}
}

// state returns where decisions come from now.
func (l *link) state() State {
	if l.down.Load() {
		return StateFallback
	}
	return StateShared
}

// stats returns the state and counters.
func (l *link) stats() Stats {
	return Stats{
		State:      l.state(),
		Fallbacks:  l.fallbacks.Load(),
		Recoveries: l.recoveries.Load(),
		Failures:   l.failures.Load(),
		Unasked:    l.unasked.Load(),
	}
}
