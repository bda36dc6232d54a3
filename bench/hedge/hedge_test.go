package hedge

import (
	"flag"
	"slices"
	"testing"
	"testing/synctest"
)

var docsPath = flag.String("hedge.docs", "", "rewrite the hedging section of this Markdown file; go test runs in the package directory, so ../../docs/BENCHMARKS.md")

// run runs each contender through s, each in a bubble of its own, in
// parallel, and returns their results in order.
func run(t *testing.T, s Scenario, cs []Contender) []Result {
	t.Helper()
	rs := make([]Result, len(cs))
	for i, c := range cs {
		t.Run(c.Name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				r, err := Run(c, s)
				if err != nil {
					t.Fatal(err)
				}
				rs[i] = r
			})
		})
	}
	return rs
}

func TestHedgeCutsTheTail(t *testing.T) {
	afterHeaders := DefaultScenario
	afterHeaders.AfterHeaders = true
	afterContenders := []Contender{Damper(), DamperHedge(), DamperHedgeFixed(), FailsafeFixed(), FailsafeQuantile()}
	var main, late []Result // the wait before the headers, after them
	t.Run("runs", func(t *testing.T) {
		main = run(t, DefaultScenario, Contenders())
		late = run(t, afterHeaders, afterContenders)
	})
	if t.Failed() {
		return
	}
	for _, r := range main {
		t.Log("wait before the headers:", r)
	}
	for _, r := range late {
		t.Log("wait after the headers: ", r)
	}
	for _, r := range slices.Concat(main, late) {
		if r.Errors > 0 {
			t.Errorf("%s: %d of %d requests failed; the first: %s", r.Contender.Name, r.Errors, r.Requests, r.FirstError)
		}
		if !r.Reported {
			continue
		}
		if r.OpenBodies > 0 { // Damper closes every body it does not hand over
			t.Errorf("%s: %d response bodies left open", r.Contender.Name, r.OpenBodies)
		}
		if r.HedgesWon != r.ServedByHedge {
			t.Errorf("%s: Report.HedgeWon on %d calls, but the provider served %d streams from a hedge", r.Contender.Name, r.HedgesWon, r.ServedByHedge)
		}
	}

	base, hedged := byName(t, main, Damper().Name), byName(t, main, DamperHedge().Name)
	lateBase, lateHedged := byName(t, late, Damper().Name), byName(t, late, DamperHedge().Name)
	targets := slices.Concat(
		Targets("wait before the headers", base, hedged),
		Targets("wait after the headers", lateBase, lateHedged))

	if *docsPath != "" {
		if err := RewriteSection(*docsPath, Markdown(DefaultScenario, main, late, targets)); err != nil {
			t.Fatal(err)
		}
		t.Logf("rewrote %q in %s", Heading, *docsPath)
	}

	for _, tg := range targets {
		t.Logf("target %s: %s", tg.Name, tg.Measured)
	}
	for _, h := range []struct {
		label string
		r     Result
	}{{"wait before the headers", hedged}, {"wait after the headers", lateHedged}} {
		if h.r.Hedges == 0 {
			t.Errorf("%s: %s sent no hedge (Report.Hedges is 0 on every call): the engine does not hedge", h.label, h.r.Contender.Name)
		}
	}
	for _, tg := range targets {
		if !tg.Met {
			t.Errorf("target missed: %s: %s", tg.Name, tg.Measured)
		}
	}
}

// byName returns the result of the contender called name.
func byName(t *testing.T, rs []Result, name string) Result {
	t.Helper()
	i := slices.IndexFunc(rs, func(r Result) bool { return r.Contender.Name == name })
	if i < 0 {
		t.Fatalf("no result for %s", name)
	}
	return rs[i]
}

func TestDeterministic(t *testing.T) {
	s := DefaultScenario
	s.Requests = 500
	var runs [2]Result
	for i := range runs {
		synctest.Test(t, func(t *testing.T) {
			r, err := Run(DamperHedge(), s)
			if err != nil {
				t.Fatal(err)
			}
			r.Contender = Contender{}
			runs[i] = r
		})
	}
	a, b := runs[0], runs[1]
	if a.String() != b.String() || !slices.Equal(a.FirstContent, b.FirstContent) {
		t.Errorf("two runs differ:\n%v\n%v", a, b)
	}
	t.Log(a)
}
