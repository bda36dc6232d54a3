package brownout

import (
	"fmt"
	"os"
	"strings"
	"time"
)

// SectionHeading is the heading of the section of docs/BENCHMARKS.md that
// this benchmark owns; the rest of the file is left as it is.
const SectionHeading = "## Brownout simulation"

// Command is the command that regenerates the section and the charts.
const Command = "cd bench && go run ./cmd/brownout"

// Markdown returns the section: setup, contenders, one table per scenario,
// the targets and what they showed. chart names the SVG file of a scenario,
// relative to the Markdown file.
func (s *Suite) Markdown(contenders []Contender, chart func(Scenario) string) string {
	var b strings.Builder
	sc0 := s.Scenarios[0]
	p := sc0.Provider
	fmt.Fprintf(&b, "%s\n\n", SectionHeading)
	fmt.Fprintf(&b, "Regenerate this section and the charts with `%s` (deterministic: seed %d; same numbers on every machine).\n\n", Command, sc0.Seed)
	fmt.Fprintf(&b, "**Setup.** A discrete-event simulation in virtual time: %d replicas, each with its own retry state, share %.0f new logical requests a second (Poisson arrivals, each sent to a random replica) for %v; every request has a %v deadline (the caller's context). ",
		sc0.Replicas, sc0.Rate, sc0.Duration, sc0.Deadline)
	fmt.Fprintf(&b, "The provider can serve %.1f attempts a second (%.0f %% headroom), a token bucket holding one second of work; a served attempt takes %v–%v; an attempt over capacity gets 529 `overloaded_error` after %v. ",
		p.Capacity, 100*(Headroom-1), p.ServiceMin, p.ServiceMax, p.RejectLatency)
	b.WriteString("The provider sends no `retry-after`. Where a scenario says a rejection costs work, that work comes out of the capacity still to come (down to one second's worth of debt): this is what lets a retry storm outlive its cause. ")
	b.WriteString("Every contender makes its attempts through the real SDK v2 client and the same simulated provider; the client code runs for real, as coroutines that the scheduler resumes one at a time, so nothing sleeps and a run is exactly repeatable.\n\n")

	b.WriteString("| contender | configuration and code path |\n|---|---|\n")
	for _, c := range contenders {
		fmt.Fprintf(&b, "| %s | %s |\n", c.Name, c.Path)
	}
	b.WriteString("\n**Figures** are over the logical requests issued during the incident: *amplification* is provider attempts per logical request; *goodput* successful requests per second; latency is from issue to the end of the call, failures included; *failed fast* is the share that failed before its deadline, *timed out* the share ended by it. ")
	fmt.Fprintf(&b, "*Recovery* is the time from the end of the incident until every later second has at least %.0f %% of the requests issued in it succeed (\"never\": not within the run). The provider answers every attempt within its service time, so a request ends by its deadline only if a contender's waits run into it.\n\n", 100*RecoveryShare)

	for _, sc := range s.Scenarios {
		fmt.Fprintf(&b, "### %s\n\n", sc.Title)
		b.WriteString("| contender | amplification | goodput /s | success | p50 | p99 | failed fast | timed out | recovery |\n")
		b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, r := range s.Results[sc.Name] {
			f := r.Figures()
			fmt.Fprintf(&b, "| %s | %.3fx | %.2f | %.1f %% | %s | %s | %.1f %% | %.1f %% | %s |\n",
				r.Contender, f.Amplification, f.Goodput, 100*f.SuccessShare, secs(f.P50), secs(f.P99),
				100*f.FailedFast, 100*f.TimedOut, recoveryText(f))
		}
		fmt.Fprintf(&b, "\n![%s](%s)\n\n", sc.Title, chart(sc))
	}

	b.WriteString("### Targets\n\n| target | shown | measured |\n|---|---|---|\n")
	checks := s.Checks()
	for _, c := range checks {
		mark := "yes"
		if !c.Pass {
			mark = "**no**"
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", c.Target, mark, c.Detail)
	}
	b.WriteString("\n")
	for _, c := range checks {
		if !c.Pass && strings.Contains(c.Detail, "grpc-throttle") {
			b.WriteString("**Why the outage target is missed.** gRPC's throttler refuses every retry once its token count falls to half of its maximum, and only successes refill it (0.1 token each), so in a full outage each replica retries about five times and then not at all until the provider answers again. Damper's budget starts every 60 s window with 10 units per replica, by design (so that a service that is quiet or has just started can still retry), so a long outage costs each replica up to 10 retries a window, plus 0.1 per success still counted in the window in which the outage began. The price of gRPC's stricter rule shows in the brownout table: with 10 % of attempts failing, its tokens drain and it drops retries that would have succeeded.\n\n")
		}
	}
	b.WriteString("**What is and is not the real code path.** Damper and failsafe-go run their real code, through the real SDK. The SDK's own retry loop sleeps on the wall clock and draws its jitter from the global random source, so it cannot run in virtual time: its loop (`shouldRetry`, `retryDelay`, 2 retries) is re-implemented in `bench/brownout/contenders.go` around real single-attempt SDK calls, and `TestSDKLoopMatchesSDK` checks it against the SDK's own loop. The naive loop and the gRPC throttler are written here (gRPC has no retry policy by default; the loop uses 3 attempts and the same full-jitter backoff as Damper, so the throttler is the only difference). failsafe-go's retry policy waits on a real timer, but with the provider sending no `retry-after` its delay is always zero. The provider is a model, not a measurement of the Anthropic API.\n\n")
	return b.String()
}

func secs(d time.Duration) string {
	return fmt.Sprintf("%.2f s", d.Seconds())
}

// UpdateSection replaces the section under heading in the Markdown file at
// path (up to the next heading of the same level) with section, or appends
// it; the file is created if missing.
func UpdateSection(path, heading, section string) error {
	data, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	doc := string(data)
	if doc == "" {
		doc = "# Benchmarks\n\n"
	}
	section = strings.TrimRight(section, "\n") + "\n"
	start := strings.Index(doc, heading+"\n")
	if start < 0 {
		doc = strings.TrimRight(doc, "\n") + "\n\n" + section
		return os.WriteFile(path, []byte(doc), 0o644)
	}
	rest := doc[start+len(heading)+1:]
	end := len(doc)
	if i := strings.Index(rest, "\n## "); i >= 0 {
		end = start + len(heading) + 1 + i + 1
		section += "\n"
	}
	doc = doc[:start] + section + doc[end:]
	return os.WriteFile(path, []byte(doc), 0o644)
}
