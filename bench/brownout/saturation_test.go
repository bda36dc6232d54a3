package brownout

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

// saturationSuite is the published saturation scenario: a run takes a few
// seconds, and the limits' figures depend on the number of replicas.
var saturationSuite = sync.OnceValues(func() (*SaturationSuite, error) {
	return RunSaturation(SaturationScenario(DefaultReplicas), SaturationContenders(DefaultReplicas))
})

func TestSaturationTargets(t *testing.T) {
	s, err := saturationSuite()
	if err != nil {
		t.Fatal(err)
	}
	checks := s.Checks()
	if len(checks) != 3 {
		t.Fatalf("got %d saturation checks, want 3", len(checks))
	}
	md := s.Markdown()
	for _, c := range checks {
		switch {
		case c.Pass:
		case c.Target == saturationTargetP99:
			// The adaptive limit's tolerance and its wait for a slot
			// keep it short of this one: the report must say why.
			t.Logf("target missed, and explained in the report: %s (%s)", c.Target, c.Detail)
			if !strings.Contains(md, "**Why the latency target is missed.**") {
				t.Errorf("target missed without its reason in the report: %s (%s)", c.Target, c.Detail)
			}
		default:
			t.Errorf("target missed: %s (%s)", c.Target, c.Detail)
		}
	}

	sc := s.Scenario
	f := s.figures()
	rec, fx, a := f[recommendedName], f[fixedLimitName], f[adaptiveLimitName]
	// Without a limit the provider fills to its depth, answers 529 there,
	// and its slowness runs requests into their deadline.
	if rec.PeakHeld != sc.Saturating.Depth || rec.Rejected == 0 || rec.TimedOut < 0.05 || rec.Limited != 0 {
		t.Errorf("%s: peak held %d, %d 529s, %.3f timed out, %.3f limited; want the depth (%d), some 529s, over 0.05 timed out, none limited",
			recommendedName, rec.PeakHeld, rec.Rejected, rec.TimedOut, rec.Limited, sc.Saturating.Depth)
	}
	// A limit holds the provider under its depth: no 529, no timeout,
	// and the excess refused by the limit instead.
	limit := SaturationFixedLimit(sc.Replicas)
	if fx.PeakHeld > limit*sc.Replicas || fx.Rejected != 0 || fx.TimedOut != 0 || fx.Limited == 0 {
		t.Errorf("%s: peak held %d, %d 529s, %.3f timed out, %.3f limited; want at most %d, none, none, some",
			fixedLimitName, fx.PeakHeld, fx.Rejected, fx.TimedOut, fx.Limited, limit*sc.Replicas)
	}
	if a.PeakHeld >= sc.Saturating.Depth || a.Rejected != 0 || a.TimedOut != 0 || a.Limited == 0 || a.P99 >= rec.P99 {
		t.Errorf("%s: peak held %d, %d 529s, %.3f timed out, %.3f limited, p99 %v; want under the depth, none, none, some, under %s's %v",
			adaptiveLimitName, a.PeakHeld, a.Rejected, a.TimedOut, a.Limited, a.P99, recommendedName, rec.P99)
	}
	// With the tolerance that suits this provider's narrow spread of
	// times, the adaptive limit meets all three targets, as the report
	// says.
	if t13 := f[fmt.Sprintf("%s-%g", adaptiveLimitName, SaturationTolerance)]; t13.P99 > rec.P99/2 || t13.OK < rec.OK ||
		t13.SurgeGoodput < rec.SurgeGoodput || t13.Attempts > rec.Attempts {
		t.Errorf("tolerance %g: p99 %v, %d successful, %.2f/s in the surge, %d attempts; want at most half of %v, at least %d and %.2f/s, at most %d",
			SaturationTolerance, t13.P99, t13.OK, t13.SurgeGoodput, t13.Attempts, rec.P99, rec.OK, rec.SurgeGoodput, rec.Attempts)
	}
	// The limits are read from each replica's gauge: none without a
	// limit, the fixed one throughout, and the adaptive one moving.
	for _, r := range s.Results {
		for i, by := range r.Limit {
			lo, hi := by[0], by[0]
			for _, v := range by[:int(sc.Duration/time.Second)] {
				lo, hi = min(lo, v), max(hi, v)
			}
			var ok bool
			switch r.Contender {
			case recommendedName:
				ok = hi == -1
			case fixedLimitName:
				ok = lo == limit && hi == limit
			case adaptiveLimitName, fmt.Sprintf("%s-%g", adaptiveLimitName, SaturationTolerance):
				ok = lo >= 1 && hi > lo
			}
			if !ok {
				t.Errorf("%s, replica %d: limit from %d to %d over the run", r.Contender, i, lo, hi)
			}
		}
	}

	for _, want := range []string{"### " + sc.Title + "\n", "| " + fixedLimitName + " | ", "| " + adaptiveLimitName + " | ",
		"#### Saturation targets", "**failsafe-go's adaptive limiter**", "`adaptiveLimiter.newPermit`", "limits: "} {
		if !strings.Contains(md, want) {
			t.Errorf("saturation report lacks %q", want)
		}
	}
}

