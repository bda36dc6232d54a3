package concurrency

import (
	"container/heap"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/conf"
	"github.com/damper-ai/damper-go/internal/core"
)

// queueingProvider is a provider of known capacity: an attempt sent while
// n attempts (itself included) are in flight takes service × max(1, n/k),
// as a provider that shares k workers among all it holds.
type queueingProvider struct {
	k       int
	service func() time.Duration
}

// inFlight is an attempt under way in a simulation: its slot and its end.
type inFlight struct {
	end  time.Time
	pass *concPass
}

type inFlightHeap []inFlight

func (h inFlightHeap) Len() int           { return len(h) }
func (h inFlightHeap) Less(i, j int) bool { return h[i].end.Before(h[j].end) }
func (h inFlightHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *inFlightHeap) Push(x any)        { *h = append(*h, x.(inFlight)) }
func (h *inFlightHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// saturation is a limit under unbounded demand, on a virtual clock: every
// free slot is taken at once. With a demand, it is a closed loop of that
// many callers: each sends its next attempt as its last one ends, and
// waits in line while the limit is full.
type saturation struct {
	l       *Limit
	now     time.Time
	running inFlightHeap
	demand  int // the callers; zero: unbounded
}

func saturate(l *Limit) *saturation {
	return &saturation{l: l, now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

// run goes on against provider pv, and returns the limit after each of
// samples answered attempts.
func (s *saturation) run(pv queueingProvider, samples int) []int {
	l, now := s.l, s.now
	running := &s.running
	defer func() { s.now = now }()
	limits := make([]int, 0, samples)
	answered := core.Event{Outcome: fleet.AttemptOutcome{Success: true}}
	for len(limits) < samples {
		for {
			l.mu.Lock()
			if s.demand > 0 && l.held[fleet.Interactive] >= s.demand {
				l.mu.Unlock()
				break
			}
			if !l.free(fleet.Interactive) {
				l.short = true // demand beyond the limit, as a call's admission finds it
				l.mu.Unlock()
				break
			}
			l.takeFor(fleet.Interactive, nil)
			p := l.newPass(fleet.Interactive, nil, now, 0)
			n := l.held[fleet.Interactive]
			l.mu.Unlock()
			took := time.Duration(float64(pv.service()) * max(1, float64(n)/float64(pv.k)))
			heap.Push(running, inFlight{end: now.Add(took), pass: p})
		}
		next := heap.Pop(running).(inFlight)
		now = next.end
		next.pass.Settle(now, answered)
		l.mu.Lock()
		limits = append(limits, l.slots())
		l.mu.Unlock()
	}
	return limits
}

// cohorts is how many cohorts the limit has started.
func (s *saturation) cohorts() uint64 {
	s.l.mu.Lock()
	defer s.l.mu.Unlock()
	return s.l.epoch
}

func adaptive(t *testing.T, p Policy) *Limit {
	t.Helper()
	p.Adaptive = true
	if err := conf.Fill(&p); err != nil {
		t.Fatal(err)
	}
	return newLimit(&p, nil, "primary")
}

// settledBy returns the first sample from which every limit stays within
// [lo, hi], or -1.
func settledBy(limits []int, lo, hi int) int {
	at := -1
	for i, n := range limits {
		switch {
		case n < lo || n > hi:
			at = -1
		case at < 0:
			at = i
		}
	}
	return at
}

// TestConcurrencyLimitFindsCapacity: from its start of 20, the adaptive
// limit finds a provider that serves 100 attempts at once in 1 s each
// within 300 samples, and stays between its capacity and Tolerance × it
// (where the latency it allows, 1.5 × 1 s, is reached) from then on.
func TestConcurrencyLimitFindsCapacity(t *testing.T) {
	l := adaptive(t, Policy{})
	limits := saturate(l).run(queueingProvider{k: 100, service: func() time.Duration { return time.Second }}, 3000)
	at := settledBy(limits, 100, 165)
	t.Logf("settled from sample %d; limits at 100, 500, 1000, 3000: %d %d %d %d", at, limits[99], limits[499], limits[999], limits[2999])
	if at < 0 || at > 300 {
		t.Fatalf("limit settled in [100, 165] from sample %d, want within 300", at)
	}
}

// TestConcurrencyLimitFollowsCapacityDown: a provider that served 100
// attempts at once comes to serve 40 (other traffic took the rest): the
// limit, settled near 100, comes down to 40 within 500 samples: each of
// its cohorts waits for attempts sent under the higher limit to end.
func TestConcurrencyLimitFollowsCapacityDown(t *testing.T) {
	l := adaptive(t, Policy{})
	pv := queueingProvider{k: 100, service: func() time.Duration { return time.Second }}
	s := saturate(l)
	if got := s.run(pv, 1500); got[len(got)-1] < 100 {
		t.Fatalf("limit %d before the drop, want at least 100", got[len(got)-1])
	}
	pv.k = 40
	limits := s.run(pv, 2000)
	at := settledBy(limits, 40, 66)
	t.Logf("settled from sample %d; limits at 20, 100, 200, 2000: %d %d %d %d", at, limits[19], limits[99], limits[199], limits[1999])
	if at < 0 || at > 500 {
		t.Fatalf("limit settled in [40, 66] from sample %d, want within 500", at)
	}
}

// TestConcurrencyLimitWithNoisyService: attempts whose own times spread
// from 1 s to 3 s: the limit still settles near the provider's capacity
// of 60, within 300 samples.
func TestConcurrencyLimitWithNoisyService(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	l := adaptive(t, Policy{})
	limits := saturate(l).run(queueingProvider{k: 60, service: func() time.Duration {
		return time.Second + time.Duration(rng.Int64N(int64(2*time.Second)))
	}}, 5000)
	at := settledBy(limits, 50, 110)
	t.Logf("settled from sample %d; limits at 100, 300, 5000: %d %d %d", at, limits[99], limits[299], limits[4999])
	if at < 0 || at > 300 {
		t.Fatalf("limit settled in [50, 110] from sample %d, want within 300", at)
	}
}

// A cohort with a 529 or an attempt timeout cuts the limit by 10 %; one
// with other failures (a 500, a cancellation) does not.
func TestConcurrencyOverloadCuts(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	answered := core.Event{Outcome: fleet.AttemptOutcome{Success: true}}
	for _, tt := range []struct {
		name string
		last core.Event
		want int
	}{
		{"529", core.Event{Failure: &core.Failure{StatusCode: 529}}, 45},
		{"attempt timeout", core.Event{Failure: &core.Failure{Err: core.ErrAttemptTimeout}}, 45},
		{"500", core.Event{Failure: &core.Failure{StatusCode: 500}}, 50},
		{"cancelled", core.Event{}, 50},
	} {
		l := adaptive(t, Policy{Initial: 50})
		passes := make([]*concPass, concWindow)
		l.mu.Lock()
		for i := range passes {
			l.takeFor(fleet.Interactive, nil)
			passes[i] = l.newPass(fleet.Interactive, nil, now, 0)
		}
		l.mu.Unlock()
		for _, p := range passes[:concWindow-1] {
			p.Settle(now.Add(time.Second), answered)
		}
		passes[concWindow-1].Settle(now.Add(time.Second), tt.last)
		if got := l.slots(); got != tt.want {
			t.Errorf("%s: limit %d after the cohort, want %d", tt.name, got, tt.want)
		}
	}
}

// A slot given back goes to the first in line even while others wait
// behind it: the line drains one slot at a time.
func TestConcurrencyLineDrainsInOrder(t *testing.T) {
	l := newLimit(&Policy{Max: 1, BatchShare: 0.8}, nil, "primary")
	l.mu.Lock()
	defer l.mu.Unlock()
	l.takeFor(fleet.Interactive, nil)
	var waiters []*slotWaiter
	for range 3 {
		w := &slotWaiter{cancel: func() {}}
		waiters = append(waiters, w)
		l.line[fleet.Interactive].push(w)
	}
	for i := range waiters {
		l.release(fleet.Interactive, nil)
		for j, w := range waiters {
			if want := j <= i; w.granted != want {
				t.Fatalf("after %d slots given back: waiter %d granted %v, want %v", i+1, j, w.granted, want)
			}
		}
		if l.held[fleet.Interactive] != 1 {
			t.Fatalf("after %d slots given back: %d held, want 1", i+1, l.held[fleet.Interactive])
		}
	}
}

// TestConcurrencyLimitWithHeavyTails: attempts whose own times have the
// heavy tail of a model's answers (log-normal, the slowest in a hundred
// six times the median), against a provider of 60 that is never short of
// demand: over 40,000 attempts the limit neither collapses, as a best
// taken from the luckiest cohort would make it, nor runs away.
// (A Tolerance of 1.3 does fall to a handful here: the run logs it.)
func TestConcurrencyLimitWithHeavyTails(t *testing.T) {
	run := func(seed uint64, tolerance float64) []int {
		rng := rand.New(rand.NewPCG(seed, 2))
		l := adaptive(t, Policy{Tolerance: tolerance})
		return saturate(l).run(queueingProvider{k: 60, service: func() time.Duration {
			return time.Duration(float64(time.Second) * math.Exp(0.8*rng.NormFloat64()))
		}}, 40000)[2000:]
	}
	for seed := uint64(1); seed <= 3; seed++ {
		limits := run(seed, 0)
		lo, hi := slices.Min(limits), slices.Max(limits)
		t.Logf("seed %d: after 2,000 attempts, limits %d to %d; with a tolerance of 1.3, as low as %d", seed, lo, hi, slices.Min(run(seed, 1.3)))
		if lo < 20 || hi > 150 {
			t.Errorf("seed %d: limits %d to %d after 2,000 attempts, want within [20, 150]", seed, lo, hi)
		}
	}
}

// TestConcurrencyLimitBelowDemandKeepsSampling: 30 callers in a closed
// loop, against a provider that serves 100 at once in 1 s, under a limit
// from 12 that may grow to 100. The limit grows while attempts find it
// full, 12, 18, 27, to 40 (27 × 1.5), and no further: the callers never
// fill 40, so nothing needs more room. Its cohorts go on all the same,
// each started once 20 attempts have been sent without filling it, so
// that when the provider's time to the first byte rises to 5 s, the
// first cohort sent after the rise cuts the limit, by half (1.5 s
// allowed / 5 s, at most halved), to 20: at the end of the second cohort
// to end after the rise, the one under way and the next. A limit that
// waited for the callers to fill 40 before its next cohort took no more
// samples, and stayed at 40.
func TestConcurrencyLimitBelowDemandKeepsSampling(t *testing.T) {
	l := adaptive(t, Policy{Initial: 12, Max: 100})
	service := time.Second
	pv := queueingProvider{k: 100, service: func() time.Duration { return service }}
	s := saturate(l)
	s.demand = 30
	limits := s.run(pv, 600)
	if hi := slices.Max(limits); hi != 40 || limits[len(limits)-1] != 40 {
		t.Fatalf("limit at most %d, %d at the end, under a demand of 30; want it to stop at 40", hi, limits[len(limits)-1])
	}
	steady := s.cohorts()
	limits = s.run(pv, 600)
	if lo, hi := slices.Min(limits), slices.Max(limits); lo != 40 || hi != 40 {
		t.Fatalf("limits %d to %d over 600 more samples, want 40 throughout", lo, hi)
	}
	// A cohort about every 53 samples: its 20 sends, and the 30-odd ends
	// before its last one's, a second after it was sent.
	if n := s.cohorts() - steady; n != 11 {
		t.Fatalf("%d cohorts over 600 samples at a steady limit, want 11", n)
	}

	service = 5 * time.Second
	slowed, start := s.cohorts(), s.now
	for i := range 200 {
		if n := s.run(pv, 1)[0]; n != 40 {
			ended := s.cohorts() - slowed
			t.Logf("cut to %d at sample %d, %v after the rise", n, i, s.now.Sub(start))
			if n != 20 || ended != 2 {
				t.Fatalf("limit cut to %d as cohort %d since the rise ended, want 20 as the second did", n, ended)
			}
			return
		}
	}
	t.Fatalf("limit still 40 after 200 samples at 5 s, want it cut")
}

// TestConcurrencyLimitSurgeRestartsTheCohort: a cohort begun under a
// demand below the limit, with answers in, is begun again the moment a
// surge fills the limit, so that the answers of the quiet time do not
// stand for the surge's load.
func TestConcurrencyLimitSurgeRestartsTheCohort(t *testing.T) {
	l := adaptive(t, Policy{Initial: 12, Max: 100})
	pv := queueingProvider{k: 100, service: func() time.Duration { return time.Second }}
	s := saturate(l)
	s.demand = 30
	s.run(pv, 610)
	l.mu.Lock()
	before, ended, below := l.epoch, l.win.ended, l.below
	l.mu.Unlock()
	if ended == 0 || !below {
		t.Fatalf("cohort under way: %d answers in, begun below the limit %v; want some, true", ended, below)
	}
	s.demand = 0 // unbounded: the next sends fill the limit of 40
	s.run(pv, 1)
	l.mu.Lock()
	defer l.mu.Unlock()
	// The fill is followed by the end of an attempt of the quiet time.
	if l.epoch != before+1 || l.cohort != 1 || l.win.ended != 0 || l.held[fleet.Interactive] != 39 {
		t.Fatalf("after the surge: cohort %d (was %d), %d sent and %d ended, %d held; want the next, begun by the attempt that filled the limit, none ended, 39 held",
			l.epoch, before, l.cohort, l.win.ended, l.held[fleet.Interactive])
	}
}

// A slot given back goes to the tenant waiting that holds the fewest
// slots per unit of weight, the oldest of its waiters first; among
// tenants with equal shares, to the one whose oldest came first. The
// count of slots held by tenant keeps no tenant that holds none.
func TestConcurrencyLineByTenantShare(t *testing.T) {
	a, b, c := &core.Tenant{Name: "a", Weight: 3}, &core.Tenant{Name: "b", Weight: 1}, &core.Tenant{Name: "c", Weight: 1}
	l := newLimit(&Policy{Max: 4, BatchShare: 0.8}, nil, "primary")
	l.mu.Lock()
	defer l.mu.Unlock()
	for range 4 {
		l.takeFor(fleet.Interactive, a)
	}
	waiters := map[string]*slotWaiter{}
	for _, w := range []struct {
		name string
		t    *core.Tenant
	}{{"a1", a}, {"c1", c}, {"b1", b}, {"a2", a}, {"b2", b}, {"none", nil}} {
		l.seq++
		waiters[w.name] = &slotWaiter{cancel: func() {}, tenant: w.t, seq: l.seq}
		l.line[fleet.Interactive].push(waiters[w.name])
	}
	granted := func() []string {
		var names []string
		for name, w := range waiters {
			if w.granted {
				names = append(names, name)
			}
		}
		slices.Sort(names)
		return names
	}
	for i, want := range [][]string{
		{"c1"},                     // a 3/3, c 0, b 0, none 0: c's came first
		{"b1", "c1"},               // a 2/3, b 0, none 0
		{"b1", "c1", "none"},       // a 1/3, b 1, none 0
		{"a1", "b1", "c1", "none"}, // a 0, b 1
	} {
		l.release(fleet.Interactive, a)
		if got := granted(); !slices.Equal(got, want) {
			t.Fatalf("after %d of a's slots given back: granted %v, want %v", i+1, got, want)
		}
	}
	if l.heldBy[a] != 1 || len(l.heldBy) != 4 || l.line[fleet.Interactive].n != 2 {
		t.Fatalf("held by tenant %v, %d waiting; want a, b, c and none 1 each, 2 waiting", l.heldBy, l.line[fleet.Interactive].n)
	}
	l.release(fleet.Interactive, c) // a 1/3, b 1: a's second
	if !waiters["a2"].granted || waiters["b2"].granted {
		t.Fatalf("granted %v, want a2 before b2", granted())
	}
	for _, ten := range []*core.Tenant{a, a, b, nil} {
		l.release(fleet.Interactive, ten)
	}
	l.release(fleet.Interactive, b)
	if l.held[fleet.Interactive] != 0 || len(l.heldBy) != 0 || l.line[fleet.Interactive].n != 0 || len(l.line[fleet.Interactive].tenants) != 0 {
		t.Errorf("%d held, by tenant %v, %d waiting in %d lines; want none", l.held[fleet.Interactive], l.heldBy, l.line[fleet.Interactive].n, len(l.line[fleet.Interactive].tenants))
	}
}
