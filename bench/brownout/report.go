package brownout

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/damper-ai/damper-go"
)

// SectionHeading is the heading of the section of docs/BENCHMARKS.md that
// this benchmark owns; the rest of the file is left as it is.
const SectionHeading = "## Brownout simulation"

// Command is the command that regenerates the section and the charts.
const Command = "cd bench && go run ./cmd/brownout"

// Markdown returns the section: setup, contenders, one table per scenario,
// the outage's worst cases, the targets and what they showed, and, when
// sweep is not nil, the sweep of the throttle's settings. chart names the
// SVG file of a scenario, relative to the Markdown file.
func (s *Suite) Markdown(contenders []Contender, sweep *Sweep, breakers *Suite, chart func(Scenario) string) string {
	var b strings.Builder
	sc0 := s.Scenarios[0]
	p := sc0.Provider
	runs := s.OutageRuns()
	fmt.Fprintf(&b, "%s\n\n", SectionHeading)
	fmt.Fprintf(&b, "Regenerate this section and the charts with `%s` (deterministic: seed %d; same numbers on every machine).\n\n", Command, sc0.Seed)
	fmt.Fprintf(&b, "**Setup.** A discrete-event simulation in virtual time: %d replicas, each with its own retry state, share %.0f new logical requests a second (Poisson arrivals, each sent to a random replica) for %v; every request has a %v deadline (the caller's context). ",
		sc0.Replicas, sc0.Rate, sc0.Duration, sc0.Deadline)
	fmt.Fprintf(&b, "The provider can serve %.1f attempts a second (%.0f %% headroom), a token bucket holding one second of work; a served attempt takes %v–%v; an attempt over capacity gets 529 `overloaded_error` after %v. ",
		p.Capacity, 100*(Headroom-1), p.ServiceMin, p.ServiceMax, p.RejectLatency)
	b.WriteString("The provider sends no `retry-after`. Where a scenario says a rejection costs work, that work comes out of the capacity still to come (down to one second's worth of debt): this is what lets a retry storm outlive its cause. ")
	fmt.Fprintf(&b, "Each incident starts %s into the run; the full outage is also run at %d start times, for each contender's worst case. ", secs0(sc0.Provider.Incident.Start), len(runs))
	b.WriteString("Every contender makes its attempts through the real SDK v2 client and the same simulated provider; the client code runs for real, as coroutines that the scheduler resumes one at a time, so nothing sleeps and a run is exactly repeatable.\n\n")

	b.WriteString("| contender | configuration and code path |\n|---|---|\n")
	for _, c := range contenders {
		fmt.Fprintf(&b, "| %s | %s |\n", c.Name, c.Path)
	}
	b.WriteString("\n**Contenders.** *no-retry* is the control: one attempt per logical request, so its amplification is 1.000x by definition and its goodput is what the provider serves with no retries at all. ")
	b.WriteString("*damper* is Damper's default policy, `damper.Policy{}`, which limits retries with its retry budget alone. ")
	fmt.Fprintf(&b, "*damper+throttle* adds the retry throttle with its defaults (%d tokens, ratio %g): gRPC's rule, a failed attempt costs a token, a success earns %g, and no retry is made while half of the tokens or fewer are left; a retry then needs both the throttle and the budget. ",
		defaults.Throttle.MaxTokens, defaults.Throttle.TokenRatio, defaults.Throttle.TokenRatio)
	fmt.Fprintf(&b, "*damper+breaker* is `damper.RecommendedPolicy()`, the policy Damper recommends for production: the default policy plus the throttle with its defaults and the circuit breaker with its defaults but for shorter open periods. The breaker opens when at least %.0f %% of at least %d attempts with a verdict in the last %s failed on the provider's health (5xx, 529, transport failures, attempt timeouts); it then refuses every call, sending nothing and spending no budget, for %s, and then admits one probe at a time; a failed probe opens it again for twice as long, up to %s, and a successful one closes it (the breaker's own defaults are %s and %s: see the breaker sweep below). ",
		100*defaults.Breaker.FailureRatio, defaults.Breaker.MinAttempts, secs0(defaults.Breaker.Window), secs0(recommended.Breaker.OpenFor), secs0(recommended.Breaker.MaxOpenFor),
		secs0(defaults.Breaker.OpenFor), secs0(defaults.Breaker.MaxOpenFor))
	b.WriteString("Each replica has its own Damper, and so its own budget, throttle and breaker.\n\n")

	b.WriteString("**Figures** are over the logical requests issued during the incident: *amplification* is provider attempts per logical request (a call that an open breaker refuses makes none, so amplification can fall below 1); *goodput* successful requests per second; latency is from issue to the end of the call, failures included; *failed fast* is the share that failed before its deadline, *timed out* the share ended by it. ")
	fmt.Fprintf(&b, "*Recovery* is the time from the end of the incident until every later second has at least %.0f %% of the requests issued in it succeed (\"never\": not within the run). The provider answers every attempt within its service time, so a request ends by its deadline only if a contender's waits run into it.\n\n", 100*RecoveryShare)

	for _, sc := range s.Scenarios {
		inc := sc.Provider.Incident
		fmt.Fprintf(&b, "### %s\n\n", sc.Title)
		fmt.Fprintf(&b, "The incident lasts from %s to %s of the run.\n\n", secs0(inc.Start), secs0(inc.Start+inc.Length))
		b.WriteString("| contender | amplification | goodput /s | success | p50 | p99 | failed fast | timed out | recovery |\n")
		b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, r := range s.Results[sc.Name] {
			f := r.Figures()
			fmt.Fprintf(&b, "| %s | %.3fx | %.2f | %.1f %% | %s | %s | %.1f %% | %.1f %% | %s |\n",
				r.Contender, f.Amplification, f.Goodput, 100*f.SuccessShare, secs(f.P50), secs(f.P99),
				100*f.FailedFast, 100*f.TimedOut, recoveryText(f))
		}
		fmt.Fprintf(&b, "\n![%s](%s)\n\n", sc.Title, chart(sc))
		if sc.Name == "outage" && len(runs) > 1 {
			s.writeWorstOutage(&b, runs)
		}
	}

	checks := s.Checks()
	writeChecks(&b, "### Targets", checks)
	b.WriteString("\nFor the probe target, each replica whose breaker opened during the outage counts the attempts that reached the provider from it after its breaker first opened and before the outage ended, against the open periods begun in that time, the first included; each open period admits at most one probe, when it ends.\n\n")
	s.writeWhyMissed(&b, checks)
	if breakers != nil {
		writeBreakerSweep(&b, breakers)
	}
	if sweep != nil {
		writeSweep(&b, sweep)
	}
	writeCodePaths(&b)
	return b.String()
}

