package brownout

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// psBench is a saturating provider on a scheduler of its own, with
// processes that each send it one attempt.
type psBench struct {
	s  *sched
	ps *psProvider
	// ends is when each process was answered or gave up, refused whether
	// the provider turned its attempt away, and heldAfter how many
	// attempts the provider held as it ended.
	ends      []time.Duration
	refused   []bool
	heldAfter []int
}

func newPSBench(p SaturatingProvider) *psBench {
	s := newSched(epoch)
	return &psBench{s: s, ps: newPSProvider(p, s, rand.New(rand.NewPCG(1, 1)), 1)}
}

// send starts, at virtual time at, a process that sends one attempt and
// gives up patience after it started.
func (b *psBench) send(at, patience time.Duration) {
	i := len(b.ends)
	b.ends, b.refused, b.heldAfter = append(b.ends, -1), append(b.refused, false), append(b.heldAfter, -1)
	b.s.at(epoch.Add(at), nil, func() {
		ctx, cancel := newDeadlineCtx(b.s.now.Add(patience))
		done := false
		p := b.s.spawn(ctx, func(p *proc) {
			if j := b.ps.admit(p, 0); j == nil {
				b.refused[i] = true
			} else if w := b.s.park(ctx, nil); w.err != nil {
				b.ps.leave(j)
			}
			b.ends[i], b.heldAfter[i] = b.s.now.Sub(epoch), len(b.ps.held)
			done = true
		})
		if !done {
			b.s.at(ctx.deadline, p, func() { ctx.expired = true; cancel() })
		}
	})
}

func (b *psBench) run() { b.s.run(epoch.Add(time.Hour)) }

// fixedWork is a provider of cores cores and depth depth whose every
// attempt needs 2 s of work.
func fixedWork(cores, depth int) SaturatingProvider {
	return SaturatingProvider{Cores: cores, Depth: depth, WorkMin: 2 * time.Second, WorkMax: 2 * time.Second, RejectLatency: 50 * time.Millisecond}
}

// An attempt's time is its work while the provider holds no more than its
// cores, and grows in proportion to what it holds beyond them.
func TestSaturatingServiceTimeGrowsWithHeld(t *testing.T) {
	for _, tc := range []struct {
		n    int
		want time.Duration
	}{{1, 2 * time.Second}, {4, 2 * time.Second}, {8, 4 * time.Second}, {12, 6 * time.Second}, {20, 10 * time.Second}} {
		b := newPSBench(fixedWork(4, 20))
		for range tc.n {
			b.send(0, time.Minute)
		}
		b.run()
		for i, end := range b.ends {
			if b.refused[i] || end < tc.want || end > tc.want+time.Microsecond {
				t.Errorf("%d held at once: attempt %d ended at %v (refused %v), want %v", tc.n, i, end, b.refused[i], tc.want)
			}
		}
	}
	// An attempt that arrives later shares what is left: two attempts on
	// one core, the second a second later, end at 3 s and 4 s.
	b := newPSBench(fixedWork(1, 10))
	b.send(0, time.Minute)
	b.send(time.Second, time.Minute)
	b.run()
	if b.ends[0] < 3*time.Second || b.ends[0] > 3*time.Second+time.Microsecond ||
		b.ends[1] < 4*time.Second || b.ends[1] > 4*time.Second+time.Microsecond {
		t.Errorf("two attempts on one core, at 0 s and 1 s: ended at %v and %v, want 3s and 4s", b.ends[0], b.ends[1])
	}
}

