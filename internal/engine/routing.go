package engine

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/damper-ai/damper-go/fleet"
)

// Routing: which backend a call starts on. Failover starts every call on
// the primary; spread starts each on the backend with the most headroom
// (FallbackPolicy.Routing). Either way a failed call moves on in the
// routes' order (fallback.go).

// routingSpread is FallbackPolicy.Routing's value for spread routing; its
// tag lists the values.
const routingSpread = "spread"

// The bases of a spread call's first choice, in damper.routing.choices
// and on the damper.request span.
const (
	basisHeadroom = "headroom" // the most headroom, times the weight
	basisWeights  = "weights"  // headroom told the backends apart in nothing: the weights' turn
	basisNone     = "none"     // every backend refused at once: the failover order
	basisAffinity = "affinity" // the backend that last served the prompt's cached prefix (affinity.go)
)

// spread is what spread routing keeps between calls: the smooth weighted
// round robin of the backends, whose turn comes when their headroom tells
// them apart in nothing (nothing learned yet, or every bucket full).
type spread struct {
	mu     sync.Mutex
	credit map[*backend]float64 // each backend's running credit, under mu
}

// candidate is one route a spread call may start on.
type candidate struct {
	at       int     // its index in the call's routes
	headroom float64 // the least share left of its limits; 1 when none is known
	// capacity is how many calls like this one its limits take a
	// minute, 0 when none is known.
	capacity float64
}

// maxCandidates bounds the routes a spread call chooses among: the
// first ones in order, the primary and 15 backends.
const maxCandidates = 16

// spread chooses the route c starts on, among the routes of its own model
// (the primary and each backend with an ID for it), and puts it first, the
// others following in their order. It runs as the call starts, before its
// first attempt. A call whose prompt has a cached prefix that a backend
// served last starts there, while that backend is a candidate with
// headroom of at least affinityFloor (cache affinity, affinity.go).
func (c *call) spread() {
	d := c.d
	now := d.clock.Now()
	var pinned *backend // the backend that last served the call's cached prefix
	affinity := ""
	if key := c.out.facts.prefix; key != 0 {
		affinity = affinityNew
		if b, ok := d.affinity.lookup(key); ok {
			pinned, affinity = b, affinityMoved
		}
	}
	var buf [maxCandidates]candidate
	cands := buf[:0]
	pin := -1
	cost := fleet.RateAmounts{1, float64(c.inputTokens), float64(c.maxTokens)}
	for i := range c.list {
		r := &c.list[i]
		if r.model != c.first.model || len(cands) == maxCandidates {
			break // the siblings: only after every backend of the model
		}
		if r.b.refusesNow(c, now) {
			continue
		}
		h, capacity := r.b.headroom(r.model, now, cost)
		if r.b == pinned && h >= affinityFloor {
			pin = len(cands)
		}
		cands = append(cands, candidate{at: i, headroom: h, capacity: capacity})
	}
	at, basis := 0, basisNone
	if len(cands) > 0 {
		at, basis = d.spread.choose(c.list, cands, pin)
	}
	if at > 0 && !c.prepare(&c.list[at]) {
		at, basis = 0, basisNone // its body cannot be made: the failover order
	}
	var startOn, provider string
	if at > 0 {
		chosen := c.list[at]
		copy(c.list[1:at+1], c.list[:at])
		c.list[0] = chosen
		b := chosen.b
		startOn, provider = b.name, b.provider
		if provider == "" {
			provider = providerOf(c.req)
		}
	}
	c.route = &c.list[0]
	c.routing = basis
	d.tel.m.routed(c.ctx, c.route.b.name, basis)
	if affinity != "" {
		if c.route.b == pinned {
			affinity = affinityHit
		}
		c.affinity = affinity
		d.tel.m.affinity(c.ctx, affinity)
	}
	c.report.routed(startOn, provider, affinity)
}