// writeWorstOutage writes the table of each contender's worst case of the
// outage over runs, and Damper's amplification at each start.
func (s *Suite) writeWorstOutage(b *strings.Builder, runs []OutageRun) {
	worst := s.WorstOutage()
	starts := make([]string, len(runs))
	for i, run := range runs {
		starts[i] = strconv.Itoa(int(run.Start / time.Second))
	}
	window := defaults.RetryBudgetWindow
	d := worst[damperName]
	fmt.Fprintf(b, "### Full outage: worst case over %d start times\n\n", len(runs))
	fmt.Fprintf(b, "The same outage, run with its incident starting at %s s. ", strings.Join(starts, ", "))
	fmt.Fprintf(b, "Damper's budget windows are fixed, %s long and aligned to the minute of the run, so what an outage costs under the budget depends on where in a window it begins: it can spend the units that successes earned earlier in that window (%g each), more of them the later it begins, but units do not carry over, so the later it begins, the fewer seconds are left to spend them in. ", secs0(window), defaults.RetryBudgetRatio)
	fmt.Fprintf(b, "These starts cover one whole window every 5 s, and its last second; Damper's worst case begins %s into a window. ", secs0(d.Start%window))
	b.WriteString("Each row is a contender's worst case: the start that gave it the highest amplification (the earliest, in a tie) and the figures of that run; *lowest* is its lowest amplification over all the starts.\n\n")
	b.WriteString("| contender | worst amplification | at start | lowest | goodput /s | success | failed fast | recovery |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range runs[0].Results {
		w := worst[r.Contender]
		f := w.Figures
		fmt.Fprintf(b, "| %s | %.3fx | %s | %.3fx | %.2f | %.1f %% | %.1f %% | %s |\n",
			r.Contender, f.Amplification, secs0(w.Start), w.Lowest, f.Goodput, 100*f.SuccessShare, 100*f.FailedFast, recoveryText(f))
	}
	b.WriteString("\nDamper's default policy, by start: ")
	var by []string
	for _, run := range runs {
		for _, r := range run.Results {
			if r.Contender == damperName {
				by = append(by, fmt.Sprintf("%s %.3fx", secs0(run.Start), r.Figures().Amplification))
			}
		}
	}
	b.WriteString(strings.Join(by, ", ") + ".\n\n")
}

