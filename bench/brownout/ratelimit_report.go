package brownout

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// RateLimitHeading is the heading of the rate-limit part of the section.
const RateLimitHeading = "### Rate limits: twice the load the organisation's limit admits"

// rateBody is the body the SDK sends in the rate-limit scenario.
func rateBody() []byte {
	b, err := json.Marshal(paramsFor(ratePrompt))
	if err != nil {
		panic(err)
	}
	return b
}

// Markdown returns the rate-limit part of the section: setup, the limiter
// contenders, one table per replica count, the targets, and why each
// target that is missed for a known reason is missed.
func (s *RateSuite) Markdown() string {
	var b strings.Builder
	sc := s.Scenarios[0]
	p := sc.Provider
	admitted := AdmittedPerMinute()
	body := rateBody()
	estimate := damperEstimate(body)
	fmt.Fprintf(&b, "%s\n\n", RateLimitHeading)
	fmt.Fprintf(&b, "**Setup.** The same simulated provider, healthy, enforcing a rate limit as the API does: per organisation (every replica shares it, as they share one API key), a token bucket of %s input tokens a minute and one of %s requests a minute, each holding one minute of its limit, refilling continuously and starting full. ",
		thousands(RateLimitITPM), thousands(RateLimitRPM))
	fmt.Fprintf(&b, "An attempt takes one request and its input tokens from both at once; one that finds no room gets 429 `rate_limit_error` after %v, with `retry-after` (whole seconds until there would be room for it), and takes nothing. Every response, whatever its status, carries the `anthropic-ratelimit-{requests,input-tokens}-{limit,remaining,reset}` headers (what remains after the request's take; when the bucket would be full), and every answer's usage reports the input tokens that the provider counted. ",
		p.RejectLatency)
	fmt.Fprintf(&b, "Every request sends the same prompt, %s input tokens as the provider counts them (a token per %d bytes of text, plus %d per request), so the input-token limit admits %.0f requests a minute and binds long before the request limit. ",
		thousands(PromptTokens), bytesPerInputToken, requestOverheadToken, admitted)
	fmt.Fprintf(&b, "Requests arrive at %.2f a second (%.0f a minute, %gx what the limit admits) for %v, each with a %v deadline; a served attempt takes %v–%v, and the provider's capacity is never the bound. ",
		sc.Rate, 60*sc.Rate, RateLimitOverload, sc.Duration, sc.Deadline, p.ServiceMin, p.ServiceMax)
	counts := make([]string, len(s.Scenarios))
	for i, x := range s.Scenarios {
		counts[i] = fmt.Sprint(x.Replicas)
	}
	fmt.Fprintf(&b, "The scenario is run with %s replicas, the offered load the same (it is the organisation's). The figures are over the requests issued from %s on (the first minute spends the full bucket) to the end of arrivals, and the provider attempts that arrived meanwhile.\n\n",
		strings.Join(counts, " and "), secs0(RateLimitSteadyFrom))

	b.WriteString("The contenders are those above, but failsafe-go: it waits for a `Retry-After`, which the provider sends with every 429, on a wall-clock timer that cannot run in virtual time (see below). Damper's rate limiter runs in these:\n\n")
	b.WriteString("| contender | configuration and code path |\n|---|---|\n")
	last := s.Scenarios[len(s.Scenarios)-1]
	for _, c := range LimiterContenders(last.Replicas) {
		fmt.Fprintf(&b, "| %s | %s |\n", c.Name, c.Path)
	}
	fmt.Fprintf(&b, "\nThe limiter keeps a requests, an input-token and an output-token bucket for each model family. An attempt reserves one request, Damper's estimate of its input tokens (%s for this body: a token per %d bytes of the whole JSON request, against the provider's %s) and its max_tokens, from all three or none, and the answer's usage settles the reservation; an attempt that finds no room waits in line, first come, first served, at most MaxWait (by default %s), and is not sent so close to the caller's deadline that an attempt, as long as the group's attempts have been taking, could not end before it; or else it fails at once with `damper.ErrRateLimited`, having sent nothing. A 429 for a rate limit empties the buckets it names until its `retry-after`. ",
		thousands(estimate), 4, thousands(PromptTokens), secs0(defaults.RateLimit.MaxWait))
	fmt.Fprintf(&b, "*learned* learns every limit from the headers; *configured* is given the organisation's limits (and learns the output-token one, which the provider does not enforce). The rows marked *wait %s* set MaxWait to %s, a shorter wait in line for more refusals; *configured 1/%d* gives each of the %d replicas a %s of the organisation's limits. Each replica has its own Damper, and so its own limiter.\n\n",
		secs0(RateLimitShortWait), secs0(RateLimitShortWait), last.Replicas, last.Replicas, fraction(last.Replicas))
	fmt.Fprintf(&b, "**Figures.** *429s* are the attempts the provider refused for the rate limit; *goodput* is successful requests a minute, and as a share of the %.0f a minute that the limit admits (%s ÷ %s); *refused* is the share of requests that Damper's rate limiter refused (`ErrRateLimited`); *timed out* the share ended by their deadline; the latency is that of the successful requests, from issue to the end of the call.\n\n",
		admitted, thousands(RateLimitITPM), thousands(PromptTokens))

	for _, sc := range s.Scenarios {
		fmt.Fprintf(&b, "#### %d %s\n\n", sc.Replicas, plural(sc.Replicas, "replica", "replicas"))
		b.WriteString("| contender | attempts | 429s | goodput /min | of the limit | success | refused | timed out | p50 | p99 |\n")
		b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, r := range s.Results[sc.Name] {
			f := r.RateFigures()
			fmt.Fprintf(&b, "| %s | %d | %d | %.1f | %.1f %% | %.1f %% | %.1f %% | %.1f %% | %s | %s |\n",
				r.Contender, f.Attempts, f.Provider429, f.Goodput, 100*f.GoodputShare, 100*f.SuccessShare,
				100*f.LimiterShare, 100*f.TimedOut, latencyText(f, f.P50), latencyText(f, f.P99))
		}
		b.WriteString("\n")
	}

	checks := s.Checks()
	writeChecks(&b, "#### Rate-limit targets", checks)
	b.WriteString("\n")
	s.writeRateWhy(&b, checks, estimate)
	return b.String()
}

