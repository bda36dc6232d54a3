package brownout

import (
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// SaturatingProvider is a simulated Messages API whose service time grows
// with the attempts it holds: processor sharing over Cores.
//
// An admitted attempt needs work of one core, drawn uniformly from
// [WorkMin, WorkMax]. With n attempts held, each progresses at min(1,
// Cores/n) of a core: up to Cores attempts are each served at full speed,
// and beyond that every attempt slows down alike, so that each one held
// past Cores lengthens all the others. The next completion is recomputed
// on every arrival and departure. An attempt that arrives when the
// provider holds Depth or more is answered 529 overloaded_error after
// RejectLatency, taking no work. An attempt whose caller gives up (its
// context ends) leaves at once, and the work done on it is lost.
type SaturatingProvider struct {
	// Cores is how many attempts the provider serves at full speed.
	Cores int
	// Depth is how many attempts it holds at most; it refuses the rest.
	Depth int
	// WorkMin and WorkMax bound an attempt's work, in time of one core:
	// its service time when the provider holds Cores or fewer.
	WorkMin, WorkMax time.Duration
	// RejectLatency is the time a 529 takes.
	RejectLatency time.Duration
}

// validate reports the first setting that cannot describe a provider.
func (p SaturatingProvider) validate() error {
	switch {
	case p.Cores < 1:
		return fmt.Errorf("SaturatingProvider.Cores = %d: must be at least 1", p.Cores)
	case p.Depth < p.Cores:
		return fmt.Errorf("SaturatingProvider.Depth = %d: must be at least Cores (%d)", p.Depth, p.Cores)
	case p.WorkMin <= 0 || p.WorkMax < p.WorkMin:
		return fmt.Errorf("SaturatingProvider.WorkMin, WorkMax = %v, %v: need 0 < WorkMin <= WorkMax", p.WorkMin, p.WorkMax)
	case p.RejectLatency < 0:
		return fmt.Errorf("SaturatingProvider.RejectLatency = %v: must not be negative", p.RejectLatency)
	}
	return nil
}

// psProvider is a SaturatingProvider during one run.
//
// Every held attempt progresses at the same rate, so the service each has
// had since it arrived is v now less v at its arrival: an attempt is done
// when v reaches its finish tag, v at arrival plus its work, and the next
// to finish is the one with the lowest tag.
type psProvider struct {
	SaturatingProvider
	s   *sched
	rng *rand.Rand
	v   float64   // service a held attempt has had since the run began, in seconds of a core
	at  time.Time // when v was last brought up to date
	// held is the attempts held, by finish tag; next the event of the
	// first one's completion.
	held psHeap
	next *event
	// noteHeld is told how many attempts are held, in all and from
	// replica, whenever that changes.
	noteHeld func(now time.Time, replica, all, byReplica int)
	// byReplica is how many attempts each replica has held.
	byReplica []int
}

// psJob is one attempt held by a psProvider.
type psJob struct {
	finish  float64
	p       *proc
	replica int
	index   int
}

type psHeap []*psJob

func (h psHeap) Len() int           { return len(h) }
func (h psHeap) Less(i, j int) bool { return h[i].finish < h[j].finish }
func (h psHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *psHeap) Push(x any) {
	j := x.(*psJob)
	j.index = len(*h)
	*h = append(*h, j)
}
func (h *psHeap) Pop() any {
	old := *h
	j := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	j.index = -1
	return j
}

func newPSProvider(p SaturatingProvider, s *sched, rng *rand.Rand, replicas int) *psProvider {
	return &psProvider{SaturatingProvider: p, s: s, rng: rng, at: s.now, byReplica: make([]int, replicas)}
}

// rate is the share of a core each held attempt gets.
func (ps *psProvider) rate() float64 {
	return min(1, float64(ps.Cores)/float64(len(ps.held)))
}

// advance brings v up to now.
func (ps *psProvider) advance() {
	now := ps.s.now
	if len(ps.held) > 0 {
		ps.v += ps.rate() * now.Sub(ps.at).Seconds()
	}
	ps.at = now
}

// admit takes an attempt of process p from replica, unless the provider
// is full: then it returns nil, and the attempt gets 529.
func (ps *psProvider) admit(p *proc, replica int) *psJob {
	ps.advance()
	if len(ps.held) >= ps.Depth {
		return nil
	}
	work := ps.WorkMin + time.Duration(ps.rng.Float64()*float64(ps.WorkMax-ps.WorkMin))
	j := &psJob{finish: ps.v + work.Seconds(), p: p, replica: replica}
	heap.Push(&ps.held, j)
	ps.changed(replica, +1)
	return j
}

// leave drops an attempt whose caller gave up.
func (ps *psProvider) leave(j *psJob) {
	if j.index < 0 {
		return // already answered
	}
	ps.advance()
	heap.Remove(&ps.held, j.index)
	ps.changed(j.replica, -1)
}

// complete answers the attempt that finishes first, whose completion is
// due now.
func (ps *psProvider) complete() {
	ps.next = nil
	ps.advance()
	j := heap.Pop(&ps.held).(*psJob)
	ps.v = max(ps.v, j.finish) // the event's time is rounded to the nanosecond
	ps.changed(j.replica, -1)
	ps.s.resume(j.p, wakeup{res: &response{status: 200}})
}

// changed records a change of the attempts held by replica, and schedules
// the next completion anew: every held attempt's speed has changed.
func (ps *psProvider) changed(replica, delta int) {
	ps.byReplica[replica] += delta
	if ps.noteHeld != nil {
		ps.noteHeld(ps.s.now, replica, len(ps.held), ps.byReplica[replica])
	}
	ps.s.cancel(ps.next)
	ps.next = nil
	if len(ps.held) == 0 {
		return
	}
	wait := (ps.held[0].finish - ps.v) / ps.rate()
	ps.next = ps.s.at(ps.s.now.Add(time.Duration(math.Ceil(max(wait, 0)*1e9))), nil, ps.complete)
}
