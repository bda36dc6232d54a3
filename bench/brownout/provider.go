package brownout

import (
	"bytes"
	"math"
	"math/rand/v2"
	"time"
)

// Provider is the simulated Messages API: a service of finite capacity that
// every contender's attempts share.
//
// Capacity is work per virtual second, kept as a token bucket that refills
// at Capacity and holds at most one second of it (so that ordinary bursts
// of arrivals are absorbed): a served attempt costs one unit, and an
// attempt that arrives when less than one unit is left is turned away at
// once with 529 overloaded_error. Turning an attempt away may itself cost
// work (RejectCost units: the TLS handshake, authentication, parsing and
// routing of the prompt that happen before a front end can refuse it);
// that cost is taken from the capacity still to come, at most one second
// ahead.
// When rejections cost work, retries of rejected attempts eat the capacity
// that fresh requests need, which is how a retry storm outlives its cause.
type Provider struct {
	// Capacity is the work per second the provider can do when healthy.
	Capacity float64
	// RejectCost is the work one rejected attempt costs, in units of a
	// served attempt.
	RejectCost float64
	// ServiceMin and ServiceMax bound the time a served attempt takes
	// (uniform).
	ServiceMin, ServiceMax time.Duration
	// RejectLatency is the time a rejection or an outage error takes.
	RejectLatency time.Duration
	// Incident is what goes wrong, and when.
	Incident Incident
	// RateLimit, when set, is the organisation's rate limit, which every
	// replica's attempts share as they share one API key.
	RateLimit *RateLimit
	// CacheLifetime, when set (with a RateLimit, whose count reads the
	// body), is the lifetime of the organisation's prompt cache: a served
	// attempt whose prompt has a cache breakpoint reads the prefix up to
	// it from the cache (a hit) when this organisation served the same
	// prefix within the lifetime, and writes it otherwise; either renews
	// the entry for another lifetime, as the API's ephemeral cache does.
	// The cache is the organisation's own: another's entries do not count.
	// It changes no other figure: the limit counts every input token,
	// read from the cache or not, and the answer's usage reports them all
	// as input tokens.
	CacheLifetime time.Duration
}

// RateLimit is an organisation's rate limit as the Messages API enforces
// it: a token bucket for each limit set, of capacity L refilling
// continuously at L a minute and starting full. An attempt takes one
// request and its input tokens from every bucket at once; one that finds
// no room in a bucket takes nothing and gets 429 rate_limit_error at once
// (after RejectLatency), with retry-after, in whole seconds rounded up,
// until there is room for it. Every response, whatever its status, carries
// the anthropic-ratelimit-* headers of each bucket: its limit, what
// remains after the request's take (rounded down) and when it would be
// full again. Zero leaves a bucket out: no limit, no headers. The limit is
// checked before the provider's capacity; an attempt that the provider
// then turns away (529) takes nothing from it.
type RateLimit struct {
	RequestsPerMinute    float64
	InputTokensPerMinute float64
}

// IncidentKind names what goes wrong during an incident.
type IncidentKind int

const (
	// Outage: every attempt fails at once with 529.
	Outage IncidentKind = iota + 1
	// Brownout: a fraction of the served attempts fail with 500 api_error
	// after doing their work.
	Brownout
	// CapacityDrop: capacity falls to a fraction of the offered load.
	CapacityDrop
)

// Incident is a degradation of the provider over [Start, Start+Length).
type Incident struct {
	Kind   IncidentKind
	Start  time.Duration // from the start of the run
	Length time.Duration
	// FailShare is, for a Brownout, the share of attempts that fail.
	FailShare float64
	// Capacity is, for a CapacityDrop, the capacity during the incident,
	// in work per second.
	Capacity float64
}

// providerState is a Provider during one run.
type providerState struct {
	Provider
	start time.Time
	rng   *rand.Rand
	last  time.Time // when left was last brought up to date
	left  float64   // work available now; negative is debt
	// requests and inputTokens are the rate limit's buckets, when set.
	requests, inputTokens *rateBucket
	// counted is the last body counted and its input tokens: the bodies of
	// a run are alike, and decoding each would be most of a run's work.
	counted       []byte
	countedTokens int
	// cache is, with a CacheLifetime, when each prefix (by its key) was
	// last served; prefixes memoizes the key of each body seen (a run has
	// a few bodies), "" for one without a breakpoint.
	cache    map[string]time.Time
	prefixes map[string]string
}

// CacheOutcome is what a served attempt did with the organisation's
// prompt cache.
type CacheOutcome int8

const (
	// NoCache: the prompt has no cache breakpoint, or the provider no cache.
	NoCache CacheOutcome = iota
	// CacheWrite: the prefix was not in this organisation's cache.
	CacheWrite
	// CacheHit: the prefix was read from this organisation's cache.
	CacheHit
)

// prefixOf returns the cache key of body's prefix, "" without a breakpoint.
func (p *providerState) prefixOf(body []byte) string {
	key, ok := p.prefixes[string(body)]
	if !ok {
		key = cachePrefix(body)
		p.prefixes[string(body)] = key
	}
	return key
}

// useCache is the cache's answer to a served attempt with prefix key at now.
func (p *providerState) useCache(now time.Time, key string) CacheOutcome {
	if key == "" || p.cache == nil {
		return NoCache
	}
	last, seen := p.cache[key]
	p.cache[key] = now
	if seen && now.Sub(last) < p.CacheLifetime {
		return CacheHit
	}
	return CacheWrite
}

