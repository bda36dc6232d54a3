package hedge

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Heading is the heading of the scenario's section of docs/BENCHMARKS.md.
const Heading = "## Hedging: a latency tail ten times the median"

// insertBefore is the heading the section goes before when the document
// has none yet.
const insertBefore = "## Streaming"

// Command regenerates the section, from the repository root.
const Command = "cd bench && go test ./hedge -run TestHedgeCutsTheTail -hedge.docs=../../docs/BENCHMARKS.md"

// Target is one of the scenario's targets and what was measured.
type Target struct {
	Name     string // what is aimed at
	Met      bool
	Measured string // the figures it was judged on
}

// Targets returns the targets of a scenario, from the results of Damper
// without hedging (base) and with its default HedgePolicy (hedged); label
// names the scenario.
func Targets(label string, base, hedged Result) []Target {
	bp, hp := base.Quantile(0.99), hedged.Quantile(0.99)
	cut := 0.0
	if bp > 0 {
		cut = 1 - hp.Seconds()/bp.Seconds()
	}
	more := float64(hedged.Attempts)/float64(base.Attempts) - 1
	return []Target{{
		Name:     fmt.Sprintf("%s: %s's p99 time to first content at least 40 %% lower than %s's", label, hedged.Contender.Name, base.Contender.Name),
		Met:      cut >= 0.40 && hedged.Errors == 0,
		Measured: fmt.Sprintf("%s against %s (%.0f %% lower)", fmtDuration(hp), fmtDuration(bp), 100*cut),
	}, {
		Name:     fmt.Sprintf("%s: %s makes at most 10 %% more provider attempts than %s", label, hedged.Contender.Name, base.Contender.Name),
		Met:      more <= 0.10,
		Measured: fmt.Sprintf("%s against %s (%+.1f %%)", thousands(hedged.Attempts), thousands(base.Attempts), 100*more),
	}}
}

// Markdown returns the section: the scenario, the results of main (the
// wait before the headers) and of after (the wait after them), and the
// targets.
func Markdown(s Scenario, main, after []Result, targets []Target) string {
	m := s.Model
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }

	p("%s\n\n", Heading)
	p("Regenerate with `%s` (virtual time: the same numbers on every machine).\n\n", Command)
	p("**Setup.** A simulated provider answers streaming Messages calls (`client.Messages.NewStreaming`: message_start, content_block_start, %d content_block_delta, content_block_stop, message_delta, message_stop) with no error and no rate limit: only latency. ", deltas)
	p("Each attempt waits, independently of every other, %s–%s s with probability %.0f %%, else %s–%s s (uniform in each range), and then sends its headers and all its events at once. ",
		secs(m.FastMin), secs(m.FastMax), 100*m.FastShare, secs(m.SlowMin), secs(m.SlowMax))
	p("One attempt's p50 is %s, its p95 %s and its p99 %s, %.0f times the median. ",
		fmtDuration(m.Quantile(0.5)), fmtDuration(m.Quantile(0.95)), fmtDuration(m.Quantile(0.99)), m.Quantile(0.99).Seconds()/m.Quantile(0.5).Seconds())
	p("The slow share is kept under 5 %%, so that the p95 falls in the fast range: with 5 %% or more slow attempts, a hedge at the p95 would leave only after the first slow ones had answered. ")
	p("%s requests arrive open-loop, one every %s s (%s s of arrivals), the same for every contender. ",
		thousands(s.Requests), secs(s.Interval), secs(s.Interval*time.Duration(s.Requests)))
	p("An attempt's wait is drawn from a hash of its request's index and its rank among that request's attempts, not from a shared random stream, so that a run does not depend on the order in which goroutines run. ")
	p("The SDK, Damper and failsafe-go run for real over an in-memory `http.RoundTripper`, inside a `testing/synctest` bubble, whose clock moves only when every goroutine waits; the transport honours each attempt's context, so that a cancelled attempt ends at once with its context's error.\n\n")

	p("| contender | configuration |\n|---|---|\n")
	for _, r := range main {
		p("| %s | %s |\n", r.Contender.Name, r.Contender.Config)
	}
	p("\n**Figures.** *Time to first content* runs from the call to the first content_block_delta in the caller's hands, over every request; *attempts* are those the provider received, per request, and *extra* the share beyond one; *hedges* are Damper's `Report.Hedges` and `Report.HedgeWon` summed over the calls (`damper.ReportInto`); for failsafe-go, the attempts beyond one per request, and the requests whose stream the provider saw read whole from an attempt other than the first (for Damper this count equals its reports').\n\n")
	resultTable(&b, main)

	p("\n")
	if sdk, d := find(main, SDK().Name), find(main, Damper().Name); sdk != nil && d != nil && slices.Equal(sdk.FirstContent, d.FirstContent) && sdk.Attempts == d.Attempts {
		p("Without a HedgePolicy, Damper changes nothing here: there is no failure to retry. ")
	}
	if h := find(main, DamperHedge().Name); h != nil && h.Hedges > 0 {
		p("*%s* sends %s hedges, and %s of them win; the others lose to the attempt they hedge, which answers first. ",
			h.Contender.Name, thousands(h.Hedges), thousands(h.HedgesWon))
	}
	p("A fixed delay at the top of the fast range (%s) hedges the slow attempts and almost nothing else, but only a caller who knows the latency ahead of time can set it; a quantile learns it from the attempts it sees. ", fmtDuration(FixedDelay))
	p("Damper's quantile is that of the last %d attempts' times to first content; failsafe-go's adaptive policy keeps a moving estimate of its quantile over its round trips (an age of %d). ", defaults.Hedge.Window, adaptiveWindow)
	p("What is left of the tail is the requests whose attempt and hedge were both slow.\n\n")

	p("**With the wait after the headers.** A provider may send its headers and message_start at once and spend its time to first token after them. ")
	p("In this run the headers and message_start come after %s–%s s, and the first content, with the rest of the stream, after the same wait as above, counted from the request: the time to first content is drawn as before, but a round trip ends with the headers. ",
		secs(m.HeadersMin), secs(m.HeadersMax))
	p("Damper races its attempts to the first content; failsafe-go's hedge policy, a RoundTripper, races them to the headers.\n\n")
	resultTable(&b, after)
	p("\n")
	if f := find(after, FailsafeFixed().Name); f != nil {
		p("No round trip lasts %s, so *%s* never hedges. ", fmtDuration(FixedDelay), f.Contender.Name)
	}
	if f, d := find(after, FailsafeQuantile().Name), find(after, Damper().Name); f != nil && d != nil {
		p("*%s* learns the p95 of the headers' time and hedges %.1f %% of the requests on it; its p99 time to first content is %s, against %s without hedging. ",
			f.Contender.Name, f.ExtraAttempts(), fmtDuration(f.Quantile(0.99)), fmtDuration(d.Quantile(0.99)))
	}
	p("A hedge is an attempt: in Damper it passes the gates a retry passes and takes a unit of the retry budget.\n\n")

	p("**Targets.**\n\n| target | result | measured |\n|---|---|---|\n")
	for _, t := range targets {
		mark := "met"
		if !t.Met {
			mark = "**missed**"
		}
		p("| %s | %s | %s |\n", t.Name, mark, t.Measured)
	}
	return b.String()
}

