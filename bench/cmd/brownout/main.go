// Command brownout runs the brownout simulation with every contender (and
// the full outage at several start times, Damper's retry throttle and
// breaker at several settings, the rate-limit scenario with one replica
// and with -replicas, the fallback to a second provider through the
// primary's full outage, failover against spread routing over two
// rate-limited organisations with prompt caches, and a surge past the
// capacity of a provider that slows with the attempts it holds) and
// writes the "Brownout simulation" section of docs/BENCHMARKS.md and the
// charts docs/brownout-*.svg. Run it from the bench module (it takes a
// few minutes):
//
//	cd bench && go run ./cmd/brownout
//
// With -routing, it runs the routing scenario alone and rewrites only its
// part of the section, which a whole run has written before (seconds).
//
// It prints each target and whether the run showed it; a missed target is
// written to the docs with the reason, not hidden, and does not fail the
// command (the bench module's tests assert the targets that must hold).
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/damper-ai/damper-go/bench/brownout"
)

func main() {
	docs := flag.String("docs", "../docs", "directory holding BENCHMARKS.md and the charts")
	replicas := flag.Int("replicas", brownout.DefaultReplicas, "client replicas, each with its own retry state")
	routingOnly := flag.Bool("routing", false, "run the routing scenario alone and rewrite only its part of the section")
	flag.Parse()
	do := run
	if *routingOnly {
		do = runRouting
	}
	if err := do(*docs, *replicas); err != nil {
		fmt.Fprintln(os.Stderr, "brownout:", err)
		os.Exit(1)
	}
}

func run(docs string, replicas int) error {
	contenders := brownout.Contenders()
	scenarios := brownout.Scenarios(replicas)
	suite, err := brownout.RunSuite(scenarios, brownout.OutageStarts(), contenders)
	if err != nil {
		return err
	}
	sweep, err := brownout.SweepThrottle(scenarios, brownout.OutageStarts(), brownout.ThrottleSettings())
	if err != nil {
		return err
	}
	breakers, err := brownout.SweepBreaker(scenarios, brownout.OutageStarts(), brownout.BreakerSettings())
	if err != nil {
		return err
	}
	chart := func(sc brownout.Scenario) string { return "brownout-" + sc.Name + ".svg" }
	for _, sc := range suite.Scenarios {
		f, err := os.Create(filepath.Join(docs, chart(sc)))
		if err != nil {
			return err
		}
		err = brownout.WriteSVG(f, suite.Results[sc.Name])
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	counts := []int{1}
	if replicas > 1 {
		counts = append(counts, replicas)
	}
	rates, err := brownout.RunRateLimit(counts, brownout.RateLimitContenders)
	if err != nil {
		return err
	}
	fallback, err := brownout.RunFallback(brownout.FallbackScenario(replicas), brownout.FallbackContenders())
	if err != nil {
		return err
	}
	routing, err := brownout.RunRouting(brownout.RoutingScenario(replicas, brownout.RoutingDuration), brownout.RoutingContenders(), brownout.AffinityReplicas)
	if err != nil {
		return err
	}
	saturation, err := brownout.RunSaturation(brownout.SaturationScenario(replicas), brownout.SaturationContenders(replicas))
	if err != nil {
		return err
	}
	md := suite.Markdown(contenders, sweep, breakers, chart) + rates.Markdown() + "\n" + fallback.Markdown() + "\n" + routing.Markdown() + "\n" + saturation.Markdown()
	if err := brownout.UpdateSection(filepath.Join(docs, "BENCHMARKS.md"), brownout.SectionHeading, md); err != nil {
		return err
	}
	checks := append(suite.Checks(), rates.Checks()...)
	checks = append(checks, fallback.Checks()...)
	checks = append(checks, routing.Checks()...)
	printChecks(append(checks, saturation.Checks()...))
	return nil
}

// runRouting runs the routing scenario and rewrites its part of the
// section.
func runRouting(docs string, replicas int) error {
	routing, err := brownout.RunRouting(brownout.RoutingScenario(replicas, brownout.RoutingDuration), brownout.RoutingContenders(), brownout.AffinityReplicas)
	if err != nil {
		return err
	}
	if err := brownout.UpdateSubsection(filepath.Join(docs, "BENCHMARKS.md"), brownout.RoutingHeading, routing.Markdown()); err != nil {
		return err
	}
	printChecks(routing.Checks())
	return nil
}

func printChecks(checks []brownout.Check) {
	for _, c := range checks {
		status := "shown"
		if !c.Pass {
			status = "MISSED"
		}
		fmt.Printf("%-7s %s: %s\n", status, c.Target, c.Detail)
	}
}