// TestSaturationDeterministic runs a short saturation scenario twice with
// the adaptive limit: waits for a slot, the provider's sharing and the
// gauges' readings must not make runs differ.
func TestSaturationDeterministic(t *testing.T) {
	sc := SaturationScenario(2)
	sc.Duration = 150 * time.Second
	run := func() *Result {
		r, err := Run(sc, DamperAdaptiveLimit())
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	a, b := run(), run()
	if !reflect.DeepEqual(a.Requests, b.Requests) || !reflect.DeepEqual(a.Attempts, b.Attempts) ||
		!reflect.DeepEqual(a.Held, b.Held) || !reflect.DeepEqual(a.Limit, b.Limit) {
		t.Error("two runs of the saturation scenario differ")
	}
	if f := a.SaturationFigures(); f.Limited == 0 || f.OK == 0 {
		t.Errorf("%d successful, %.3f limited: want the limit to refuse some of the surge", f.OK, f.Limited)
	}
}

// A slot handed on wakes its waiter at once: with a fixed limit of one,
// a call that finds the slot taken is sent when the call before it is
// answered, not when its wait for a slot would have ended.
func TestSaturationSlotWakesItsWaiter(t *testing.T) {
	sc := SaturationScenario(1)
	sc.Saturating.WorkMin, sc.Saturating.WorkMax = 500*time.Millisecond, 500*time.Millisecond
	r, err := runAt(sc, DamperFixedLimit(1), 0, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Requests) != 2 || !r.Requests[0].OK || !r.Requests[1].OK {
		t.Fatalf("requests %+v: want two, both successful", r.Requests)
	}
	if got, want := r.Requests[1].LastSent, r.Requests[0].Ended; got != want {
		t.Errorf("the second request was sent at %v, want when the first ended (%v)", got, want)
	}
}

// runAt runs contender c's one replica against sc's saturating provider
// with a request issued at each of at.
func runAt(sc Scenario, c Contender, at ...time.Duration) (*Result, error) {
	s := newSched(epoch)
	res := &Result{Scenario: sc, Contender: c.Name, AttemptsPerSecond: make([]int, 60), GoodputPerSecond: make([]int, 60)}
	run := &runState{s: s, provider: newProviderState(Provider{}, sc.Seed, 1), res: res}
	run.saturating = newPSProvider(*sc.Saturating, s, rand.New(rand.NewPCG(sc.Seed, 1)), 1)
	replica, err := c.newReplica(replicaEnv{
		transport: simTransport{run: run},
		clock:     simClock{s: s},
		rng:       rand.New(rand.NewPCG(sc.Seed, 100)),
		circuit:   run.circuitRecorder(0),
		params:    paramsFor(""),
		moved:     run.noteMove,
	})
	if err != nil {
		return nil, err
	}
	for _, t := range at {
		s.at(epoch.Add(t), nil, func() { run.start(replica, sc.Deadline, 0) })
	}
	s.run(epoch.Add(time.Hour))
	return res, nil
}
