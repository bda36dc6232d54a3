package brownout

import (
	"fmt"
	"time"

	"github.com/damper-ai/damper-go"
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
	Scenarios []Scenario
	Results   map[string][]*Result // by scenario name, in contender order
}

// RunSuite runs every scenario with every contender.
func RunSuite(scenarios []Scenario, contenders []Contender) (*Suite, error) {
	s := &Suite{Scenarios: scenarios, Results: map[string][]*Result{}}
	for _, sc := range scenarios {
		for _, c := range contenders {
			r, err := Run(sc, c)
			if err != nil {
				return nil, err
			}
			s.Results[sc.Name] = append(s.Results[sc.Name], r)
		}
	}
	return s, nil
}

func (s *Suite) figures(scenario string) map[string]Figures {
	out := map[string]Figures{}
	for _, r := range s.Results[scenario] {
		out[r.Contender] = r.Figures()
	}
	return out
}

// Checks evaluates the targets on the suite's results. A scenario that the
// suite did not run is reported as not shown.
func (s *Suite) Checks() []Check {
	var checks []Check

	out := s.figures("outage")
	d, ok := out["damper"]
	checks = append(checks, Check{
		Target: "full outage: Damper's amplification at most 1.10x",
		Pass:   ok && d.Amplification <= 1.10,
		Detail: fmt.Sprintf("%.3fx", d.Amplification),
	})
	lowest, by := d.Amplification, "damper"
	for name, f := range out {
		if name != "damper" && f.Amplification < lowest {
			lowest, by = f.Amplification, name
		}
	}
	checks = append(checks, Check{
		Target: "full outage: Damper's amplification the lowest of all contenders",
		Pass:   ok && by == "damper",
		Detail: fmt.Sprintf("lowest: %s at %.3fx", by, lowest),
	})

	bo := s.figures("brownout")
	d, ok = bo["damper"]
	best, bestBy := 0.0, ""
	for name, f := range bo {
		if f.Goodput > best {
			best, bestBy = f.Goodput, name
		}
	}
	checks = append(checks, Check{
		Target: "brownout (10 % of attempts fail): Damper's goodput at least 95 % of the best contender's",
		Pass:   ok && best > 0 && d.Goodput >= 0.95*best,
		Detail: fmt.Sprintf("damper %.2f/s, best %s %.2f/s (%.1f %%)", d.Goodput, bestBy, best, 100*d.Goodput/max(best, 1e-9)),
	})

	window := damper.DefaultRetryBudgetWindow
	for _, name := range []string{"capacity-drop", "capacity-drop-costly"} {
		f, ok := s.figures(name)["damper"]
		checks = append(checks, Check{
			Target: fmt.Sprintf("%s: Damper recovers to %.0f %% goodput within one budget window (%v) of the cause ending", name, 100*RecoveryShare, window),
			Pass:   ok && f.Recovered && f.Recovery <= window,
			Detail: recoveryText(f),
		})
	}
	return checks
}

func recoveryText(f Figures) string {
	if !f.Recovered {
		return "never, within the run"
	}
	return f.Recovery.Round(time.Second).String()
}