// writeWhyMissed explains each missed target whose reason is known.
func (s *Suite) writeWhyMissed(b *strings.Builder, checks []Check) {
	worst := s.WorstOutage()
	bo := s.figures("brownout")
	for _, c := range checks {
		switch {
		case c.Pass:
		case c.Target == targetLowestOutage && strings.HasPrefix(c.Detail, "lowest: grpc-throttle "):
			d, t, r := worst[damperName], worst["damper+throttle"], worst[recommendedName]
			b.WriteString("**Why the default policy's outage target is missed.** gRPC's throttler refuses every retry once its token count falls to half of its maximum, and only successes refill it (0.1 token each), so in a full outage each replica retries about five times and then not at all until the provider answers again. ")
			fmt.Fprintf(b, "Damper's default policy limits retries with its budget alone, which starts every %s window with %d units per replica, by design (so that a service that is quiet or has just started can still retry), so a long outage costs each replica up to %d retries a window, plus %g per success still counted in the window in which the outage began; the worst case is an outage that begins late in a window (%.3fx, at %s). ",
				secs0(defaults.RetryBudgetWindow), defaults.RetryBudgetMinTokens, defaults.RetryBudgetMinTokens, defaults.RetryBudgetRatio, d.Figures.Amplification, secs0(d.Start))
			fmt.Fprintf(b, "The stricter rules are opt-in: with the throttle, Damper's worst case is %.3fx, and the recommended policy's is %.3fx, the lowest of all contenders, because its breakers open and each replica then sends one probe per open period. ",
				t.Figures.Amplification, r.Figures.Amplification)
			fmt.Fprintf(b, "The price of gRPC's ratio of 0.1 shows in the brownout table: with 10 %% of attempts failing, its tokens drain and it drops retries that would have succeeded (goodput %.2f/s, against %.2f/s for damper+throttle, whose ratio of %g holds its tokens).\n\n",
				bo["grpc-throttle"].Goodput, bo["damper+throttle"].Goodput, defaults.Throttle.TokenRatio)
		case c.Target == targetRecovery:
			period := recommended.Breaker.OpenFor
			cc := s.figures("capacity-drop-costly")
			rc := cc[recommendedName]
			delete(cc, recommendedName)
			first, firstBy := earliestRecovery(cc)
			fmt.Fprintf(b, "**Why the recommended policy's recovery target is missed.** An open breaker refuses every call until its open period ends, whether or not the provider has recovered in the meantime: only a probe tells it. In the costly capacity drop, most replicas' breakers open, admit a probe that succeeds once the load is gone, close, and open again when the load they let back in overloads the provider; when the drop ends, the replicas whose breakers are open at that moment go on refusing calls for the rest of their open period (%s, and twice that after a failed probe), so the recommended policy recovers %s after the drop ends, where the first of the other contenders, %s, recovers after %s. ",
				secs0(period), recoveryText(rc), firstBy, recoveryText(first))
			fmt.Fprintf(b, "The other incidents show the same cost. In the capacity drop with free rejections, a probe that fails just before the drop ends holds its replica's breaker open for %s more (recovery %s). In the full outage, each failed probe doubles the open period (%s, %s, %s, up to %s), so after 120 s of outage each replica goes on refusing calls until its next probe, long after the provider is back (recovery %s in the worst case). ",
				secs0(2*period), recoveryText(s.figures("capacity-drop")[recommendedName]), secs0(period), secs0(2*period), secs0(4*period), secs0(recommended.Breaker.MaxOpenFor), recoveryText(worst[recommendedName].Figures))
			b.WriteString("In exchange, while the provider is down each replica sends one probe per open period instead of retries, and in the costly capacity drop the recommended policy keeps far more goodput than any other contender.\n\n")
		}
	}
}

