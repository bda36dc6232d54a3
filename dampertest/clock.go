package dampertest

import (
	"container/heap"
	"context"
	"sync"
	"time"
)

// Clock is a virtual clock for tests and simulations. Time moves only when
// [Clock.Advance] or [Clock.Sleep] is called, so code driven by it is exact
// and never waits on real time.
//
// Clock has the three methods of damper.Clock (Now, Sleep, AfterFunc).
// Timers registered with [Clock.AfterFunc] fire, in deadline order, while
// Advance or Sleep moves the clock past their deadlines; each callback runs
// on the goroutine that moved the clock, with no lock held, so a callback may
// use the clock itself.
//
// A Clock is safe for concurrent use. Create one with [NewClock]; the zero
// Clock starts at the zero time.
type Clock struct {
	mu     sync.Mutex
	now    time.Time
	sleeps []time.Duration
	timers timerHeap
	seq    uint64 // registration order, to break deadline ties
}

// NewClock returns a Clock that reads start until it is moved.
func NewClock(start time.Time) *Clock {
	return &Clock{now: start}
}

// Now returns the clock's current time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Sleep records d (see [Clock.Sleeps]), moves the clock forward by d, firing
// the timers that fall due, and returns at once.
//
// If ctx is already done, Sleep records d and returns ctx.Err() without moving
// the clock. If a timer that fires during the sleep ends ctx (a deadline or a
// per-attempt timeout registered with AfterFunc), the clock stops at that
// timer's deadline and Sleep returns ctx.Err(), as a real sleep cut short by
// its context would. A d <= 0 is recorded and returns nil.
func (c *Clock) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	c.sleeps = append(c.sleeps, d)
	c.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	if d <= 0 {
		return nil
	}
	c.advance(d, func() bool { return ctx.Err() != nil })
	return ctx.Err()
}

// Sleeps returns a copy of the duration of every [Clock.Sleep] call, in call
// order, including calls that returned an error.
func (c *Clock) Sleeps() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]time.Duration, len(c.sleeps))
	copy(out, c.sleeps)
	return out
}

// AfterFunc arranges for f to be called once the clock reaches Now()+d. The
// returned stop function cancels the call; it reports whether it did so
// before f was called, like [time.Timer.Stop].
//
// A d <= 0 is already due: as with [time.AfterFunc], f then runs on its own
// goroutine straight away (unless stopped first), so a caller that holds a
// lock f needs does not deadlock.
func (c *Clock) AfterFunc(d time.Duration, f func()) (stop func() bool) {
	c.mu.Lock()
	c.seq++
	t := &clockTimer{at: c.now.Add(d), seq: c.seq, f: f, index: -1}
	if d > 0 {
		heap.Push(&c.timers, t)
	}
	c.mu.Unlock()

	if d <= 0 {
		go func() {
			if c.claim(t) {
				f()
			}
		}()
	}
	return func() bool { return c.claim(t) }
}

// Pending returns the number of timers with a positive delay that have
// neither fired nor been stopped. Tests use it to check that code stops the
// timers it no longer needs.
func (c *Clock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers) // fired and stopped timers leave the heap at once
}

// Advance moves the clock forward by d, firing due timers in deadline order
// (ties in registration order). While a callback runs, Now reports its
// deadline. Timers registered by a callback fire in the same Advance if they
// fall due within it. A d < 0 is treated as 0, which still fires timers
// already due.
//
// Concurrent calls overlap rather than add up: each moves the clock to at
// least the time it computed when it started.
func (c *Clock) Advance(d time.Duration) {
	c.advance(d, nil)
}

// advance moves the clock forward by d. After each timer it fires it calls
// stop, if not nil; when stop returns true the clock stays at that timer's
// deadline, as when the timer ended the wait of whoever is advancing.
func (c *Clock) advance(d time.Duration, stop func() bool) {
	c.mu.Lock()
	target := c.now.Add(max(d, 0))
	for {
		t := c.timers.peek()
		if t == nil || t.at.After(target) {
			break
		}
		heap.Pop(&c.timers)
		t.done = true
		if t.at.After(c.now) {
			c.now = t.at
		}
		// The callback may call back into the clock (Now, AfterFunc, stop).
		c.mu.Unlock()
		t.f()
		if stop != nil && stop() {
			return
		}
		c.mu.Lock()
	}
	if target.After(c.now) {
		c.now = target
	}
	c.mu.Unlock()
}

// claim marks t done and reports whether it was still pending, so that
// exactly one of stop and firing wins.
func (c *Clock) claim(t *clockTimer) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.done {
		return false
	}
	t.done = true
	if t.index >= 0 {
		heap.Remove(&c.timers, t.index)
	}
	return true
}

type clockTimer struct {
	at    time.Time
	seq   uint64
	f     func()
	done  bool // fired or stopped; requires Clock.mu
	index int  // position in the heap, -1 when not in it
}

// timerHeap orders timers by deadline, then registration. Requires Clock.mu.
type timerHeap []*clockTimer

func (h timerHeap) Len() int { return len(h) }
func (h timerHeap) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	return h[i].seq < h[j].seq
}
func (h timerHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *timerHeap) Push(x any) {
	t := x.(*clockTimer)
	t.index = len(*h)
	*h = append(*h, t)
}
func (h *timerHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	t.index = -1
	return t
}
func (h timerHeap) peek() *clockTimer {
	if len(h) == 0 {
		return nil
	}
	return h[0]
}
