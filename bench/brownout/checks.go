package brownout

import (
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/damper-ai/damper-go/fleet"
)

// Check is one of the targets the benchmark must show, and whether the
// run showed it.
type Check struct {
	Target string
	Pass   bool
	Detail string
}

// Suite is every contender's result for each scenario, in order.
type Suite struct {
	// Scenarios are the published scenarios: a table and a chart each.
	Scenarios []Scenario
	// OutageStarts are the incident starts at which the scenario named
	// "outage" was also run, for its worst case; with none, only its own
	// start counts.
	OutageStarts []time.Duration
	Results      map[string][]*Result // by scenario name, in contender order
}

// RunSuite runs every scenario with every contender, and the scenario
// named "outage" at each of outageStarts too. Runs are independent, so
// they run in parallel; each is deterministic on its own.
func RunSuite(scenarios []Scenario, outageStarts []time.Duration, contenders []Contender) (*Suite, error) {
	s := &Suite{Scenarios: scenarios, OutageStarts: outageStarts, Results: map[string][]*Result{}}
	all := slices.Clone(scenarios)
	if out, ok := s.scenario("outage"); ok {
		for _, start := range outageStarts {
			if v := OutageAt(out, start); !slices.ContainsFunc(all, func(x Scenario) bool { return x.Name == v.Name }) {
				all = append(all, v)
			}
		}
	}
	results, err := runAll(all, contenders)
	if err != nil {
		return nil, err
	}
	for i, sc := range all {
		s.Results[sc.Name] = results[i*len(contenders) : (i+1)*len(contenders)]
	}
	return s, nil
}

// runAll runs every scenario with every contender, on as many goroutines
// as there are processors, and returns the results scenario by scenario,
// each in contender order, or the first error in that order.
func runAll(scenarios []Scenario, contenders []Contender) ([]*Result, error) {
	var scs []Scenario
	var cs []Contender
	for _, sc := range scenarios {
		for _, c := range contenders {
			scs, cs = append(scs, sc), append(cs, c)
		}
	}
	return runPairs(scs, cs)
}

// runEach runs sc with every contender, and returns the results in
// contender order.
func runEach(sc Scenario, contenders []Contender) ([]*Result, error) {
	scs := make([]Scenario, len(contenders))
	for i := range scs {
		scs[i] = sc
	}
	return runPairs(scs, contenders)
}

// resultOf returns the result of contender among results.
func resultOf(results []*Result, contender string) (*Result, bool) {
	i := slices.IndexFunc(results, func(r *Result) bool { return r.Contender == contender })
	if i < 0 {
		return nil, false
	}
	return results[i], true
}

// runPairs runs scenarios[j] with contenders[j] for every j, on as many
// goroutines as there are processors, and returns the results in that
// order, or the first error in that order.
func runPairs(scenarios []Scenario, contenders []Contender) ([]*Result, error) {
	n := len(scenarios)
	results := make([]*Result, n)
	errs := make([]error, n)
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), n) {
		wg.Go(func() {
			for j := range jobs {
				results[j], errs[j] = Run(scenarios[j], contenders[j])
			}
		})
	}
	for j := range n {
		jobs <- j
	}
	close(jobs)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return results, nil
}

// scenario returns the published scenario called name.
func (s *Suite) scenario(name string) (Scenario, bool) {
	i := slices.IndexFunc(s.Scenarios, func(sc Scenario) bool { return sc.Name == name })
	if i < 0 {
		return Scenario{}, false
	}
	return s.Scenarios[i], true
}

func (s *Suite) figures(scenario string) map[string]Figures {
	out := map[string]Figures{}
	for _, r := range s.Results[scenario] {
		out[r.Contender] = r.Figures()
	}
	return out
}

// Targets whose misses the report explains.
const (
	targetLowestOutage = "full outage (worst start): Damper's amplification the lowest of all contenders (the no-retry control and Damper's opt-in policies aside)"
	targetRecovery     = "capacity-drop-costly: the recommended policy recovers no later than any other contender"
)

