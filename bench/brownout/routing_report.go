package brownout

import (
	"fmt"
	"strings"
	"time"
)

// RoutingHeading is the heading of the routing part of the section.
const RoutingHeading = "### Routing: two organisations, failover or spread, and prompt caches"

// The routing targets.
const (
	routingTargetServed   = "routing: spread serves at least as many requests as failover"
	routingTarget429      = "routing: spread gets fewer 429s from the organisations than failover"
	routingTargetP99      = "routing: spread's p99 latency lower than failover's"
	routingTargetAttempts = "routing: spread sends fewer attempts per request than failover"
	routingTargetAffinity = "routing: spread with cache affinity reads the prompt cache at least as often as spread without it"
)

// Checks evaluates the routing targets.
func (s *RoutingSuite) Checks() []Check {
	var checks []Check
	add := func(target string, pass bool, detail string, args ...any) {
		checks = append(checks, Check{Target: target, Pass: pass, Detail: fmt.Sprintf(detail, args...)})
	}
	f := s.figures()
	o, sp, a := f[failoverName], f[spreadName], f[affinityName]
	ok := o.Requests > 0 && sp.Requests > 0
	add(routingTargetServed, ok && sp.Served >= o.Served, "%d against %d of %d", sp.Served, o.Served, sp.Requests)
	add(routingTarget429, ok && sp.Provider429 < o.Provider429, "%d against %d", sp.Provider429, o.Provider429)
	add(routingTargetP99, ok && sp.P99 < o.P99, "%s against %s", secs(sp.P99), secs(o.P99))
	add(routingTargetAttempts, ok && sp.PerRequest < o.PerRequest, "%.3f against %.3f", sp.PerRequest, o.PerRequest)
	add(routingTargetAffinity, a.Cached > 0 && sp.Cached > 0 && a.HitShare >= sp.HitShare,
		"%.1f %% of %d against %.1f %% of %d", 100*a.HitShare, a.Cached, 100*sp.HitShare, sp.Cached)
	return checks
}