// writeSweep writes the sweep of the throttle's settings.
func writeSweep(b *strings.Builder, sweep *Sweep) {
	worst := sweep.WorstOutage()
	bo := sweep.figures("brownout")
	cd := sweep.figures("capacity-drop")
	cc := sweep.figures("capacity-drop-costly")
	b.WriteString("### The throttle's settings\n\n")
	fmt.Fprintf(b, "Damper's default policy plus the retry throttle at each setting below, through the same scenarios (the outage at the same %d start times, its worst case shown). The defaults are %d tokens and ratio %g. ",
		len(sweep.OutageRuns()), defaults.Throttle.MaxTokens, defaults.Throttle.TokenRatio)
	var ratios []string
	seen := map[float64]bool{}
	for _, r := range sweep.Settings {
		if !seen[r.TokenRatio] {
			seen[r.TokenRatio] = true
			ratios = append(ratios, fmt.Sprintf("%.0f %% at %g", 100*r.TokenRatio/(1+r.TokenRatio), r.TokenRatio))
		}
	}
	fmt.Fprintf(b, "With ratio *r*, a replica's tokens hold while no more than *r*/(1+*r*) of its attempts fail: %s. ", strings.Join(ratios, ", "))
	b.WriteString("Half of the tokens is the number of retries a replica makes, once failures begin, before the throttle closes.\n\n")
	b.WriteString("| throttle | outage: worst amplification | brownout: goodput /s | brownout: success | capacity drop: amplification | costly drop: amplification | costly drop: goodput /s | costly drop: recovery |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, name := range contenderNames(sweep.Suite) {
		w := worst[name]
		fmt.Fprintf(b, "| %s | %.3fx (at %s) | %.2f | %.1f %% | %.3fx | %.3fx | %.2f | %s |\n",
			name, w.Figures.Amplification, secs0(w.Start), bo[name].Goodput, 100*bo[name].SuccessShare,
			cd[name].Amplification, cc[name].Amplification, cc[name].Goodput, recoveryText(cc[name]))
	}
	b.WriteString("\nThe ratio shows in the brownout: its 10 % of failed attempts is more than a ratio of 0.1 holds, so retries stop, as gRPC's do; at 0.2 and 0.3 the tokens hold on average, and only runs of failures close the throttle now and then, less often the higher the ratio. ")
	b.WriteString("The tokens show in the outage and the capacity drops, where more tokens mean more retries before the throttle closes, and in the brownout, where fewer tokens let shorter runs of failures close it. ")
	b.WriteString("None of these scenarios has a failure rate between what 0.2 and 0.3 hold (17 % and 23 %), where a ratio of 0.3 would go on retrying into the failures and 0.2 would stop.\n\n")
}