// writeRateWhy explains the rate-limit figures, and each known reason for
// a missed target that the run shows.
func (s *RateSuite) writeRateWhy(b *strings.Builder, checks []Check, estimate int) {
	missed := map[string]bool{}
	for _, c := range checks {
		if !c.Pass {
			missed[c.Target] = true
		}
	}
	one, many := s.Scenarios[0], s.Scenarios[len(s.Scenarios)-1]
	f1, fn := s.figures(one.Name), s.figures(many.Name)
	short := func(configured bool) string { return limiterName(configured, 1, RateLimitShortWait) }

	b.WriteString("**What the limit leaves to a client.** The provider's bucket admits what it admits, whoever asks, and a 429 costs it nothing here: every contender without a limiter keeps the goodput at what the limit admits, and differs only in how many 429s it collects on the way. The SDK's loop and the naive loop retry each one, after its `retry-after` or their backoff, and collect the most; the throttles (gRPC's, Damper's, and the recommended policy's) close with half the attempts failing, far more than their token ratios hold, and then send first attempts only, as the no-retry control does; Damper's default policy retries as far as its budget allows. ")
	d1 := f1[damperName]
	if l := f1[short(false)]; l.Requests > 0 {
		fmt.Fprintf(b, "What a limiter can save is the 429s, by keeping the attempts that would get one at home: with one replica and a wait of %s, the learned limiter cuts them from %d to %d at %.1f %% of what the limit admits, and refuses the rest of the requests at once. The price is waiting: the offered load stays above the limit, so the line never empties and every admitted call waits about MaxWait (p50 %s, against %s for damper without a limiter, whose admitted calls are those that find room on arrival). ",
			secs0(RateLimitShortWait), d1.Provider429, l.Provider429, 100*l.GoodputShare, secs(l.P50), secs(d1.P50))
	}
	if c, l := f1[short(true)], f1[short(false)]; c.Requests > 0 {
		if c.GoodputShare < l.GoodputShare-0.005 {
			fmt.Fprintf(b, "The configured limiter's goodput is %.1f %% of the limit where the learned one's is %.1f %%: the learned buckets follow the headers, which count each request as the provider does (%s tokens), while the configured one keeps charging each request nearer Damper's estimate (%s tokens; %s ÷ %s = %.1f requests a minute).",
				100*c.GoodputShare, 100*l.GoodputShare, thousands(PromptTokens), thousands(estimate),
				thousands(RateLimitITPM), thousands(estimate), float64(RateLimitITPM)/float64(estimate))
		} else {
			fmt.Fprintf(b, "The configured limiter does as well as the learned one (%.1f %% and %.1f %% of the limit): each reserves Damper's estimate (%s tokens) and settles by the provider's count (%s).",
				100*c.GoodputShare, 100*l.GoodputShare, thousands(estimate), thousands(PromptTokens))
		}
	}
	b.WriteString("\n\n")

	if many.Replicas > 1 {
		d, l, c := fn[damperName], fn[limiterLearnedName], fn[limiterConfiguredName]
		ls := fn[limiterName(false, 1, RateLimitShortWait)]
		share := fn[limiterName(true, many.Replicas, RateLimitShortWait)]
		fmt.Fprintf(b, "**%d replicas.** Each replica has its own Damper, and so its own limiter, which learns the organisation's limit (or is given it) as if it had the limit to itself. What the others take shows in its own responses: the count of what remains falls below what the replica's own traffic leaves. The limiter estimates from those gaps the rate at which other traffic takes tokens, and refills its buckets with only what that leaves, so the replicas settle near equal shares with no state in common. ",
			many.Replicas)
		fmt.Fprintf(b, "The learned and configured limiters collect %d and %d 429s against damper's %d (%s and %s), at %.1f %% and %.1f %% of what the limit admits; with a %s wait, %d (%s). ",
			l.Provider429, c.Provider429, d.Provider429, fewerText(l.Provider429, d.Provider429), fewerText(c.Provider429, d.Provider429),
			100*l.GoodputShare, 100*c.GoodputShare, secs0(RateLimitShortWait), ls.Provider429, fewerText(ls.Provider429, d.Provider429))
		if missed[rateTarget(many, limiterLearnedName, rateTarget429)] || missed[rateTarget(many, limiterConfiguredName, rateTarget429)] {
			b.WriteString("The 429s left are those of the estimate's lag: a replica learns of the others' traffic a response at a time, a few a second, and an attempt that joined its line before the estimate rose is sent when its turn comes. ")
		}
		if share.Requests > 0 {
			fmt.Fprintf(b, "Configured with a %s of the limit each, the replicas stay under it together: %d 429s, at %.1f %% of what the limit admits (the random spread of requests over the replicas costs a little). ",
				fraction(many.Replicas), share.Provider429, 100*share.GoodputShare)
		}
		b.WriteString("A budget and limits shared through a fleet store remove the guesswork.\n\n")
	}
	b.WriteString("**failsafe-go and `Retry-After`.** The provider sends `retry-after` with every 429, and failsafe-go's HTTP retry policy waits for it on a real timer (`time.NewTimer` in `executor.Apply`, `retrypolicy/retryexecutor.go`); in virtual time, each such wait would hold the whole simulation for as long in wall-clock time, and its retry would leave at once in virtual time, so failsafe-go is left out of this scenario.\n")
}

// fraction writes 1/n in words for the small n of a replica count.
func fraction(n int) string {
	switch n {
	case 2:
		return "half"
	case 4:
		return "quarter"
	case 10:
		return "tenth"
	}
	return fmt.Sprintf("1/%d", n)
}

func latencyText(f RateFigures, d time.Duration) string {
	if f.SuccessShare == 0 {
		return "–"
	}
	return secs(d)
}

// fewerText says how many fewer (or more) n is than of, in per cent.
func fewerText(n, of int) string {
	if of == 0 {
		return "none to compare with"
	}
	if n > of {
		return fmt.Sprintf("%.1f %% more", 100*float64(n-of)/float64(of))
	}
	return fmt.Sprintf("%.1f %% fewer", 100*float64(of-n)/float64(of))
}
