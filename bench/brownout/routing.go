package brownout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go"
)

// The routing scenario: two organisations, each with a rate limit of its
// own, taught by the anthropic-ratelimit-* headers and enforced with
// 429s, under a load 1.6 times what one of them admits; half the requests
// carry one of many cached prompt prefixes, and each organisation has a
// prompt cache of its own. Damper reaches the first organisation as its
// client's own backend (the primary) and the second as a backend, and
// the contenders differ in where a call starts.
const (
	// RoutingITPM and RoutingRPM are each organisation's limits.
	RoutingITPM = 80_000
	RoutingRPM  = 50
	// RoutingLoad is the offered load over what one organisation admits.
	RoutingLoad = 1.6
	// RoutingCachedShare of the requests carry one of RoutingPrefixes
	// cached prefixes, drawn alike.
	RoutingCachedShare = 0.5
	RoutingPrefixes    = 100
	// RoutingFewPrefixes is the prefixes of the run that shows a few hot
	// prefixes kept warm by both organisations.
	RoutingFewPrefixes = 4
	// CacheLifetime is the lifetime of a prompt cache's entry since its
	// last use: the API's ephemeral cache, 5 minutes.
	CacheLifetime = 5 * time.Minute
	// RoutingDuration is how long requests arrive; RoutingSteadyFrom is
	// when the figures begin: the buckets start full and the caches
	// empty, and from one lifetime on whether a prefix is in a cache
	// depends on that lifetime's requests alone.
	RoutingDuration   = 30 * time.Minute
	RoutingSteadyFrom = CacheLifetime
	// RoutingCapacity is each organisation's capacity, in attempts a
	// second: far above the load, so that only the limits refuse.
	RoutingCapacity = 100
	// RoutingReplicas is the replicas of the published run.
	RoutingReplicas = DefaultReplicas
)

// OrgBBackend is the name of the backend that reaches the second
// organisation; the first is the client's own, damper.PrimaryBackend.
const OrgBBackend = "org-b"

// RoutingAdmitted is what one organisation's limit admits: requests a
// minute of PromptTokens each.
func RoutingAdmitted() float64 {
	return min(float64(RoutingITPM)/PromptTokens, RoutingRPM)
}

// RoutingScenario returns the routing scenario with replicas client
// processes, over duration (RoutingDuration for the published run).
func RoutingScenario(replicas int, duration time.Duration) Scenario {
	rate := RoutingLoad * RoutingAdmitted() / 60
	org := Provider{
		// Capacity never the bound: a burst of arrivals finds room.
		Capacity:      RoutingCapacity,
		ServiceMin:    time.Second,
		ServiceMax:    3 * time.Second,
		RejectLatency: 50 * time.Millisecond,
		RateLimit:     &RateLimit{RequestsPerMinute: RoutingRPM, InputTokensPerMinute: RoutingITPM},
		CacheLifetime: CacheLifetime,
	}
	second := org
	return Scenario{
		Name: fmt.Sprintf("routing-%dr", replicas),
		Title: fmt.Sprintf("Routing: two organisations, each %s input tokens a minute, offered %gx what one admits",
			thousands(RoutingITPM), RoutingLoad),
		Provider:  org,
		Secondary: &second,
		Replicas:  replicas,
		Rate:      rate,
		Duration:  duration,
		Deadline:  30 * time.Second,
		Seed:      DefaultSeed,
		Prompt:    ratePrompt,
		Cached:    &CachedPrompts{Share: RoutingCachedShare, Prefixes: RoutingPrefixes},
	}
}

// cacheQuestion is the user message after a cached prefix.
const cacheQuestion = "What does the document above say about the fox?"

// cachedParams returns, at index i from 1 to n, the request with the
// cached prefix i: a system prompt of its own text, with a cache
// breakpoint, and cacheQuestion, counting tokens input tokens in all (as
// countInputTokens counts them). Index 0 is left for the plain prompt.
func cachedParams(n, tokens int) []anthropic.MessageNewParams {
	question := (len(cacheQuestion) + bytesPerInputToken - 1) / bytesPerInputToken
	size := (tokens - requestOverheadToken - question) * bytesPerInputToken
	const words = "the quick brown fox jumps over the lazy dog while five boxing wizards jump quickly "
	filler := strings.Repeat(words, size/len(words)+1)
	out := make([]anthropic.MessageNewParams, n+1)
	for i := 1; i <= n; i++ {
		text := (fmt.Sprintf("Document %05d. ", i) + filler)[:size]
		out[i] = anthropic.MessageNewParams{
			Model:     messageParams.Model,
			MaxTokens: messageParams.MaxTokens,
			System:    []anthropic.TextBlockParam{{Text: text, CacheControl: anthropic.NewCacheControlEphemeralParam()}},
			Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(cacheQuestion))},
		}
	}
	return out
}

