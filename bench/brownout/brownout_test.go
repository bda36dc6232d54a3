package brownout

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/fleet"
)

// fastStarts are the outage starts of the fast suite: the first second of
// a budget window, the published start, and the phase of Damper's worst
// case in the published run.
var fastStarts = []time.Duration{60 * time.Second, PublishedStart, 115 * time.Second}

// fastScenarios are the published scenarios, some with fewer replicas so
// that the run stays short under -race: 2 for the full outage and the
// capacity drop with free rejections, whose figures that matter are per
// replica; 5 for the brownout, where the recommended policy's goodput is
// compared more closely than 2 replicas' noise allows; and the published
// 10 for the costly capacity drop, where the breakers shed load a replica
// at a time, a step too coarse for its targets with fewer replicas.
func fastScenarios() []Scenario {
	two, five, published := Scenarios(2), Scenarios(5), Scenarios(DefaultReplicas)
	return []Scenario{two[0], five[1], two[2], published[3]}
}

// fastSuite is fastScenarios, with the outage at fastStarts.
var fastSuite = sync.OnceValues(func() (*Suite, error) {
	return RunSuite(fastScenarios(), fastStarts, Contenders())
})

func suite(t *testing.T) *Suite {
	t.Helper()
	s, err := fastSuite()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestOutageAmplification(t *testing.T) {
	s := suite(t)
	f := s.figures("outage")
	d := f["damper"]
	if d.Amplification > 1.10 {
		t.Errorf("damper amplification in a full outage = %.3fx, want <= 1.10x", d.Amplification)
	}
	// gRPC's throttler is stricter still in a long outage (see the docs);
	// every contender without a shared retry limit must be far above.
	for _, name := range []string{"sdk-default", "naive-3x", "failsafe-go"} {
		if f[name].Amplification <= d.Amplification || f[name].Amplification < 2.5 {
			t.Errorf("%s amplification = %.3fx, want above damper's %.3fx and 2.5x", name, f[name].Amplification, d.Amplification)
		}
	}
	if d.SuccessShare != 0 || d.TimedOut != 0 || d.FailedFast != 1 {
		t.Errorf("damper in a full outage: success %.3f, timed out %.3f, failed fast %.3f; want 0, 0, 1", d.SuccessShare, d.TimedOut, d.FailedFast)
	}
	if a := f["no-retry"].Amplification; a != 1 {
		t.Errorf("no-retry amplification = %.3fx, want exactly 1", a)
	}

	runs := s.OutageRuns()
	if len(runs) != len(fastStarts) {
		t.Fatalf("outage run at %d starts, want %d", len(runs), len(fastStarts))
	}
	worst := s.WorstOutage()
	if w := worst["damper"]; w.Figures.Amplification > 1.10 || w.Lowest > w.Figures.Amplification {
		t.Errorf("damper's worst case: %.3fx at %v (lowest %.3fx), want at most 1.10x", w.Figures.Amplification, w.Start, w.Lowest)
	}
	rec := worst["damper+breaker"]
	for name, w := range worst {
		if name != "damper+breaker" && w.Figures.Amplification <= rec.Figures.Amplification {
			t.Errorf("%s worst case %.3fx, not above the recommended policy's %.3fx", name, w.Figures.Amplification, rec.Figures.Amplification)
		}
	}
}

// TestOutageProbes checks the recommended policy in a full outage: every
// replica's breaker opens, and after that at most one attempt per open
// period reaches the provider while the outage lasts.
func TestOutageProbes(t *testing.T) {
	for _, run := range suite(t).OutageRuns() {
		r := run.Results[len(run.Results)-1]
		if r.Contender != "damper+breaker" {
			t.Fatalf("last contender is %s, want damper+breaker", r.Contender)
		}
		tallies := r.ProbeTallies()
		if len(tallies) != r.Scenario.Replicas {
			t.Errorf("start %v: %d replicas opened their breaker, want all %d", run.Start, len(tallies), r.Scenario.Replicas)
		}
		for _, x := range tallies {
			if x.Attempts > x.OpenPeriods || x.OpenPeriods < 2 {
				t.Errorf("start %v, replica %d: %d attempts in %d open periods, want at most one per period, over at least 2", run.Start, x.Replica, x.Attempts, x.OpenPeriods)
			}
		}
	}
}

func TestProbeTallies(t *testing.T) {
	sc := Scenarios(2)[0]
	r := &Result{
		Scenario: sc,
		Attempts: []Attempt{{At: 91 * time.Second, Replica: 0}, {At: 100 * time.Second, Replica: 1}, {At: 130 * time.Second, Replica: 0}, {At: 200 * time.Second, Replica: 0}, {At: 250 * time.Second, Replica: 0}},
		Circuit: []CircuitEvent{
			{At: 95 * time.Second, Replica: 0, To: fleet.CircuitOpen, Backend: damper.PrimaryBackend, Seq: 1},
			{At: 125 * time.Second, Replica: 0, To: fleet.CircuitHalfOpen, Backend: damper.PrimaryBackend, Seq: 2},
			{At: 130 * time.Second, Replica: 0, To: fleet.CircuitOpen, Backend: damper.PrimaryBackend, Seq: 3},
		},
	}
	// Replica 0: the attempts at 130 s and 200 s came after it opened and
	// before the outage ended at 210 s; the one at 250 s did not.
	want := []ProbeTally{{Replica: 0, Attempts: 2, OpenPeriods: 2}}
	if got := r.ProbeTallies(); !reflect.DeepEqual(got, want) {
		t.Errorf("ProbeTallies = %+v, want %+v", got, want)
	}
}

func TestBrownoutGoodput(t *testing.T) {
	s := suite(t)
	f := s.figures("brownout")
	best, by := bestGoodput(f)
	if d := f["damper"]; d.Goodput < 0.95*best {
		t.Errorf("damper brownout goodput %.2f/s < 95 %% of %s's %.2f/s", d.Goodput, by, best)
	}
	if d := f["damper+breaker"]; d.Goodput < 0.99*best {
		t.Errorf("damper+breaker brownout goodput %.2f/s < 99 %% of %s's %.2f/s", d.Goodput, by, best)
	}
	if openings, refused := s.breakerActivity("brownout", "damper+breaker"); openings != 0 || refused != 0 {
		t.Errorf("damper+breaker in the brownout: %d openings, %d calls refused; want none", openings, refused)
	}
}

func TestCapacityDropRecovery(t *testing.T) {
	s := suite(t)
	f := s.figures("capacity-drop-costly")
	if d := f["damper"]; !d.Recovered || d.Recovery > time.Minute {
		t.Errorf("damper recovery after the capacity drop = %v (recovered %v), want within 1m0s", d.Recovery, d.Recovered)
	}
	// The storm: contenders that retry every rejection keep the provider
	// saturated after the cause is gone.
	for _, name := range []string{"sdk-default", "naive-3x"} {
		if x := f[name]; x.Recovered || x.Amplification < 2.5 {
			t.Errorf("%s: recovered %v after %v with %.3fx; want a storm that never recovers", name, x.Recovered, x.Recovery, x.Amplification)
		}
	}
	// The recommended policy's breakers shed the load: the most goodput,
	// and a recovery late by no more than one open period (see the docs).
	rec := f["damper+breaker"]
	for name, x := range f {
		if x.Goodput > rec.Goodput {
			t.Errorf("%s goodput %.2f/s above damper+breaker's %.2f/s", name, x.Goodput, rec.Goodput)
		}
	}
	if !rec.Recovered || rec.Recovery > recommended.Breaker.OpenFor {
		t.Errorf("damper+breaker recovery = %v (recovered %v), want within one open period", rec.Recovery, rec.Recovered)
	}
	if _, refused := s.breakerActivity("capacity-drop-costly", "damper+breaker"); refused == 0 {
		t.Error("damper+breaker: no call refused by an open breaker in the costly capacity drop")
	}
}

// knownMisses are the targets the published run misses, each with the
// start its Detail must have (see the docs): gRPC's throttler stops
// retrying sooner than Damper's default policy in a long outage, at a cost
// in the brownout. Any other miss, or this one lost to another contender,
// fails the test.
var knownMisses = map[string]string{
	targetLowestOutage: "lowest: grpc-throttle at ",
}

func TestChecksAndReport(t *testing.T) {
	s := suite(t)
	checks := s.Checks()
	// Damper's default policy: outage (two), brownout and both capacity
	// drops; the recommended policy: outage (two), brownout and the costly
	// capacity drop (two).
	if len(checks) != 10 {
		t.Fatalf("got %d checks, want 10", len(checks))
	}
	for _, sc := range fastScenarios() {
		if len(s.Results[sc.Name]) != len(Contenders()) {
			t.Errorf("scenario %s has %d results, want one per contender", sc.Name, len(s.Results[sc.Name]))
		}
	}
	for _, c := range checks {
		if _, known := knownMisses[c.Target]; known && c.Pass {
			t.Errorf("target %q now passes: take it out of knownMisses", c.Target)
		}
		if c.Pass {
			continue
		}
		if want, known := knownMisses[c.Target]; !known || !strings.HasPrefix(c.Detail, want) {
			t.Errorf("target missed: %s (%s)", c.Target, c.Detail)
		}
	}
	md := s.Markdown(Contenders(), nil, nil, func(sc Scenario) string { return sc.Name + ".svg" })
	for _, want := range []string{SectionHeading + "\n", Command, "| damper | ", "| damper+breaker | ", "### Targets", "outage.svg",
		"### Full outage: worst case over 3 start times", "Why the default policy's outage target is missed"} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	var svg strings.Builder
	if err := WriteSVG(&svg, s.Results["outage"]); err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(svg.String(), "<polyline"); got != 2*len(Contenders()) {
		t.Errorf("chart has %d lines, want %d", got, 2*len(Contenders()))
	}
}

// TestDeterministic runs the same scenario twice: every request's record
// must be identical, whatever the Go scheduler did.
func TestDeterministic(t *testing.T) {
	sc := Scenarios(1)[3]
	sc.Duration = 120 * time.Second
	sc.Provider.Incident.Start = 30 * time.Second
	for _, c := range []Contender{Damper(), Failsafe(), SDKDefault(), DamperRecommended()} {
		a, err := Run(sc, c)
		if err != nil {
			t.Fatal(err)
		}
		b, err := Run(sc, c)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(a.Requests, b.Requests) || !reflect.DeepEqual(a.Attempts, b.Attempts) || !reflect.DeepEqual(a.Circuit, b.Circuit) {
			t.Errorf("%s: two runs of the same scenario differ", c.Name)
		}
		if len(a.Requests) < 500 {
			t.Errorf("%s: %d requests, want about 600", c.Name, len(a.Requests))
		}
	}
}

func TestUpdateSectionKeepsOtherSections(t *testing.T) {
	path := filepath.Join(t.TempDir(), "BENCHMARKS.md")
	orig := "# Benchmarks\n\n## Microbenchmarks\n\nmicro\n\n" + SectionHeading + "\n\nold\n\n## Streams\n\nstreams\n"
	if err := os.WriteFile(path, []byte(orig), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := UpdateSection(path, SectionHeading, SectionHeading+"\n\nnew\n"); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(path)
	want := "# Benchmarks\n\n## Microbenchmarks\n\nmicro\n\n" + SectionHeading + "\n\nnew\n\n## Streams\n\nstreams\n"
	if string(got) != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
	if err := UpdateSection(path, "## Other", "## Other\n\nx\n"); err != nil {
		t.Fatal(err)
	}
	got, _ = os.ReadFile(path)
	if !strings.HasSuffix(string(got), "streams\n\n## Other\n\nx\n") {
		t.Errorf("appended section missing:\n%s", got)
	}
}

func TestRunRejectsBadScenario(t *testing.T) {
	sc := Scenarios(1)[0]
	sc.Rate = 0
	if _, err := Run(sc, Damper()); err == nil || !strings.Contains(err.Error(), "outage") {
		t.Errorf("Run with Rate 0: err = %v, want one naming the scenario", err)
	}
}

func TestOutageAt(t *testing.T) {
	sc := Scenarios(1)[0]
	if got := OutageAt(sc, PublishedStart); got.Name != "outage" || got.Provider.Incident.Start != PublishedStart {
		t.Errorf("OutageAt(published start) = %s at %v", got.Name, got.Provider.Incident.Start)
	}
	if got := OutageAt(sc, 115*time.Second); got.Name != "outage-at-115s" || got.Provider.Incident.Start != 115*time.Second {
		t.Errorf("OutageAt(115s) = %s at %v", got.Name, got.Provider.Incident.Start)
	}
	starts := OutageStarts()
	if len(starts) != 13 || starts[0] != time.Minute || starts[len(starts)-1] != 119*time.Second {
		t.Errorf("OutageStarts() = %v", starts)
	}
}

// TestThrottleSweep runs the sweep of the throttle's settings over the
// full outage with one replica: more tokens, more retries before the
// throttle closes; and the report has a row for each setting.
func TestThrottleSweep(t *testing.T) {
	sweep, err := SweepThrottle(Scenarios(1)[:1], nil, ThrottleSettings())
	if err != nil {
		t.Fatal(err)
	}
	worst := sweep.WorstOutage()
	five, ten, twenty := worst["5 tokens, ratio 0.2"], worst["10 tokens, ratio 0.2"], worst["20 tokens, ratio 0.2"]
	if !(five.Figures.Amplification < ten.Figures.Amplification && ten.Figures.Amplification < twenty.Figures.Amplification) {
		t.Errorf("outage amplification with 5, 10, 20 tokens: %.3fx, %.3fx, %.3fx; want increasing",
			five.Figures.Amplification, ten.Figures.Amplification, twenty.Figures.Amplification)
	}
	var b strings.Builder
	writeSweep(&b, sweep)
	for _, set := range ThrottleSettings() {
		if !strings.Contains(b.String(), "| "+throttleName(set)+" | ") {
			t.Errorf("sweep table lacks a row for %s:\n%s", throttleName(set), b.String())
		}
	}
}