// writeBreakerSweep writes the sweep of the breaker's open periods.
func writeBreakerSweep(b *strings.Builder, sweep *Suite) {
	worst := sweep.WorstOutage()
	bo := sweep.figures("brownout")
	cd := sweep.figures("capacity-drop")
	cc := sweep.figures("capacity-drop-costly")
	b.WriteString("### The breaker's open periods\n\n")
	fmt.Fprintf(b, "The recommended policy with each pair of open periods below (the first, and the longest that doubling after failed probes reaches), through the same scenarios (the outage at the same %d start times, its worst case shown). The breaker's own defaults are the first row; the recommended policy's is %s.\n\n",
		len(sweep.OutageRuns()), breakerName(damper.BreakerPolicy{OpenFor: recommended.Breaker.OpenFor, MaxOpenFor: recommended.Breaker.MaxOpenFor}))
	b.WriteString("| breaker | outage: worst amplification | outage: recovery | brownout: goodput /s | capacity drop: recovery | costly drop: goodput /s | costly drop: recovery |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|\n")
	for _, name := range contenderNames(sweep) {
		w := worst[name]
		fmt.Fprintf(b, "| %s | %.3fx (at %s) | %s | %.2f | %s | %.2f | %s |\n",
			name, w.Figures.Amplification, secs0(w.Start), recoveryText(w.Figures), bo[name].Goodput,
			recoveryText(cd[name]), cc[name].Goodput, recoveryText(cc[name]))
	}
	b.WriteString("\nAn open breaker refuses every call until its open period ends, whether or not the provider has come back meanwhile: only a probe tells it. The long defaults therefore hold callers off long after an incident: after two minutes of outage, each failed probe having doubled the open period, for most of two more minutes. Short periods cost a provider that is down one probe every few seconds from each replica, which leaves the outage's amplification far below every other contender's, and cost nothing in the brownout, where the breaker never opens. ")
	b.WriteString("Shorter still, 1 s up to 4 s, recovers sooner from the outage but later from the costly drop, and sends more probes: a period shorter than a probe (a served attempt takes 1–3 s here) keeps the breaker half-open, one probe in flight and every other call refused, for more of an incident. The recommended 2 s up to 10 s recovers from the costly drop as soon as the first contender without a breaker, and costs the callers a few seconds after the other incidents (the tables above), where the breaker's defaults cost them minutes.\n\n")
}

// contenderNames returns the contenders of s in table order.
func contenderNames(s *Suite) []string {
	var names []string
	if len(s.Scenarios) == 0 {
		return nil
	}
	for _, r := range s.Results[s.Scenarios[0].Name] {
		names = append(names, r.Contender)
	}
	return names
}

