package brownout

import (
	"container/heap"
	"context"
	"time"
)

// sched is a discrete-event scheduler in virtual time that runs real,
// blocking client code (the SDK, Damper, failsafe-go) as coroutines.
//
// Every logical request runs on its own goroutine, but only one goroutine
// runs at a time: the scheduler resumes a process and waits until that
// process parks again (in [sched.Sleep], an attempt on the simulated
// transport) or ends. Events at the same instant run in the order they were
// scheduled. With seeded randomness, a run is therefore exactly repeatable,
// whatever the Go scheduler does, and no code ever sleeps on real time.
type sched struct {
	now    time.Time
	events eventHeap
	seq    uint64
	cur    *proc         // the process running now, nil while the scheduler runs
	yield  chan struct{} // a process parked or ended
	// sleepers are the processes that went to sleep (simClock.Sleep), in
	// that order; some may have woken since.
	sleepers []*proc
}

func newSched(start time.Time) *sched {
	return &sched{now: start, yield: make(chan struct{})}
}

// event is something due at a virtual instant: a callback run by the
// scheduler, owned by a process whose context it may end.
type event struct {
	at       time.Time
	seq      uint64
	fn       func()
	owner    *proc
	index    int
	canceled bool
}

type eventHeap []*event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	return h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *eventHeap) Push(x any) {
	e := x.(*event)
	e.index = len(*h)
	*h = append(*h, e)
}
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	e.index = -1
	return e
}

// at schedules fn at t (or now, if t is past) on behalf of owner.
func (s *sched) at(t time.Time, owner *proc, fn func()) *event {
	if t.Before(s.now) {
		t = s.now
	}
	s.seq++
	e := &event{at: t, seq: s.seq, fn: fn, owner: owner}
	heap.Push(&s.events, e)
	return e
}

func (s *sched) cancel(e *event) {
	if e != nil && !e.canceled && e.index >= 0 {
		e.canceled = true
		heap.Remove(&s.events, e.index)
	}
}

// run executes events in time order until none is left before end.
func (s *sched) run(end time.Time) {
	for len(s.events) > 0 {
		e := s.events[0]
		if e.at.After(end) {
			break
		}
		heap.Pop(&s.events)
		s.now = e.at
		e.fn()
		// A callback may have ended the owner's context (its deadline, an
		// attempt timeout): a parked owner then wakes at once, as a real
		// goroutine blocked on that context would.
		if p := e.owner; p != nil && p.parked && p.ctxDone() {
			s.cancel(p.wake)
			s.resume(p, wakeup{err: p.ctxErr()})
		}
		s.wakeSleepers()
	}
	if s.now.Before(end) {
		s.now = end
	}
}

// wakeSleepers wakes, in the order they went to sleep, the sleeping
// processes whose context another process has ended: a Damper whose
// concurrency limit hands a slot to an attempt waiting for one ends that
// attempt's wait so, and a real goroutine would wake at once.
func (s *sched) wakeSleepers() {
	var due []*proc
	kept := s.sleepers[:0]
	for _, p := range s.sleepers {
		if !p.sleeping {
			continue
		}
		kept = append(kept, p)
		if p.parked && p.ctxDone() {
			due = append(due, p)
		}
	}
	clear(s.sleepers[len(kept):])
	s.sleepers = kept
	for _, p := range due {
		if p.sleeping && p.parked && p.ctxDone() {
			s.cancel(p.wake)
			s.resume(p, wakeup{err: p.ctxErr()})
		}
	}
}

// proc is one logical request running as a coroutine.
type proc struct {
	s       *sched
	root    context.Context // the caller's context: its deadline
	resumeC chan wakeup
	parked  bool
	parkCtx context.Context // the context the process is blocked on
	wake    *event          // the event that will resume it normally
	attempt int             // provider attempts sent for this request
	// secondary is how many of them went to the secondary provider;
	// bySecondary is true when the last answer of 200 came from it.
	secondary   int
	bySecondary bool
	moved       string       // the reason of its first move to another backend
	cache       CacheOutcome // what the answer of 200 did with the prompt cache
	prefix      int          // the request's cached prefix, 1 on; 0 for none
	sleeping    bool         // parked in simClock.Sleep
	sent        time.Time    // when its last attempt reached a provider
}

type wakeup struct {
	res *response
	err error
}

func (p *proc) ctxDone() bool {
	return p.root.Err() != nil || (p.parkCtx != nil && p.parkCtx.Err() != nil)
}

func (p *proc) ctxErr() error {
	if err := p.root.Err(); err != nil {
		return err
	}
	return p.parkCtx.Err()
}

// spawn starts body as a process and runs it until it first parks.
func (s *sched) spawn(root context.Context, body func(p *proc)) *proc {
	p := &proc{s: s, root: root, resumeC: make(chan wakeup)}
	go func() {
		<-p.resumeC
		body(p)
		s.yield <- struct{}{}
	}()
	s.resume(p, wakeup{})
	return p
}

// resume hands control to p and waits until it parks or ends.
func (s *sched) resume(p *proc, w wakeup) {
	p.parked = false
	p.parkCtx = nil
	p.wake = nil
	s.cur = p
	p.resumeC <- w
	<-s.yield
	s.cur = nil
}

// park blocks the calling process, which must be s.cur, until the
// scheduler resumes it: through wake, or because ctx ended.
func (s *sched) park(ctx context.Context, wake *event) wakeup {
	p := s.cur
	p.parked = true
	p.parkCtx = ctx
	p.wake = wake
	s.yield <- struct{}{}
	return <-p.resumeC
}

// Clock is the scheduler seen as a damper.Clock, for the contenders.
type simClock struct{ s *sched }

func (c simClock) Now() time.Time { return c.s.now }

// Sleep parks the calling process for d of virtual time, or until ctx ends.
func (c simClock) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d <= 0 {
		return nil
	}
	s := c.s
	p := s.cur
	e := s.at(s.now.Add(d), nil, func() { s.resume(p, wakeup{}) })
	p.sleeping = true
	s.sleepers = append(s.sleepers, p)
	w := s.park(ctx, e)
	p.sleeping = false
	if w.err != nil {
		return ctx.Err()
	}
	return nil
}

// AfterFunc runs f on the scheduler once d has passed. The running process
// owns the timer, so that a context f ends wakes it.
func (c simClock) AfterFunc(d time.Duration, f func()) func() bool {
	s := c.s
	e := s.at(s.now.Add(d), s.cur, f)
	return func() bool {
		if e.canceled || e.index < 0 {
			return false
		}
		s.cancel(e)
		return true
	}
}
