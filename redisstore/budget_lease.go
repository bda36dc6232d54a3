package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// lease is what a budget holds of a lease (see Options.Lease): units
// taken from Redis in one decision and not spent yet. The budget's mu
// guards it.
//
// At most one decision taking a lease is in flight per budget: an Acquire
// that finds no unit to spend while one is in flight waits for it, so
// that a process holds at most size-1 units and its goroutines share one
// round trip instead of each taking a lease of its own.
type lease struct {
	size    int           // the most units one decision takes
	keepFor time.Duration // how long units are kept unspent

	window int64       // the window the units belong to (see windowNumber)
	units  int         // units held unspent: at most size-1
	taken  int64       // when they were taken, in the link's time (see link.now)
	epoch  uint64      // the link's fallbacks then: a fallback since voids them
	flight *flight     // the decision taking a lease, while in flight
	timer  *time.Timer // gives the units back keepFor after they were taken
}

// flight is a decision taking a lease, seen by the Acquires that wait for
// it.
type flight struct {
	done chan struct{}
	// refused: Redis answered, with no unit left, after every waiter had
	// asked; so each of them is refused too, as a decision of its own
	// would have been.
	refused bool
}

// returned is a part of a lease to give back.
type returned struct {
	window int64
	units  int
}

// acquireLeased is Acquire with leases.
func (b *Budget) acquireLeased(ctx context.Context, now time.Time) (bool, error) {
	id := windowNumber(now, b.window)
	l := &b.lease
	for {
		b.mu.Lock()
		b.voidStale(id)
		if l.units > 0 && b.link.now()-l.taken < int64(l.keepFor) {
			l.units--
			b.mu.Unlock()
			b.local.TryAcquire(now)
			return true, nil
		}
		if f := l.flight; f != nil {
			b.mu.Unlock()
			select {
			case <-f.done:
			case <-ctx.Done():
				return b.fallback(now, fmt.Errorf("redisstore: acquire on %q: %w", b.link.name, ctx.Err()))
			}
			if f.refused {
				return false, nil
			}
			continue // spend from the new lease, or take one
		}
		f := &flight{done: make(chan struct{})}
		l.flight = f
		back := b.takeBack() // kept too long: they go back ahead of the decision
		b.mu.Unlock()
		b.giveBackNow(back)

		epoch := b.link.fallbacks.Load()
		r, err := b.run(ctx, "acquire", leaseScript, now, l.size)
		b.mu.Lock()
		l.flight = nil
		f.refused = err == nil && !r.granted
		if err == nil && r.units > 1 {
			l.window, l.units, l.taken, l.epoch = id, int(r.units-1), b.link.now(), epoch
			if l.timer == nil {
				l.timer = time.AfterFunc(l.keepFor, func() { b.giveBack(true) })
			} else {
				l.timer.Reset(l.keepFor)
			}
		}
		b.mu.Unlock()
		close(f.done)
		if err != nil {
			return b.fallback(now, err)
		}
		if r.granted {
			b.local.TryAcquire(now)
		}
		return r.granted, nil
	}
}

// voidStale drops the lease's units when they no longer hold: a fallback
// has begun since they were taken, or now's window, id, is past theirs
// (units never carry over). mu held.
func (b *Budget) voidStale(id int64) {
	l := &b.lease
	if l.units > 0 && (id > l.window || b.link.down.Load() || b.link.fallbacks.Load() != l.epoch) {
		l.units = 0
	}
}

// leased returns the lease's units that a caller in window id may spend.
func (b *Budget) leased(id int64) int {
	if b.lease.size <= 1 {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.voidStale(id)
	if id > b.lease.window {
		return 0
	}
	return b.lease.units
}

// takeBack takes the lease's units out, to be given back. mu held.
func (b *Budget) takeBack() returned {
	l := &b.lease
	r := returned{window: l.window, units: l.units}
	l.units = 0
	return r
}

// giveBack gives the lease's unspent units back to Redis: all of them, or
// with expiredOnly those kept keepFor already (the timer's call, which
// waits again for units taken since).
func (b *Budget) giveBack(expiredOnly bool) {
	b.mu.Lock()
	l := &b.lease
	if !expiredOnly && l.timer != nil {
		l.timer.Stop() // nothing left to wait for
	}
	var back returned
	if l.units > 0 && !b.link.down.Load() && b.link.fallbacks.Load() == l.epoch {
		if left := int64(l.keepFor) - (b.link.now() - l.taken); expiredOnly && left > 0 {
			l.timer.Reset(time.Duration(left))
		} else {
			back = b.takeBack()
		}
	} else {
		l.units = 0 // void: nothing to give back
	}
	b.mu.Unlock()
	b.giveBackNow(back)
}

// giveBackNow queues the record that gives back r, if it holds units. The
// books heard lose the units once Redis has taken them back.
func (b *Budget) giveBackNow(r returned) {
	if r.units == 0 {
		return
	}
	args := []any{strconv.FormatInt(r.window, 10), r.units}
	// A failed record leaves the units used in Redis: fewer retries, never
	// more. Its error is counted by the link.
	_ = b.link.record(context.Background(), "return", returnScript, b.keys, args, nil, func(v any, err error) {
		if err != nil {
			return
		}
		rs, err := b.link.ints("return", v, 3)
		if err != nil || rs[2] != 1 {
			return
		}
		b.mu.Lock()
		if h := &b.heard; h.window == r.window {
			h.successes = max(h.successes, rs[0])
			h.used = max(0, h.used-int64(r.units))
		}
		b.mu.Unlock()
	})
}
