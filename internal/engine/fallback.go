package engine

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/damper-ai/damper-go/internal/conf"
	"github.com/damper-ai/damper-go/internal/core"
)

// Fallback: a call's routes, each a backend and a model, and when the call
// moves from one to the next.

// FallbackPolicy says when a call moves to its next route: the next
// backend (see [WithBackends]), then the next sibling model on every
// backend again. A call moves:
//
//   - before an attempt, when the current backend's breaker is open, or
//     its rate limiter cannot admit the attempt in time;
//   - after a failed attempt whose failure speaks of the provider's health
//     (5xx, 529, a transport failure, a timeout, a stream that failed
//     before content) or of a rate limit, once the current backend cannot
//     retry it: its attempts (MaxAttempts per backend), its retry budget,
//     throttle, breaker or limiter, or a provider delay past MaxRetryAfter
//     refuse the retry;
//   - after a spend-limit 429, with OnSpendLimit.
//
// A call never moves on the caller's own errors (a 4xx but 429), after
// content has reached the caller, or when the move's attempt would cross
// the retry cost ceiling (which covers every attempt of the call, on every
// backend, at each one's model's price) or could not finish before the
// caller's deadline. A move waits no backoff: the next backend is another
// pool of capacity. Its attempt is that backend's first for the call, so
// it takes nothing from that backend's retry budget.
type FallbackPolicy struct {
	// OnSpendLimit moves a call on a spend-limit 429 (the organisation's
	// or the contract's limit reached), which is final on its backend;
	// a Bedrock or Vertex account has billing of its own.
	OnSpendLimit bool `key:"on_spend_limit"`
	// Models lists, per model as the caller names it, the sibling models
	// to fall back to, in order, once every backend has been tried with
	// the model itself: {"claude-opus-4-5": {"claude-sonnet-4-5"}}. Each
	// sibling is priced by Policy.PriceTable for the cost ceiling. At most
	// 1,000 models, 16 siblings per model, and 256 bytes of UTF-8 a name.
	Models map[string][]string `key:"models" max:"1000" unit:"models"`
	// Routing says where a call starts: "failover" (the default, also
	// "") starts every call on the primary and moves on in order;
	// "spread" starts each call on the backend with the most headroom
	// left under its rate limits, as a share of each limit, times its
	// weight, skipping a backend whose breaker is open or whose
	// concurrency limit is full; while no backend's limits are known yet,
	// the weights alone share the calls out. A call that fails moves on
	// as in failover, in order. See routing.go.
	Routing string `key:"routing" default:"failover" enum:"failover,spread"`
	// PrimaryWeight is the primary's weight under spread routing (see
	// [Backend].Weight). Default 1; at most 1000.
	PrimaryWeight int `key:"primary_weight" default:"1" min:"1" max:"1000"`
	// CacheAffinity is the size of the cache affinity table under spread
	// routing: a call whose prompt has a cache breakpoint (cache_control
	// on a tool, a system block or a message's content block, or a
	// top-level one) starts on the backend that last served the same
	// prefix, model and prompt up to its first breakpoint, while that
	// backend has a tenth of its known limits left and is not refused;
	// prompt caches live per account. The table keeps the most recently
	// used prefixes. Default 4096; [None] turns cache affinity off; at
	// most 1,000,000. See affinity.go.
	CacheAffinity int `key:"cache_affinity" default:"4096" none:"turns cache affinity off" min:"0" max:"1000000" unit:"prefixes"`
}

// check is what the tags of FallbackPolicy cannot say: the models' names
// and their siblings.
func (p *FallbackPolicy) check(FallbackPolicy) error {
	for model, siblings := range p.Models {
		if model == "" {
			return fieldError("Models", model, "a model name is required")
		}
		if !boundedName(model) {
			return fieldError("Models", conf.Text(quoteKey(model)), fmt.Sprintf("a model name is at most %d bytes of UTF-8", MaxModelID))
		}
		if len(siblings) > maxFallbackSiblings { // each is a route on every backend
			return fieldError(fmt.Sprintf("Models[%q]", model), conf.Text(fmt.Sprintf("%d siblings", len(siblings))), fmt.Sprintf("must be at most %d", maxFallbackSiblings))
		}
		for _, s := range siblings {
			if s == "" || s == model {
				return fieldError(fmt.Sprintf("Models[%q]", model), siblings, "siblings must be other, non-empty model names")
			}
			if !boundedName(s) {
				return fieldError(fmt.Sprintf("Models[%q]", model), conf.Text(quoteKey(s)), fmt.Sprintf("a model name is at most %d bytes of UTF-8", MaxModelID))
			}
		}
	}
	return nil
}

// quoteKey quotes the start of a key too long or not UTF-8, for an error.
func quoteKey(key string) string {
	if len(key) <= 64 {
		return strconv.Quote(key)
	}
	return strconv.Quote(key[:64]) + "..."
}

// boundedName reports whether a model named in a Policy is short, valid
// text: it becomes a map key, and may reach a log line.
func boundedName(s string) bool { return core.BoundedName(s) }

