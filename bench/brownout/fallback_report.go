package brownout

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// FallbackHeading is the heading of the fallback part of the section.
const FallbackHeading = "### Fallback: the primary in a full outage, a second provider healthy"

// Markdown returns the fallback part of the section: setup, contenders,
// the table, the targets and what the run shows.
func (s *FallbackSuite) Markdown() string {
	var b strings.Builder
	sc := s.Scenario
	p, q := sc.Provider, sc.Secondary
	inc := p.Incident
	fmt.Fprintf(&b, "%s\n\n", FallbackHeading)
	fmt.Fprintf(&b, "**Setup.** The full outage above, run once at its published start: %d replicas share %.0f new logical requests a second for %v, each with a %v deadline, and from %s to %s of the run the primary provider answers every attempt with 529 `overloaded_error`, after %v. ",
		sc.Replicas, sc.Rate, sc.Duration, sc.Deadline, secs0(inc.Start), secs0(inc.Start+inc.Length), p.RejectLatency)
	fmt.Fprintf(&b, "A second simulated provider, with capacity, a token bucket and draws of its own, is healthy throughout: it serves %.1f attempts a second, as the primary does when healthy, in %v–%v. ",
		q.Capacity, q.ServiceMin, q.ServiceMax)
	fmt.Fprintf(&b, "Only a Damper with a backend for it reaches it: `damper.Backend{Name: %q, Provider: damper.ProviderAnthropic}` whose Options are the SDK's `option.WithBaseURL` and `option.WithHTTPClient` over the simulated transport, so that Damper's own client for the backend sends each of its attempts, with the backend's own budget, throttle and breaker. ",
		SecondaryBackend)
	fmt.Fprintf(&b, "Which provider answered a request is taken from the providers' side (the one whose 200 ended it); why a request moved, from Damper's `Report.Fallbacks` (`damper.ReportInto`).\n\n")

	b.WriteString("| contender | configuration and code path |\n|---|---|\n")
	for _, r := range s.Results {
		c := contenderPath(r.Contender)
		fmt.Fprintf(&b, "| %s | %s |\n", r.Contender, c)
	}
	b.WriteString("\n")
	fmt.Fprintf(&b, "**Figures.** *Success* is the share of the requests issued during the outage, and of all the requests of the run, that succeeded; *by the secondary* the requests of the outage that the secondary answered, and *straight on* those that sent nothing to the primary. *Primary attempts* are those that reached the primary during the outage, with their number per request of the outage (the amplification of the tables above) and per second; *once open* is the primary's attempts a second from the moment every replica's breaker had opened to the end of the outage (that moment, from the outage's start, in brackets). *Minute after* is the share of the requests issued in the %s after the outage that the primary answered; *back* the time from the outage's end until every later request of the run is answered by the primary. Latency is over the requests of the outage, failures included.\n\n",
		secs0(FallbackAfter))
	b.WriteString("| contender | success, outage | success, run | by the secondary | straight on | primary attempts | primary /s | once open /s | p50 | p99 | minute after | back |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range s.Results {
		f := r.FallbackFigures()
		open := "–"
		if f.AllOpened {
			open = fmt.Sprintf("%.2f (%s)", f.OpenRate, secs0(f.AllOpen.Round(time.Second)))
		}
		fmt.Fprintf(&b, "| %s | %.2f %% | %.2f %% | %d | %d | %d (%.3fx) | %.2f | %s | %s | %s | %.1f %% | %s |\n",
			r.Contender, 100*f.SuccessShare, 100*f.AllSuccessShare, f.BySecondary, f.Skipped,
			f.PrimaryAttempts, float64(f.PrimaryAttempts)/float64(max(f.Requests, 1)), f.PrimaryRate, open,
			secs(f.P50), secs(f.P99), 100*f.AfterByPrimary, backText(f))
	}
	b.WriteString("\n")

	checks := s.Checks()
	writeChecks(&b, "#### Fallback targets", checks)
	b.WriteString("\n")
	s.writeFallbackWhy(&b)
	return b.String()
}

// contenderPath is the configuration and code path of the fallback
// contender called name.
func contenderPath(name string) string {
	for _, c := range FallbackContenders() {
		if c.Name == name {
			return c.Path
		}
	}
	return ""
}