func mustMarshal(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// Names of the routing contenders.
const (
	failoverName = "failover"
	spreadName   = "spread"
	affinityName = "spread+affinity"
)

// RoutingContenders returns the contenders of the routing scenario:
// failover, spread without cache affinity, and spread with it.
func RoutingContenders() []Contender {
	return []Contender{
		routingContender(failoverName, "failover", false),
		routingContender(spreadName, "spread", false),
		routingContender(affinityName, "spread", true),
	}
}

// routingPolicy is the policy of every routing contender: the recommended
// policy, the rate limiter learning each backend's limits from its
// headers (spread's headroom), and routing; affinity keeps a call whose
// prompt has a cache breakpoint on the backend that served its prefix
// last (FallbackPolicy.CacheAffinity at its default), and without it
// cache affinity is off.
func routingPolicy(routing string, affinity bool) damper.Policy {
	p := damper.RecommendedPolicy()
	p.RateLimit = &damper.RateLimitPolicy{}
	p.Fallback = &damper.FallbackPolicy{Routing: routing}
	if !affinity {
		p.Fallback.CacheAffinity = damper.None
	}
	return p
}

// routingPath is the configuration and code path of a routing contender.
func routingPath(routing string, affinity bool) string {
	what := "every call starts on the primary (organisation A) and moves to org-b when A refuses or fails it"
	fields := fmt.Sprintf("Routing: %q", routing)
	if routing == "spread" {
		what = "each call starts on the organisation with the most headroom left under its learned limits"
		if affinity {
			what += ", a call with a cached prefix on the organisation that served the prefix last while it has a tenth of its limits left (cache affinity at its default, a table of 4096 prefixes)"
		} else {
			fields += ", CacheAffinity: damper.None"
			what += ", whatever its prompt (cache affinity off)"
		}
	}
	return fmt.Sprintf("real code: SDK v2 client + damper.New(p, damper.WithBackends(org-b)) middleware, p := damper.RecommendedPolicy() with p.RateLimit = &damper.RateLimitPolicy{} (limits learned from each organisation's headers) and p.Fallback = &damper.FallbackPolicy{%s}: %s; on the virtual clock", fields, what)
}

// routingContender is Damper with routingPolicy(routing, affinity), the
// first organisation as the client's own backend and the second as the
// backend org-b.
func routingContender(name, routing string, affinity bool) Contender {
	return Contender{
		Name: name,
		Path: routingPath(routing, affinity),
		newReplica: func(env replicaEnv) (call, error) {
			if env.secondary == nil || env.request == nil {
				return nil, errors.New("the scenario needs a Secondary provider and Cached prompts")
			}
			d, err := newDamper(env, routingPolicy(routing, affinity), damper.WithBackends(damper.Backend{
				Name:     OrgBBackend,
				Provider: damper.ProviderAnthropic,
				Options: []option.RequestOption{
					option.WithBaseURL("http://org-b.sim/"),
					option.WithAPIKey("sim-key-org-b"),
					option.WithHTTPClient(&http.Client{Transport: env.secondary}),
				},
			}))
			if err != nil {
				return nil, err
			}
			client := newSDKClient(env.transport, d.Option())
			return func(ctx context.Context) error {
				var rep damper.Report
				_, err := client.Messages.New(ctx, env.request(), damper.ReportInto(&rep))
				if len(rep.Fallbacks) > 0 {
					env.moved(rep.Fallbacks[0].Reason)
				}
				return err
			}, nil
		},
	}
}

// RoutingFigures are the numbers of one contender in the routing
// scenario, over the requests issued from RoutingSteadyFrom to the end of
// arrivals and the attempts that reached either organisation meanwhile.
type RoutingFigures struct {
	Requests, Served int
	// ServedShare is Served over Requests; ByB is the share of Served
	// that the second organisation answered.
	ServedShare, ByB float64
	// Provider429 is the attempts either organisation refused for its
	// rate limit; Attempts all those that reached them.
	Provider429, Attempts int
	// PerRequest is the requests' attempts, at either organisation, per
	// request.
	PerRequest float64
	// P50 and P99 are the latency of the requests, failures included.
	P50, P99 time.Duration
	// Cached is the served requests with a cached prefix; CacheHits of
	// them read it from the cache of the organisation that answered
	// (HitShare: over Cached); PrefixMoves of them were answered by
	// another organisation than the one that answered their prefix last.
	Cached, CacheHits, PrefixMoves int
	HitShare                       float64
	// RateLimited and TimedOut are the shares of the requests that
	// Damper's rate limiter refused (damper.ErrRateLimited) and that
	// their deadline ended.
	RateLimited, TimedOut float64
}

// RoutingFigures computes the routing figures of r.
func (r *Result) RoutingFigures() RoutingFigures {
	from, to := RoutingSteadyFrom, r.Scenario.Duration
	var f RoutingFigures
	var lat []time.Duration
	var attempts, limited, timedOut, byB int
	// The answers of the whole run in the order they were sent, for the
	// prefix moves.
	served := make([]int, 0, len(r.Requests))
	for i, q := range r.Requests {
		if q.OK && q.Prefix > 0 {
			served = append(served, i)
		}
		if q.Issued < from || q.Issued >= to {
			continue
		}
		f.Requests++
		attempts += q.Attempts
		lat = append(lat, q.Ended-q.Issued)
		switch {
		case q.OK:
			f.Served++
			if q.BySecondary {
				byB++
			}
			if q.Prefix > 0 {
				f.Cached++
				if q.Cache == CacheHit {
					f.CacheHits++
				}
			}
		case q.RateLimited:
			limited++
		case q.TimedOut:
			timedOut++
		}
	}
	slices.SortStableFunc(served, func(a, b int) int { return int(r.Requests[a].LastSent - r.Requests[b].LastSent) })
	lastByB := map[int]bool{}
	for _, i := range served {
		q := r.Requests[i]
		last, seen := lastByB[q.Prefix]
		if seen && last != q.BySecondary && q.Issued >= from && q.Issued < to {
			f.PrefixMoves++
		}
		lastByB[q.Prefix] = q.BySecondary
	}
	for _, as := range [][]Attempt{r.Attempts, r.SecondaryAttempts} {
		for _, a := range as {
			if a.At < from || a.At >= to {
				continue
			}
			f.Attempts++
			if a.Status == http.StatusTooManyRequests {
				f.Provider429++
			}
		}
	}
	if f.Requests > 0 {
		n := float64(f.Requests)
		f.ServedShare, f.PerRequest = float64(f.Served)/n, float64(attempts)/n
		f.RateLimited, f.TimedOut = float64(limited)/n, float64(timedOut)/n
		slices.Sort(lat)
		f.P50, f.P99 = quantile(lat, 0.50), quantile(lat, 0.99)
	}
	if f.Served > 0 {
		f.ByB = float64(byB) / float64(f.Served)
	}
	if f.Cached > 0 {
		f.HitShare = float64(f.CacheHits) / float64(f.Cached)
	}
	return f
}

// RoutingSuite is the routing scenario with the results of its
// contenders, of spread with RoutingFewPrefixes prefixes, and of spread
// without and with cache affinity at other replica counts.
type RoutingSuite struct {
	Scenario Scenario
	Results  []*Result // in contender order
	Few      *Result
	// ByReplicas is, for other replica counts than the scenario's,
	// spread's result and spread with affinity's.
	ByReplicas map[int][2]*Result
}

// AffinityReplicas are the replica counts at which spread without and
// with cache affinity are compared: each replica's Damper has a table of
// its own.
var AffinityReplicas = []int{1, 2, RoutingReplicas}

// RunRouting runs sc with every contender, spread with sc's cached
// prompts drawn from RoutingFewPrefixes prefixes, and spread without and
// with cache affinity at each of replicas but sc's own (the published run
// takes AffinityReplicas).
func RunRouting(sc Scenario, contenders []Contender, replicas []int) (*RoutingSuite, error) {
	if sc.Secondary == nil || sc.Cached == nil {
		return nil, fmt.Errorf("brownout: scenario %q: the routing scenario needs a Secondary provider and Cached prompts", sc.Name)
	}
	few := sc
	cached := *sc.Cached
	cached.Prefixes = RoutingFewPrefixes
	few.Cached = &cached
	scs := make([]Scenario, len(contenders), len(contenders)+1)
	for i := range scs {
		scs[i] = sc
	}
	cs := append(slices.Clone(contenders), routingContender(spreadName, "spread", false))
	scs = append(scs, few)
	var counts []int
	for _, n := range replicas {
		if n != sc.Replicas {
			counts = append(counts, n)
			x := sc
			x.Replicas = n
			scs = append(scs, x, x)
			cs = append(cs, routingContender(spreadName, "spread", false), routingContender(affinityName, "spread", true))
		}
	}
	results, err := runPairs(scs, cs)
	if err != nil {
		return nil, err
	}
	n := len(contenders)
	s := &RoutingSuite{Scenario: sc, Results: results[:n], Few: results[n], ByReplicas: map[int][2]*Result{}}
	for i, count := range counts {
		s.ByReplicas[count] = [2]*Result{results[n+1+2*i], results[n+2+2*i]}
	}
	return s, nil
}

// affinityRows returns, by replica count, spread's figures and spread
// with affinity's, the scenario's own count among them.
func (s *RoutingSuite) affinityRows() (counts []int, rows map[int][2]RoutingFigures) {
	rows = map[int][2]RoutingFigures{}
	f := s.figures()
	rows[s.Scenario.Replicas] = [2]RoutingFigures{f[spreadName], f[affinityName]}
	for n, r := range s.ByReplicas {
		rows[n] = [2]RoutingFigures{r[0].RoutingFigures(), r[1].RoutingFigures()}
	}
	for n := range rows {
		counts = append(counts, n)
	}
	slices.Sort(counts)
	return counts, rows
}

func (s *RoutingSuite) figures() map[string]RoutingFigures {
	out := map[string]RoutingFigures{}
	for _, r := range s.Results {
		out[r.Contender] = r.RoutingFigures()
	}
	return out
}