// clonePolicy is clone, for Damper.Policy.
func (p *FallbackPolicy) clonePolicy() any { return p.clone() }

// clone returns a copy of p that shares nothing with it.
func (p *FallbackPolicy) clone() *FallbackPolicy {
	c := *p
	if p.Models != nil {
		c.Models = make(map[string][]string, len(p.Models))
		for k, v := range p.Models {
			c.Models[k] = slices.Clone(v)
		}
	}
	return &c
}

// skipNoModelID is the Reason of a Skip whose backend has no ID for the
// model.
const skipNoModelID = "no_model_id"

// route is one place a call's attempts can go: a backend, and the model
// sent there.
type route struct {
	b *backend
	// model is the model as the caller, or Policy.Fallback for a sibling,
	// names it: prices and limit groups go by it. sendAs is the model as
	// the backend names it, "" when the request is sent as it is.
	model, sendAs string
	price         Price
	priced        bool
	cost          float64 // the estimated cost of one attempt, when priced
	gateState     any     // one gate's state of the route (core.Call.RouteState)
	body          []byte  // the request body for sendAs, made by move
}

// sentModel is the model an attempt on r sends.
func (r *route) sentModel() string {
	if r.sendAs != "" {
		return r.sendAs
	}
	return r.model
}

// priceBy prices r's model by t, for an attempt of inputTokens and
// maxTokens.
func (r *route) priceBy(t *PriceTable, inputTokens, maxTokens int) {
	if p, ok := t.Lookup(r.model); ok {
		r.price, r.priced, r.cost = p, true, attemptCost(p, inputTokens, maxTokens)
	}
}

// routes are the places a call's attempts may go, in order, and where the
// next one goes.
type routes struct {
	// route is where the next attempt goes: first, the primary with the
	// request's own model, when the call has nowhere else to go, else one
	// of list, at index at; routeFrom is the number of attempts made
	// before it.
	route     *route
	first     route
	list      []route
	at        int
	routeFrom int
}

// plan lists the routes after the first (the primary with the request's
// own model), when the Damper has somewhere else to go: every other
// backend that can serve the request with the model (backend.serves: an
// ID for it, and every feature of need on its platform), then each
// sibling model on every backend, each priced for an attempt of
// inputTokens and maxTokens. It returns the backends left out, and why.
func (rs *routes) plan(d *Damper, inputTokens, maxTokens int, need *requestNeeds) (skipped []routeSkip) {
	var siblings []string
	if f := d.policy.Fallback; f != nil {
		siblings = f.Models[rs.first.model]
	}
	if len(d.fallbacks) == 0 && len(siblings) == 0 {
		return nil
	}
	rs.list = append(make([]route, 0, (1+len(d.fallbacks))*(1+len(siblings))), rs.first)
	rs.route = &rs.list[0]
	add := func(b *backend, model, sendAs string) {
		r := route{b: b, model: model, sendAs: sendAs}
		r.priceBy(d.policy.PriceTable, inputTokens, maxTokens)
		rs.list = append(rs.list, r)
	}
	for i, model := range append([]string{rs.first.model}, siblings...) {
		if i > 0 {
			add(d.primary, model, model)
		}
		for _, b := range d.fallbacks {
			if id, reason, feature := b.serves(model, need); reason == "" {
				add(b, model, id)
			} else {
				skipped = append(skipped, routeSkip{b, model, reason, feature})
			}
		}
	}
	return skipped
}

// routeSkip is a backend left out of a call's routes with a model, for
// reason (and the feature its platform lacks).
type routeSkip struct {
	b               *backend
	model           string
	reason, feature string
}

// skipped tells that a call cannot move to backend b with model, for
// reason: in damper.fallback.skipped, and in a Warn line the first time b
// meets model (lacks: the first time it meets a feature it lacks).
func (b *backend) skipped(ctx context.Context, t *telemetry, model, reason, feature string) {
	t.m.skipped(ctx, b.name, reason)
	if reason != skipNoModelID {
		b.lacks(ctx, t, model, reason, feature)
		return
	}
	if t.log == nil || !t.log.Enabled(ctx, slog.LevelWarn) {
		return
	}
	shown := cutText(model, maxModelShown)
	switch b.skips.first(shown) {
	case skipFirst:
		t.log.LogAttrs(ctx, slog.LevelWarn, "damper: cannot fall back to a backend with this model",
			slog.String("backend", b.name), slog.String("provider", b.provider),
			slog.String("model", shown), slog.String("reason", reason),
			slog.String("fix", "give the backend's ID for the model in Backend.Models"))
	case skipFull:
		t.log.LogAttrs(ctx, slog.LevelWarn, "damper: more models cannot fall back to a backend; no longer logged one by one",
			slog.String("backend", b.name), slog.String("provider", b.provider),
			slog.Int("models_logged", maxSkipsLogged), slog.String("reason", reason))
	}
}

// skipped counts a backend left out of a call's routes, by its name and
// the reason.
func (m *metrics) skipped(ctx context.Context, backend, reason string) {
	if m.fallbackSkips.Enabled(ctx) {
		m.fallbackSkips.Add(ctx, 1, m.attrs(keyBackend.String(backend), keyFallbackReason.String(reason)))
	}
}