// Markdown returns the routing part of the section: setup, contenders,
// the table, the targets and what the run shows.
func (s *RoutingSuite) Markdown() string {
	var b strings.Builder
	sc := s.Scenario
	p := sc.Provider
	admitted := RoutingAdmitted()
	fmt.Fprintf(&b, "%s\n\n", RoutingHeading)
	fmt.Fprintf(&b, "**Setup.** Two simulated organisations (two API keys of two organisations, or two workspaces), each the rate-limited provider of the rate-limit scenario with a limit of its own: %s input tokens and %s requests a minute, taught through the `anthropic-ratelimit-*` headers of every answer and enforced with 429 `rate_limit_error` and `retry-after`. ",
		thousands(RoutingITPM), thousands(RoutingRPM))
	fmt.Fprintf(&b, "Every request counts %s input tokens, so one organisation admits %.0f requests a minute; requests arrive at %.0f a minute, %gx that (%.0f %% of the two limits together), for %v, spread at random over %d replicas, each with a %v deadline. A served attempt takes %v–%v; the organisations' capacity is never the bound. ",
		thousands(PromptTokens), admitted, 60*sc.Rate, RoutingLoad, 100*RoutingLoad/2, sc.Duration, sc.Replicas, sc.Deadline, p.ServiceMin, p.ServiceMax)
	fmt.Fprintf(&b, "%.0f %% of the requests carry a cached prompt prefix, one of %d system prompts drawn alike, each a block with a `cache_control` breakpoint, then a short question; the others send a plain prompt. ",
		100*sc.Cached.Share, sc.Cached.Prefixes)
	fmt.Fprintf(&b, "Each organisation has a prompt cache of its own, as the API's caches are: a served request with a breakpoint reads its prefix from the cache (a *hit*) when the same organisation served that prefix within the last %s, and writes it otherwise; either keeps the entry for another %s. The limits count every input token, read from the cache or not, so the cache changes no figure but its own. ",
		minutes(CacheLifetime), minutes(CacheLifetime))
	fmt.Fprintf(&b, "Damper reaches organisation A as its client's own backend (`primary`) and organisation B as `damper.Backend{Name: %q, Provider: damper.ProviderAnthropic}` over the simulated transport. The figures are over the requests issued from %s into the run (the buckets start full and the caches empty; from one lifetime on, what a cache holds depends on that lifetime's requests alone) to the end of arrivals, and the attempts that reached either organisation meanwhile. ",
		OrgBBackend, minutes(RoutingSteadyFrom))
	b.WriteString("`cd bench && go test -run 'TestRouting|TestPromptCache' ./brownout/` checks the targets below and the run's invariants with 2 replicas over 10 minutes, in seconds; add `-args -routing.full` for the published run.\n\n")

	b.WriteString("| contender | configuration and code path |\n|---|---|\n")
	for _, r := range s.Results {
		fmt.Fprintf(&b, "| %s | %s |\n", r.Contender, routingContenderPath(r.Contender))
	}
	b.WriteString("\n")
	b.WriteString("**Figures.** *Served* is the requests that succeeded; *429s* the attempts that either organisation refused for its limit; latency is from issue to the end of the call, failures included; *attempts* is the attempts at either organisation per request; *by B* the share of the served requests that organisation B answered; *cache hits* the share of the served requests with a cached prefix that read it from the cache of the organisation that answered, and *prefix moves* those answered by another organisation than the one that answered the same prefix last.\n\n")
	b.WriteString("| contender | served | 429s | p50 | p99 | attempts per request | by B | cache hits | prefix moves |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range s.Results {
		f := r.RoutingFigures()
		fmt.Fprintf(&b, "| %s | %d of %d (%.2f %%) | %d | %s | %s | %.3f | %.1f %% | %.1f %% of %d | %d |\n",
			r.Contender, f.Served, f.Requests, 100*f.ServedShare, f.Provider429, secs(f.P50), secs(f.P99),
			f.PerRequest, 100*f.ByB, 100*f.HitShare, f.Cached, f.PrefixMoves)
	}
	b.WriteString("\n")

	writeChecks(&b, "#### Routing targets", s.Checks())
	b.WriteString("\n")
	s.writeRoutingWhy(&b)
	return b.String()
}

// routingContenderPath is the configuration and code path of the routing
// contender called name.
func routingContenderPath(name string) string {
	for _, c := range RoutingContenders() {
		if c.Name == name {
			return c.Path
		}
	}
	return ""
}

// affinityOfFailover says how failover's lopsided split compares with
// spread's for the cache.
func affinityOfFailover(o, sp RoutingFigures) string {
	if o.HitShare > sp.HitShare {
		return "a prefix that goes to the same organisation more often finds it warm more often, but failover pays for it with its waits"
	}
	return "its lopsided split buys it no more hits than spread's"
}