// writeCodePaths says what runs for real, and what failsafe-go is.
func writeCodePaths(b *strings.Builder) {
	b.WriteString("**failsafe-go, exactly.** The failsafe-go contender is failsafe-go v0.9.8's `failsafehttp.NewRetryPolicyBuilder().WithBudget(budget.New()).Build()` in a `failsafehttp.NewRoundTripper`, one per replica: at most 3 attempts; it retries 429, every 5xx but 501, and transport errors but an unsupported scheme, an untrusted certificate or too many redirects; it waits only when a 429 or 503 carries a `Retry-After` in seconds. ")
	b.WriteString("Its budget bounds concurrent retries, not retries over time: `budget.New()` (max rate 0.2, min concurrency 3) refuses a retry only when at least 3 of the replica's retries are already in flight and they are more than 20 % of its executions in flight (calls and retries together). It binds when attempts are slow, as in the capacity drop with free rejections, where served attempts take 1–3 s; when every attempt fails in 50 ms, as in the full outage, few retries are ever in flight at once, and nearly all of them are made. ")
	b.WriteString("This is the strongest configuration that failsafe-go's documentation recommends that can run in virtual time. Its documentation suggests composing a retry policy with a circuit breaker or a rate limiter, a bulkhead and a timeout, and offers an adaptive throttler and an adaptive limiter against overload; all but the bulkhead read the wall clock, and none can be given another clock. ")
	b.WriteString("The circuit breaker's clock is an unexported field that `NewBuilder` (`circuitbreaker/circuitbreakerbuilder.go`) sets to `util.WallClock`, whose `Now` is `time.Now` (`internal/util/util.go`); `newOpenState` and `openState.tryAcquirePermit` (`circuitbreaker/circuitstates.go`) read it to end the open period, and time-based thresholds count on it through `util.NewTimedStats`, so an open breaker would stay open for a minute of wall-clock time, longer than a whole simulated run takes to compute. ")
	b.WriteString("The rate limiter measures time with a wall-clock stopwatch (`util.NewStopwatch` in `config.Build`, `ratelimiter/ratelimiter.go`); the adaptive throttler counts on `util.WallClock` (`config.Build` in `adaptivethrottler/adaptivethrottler.go`); the adaptive limiter reads `time.Now` (`config.Build` and `adaptiveLimiter.newPermit` in `adaptivelimiter/adaptivelimiter.go`); the timeout is a wall-clock timer (`time.AfterFunc` in `executor.Apply`, `timeout/timeoutexecutor.go`). ")
	b.WriteString("A retry policy's delay is a real timer too (`time.NewTimer` in `executor.Apply`, `retrypolicy/retryexecutor.go`), so a backoff cannot be simulated either; with the provider sending no `Retry-After`, the contender's delay is always zero. A bulkhead would run in virtual time, but it caps all concurrent calls, not retries, at a limit to be chosen for the provider's capacity, which the documentation leaves to load testing, so it is left out.\n\n")
	b.WriteString("**What is and is not the real code path.** Damper, with each of its three policies, and failsafe-go run their real code, through the real SDK. The SDK's own retry loop sleeps on the wall clock and draws its jitter from the global random source, so it cannot run in virtual time: its loop (`shouldRetry`, `retryDelay`, 2 retries) is re-implemented in `bench/brownout/contenders.go` around real single-attempt SDK calls, and `TestSDKLoopMatchesSDK` checks it against the SDK's own loop. The naive loop and the gRPC throttler are written here (gRPC has no retry policy by default; the loop uses 3 attempts and the same full-jitter backoff as Damper, so the throttler is the only difference). The provider is a model, not a measurement of the Anthropic API.\n\n")
}

func secs(d time.Duration) string {
	return fmt.Sprintf("%.2f s", d.Seconds())
}

// writeChecks writes checks as a table under heading.
func writeChecks(b *strings.Builder, heading string, checks []Check) {
	fmt.Fprintf(b, "%s\n\n| target | shown | measured |\n|---|---|---|\n", heading)
	for _, c := range checks {
		mark := "yes"
		if !c.Pass {
			mark = "**no**"
		}
		fmt.Fprintf(b, "| %s | %s | %s |\n", c.Target, mark, c.Detail)
	}
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

// UpdateSubsection replaces, in the Markdown file at path, the part that
// starts with the line heading (a "###" heading) and ends before the next
// "###" or "##" heading, with text; the rest of the file is left as it is.
// The part must be there: the whole section's run writes it first.
func UpdateSubsection(path, heading, text string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	doc := string(data)
	start := strings.Index(doc, heading+"\n")
	if start < 0 {
		return fmt.Errorf("%s has no %q: run the whole section first", path, heading)
	}
	end := len(doc)
	rest := doc[start+len(heading)+1:]
	for _, next := range []string{"\n### ", "\n## "} {
		if i := strings.Index(rest, next); i >= 0 {
			end = min(end, start+len(heading)+1+i+1)
		}
	}
	text = strings.TrimRight(text, "\n") + "\n"
	if end < len(doc) {
		text += "\n"
	}
	return os.WriteFile(path, []byte(doc[:start]+text+doc[end:]), 0o644)
}