// find returns the result of the contender called name, or nil.
func find(rs []Result, name string) *Result {
	for i := range rs {
		if rs[i].Contender.Name == name {
			return &rs[i]
		}
	}
	return nil
}

// secs writes d in seconds, with as many decimals as it needs.
func secs(d time.Duration) string {
	return strconv.FormatFloat(d.Seconds(), 'f', -1, 64)
}

// thousands writes n with a comma between groups of three digits.
func thousands(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0 && s[i-1] != '-'; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// resultTable writes rs as a table.
func resultTable(b *strings.Builder, rs []Result) {
	fmt.Fprintf(b, "| contender | p50 | p90 | p99 | max | attempts/request | extra | hedges sent | hedges won |\n")
	fmt.Fprintf(b, "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rs {
		sent, won := "–", "–"
		switch {
		case r.Reported:
			sent, won = thousands(r.Hedges), thousands(r.HedgesWon)
		case r.Contender.Hedging:
			sent, won = thousands(r.Attempts-r.Requests), thousands(r.ServedByHedge)
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %.3f | %.1f %% | %s | %s |\n",
			r.Contender.Name, fmtDuration(r.Quantile(0.5)), fmtDuration(r.Quantile(0.9)), fmtDuration(r.Quantile(0.99)),
			fmtDuration(r.Max()), r.AttemptsPerRequest(), r.ExtraAttempts(), sent, won)
	}
}

// RewriteSection puts section in the Markdown file at path: in place of
// the section under Heading (up to the next heading of its level), or
// else just before the heading insertBefore.
func RewriteSection(path, section string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	doc := string(data)
	section = strings.TrimRight(section, "\n") + "\n\n"
	start := strings.Index(doc, Heading+"\n")
	end := start
	if start >= 0 {
		end = len(doc)
		if i := strings.Index(doc[start+len(Heading):], "\n## "); i >= 0 {
			end = start + len(Heading) + i + 1
		} else {
			section = strings.TrimRight(section, "\n") + "\n"
		}
	} else {
		start = strings.Index(doc, "\n"+insertBefore+"\n")
		if start < 0 {
			return errors.New("hedge: " + path + " has neither " + Heading + " nor " + insertBefore)
		}
		start++
		end = start
	}
	doc = doc[:start] + section + doc[end:]
	return os.WriteFile(path, []byte(doc), 0o644)
}