// Names of the contenders that targets single out.
const (
	controlName     = "no-retry"
	damperName      = "damper"
	recommendedName = "damper+breaker"
)

// isDamperOptIn reports whether name is Damper with an opt-in policy.
func isDamperOptIn(name string) bool {
	return strings.HasPrefix(name, damperName+"+")
}

// Checks evaluates the targets on the suite's results: Damper's default
// policy's, then the recommended policy's. A scenario that the suite did
// not run is reported as not shown.
func (s *Suite) Checks() []Check {
	var checks []Check
	add := func(target string, pass bool, detail string, args ...any) {
		checks = append(checks, Check{Target: target, Pass: pass, Detail: fmt.Sprintf(detail, args...)})
	}
	s.defaultChecks(add)
	s.recommendedChecks(add)
	return checks
}

// addCheck records a target, whether it was shown, and its measurement.
type addCheck func(target string, pass bool, detail string, args ...any)

func (s *Suite) defaultChecks(add addCheck) {
	worst := s.WorstOutage()
	d, ok := worst[damperName]
	add("full outage (worst start): Damper's amplification at most 1.10x",
		ok && d.Figures.Amplification <= 1.10,
		"%.3fx (start %s)", d.Figures.Amplification, secs0(d.Start))
	by, lowest := lowestWorst(worst, func(name string) bool {
		return name != damperName && name != controlName && !isDamperOptIn(name)
	})
	add(targetLowestOutage,
		ok && by != "" && d.Figures.Amplification < lowest.Figures.Amplification,
		"lowest: %s at %.3fx (start %s)", by, lowest.Figures.Amplification, secs0(lowest.Start))

	bo := s.figures("brownout")
	best, bestBy := bestGoodput(bo)
	d1, ok := bo[damperName]
	add("brownout (10 % of attempts fail): Damper's goodput at least 95 % of the best contender's",
		ok && best > 0 && d1.Goodput >= 0.95*best,
		"damper %.2f/s, best %s %.2f/s (%.1f %%)", d1.Goodput, bestBy, best, 100*d1.Goodput/max(best, 1e-9))

	window := defaults.RetryBudgetWindow
	for _, name := range []string{"capacity-drop", "capacity-drop-costly"} {
		f, ok := s.figures(name)[damperName]
		add(fmt.Sprintf("%s: Damper recovers to %.0f %% goodput within one budget window (%v) of the cause ending", name, 100*RecoveryShare, window),
			ok && f.Recovered && f.Recovery <= window, "%s", recoveryText(f))
	}
}

func (s *Suite) recommendedChecks(add addCheck) {
	worst := s.WorstOutage()
	rw, ok := worst[recommendedName]
	by, lowest := lowestWorst(worst, func(name string) bool { return name != recommendedName && name != controlName })
	add("full outage (worst start): the recommended policy's amplification lower than every other contender's (the no-retry control, 1.000x by definition, aside)",
		ok && by != "" && rw.Figures.Amplification < lowest.Figures.Amplification,
		"damper+breaker %.3fx (start %s); next lowest: %s %.3fx (start %s)", rw.Figures.Amplification, secs0(rw.Start), by, lowest.Figures.Amplification, secs0(lowest.Start))

	p := s.probeSummary(recommendedName)
	add("full outage (every start): with the recommended policy, once a replica's breaker has opened, at most one attempt per open period reaches the provider while the outage lasts",
		p.replicas > 0 && p.worst.Attempts <= p.worst.OpenPeriods,
		"worst replica: %d attempts in %d open periods; all %d replicas of %d runs: %d attempts in %d open periods",
		p.worst.Attempts, p.worst.OpenPeriods, p.replicas, p.runs, p.attempts, p.periods)

	bo := s.figures("brownout")
	best, bestBy := bestGoodput(bo)
	rb, ok := bo[recommendedName]
	openings, refused := s.breakerActivity("brownout", recommendedName)
	add("brownout (10 % of attempts fail): the recommended policy's goodput at least 99 % of the best contender's, and its breaker never opens",
		ok && best > 0 && rb.Goodput >= 0.99*best && openings == 0 && refused == 0,
		"damper+breaker %.2f/s, best %s %.2f/s (%.1f %%); %d openings, %d calls refused", rb.Goodput, bestBy, best, 100*rb.Goodput/max(best, 1e-9), openings, refused)

	cd := s.figures("capacity-drop-costly")
	rc, ok := cd[recommendedName]
	others := maps.Clone(cd)
	delete(others, recommendedName)
	best, bestBy = bestGoodput(others)
	add("capacity-drop-costly: the recommended policy's goodput the highest of all contenders (ties allowed)",
		ok && rc.Goodput >= best,
		"damper+breaker %.2f/s; next: %s %.2f/s", rc.Goodput, bestBy, best)
	first, firstBy := earliestRecovery(others)
	add(targetRecovery,
		ok && rc.Recovered && (firstBy == "" || rc.Recovery <= first.Recovery),
		"damper+breaker after %s; earliest: %s after %s", recoveryText(rc), firstBy, recoveryText(first))
}