// writeRoutingWhy explains what the figures show.
func (s *RoutingSuite) writeRoutingWhy(b *strings.Builder) {
	f := s.figures()
	o, sp, a := f[failoverName], f[spreadName], f[affinityName]
	fmt.Fprintf(b, "**Failover.** Every call starts on organisation A, which admits %.0f of the %.0f requests a minute. A's limiter, which learns A's limit from its headers, lets A's bucket run dry and then puts each call in line for room, to wait up to its `MaxWait` (30 s) and no later than leaves the call's deadline room for an attempt; a call whose turn would come later moves to B at once (`rate_limited`). So B answers %.1f %% of the served requests, and the calls that find a place in A's line wait for it: p50 %s, p99 %s. ",
		RoutingAdmitted(), 60*s.Scenario.Rate, 100*o.ByB, secs(o.P50), secs(o.P99))
	fmt.Fprintf(b, "Each replica's limiter learns what the others take a response at a time, so some attempts reach A with no room left: %d 429s, each retried or moved, %.3f attempts a request. It serves %d of %d requests.\n\n",
		o.Provider429, o.PerRequest, o.Served, o.Requests)
	fmt.Fprintf(b, "**Spread.** Each call starts on the organisation with the most of its learned limits left, as a share of each: the two refill alike, so the calls split about evenly (B answers %.1f %%), each organisation at %.0f %% of its limit, where neither runs out: %d 429s, %.3f attempts a request, p99 %s, the service time alone; it serves %d of %d.\n\n",
		100*sp.ByB, 100*RoutingLoad/2, sp.Provider429, sp.PerRequest, secs(sp.P99), sp.Served, sp.Requests)
	fmt.Fprintf(b, "**Prompt caches.** With %d prefixes, each comes back to a given organisation every few minutes, around the cache's lifetime, so where it goes decides whether the cache still holds it. Spread sends each prefix to either organisation alike: %.1f %% of the cached requests read the cache, %d of %d answered by another organisation than the prefix's last. Failover sends %.1f %% of the served requests to A, and reads the cache for %.1f %% (%d prefix moves): %s.\n\n",
		s.Scenario.Cached.Prefixes, 100*sp.HitShare, sp.PrefixMoves, sp.Cached, 100*(1-o.ByB), 100*o.HitShare, o.PrefixMoves, affinityOfFailover(o, sp))
	fmt.Fprintf(b, "**Cache affinity.** It keeps a prefix on the organisation that served it last while that one has a tenth of its limits left: with %d replicas, %.1f %% of the cached requests read the cache, %d of %d moved, with %d 429s and p99 %s.\n\n",
		s.Scenario.Replicas, 100*a.HitShare, a.PrefixMoves, a.Cached, a.Provider429, secs(a.P99))
	counts, rows := s.affinityRows()
	b.WriteString("**Affinity and replicas.** Each replica's Damper has an affinity table of its own, which knows where that replica sent a prefix last, not where the others did; the same scenario at other replica counts, spread without and with affinity:\n\n")
	b.WriteString("| replicas | cache hits, spread | cache hits, spread+affinity | prefix moves, spread | prefix moves, spread+affinity | 429s, spread+affinity | p99, spread+affinity |\n")
	b.WriteString("|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, n := range counts {
		x, y := rows[n][0], rows[n][1]
		fmt.Fprintf(b, "| %d | %.1f %% | %.1f %% | %d of %d | %d of %d | %d | %s |\n", n, 100*x.HitShare, 100*y.HitShare, x.PrefixMoves, x.Cached, y.PrefixMoves, y.Cached, y.Provider429, secs(y.P99))
	}
	one := rows[counts[0]]
	fmt.Fprintf(b, "\nWith %d %s, affinity keeps each prefix where it went first (%d %s) and reads the cache for %.1f %% of the cached requests, against %.1f %% for spread (the misses are the prefixes that come back after more than the cache's lifetime); with more replicas, each sends a prefix where it sent it last, the replicas' choices differ, and the more replicas, the more the prefix goes back and forth between the organisations, as with spread. ",
		counts[0], plural(counts[0], "replica", "replicas"), one[1].PrefixMoves, plural(one[1].PrefixMoves, "move", "moves"), 100*one[1].HitShare, 100*one[0].HitShare)
	if s.Few != nil {
		few := s.Few.RoutingFigures()
		fmt.Fprintf(b, "With a few hot prefixes, %d, every organisation keeps each of them warm, and spread reads the cache for %.1f %% of the cached requests: the cost of spreading a prefix is a write at each organisation that has not served it within the lifetime, which matters for many prefixes each used now and then (documents, conversations), not for a few shared system prompts.",
			RoutingFewPrefixes, 100*few.HitShare)
	}
	b.WriteString("\n")
}

// minutes writes d in whole minutes.
func minutes(d time.Duration) string {
	return fmt.Sprintf("%.0f %s", d.Minutes(), plural(int(d.Minutes()), "minute", "minutes"))
}
