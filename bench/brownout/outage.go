package brownout

import (
	"slices"
	"time"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/fleet"
)

// OutageRun is the outage at one start time: every contender's result.
type OutageRun struct {
	Start   time.Duration
	Results []*Result // in contender order
}

// OutageRuns returns the outage at each start it was run at, in order of
// start: the suite's OutageStarts, or the published outage alone.
func (s *Suite) OutageRuns() []OutageRun {
	out, ok := s.scenario("outage")
	if !ok {
		return nil
	}
	starts := s.OutageStarts
	if len(starts) == 0 {
		starts = []time.Duration{out.Provider.Incident.Start}
	}
	starts = slices.Clone(starts)
	slices.Sort(starts)
	starts = slices.Compact(starts)
	var runs []OutageRun
	for _, start := range starts {
		if rs, ok := s.Results[OutageAt(out, start).Name]; ok {
			runs = append(runs, OutageRun{Start: start, Results: rs})
		}
	}
	return runs
}

// Worst is a contender's worst case of the outage over its start times:
// the figures of the start with the highest amplification (the earliest
// such start, in a tie).
type Worst struct {
	Start   time.Duration
	Figures Figures
	// Lowest is the lowest amplification over the starts.
	Lowest float64
}

// WorstOutage returns each contender's worst case of the outage.
func (s *Suite) WorstOutage() map[string]Worst {
	worst := map[string]Worst{}
	for _, run := range s.OutageRuns() {
		for _, r := range run.Results {
			f := r.Figures()
			w, seen := worst[r.Contender]
			if !seen {
				worst[r.Contender] = Worst{Start: run.Start, Figures: f, Lowest: f.Amplification}
				continue
			}
			w.Lowest = min(w.Lowest, f.Amplification)
			if f.Amplification > w.Figures.Amplification {
				w.Start, w.Figures = run.Start, f
			}
			worst[r.Contender] = w
		}
	}
	return worst
}

// ProbeTally is what reached the provider from one replica while the
// incident lasted, once that replica's breaker (the provider's, not a
// secondary's) had opened.
type ProbeTally struct {
	Replica int
	// Attempts reached the provider after the breaker first opened.
	Attempts int
	// OpenPeriods is the number of open periods begun in that time, the
	// first included: each admits at most one probe when it ends.
	OpenPeriods int
}

// ProbeTallies returns a tally for each replica of r whose breaker opened
// during the incident, in order of replica.
func (r *Result) ProbeTallies() []ProbeTally {
	inc := r.Scenario.Provider.Incident
	from, to := inc.Start, inc.Start+inc.Length
	first := map[int]int{} // replica: the attempts before its first opening
	tallies := map[int]*ProbeTally{}
	for _, e := range r.Circuit {
		if e.To != fleet.CircuitOpen || e.Backend != damper.PrimaryBackend || e.At < from || e.At >= to {
			continue
		}
		t, ok := tallies[e.Replica]
		if !ok {
			t = &ProbeTally{Replica: e.Replica}
			tallies[e.Replica] = t
			first[e.Replica] = e.Seq
		}
		t.OpenPeriods++
	}
	for i, a := range r.Attempts {
		if a.At >= to {
			break // attempts are in order of arrival
		}
		if t, ok := tallies[a.Replica]; ok && i >= first[a.Replica] {
			t.Attempts++
		}
	}
	out := make([]ProbeTally, 0, len(tallies))
	for _, t := range tallies {
		out = append(out, *t)
	}
	slices.SortFunc(out, func(a, b ProbeTally) int { return a.Replica - b.Replica })
	return out
}