// The provider refuses an attempt only when it holds Depth, and a refusal
// takes nothing from the others.
func TestSaturating529OnlyPastDepth(t *testing.T) {
	b := newPSBench(fixedWork(4, 20))
	for range 19 {
		b.send(0, time.Minute)
	}
	b.send(time.Second, time.Minute) // the 20th: held, to the depth
	b.send(time.Second, time.Minute) // the 21st and 22nd: refused
	b.send(time.Second, time.Minute)
	b.run()
	for i, refused := range b.refused {
		if want := i >= 20; refused != want {
			t.Errorf("attempt %d: refused %v, want %v", i, refused, want)
		}
		if refused && b.ends[i] != time.Second {
			t.Errorf("attempt %d: refused at %v, want at once (1s)", i, b.ends[i])
		}
	}
	// 19 attempts had 4/19 of a core for a second, then 20 share 4 cores:
	// the first 19 end at 1 + (2 - 4/19)*5 s.
	rest := (2 - 4.0/19) * 5
	want := time.Second + time.Duration(rest*float64(time.Second))
	if end := b.ends[0]; end < want-time.Microsecond || end > want+time.Microsecond {
		t.Errorf("first attempt ended at %v, want %v: a refusal must not slow the others", end, want)
	}
}

// An attempt whose caller gives up leaves at once, and the others speed
// up: its work is lost, not finished for nobody.
func TestSaturatingCancelledAttemptLeaves(t *testing.T) {
	b := newPSBench(fixedWork(1, 10))
	b.send(0, time.Minute)
	b.send(0, time.Second) // gives up after 1 s, half a second of work done
	b.run()
	if b.ends[1] != time.Second || b.heldAfter[1] != 1 {
		t.Errorf("the attempt given up ended at %v with %d held after it; want 1s, 1", b.ends[1], b.heldAfter[1])
	}
	// The other had half a core for 1 s, then the whole: 1.5 s more.
	if want := 2500 * time.Millisecond; b.ends[0] < want || b.ends[0] > want+time.Microsecond {
		t.Errorf("the other attempt ended at %v, want %v", b.ends[0], want)
	}
	if len(b.ps.held) != 0 || b.ps.next != nil {
		t.Errorf("after the run: %d held, next completion %v; want none", len(b.ps.held), b.ps.next)
	}
}

func TestSaturatingBadSettings(t *testing.T) {
	sc := SaturationScenario(2)
	for _, tc := range []struct {
		edit func(*Scenario)
		want string
	}{
		{func(sc *Scenario) { sc.Saturating.Cores = 0 }, "Cores = 0"},
		{func(sc *Scenario) { sc.Saturating.Depth = 1 }, "Depth = 1"},
		{func(sc *Scenario) { sc.Saturating.WorkMax = time.Millisecond }, "WorkMin, WorkMax"},
		{func(sc *Scenario) { sc.Surge.Factor = 0 }, "Factor: 0"},
	} {
		x := sc
		p, u := *sc.Saturating, *sc.Surge
		x.Saturating, x.Surge = &p, &u
		tc.edit(&x)
		if _, err := Run(x, DamperRecommended()); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Run: err = %v, want one naming %q", err, tc.want)
		}
	}
	x := sc
	x.Saturating = nil
	if _, err := RunSaturation(x, SaturationContenders(2)); err == nil || !strings.Contains(err.Error(), "Saturating is nil") {
		t.Errorf("RunSaturation without a saturating provider: err = %v, want one naming Saturating", err)
	}
}

// Arrivals follow the surge: the load is Factor times as high while it
// lasts.
func TestSurgeArrivals(t *testing.T) {
	sc := SaturationScenario(10)
	u := sc.Surge
	var before, during, after int
	now := time.Duration(0)
	rng := rand.New(rand.NewPCG(7, 7))
	for now < sc.Duration {
		switch {
		case now < u.Start:
			before++
		case now < u.Start+u.Length:
			during++
		default:
			after++
		}
		now = sc.nextArrival(now, rng.ExpFloat64())
	}
	rate := func(n int, d time.Duration) float64 { return float64(n) / d.Seconds() }
	rb, rd, ra := rate(before, u.Start), rate(during, u.Length), rate(after, sc.Duration-u.Start-u.Length)
	if rb < 0.95*sc.Rate || rb > 1.05*sc.Rate || ra < 0.95*sc.Rate || ra > 1.05*sc.Rate ||
		rd < 0.95*u.Factor*sc.Rate || rd > 1.05*u.Factor*sc.Rate {
		t.Errorf("arrivals a second: %.1f before, %.1f during, %.1f after the surge; want %g, %g, %g within 5 %%", rb, rd, ra, sc.Rate, u.Factor*sc.Rate, sc.Rate)
	}
}