// probeSummary is the sum of a contender's probe tallies over every start
// of the outage.
type probeSummary struct {
	// worst is the replica with the most attempts beyond its open periods
	// (the first, in a tie).
	worst                             ProbeTally
	runs, replicas, attempts, periods int
}

// probeSummary sums the probe tallies of contender.
func (s *Suite) probeSummary(contender string) probeSummary {
	var p probeSummary
	for _, run := range s.OutageRuns() {
		for _, r := range run.Results {
			if r.Contender != contender {
				continue
			}
			p.runs++
			for _, t := range r.ProbeTallies() {
				if p.replicas == 0 || t.Attempts-t.OpenPeriods > p.worst.Attempts-p.worst.OpenPeriods {
					p.worst = t
				}
				p.replicas++
				p.attempts += t.Attempts
				p.periods += t.OpenPeriods
			}
		}
	}
	return p
}

// lowestWorst returns, among the contenders that keep accepts, the one
// whose worst case of the outage has the lowest amplification (the first
// by name, in a tie).
func lowestWorst(worst map[string]Worst, keep func(string) bool) (string, Worst) {
	by, lowest := "", Worst{}
	for _, name := range slices.Sorted(maps.Keys(worst)) {
		w := worst[name]
		if keep(name) && (by == "" || w.Figures.Amplification < lowest.Figures.Amplification) {
			by, lowest = name, w
		}
	}
	return by, lowest
}

// bestGoodput returns the highest goodput in figures and whose it is (the
// first by name, in a tie).
func bestGoodput(figures map[string]Figures) (float64, string) {
	best, by := 0.0, ""
	for _, name := range slices.Sorted(maps.Keys(figures)) {
		if f := figures[name]; by == "" || f.Goodput > best {
			best, by = f.Goodput, name
		}
	}
	return best, by
}

// earliestRecovery returns the figures that recovered first, and whose
// they are (the first by name, in a tie); by is "" if none recovered.
func earliestRecovery(figures map[string]Figures) (first Figures, by string) {
	for _, name := range slices.Sorted(maps.Keys(figures)) {
		if f := figures[name]; f.Recovered && (by == "" || f.Recovery < first.Recovery) {
			first, by = f, name
		}
	}
	return first, by
}

// breakerActivity returns, for contender in scenario, how many times a
// breaker opened and how many calls an open breaker refused.
func (s *Suite) breakerActivity(scenario, contender string) (openings, refused int) {
	for _, r := range s.Results[scenario] {
		if r.Contender != contender {
			continue
		}
		for _, e := range r.Circuit {
			if e.To == fleet.CircuitOpen {
				openings++
			}
		}
		for _, q := range r.Requests {
			if q.CircuitOpen {
				refused++
			}
		}
	}
	return openings, refused
}

// secs0 writes a whole number of seconds, such as a start time.
func secs0(d time.Duration) string {
	return fmt.Sprintf("%d s", int(d/time.Second))
}

func recoveryText(f Figures) string {
	if !f.Recovered {
		return "never, within the run"
	}
	return f.Recovery.Round(time.Second).String()
}