// choose returns the index in routes of the candidate to start on, and
// why: cands[pin] when pin is not -1 (cache affinity's); else the most
// headroom times the weight, the first in order among equals; or, when
// every candidate has the same headroom (none known, or every limit
// full), the turn of a smooth weighted round robin. Every choice is
// charged to the round robin, so that its turns make up for the choices
// headroom and affinity made: a backend whose limits refill in proportion
// to the others' gets the calls in that proportion at any load.
func (s *spread) choose(routes []route, cands []candidate, pin int) (int, string) {
	// Each candidate's share of the round robin: its weight, times its
	// capacity when every capacity is known.
	byCapacity := true
	for _, k := range cands {
		byCapacity = byCapacity && k.capacity > 0
	}
	var shares [maxCandidates]float64
	total := 0.0
	for i, k := range cands {
		shares[i] = float64(routes[k.at].b.weight)
		if byCapacity {
			shares[i] *= k.capacity
		}
		total += shares[i]
	}
	same := true
	best, score := cands[0].at, -1.0
	for _, k := range cands {
		same = same && k.headroom == cands[0].headroom
		// Headroom is at most 1 and weights at least 1: a backend with
		// none left (0, or a pause) still beats no choice.
		if v := k.headroom * float64(routes[k.at].b.weight); v > score {
			best, score = k.at, v
		}
	}
	basis := basisHeadroom
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.credit == nil {
		s.credit = make(map[*backend]float64)
	}
	turn := -1
	for i, k := range cands {
		b := routes[k.at].b
		s.credit[b] += shares[i] / total
		if turn < 0 || s.credit[b] > s.credit[routes[turn].b] {
			turn = k.at
		}
	}
	switch {
	case pin >= 0:
		best, basis = cands[pin].at, basisAffinity
	case same:
		best, basis = turn, basisWeights
	}
	// Bounded, so that a long spell of choices by headroom is not made up
	// for by as long a spell of turns.
	b := routes[best].b
	s.credit[b] = max(s.credit[b]-1, -maxCredit)
	for _, k := range cands {
		if b := routes[k.at].b; s.credit[b] > maxCredit {
			s.credit[b] = maxCredit
		}
	}
	return best, basis
}

// maxCredit bounds a backend's credit in the round robin, in calls.
const maxCredit = 4

// refusesNow reports whether b's gates would refuse an attempt of c at
// once, as far as can be told at no cost: its breaker open as last heard
// (asked, taking no probe, only once its open period is over or while
// half-open), or its concurrency limit full.
func (b *backend) refusesNow(c *call, now time.Time) bool {
	if b.conc != nil && b.conc.Full(c.forGates()) {
		return true
	}
	return b.breaker != nil && b.breaker.RefusesNow(c.forGates(), now)
}

// headroom is the least share of its limits that b's rate limiter has
// left for model's group at now, in [0, 1]: 0 while paused after a 429,
// 1 when no limit is known (nothing learned yet, no rate limiter, or
// buckets that cannot tell without asking their store); and the calls of
// cost its known limits take a minute, 0 when none is known.
func (b *backend) headroom(model string, now time.Time, cost fleet.RateAmounts) (h, capacity float64) {
	if b.limiter == nil {
		return 1, 0
	}
	st, ok := b.limiter.Known(model, now)
	if !ok {
		return 1, 0
	}
	h = 1.0
	for k, s := range st {
		if !s.PausedUntil.IsZero() {
			return 0, 0
		}
		if s.Limit > 0 {
			h = min(h, max(s.Remaining, 0)/s.Limit)
			if c := s.Limit / max(cost[k], 1); capacity == 0 || c < capacity {
				capacity = c
			}
		}
	}
	return h, capacity
}

// metricRoutingChoices counts spread calls by the backend they start on.
const metricRoutingChoices = "damper.routing.choices"

// Span and metric attributes of spread routing.
const (
	keyRouting      = attribute.Key("damper.routing")
	keyRoutingBasis = attribute.Key("damper.routing.basis")
)

// newRoutingChoices makes the counter of spread calls' first backends.
func newRoutingChoices(meter metric.Meter) metric.Int64Counter {
	var none noop.Meter
	return instrument(meter.Int64Counter(metricRoutingChoices, metric.WithUnit("{call}"),
		metric.WithDescription("Calls under spread routing by the backend they start on, and why: headroom (the most left of its rate limits, times its weight), weights (no headroom told the backends apart), affinity (the backend that last served the call's cached prompt prefix), none (every backend refused at once: the failover order).")))(none.Int64Counter(metricRoutingChoices))
}

// routed counts a spread call that starts on backend, chosen on basis.
func (m *metrics) routed(ctx context.Context, backend, basis string) {
	if m.routingChoices != nil && m.routingChoices.Enabled(ctx) {
		m.routingChoices.Add(ctx, 1, m.attrs(keyBackend.String(backend), keyRoutingBasis.String(basis)))
	}
}