// maxSkipsLogged bounds the models a backend logs a Skip for, one line
// each: callers name any model they like.
const maxSkipsLogged = 64

// maxModelShown bounds the length of a model's name in a log line and in
// the set of those logged.
const maxModelShown = 128

// skipLog is the set of the models a backend has logged a Skip for: a Warn
// once per model, for at most maxSkipsLogged models, then one line saying
// that the rest go unlogged.
type skipLog struct {
	seen sync.Map // model (bounded) → struct{}, read without the lock
	full atomic.Bool
	mu   sync.Mutex
	n    int // models in seen, under mu
}

// skipNews is what skipLog.first says of a model.
type skipNews uint8

const (
	skipSeen  skipNews = iota // logged before, or the set is full
	skipFirst                 // new: log it
	skipFull                  // new, and the set has just run out of room
)

// first enters model in the set, and says whether it is new.
func (l *skipLog) first(model string) skipNews {
	if _, ok := l.seen.Load(model); ok || l.full.Load() {
		return skipSeen
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.seen.Load(model); ok || l.full.Load() {
		return skipSeen
	}
	if l.n == maxSkipsLogged {
		l.full.Store(true)
		return skipFull
	}
	l.seen.Store(model, struct{}{})
	l.n++
	return skipFirst
}

// modelID is the backend's ID for model: its own table's, else the
// default one's for its platform.
func (b *backend) modelID(model string) (string, bool) {
	if id, ok := b.models[model]; ok {
		return id, true
	}
	return DefaultModelID(b.provider, model)
}

// moveOnAt moves the call on when the gate that refused its next attempt
// before it was sent, refused, is one whose refusal moves a call
// (gate.moves: the breaker, the limiter, the concurrency limit).
func (c *call) moveOnAt(refused *denial) bool {
	if !refused.Gate.Moves {
		return false
	}
	return c.move(string(refused.Gate.Outcome), false)
}

// moveOnRefusal moves the call on after an attempt that failed as cls,
// whose retry where it is refused refuses, unless its gate keeps the call
// (gate.moves: the cost ceiling, the call's wherever it goes).
func (c *call) moveOnRefusal(cls Classification, refused *denial) bool {
	if cls.Signal != ProviderHealth && cls.Signal != CallerTraffic || !refused.Gate.Moves {
		return false
	}
	return c.move(string(refused.Gate.Outcome), true)
}

// moveOnFinal moves the call on after an attempt that failed as cls, not
// to be retried where it is: a spend limit, with OnSpendLimit.
func (c *call) moveOnFinal(cls Classification) bool {
	f := c.d.policy.Fallback
	if f == nil || !f.OnSpendLimit || cls.Kind != kindSpendLimit {
		return false
	}
	return c.move(kindSpendLimit, true)
}

// move moves the call to its next route, for reason, unless it has none,
// the deadline leaves no room for an attempt, or (after a failed attempt,
// when the next one is beyond the call's first) the attempt would cross
// the cost ceiling.
func (c *call) move(reason string, afterAttempt bool) bool {
	next := c.at + 1
	if next >= len(c.list) {
		return false
	}
	r := &c.list[next]
	if pastDeadline(c, c.d.clock.Now().Add(minAttempt)) || afterAttempt && pastCostCeiling(c, c.retryCost, r) {
		return false
	}
	if !c.prepare(r) {
		return false
	}
	from := c.route
	c.at, c.route, c.routeFrom = next, r, c.report.Attempts
	if afterAttempt {
		c.addRetryCost()
	}
	fb := Fallback{From: from.b.name, To: r.b.name, Model: r.sentModel(), Reason: reason}
	provider := r.b.provider
	if provider == "" {
		provider = providerOf(c.req)
	}
	c.report.moved(fb, provider)
	c.trace.fallback(fb, provider)
	return true
}

// prepare makes the body of r's attempts when they cannot send the
// caller's as it is: on another backend's client, or with another model.
// It reports false when the body cannot be read again.
func (c *call) prepare(r *route) bool {
	if r.b.client == nil && r.sendAs == "" {
		return true
	}
	sendAs := r.sendAs
	if sendAs == c.report.Model {
		sendAs = "" // the body names it already
	}
	body, err := c.out.withModel(sendAs)
	if err != nil {
		return false
	}
	r.body = body
	return true
}

// send sends an attempt's request, areq, on r: through the backend's
// client, or the client's own chain, next, with the body the route made
// (r.body) when it sends another model.
func (r *route) send(areq *http.Request, next SendFunc) (*http.Response, error) {
	if r.b.client != nil {
		return r.b.send(areq, r.body)
	}
	if body := r.body; body != nil {
		areq.ContentLength = int64(len(body))
		areq.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		areq.Body, _ = areq.GetBody()
	}
	return next(areq)
}

// kindSpendLimit is the Kind of a spend-limit 429.
const kindSpendLimit = "spend_limit"
