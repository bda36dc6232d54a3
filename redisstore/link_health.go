package redisstore

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"
)

// What a link knows of Redis's health: a failure that puts it in fallback
// (fail), the probe that tests Redis while it is down (probe), the
// recovery (recover), and what it reports (State, Stats); how far the
// client bounds and retries a command itself (boundsItself, clientRetries).

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

// clientRetries returns how many times client sends a command again
// after a failure (its MaxRetries, once the client has read -1 as 0 and 0
// as its default, 3), or 0 for a client whose options are not known.
func clientRetries(client redis.UniversalClient) int {
	switch c := client.(type) {
	case *redis.Client:
		return c.Options().MaxRetries
	case *redis.ClusterClient:
		return c.Options().MaxRetries
	case *redis.Ring:
		return c.Options().MaxRetries
	}
	return 0
}

// probe asks Redis now, by a PING bounded by the timeout, or, when this
// process's membership is due for a refresh, by the refresh instead: one
// round trip either way, so that a process that only probes stays counted.
// While the link is down it is the probe, as a decision's would be, and an
// answer brings the link back; while it is up, a failure counts as any
// operation's.
func (l *link) probe(ctx context.Context) error {
	probe := l.down.Load()
	if probe && !l.startProbe() {
		l.unasked.Add(1)
		return l.unavailable("Probe")
	}
	l.qmu.Lock()
	join := l.joinLocked()
	l.qmu.Unlock()
	ask := func(ctx context.Context) error {
		if join == nil {
			return l.client.Ping(ctx).Err()
		}
		v, err := join.s.Run(ctx, l.client, join.keys, join.args...).Result()
		join.done(v, err)
		return err
	}
	began := l.now()
	tctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	var err error
	if l.inline {
		err = ask(tctx)
		if probe {
			l.endProbe(err)
		}
	} else {
		done := make(chan error, 1)
		go func() {
			err := ask(tctx)
			if probe {
				l.endProbe(err)
			}
			done <- err
		}()
		select {
		case err = <-done:
		case <-tctx.Done():
			if err = ctx.Err(); err == nil {
				err = fmt.Errorf("no answer within %v: %w", l.timeout, tctx.Err())
			}
		}
	}
	if err != nil {
		if ctx.Err() == nil {
			l.failSince("Probe", err, began)
		}
		return fmt.Errorf("redisstore: Probe on %q: %w", l.name, err)
	}
	l.answer()
	if probe {
		l.recover()
	}
	return nil
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
		Dropped:    l.dropped.Load(),
	}
}