// count returns countInputTokens(body).
func (p *providerState) count(body []byte) int {
	if p.counted == nil || !bytes.Equal(body, p.counted) {
		p.counted, p.countedTokens = body, countInputTokens(body)
	}
	return p.countedTokens
}

// rateBucket is one bucket of a RateLimit during a run.
type rateBucket struct {
	limit float64 // per minute
	level float64
	last  time.Time
}

func newRateBucket(limit float64, start time.Time) *rateBucket {
	if limit <= 0 {
		return nil
	}
	return &rateBucket{limit: limit, level: limit, last: start}
}

// refill brings the bucket up to now.
func (b *rateBucket) refill(now time.Time) {
	b.level = min(b.limit, b.level+b.limit*now.Sub(b.last).Seconds()/60)
	b.last = now
}

// wait is how long until the bucket holds need, refilling from now.
func (b *rateBucket) wait(need float64) time.Duration {
	if b.level >= need {
		return 0
	}
	return time.Duration((need - b.level) * 60 / b.limit * float64(time.Second))
}

// view is the bucket as a response's headers show it at now.
func (b *rateBucket) view(now time.Time) bucketView {
	full := now.Add(time.Duration((b.limit - b.level) * 60 / b.limit * float64(time.Second)))
	if t := full.Truncate(time.Second); t.Before(full) {
		full = t.Add(time.Second) // the headers give whole seconds
	}
	return bucketView{limit: int64(b.limit), remaining: int64(max(math.Floor(b.level), 0)), reset: full}
}

// bucketView is one bucket as a response's headers show it.
type bucketView struct {
	limit, remaining int64
	reset            time.Time
}

// rateView is the rate limit as a response's headers show it: the
// buckets of the limit (nil for one not set), and for a refusal the delay
// until the attempt would find room.
type rateView struct {
	requests, inputTokens *bucketView
	retryAfter            time.Duration // a 429's; 0 otherwise
}

// response is what one attempt gets back, after latency.
type response struct {
	status  int
	errType string
	latency time.Duration
	// rate is the rate limit's headers; nil without a rate limit.
	rate *rateView
	// inputTokens is the attempt's input, which a success reports in its
	// usage; 0 without a rate limit (the answer then reports a fixed one).
	inputTokens int
	// cache is what a served attempt did with the prompt cache.
	cache CacheOutcome
}

func (p *providerState) capacityAt(now time.Time) float64 {
	if p.inIncident(now) && p.Incident.Kind == CapacityDrop {
		return p.Incident.Capacity
	}
	return p.Capacity
}

func (p *providerState) inIncident(now time.Time) bool {
	t := now.Sub(p.start)
	return p.Incident.Kind != 0 && t >= p.Incident.Start && t < p.Incident.Start+p.Incident.Length
}

// attempt decides the fate of an attempt arriving at now with inputTokens
// of input (counted only for a rate limit) and the cache key of its
// prompt's prefix ("" for none).
func (p *providerState) attempt(now time.Time, inputTokens int, prefix string) response {
	if p.RateLimit == nil {
		return p.serve(now)
	}
	res := p.limited(now, inputTokens)
	if res.status == 200 {
		res.cache = p.useCache(now, prefix)
	}
	return res
}

// limited is attempt under the rate limit: the limit is checked first, and
// an attempt takes from its buckets only if the provider then serves it
// (a 529 or an outage error takes nothing).
func (p *providerState) limited(now time.Time, inputTokens int) response {
	need := [2]float64{1, float64(inputTokens)}
	buckets := [2]*rateBucket{p.requests, p.inputTokens}
	var wait time.Duration
	for i, b := range buckets {
		if b != nil {
			b.refill(now)
			wait = max(wait, b.wait(need[i]))
		}
	}
	var res response
	if wait > 0 {
		res = response{status: 429, errType: "rate_limit_error", latency: p.RejectLatency}
	} else {
		res = p.serve(now)
		if res.status != 529 {
			for i, b := range buckets {
				if b != nil {
					b.level -= need[i]
				}
			}
		}
	}
	res.inputTokens = inputTokens
	res.rate = &rateView{}
	if wait > 0 {
		res.rate.retryAfter = time.Duration(math.Ceil(wait.Seconds())) * time.Second
	}
	if b := p.requests; b != nil {
		v := b.view(now)
		res.rate.requests = &v
	}
	if b := p.inputTokens; b != nil {
		v := b.view(now)
		res.rate.inputTokens = &v
	}
	return res
}

// serve decides the fate of an attempt that the rate limit, if any, let
// through.
func (p *providerState) serve(now time.Time) response {
	if p.inIncident(now) && p.Incident.Kind == Outage {
		return response{status: 529, errType: "overloaded_error", latency: p.RejectLatency}
	}
	capacity := p.capacityAt(now)
	p.left = min(p.left+capacity*now.Sub(p.last).Seconds(), capacity)
	p.last = now
	if p.left < 1 {
		p.left = max(p.left-p.RejectCost, -capacity)
		return response{status: 529, errType: "overloaded_error", latency: p.RejectLatency}
	}
	p.left--
	latency := p.ServiceMin + time.Duration(p.rng.Float64()*float64(p.ServiceMax-p.ServiceMin))
	if p.inIncident(now) && p.Incident.Kind == Brownout && p.rng.Float64() < p.Incident.FailShare {
		return response{status: 500, errType: "api_error", latency: latency}
	}
	return response{status: 200, latency: latency}
}