// writeFallbackWhy explains what the figures show.
func (s *FallbackSuite) writeFallbackWhy(b *strings.Builder) {
	f := s.figures()
	sdk, rec, c, n := f[sdkName], f[recommendedName], f[fallbackName], f[fallbackNoBreakerName]
	inc := s.Scenario.Provider.Incident
	fmt.Fprintf(b, "**What falls back, and when.** The SDK's loop and damper+breaker without a backend can only try the primary, and answer %.1f %% and %.1f %% of the requests of the outage; the SDK's loop sends %d attempts to it meanwhile (%.2f a second). ",
		100*sdk.SuccessShare, 100*rec.SuccessShare, sdk.PrimaryAttempts, sdk.PrimaryRate)
	fmt.Fprintf(b, "With the secondary as a backend, the recommended policy answers %.2f %% of them, %d by the secondary. Their first moves were %s. ",
		100*c.SuccessShare, c.BySecondary, movesText(c.Moves))
	fmt.Fprintf(b, "Until a replica's breaker opens, which takes %s for the last of them (the breaker needs half of the attempts of its %s window to fail, and the window still holds the successes before the outage), each request tries the primary first: once the throttle has closed, a single 529 and a move with no backoff; before, up to %d attempts with backoff. ",
		secs(c.AllOpen), secs0(defaults.Breaker.Window), defaults.MaxAttempts)
	fmt.Fprintf(b, "Once every breaker is open, the primary gets %.2f attempts a second, one probe per replica per open period (%d replicas, %s each once doubled: %.1f a second), and %d of the outage's %d requests send it nothing; the probe that fails moves on to the secondary too. In all, the primary gets %d attempts during the outage, %.1f %% of the SDK loop's. ",
		c.OpenRate, s.Scenario.Replicas, secs0(recommended.Breaker.MaxOpenFor), float64(s.Scenario.Replicas)/recommended.Breaker.MaxOpenFor.Seconds(),
		c.Skipped, c.Requests, c.PrimaryAttempts, 100*float64(c.PrimaryAttempts)/float64(max(sdk.PrimaryAttempts, 1)))
	if c.PrimaryAttempts == rec.PrimaryAttempts && c.Skipped == rec.Skipped {
		b.WriteString("These are damper+breaker's figures at the primary exactly: a move sends nothing more to the primary and changes none of its budget, throttle and breaker, so falling back adds nothing to the load of the provider that is down. ")
	} else {
		fmt.Fprintf(b, "Without the backend, damper+breaker sends it %d. ", rec.PrimaryAttempts)
	}
	fmt.Fprintf(b, "When the outage ends at %s, each breaker finds the primary back with its next probe, at most its longest open period (%s) and a service time later: %.1f %% of the requests of the minute after are the primary's, and every request from %s after the end on.\n\n",
		secs0(inc.Start+inc.Length), secs0(recommended.Breaker.MaxOpenFor), 100*c.AfterByPrimary, backText(c))
	fmt.Fprintf(b, "**Why the breaker matters.** damper+fallback, the default policy with the same backend and no breaker, answers %.2f %% of the requests of the outage too, but every request tries the primary first: it sends the primary %d attempts during the outage (%.2f a second, %.3fx), against %d for the recommended policy. Its moves are %s: a retry at the primary is made while its budget has units (each %s window starts with %d a replica), with backoff before it, and the move comes once the budget refuses; so its p99 is %s against %s. A provider in an outage is then still sent about one attempt per request from every client, which is the load it has to come back under.\n",
		100*n.SuccessShare, n.PrimaryAttempts, n.PrimaryRate, float64(n.PrimaryAttempts)/float64(max(n.Requests, 1)), c.PrimaryAttempts,
		movesText(n.Moves), secs0(defaults.RetryBudgetWindow), defaults.RetryBudgetMinTokens, secs(n.P99), secs(c.P99))
}

// movesText writes the moves by reason, the most frequent first.
func movesText(moves map[string]int) string {
	reasons := slices.SortedFunc(maps.Keys(moves), func(a, b string) int {
		if moves[a] != moves[b] {
			return moves[b] - moves[a]
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, len(reasons))
	for i, r := range reasons {
		parts[i] = fmt.Sprintf("%d on `%s`", moves[r], r)
	}
	if len(parts) == 0 {
		return "never"
	}
	return strings.Join(parts, ", ")
}
