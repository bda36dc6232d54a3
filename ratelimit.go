package damper

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/conf"
	"github.com/damper-ai/damper-go/internal/ratelimit"
	"github.com/tidwall/gjson"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
)

// The rate limiter's gate: Policy.RateLimit, over one [fleet.LimitBuckets] per
// limit group from the backend's store. It admits every attempt, waiting
// in line, and is asked before a retry whether it would have room at the
// wait's end. Each call's wait is recorded in damper.ratelimit.wait, and
// the primary backend's buckets in two gauges.

// OutcomeRateLimited: the rate limiter could not admit the attempt in time.
const OutcomeRateLimited Outcome = "rate_limited"

// ErrRateLimited: the rate limiter could not admit the attempt within
// RateLimitPolicy.MaxWait and the caller's deadline, so nothing was
// sent. [Error.AdmitAt] holds when it could have been admitted, and
// [Error.RetryAfter] the time until then.
var ErrRateLimited = errors.New("damper: rate limited")

// gateRateLimit's refusal reaches a proxy's client as the API's own rate
// limit (429 rate_limit_error). It moves a call on to a backend with
// limits of its own.
var gateRateLimit = &gate{
	outcome: OutcomeRateLimited, reason: ErrRateLimited,
	status: http.StatusTooManyRequests, apiType: "rate_limit_error", moves: true,
	part: newLimiterGate, instruments: rateInstruments, recordCall: recordRateWait,
	callSpan: rateCallSpan, attemptSpan: rateAttemptSpan,
}

// The limiter's span attributes: a call's group and its wait in line, an
// attempt's wait, and, on a learned limit's log line, its bucket.
const (
	keyRateGroup   = attribute.Key("damper.ratelimit.group")
	keyRateWait    = attribute.Key("damper.ratelimit.wait_s")
	keyRateBucket  = attribute.Key("damper.ratelimit.bucket")
	keyRateLearned = attribute.Key("damper.ratelimit.learned")
)

// rateCallSpan says a call's limit group and its wait in the group's line.
func rateCallSpan(rep *Report, attrs []attribute.KeyValue) []attribute.KeyValue {
	if rep.LimitGroup != "" {
		attrs = append(attrs, keyRateGroup.String(boundedText(rep.LimitGroup)), keyRateWait.Float64(rep.RateLimitWait.Seconds()))
	}
	return attrs
}

// rateAttemptSpan says an attempt's wait in line.
func rateAttemptSpan(ar *AttemptReport, span trace.Span) {
	if ar.RateLimitWait > 0 {
		span.SetAttributes(keyRateWait.Float64(ar.RateLimitWait.Seconds()))
	}
}

// partLimiter is the limiter's part of a store.
var partLimiter = newStorePart("limiter", "damper: rate limiter store error")

// newLimiterGate makes backend b's limiter, or nil without
// Policy.RateLimit.
func newLimiterGate(d *Damper, b *backend) (hooks, error) {
	if d.policy.RateLimit == nil {
		return hooks{}, nil
	}
	b.limiter = newLimiter(d.policy.RateLimit, d.clock, b.store)
	b.limiter.tel = d.tel
	return hooks{attempt: b.limiter}, nil
}

// The limiter's metrics.
const (
	metricRateWait      = "damper.ratelimit.wait"
	metricRateLimit     = "damper.ratelimit.limit"
	metricRateRemaining = "damper.ratelimit.remaining"
)

// rateInstruments makes the histogram of the calls' waits in line and,
// when the primary backend has a limiter, the gauges of its buckets.
func rateInstruments(meter metric.Meter, d *Damper) any {
	var none noop.Meter
	wait := instrument(meter.Float64Histogram(metricRateWait, metric.WithUnit("s"),
		metric.WithDescription("Time a Messages request waited in the rate limiter's line, by limit group."),
		metric.WithExplicitBucketBoundaries(0, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60)))(none.Float64Histogram(metricRateWait))
	if d.primary.limiter != nil {
		rateGauges(meter, &d.tel.m, d.primary.limiter, d.clock, d)
	}
	return wait
}

// recordRateWait records a call's wait in its group's line.
func recordRateWait(ctx context.Context, m *metrics, inst any, rep Report) {
	wait := inst.(metric.Float64Histogram)
	if rep.LimitGroup != "" && wait.Enabled(ctx) {
		wait.Record(ctx, rep.RateLimitWait.Seconds(), m.attrs(keyProvider.String(rep.Provider), keyRateGroup.String(m.groups.label(rep.LimitGroup))))
	}
}

// rateGauges registers the gauges of the rate limiter's buckets: each
// one's limit and what remains, by group and bucket.
func rateGauges(meter metric.Meter, m *metrics, lim *limiter, clock Clock, owner *Damper) {
	limit, err := meter.Float64ObservableGauge(metricRateLimit, metric.WithUnit("{token}"),
		metric.WithDescription("Per-minute limit of each rate-limit bucket (requests or tokens), learned or configured; absent until known."))
	if err != nil {
		otel.Handle(err)
		return
	}
	remaining, err := meter.Float64ObservableGauge(metricRateRemaining, metric.WithUnit("{token}"),
		metric.WithDescription("What an interactive request could take from each rate-limit bucket now."))
	if err != nil {
		otel.Handle(err)
		return
	}
	groups, named, name := m.groups, m.named, m.name
	reg, err := meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for _, s := range lim.state(clock.Now()) {
			group := groups.label(s.Group)
			if s.Limit == 0 || group == otherLabel {
				continue // one gauge for many groups would say nothing true
			}
			kvs := []attribute.KeyValue{keyRateGroup.String(group), keyRateBucket.String(s.Bucket), keyRateLearned.Bool(s.Learned)}
			if named {
				kvs = append(kvs, name)
			}
			o.ObserveFloat64(limit, s.Limit, metric.WithAttributes(kvs...))
			o.ObserveFloat64(remaining, s.Remaining, metric.WithAttributes(kvs...))
		}
		return nil
	}, limit, remaining)
	if err != nil {
		otel.Handle(err)
		return
	}
	owner.tel.keepGauges(owner, reg)
}

// RateLimitPolicy configures the rate limiter: it keeps every goroutine of
// a Damper under the API's rate limits together, so that attempts wait in
// line on the Damper instead of each finding the limit in a 429.
//
// The API limits requests, input tokens and output tokens per minute for
// each limit group, a model family (see [LimitGroup]), as token buckets that
// refill continuously. The limiter keeps the same three buckets per group.
// A bucket's limit is configured in Limits or, by default, learned from the
// anthropic-ratelimit-* headers of the responses. The limiter counts its
// own traffic exactly; a response's count of what remains lowers a bucket
// that holds more (traffic that other processes send on the same limits),
// and a learned limit follows the API's as it is raised or lowered. From
// those gaps the limiter also estimates the rate at which other traffic
// takes tokens, and refills its buckets with only what that leaves, so that
// replicas on one key share its limits. Until a group's first response the
// limiter admits everything.
//
// An attempt takes one request, its estimated input tokens (one per
// four bytes of the body) and its max_tokens, from the three buckets at once
// or from none; the answer's usage settles the reservation (a stream's, at
// its end). An attempt that finds no room waits in line, first come, first
// served within its priority, for at most MaxWait, and is not sent so close
// to the caller's deadline that an attempt of its group, as long as they
// have been taking, could not end before it; else it fails at once with
// [ErrRateLimited], which says when it could be admitted. A 429 for a rate
// limit (not a spend limit) empties the buckets it names until the delay
// it gives, so every goroutine backs off together. Retries pass through the
// limiter like first attempts.
//
// The zero value learns every limit and has the defaults written beside
// each field; a nil *RateLimitPolicy in a Policy means no limiter.
type RateLimitPolicy struct {
	// Limits configures the limits of limit groups, each key a model ID
	// or a group's name and applying to its group, LimitGroup(key):
	// "claude-sonnet-4-5" configures "claude-sonnet-4". Two keys of one
	// group are an error; at most 256 keys, each at most 256 bytes of UTF-8; the
	// Policy a Damper reports has the groups' names as keys. A zero field
	// is learned. A configured limit may be lower than the API's, to leave
	// room for other services: the headers then only lower the bucket's
	// level, never its limit.
	Limits map[string]RateLimits `key:"limits" max:"256" unit:"groups"`
	// MaxWait is the longest an attempt waits in line. Default 30 s; at
	// most 24 h; [None] never waits: an attempt that finds no room fails
	// at once with [ErrRateLimited].
	MaxWait time.Duration `key:"max_wait" default:"30s" none:"never waits" min:">0" max:"24h"`
	// Priority is the priority of calls whose context does not give one
	// (see [ContextWithPriority]). Default [Interactive].
	Priority Priority `key:"priority" enum:"interactive:Interactive,batch:Batch"`
	// BatchShare is the share of each bucket that batch calls may use; the
	// rest is kept for interactive calls. Default 0.8; above 0, at most 1;
	// 1 keeps nothing back.
	BatchShare float64 `key:"batch_share" default:"0.8" in:"(0,1]" unit:"a share"`
}

// RateLimits are the per-minute limits of one limit group (requests,
// input tokens, output tokens); zero means learned from the API's headers.
// Each is at most 1,000,000,000.
type RateLimits = fleet.RateLimits

// clonePolicy copies p with a map of limits of its own, for Damper.Policy.
func (p *RateLimitPolicy) clonePolicy() any {
	r := *p
	r.Limits = maps.Clone(r.Limits)
	return &r
}

// check is what the tags of RateLimitPolicy cannot say: each key of
// Limits names a group, once, and becomes the group's name.
func (p *RateLimitPolicy) check(RateLimitPolicy) error {
	limits := make(map[string]RateLimits, len(p.Limits))
	keyOf := make(map[string]string, len(p.Limits)) // the key that named each group
	for _, key := range slices.Sorted(maps.Keys(p.Limits)) {
		group := LimitGroup(key)
		switch {
		case key == "":
			return fieldError("Limits", conf.Text(`""`), "a limit group needs a name (see LimitGroup)")
		case !boundedName(key):
			return fieldError("Limits", conf.Text(quoteKey(key)), fmt.Sprintf("a key is a model ID or a limit group's name, at most %d bytes of UTF-8", maxModelID))
		case keyOf[group] != "":
			return fieldError(fmt.Sprintf("Limits[%q]", key), conf.Text(strconv.Quote(key)), fmt.Sprintf("names the limit group %q, as %q does: give each group its limits once", group, keyOf[group]))
		}
		keyOf[group] = key
		limits[group] = p.Limits[key]
	}
	p.Limits = limits
	return nil
}

// quoteKey quotes the start of a key too long or not UTF-8, for an error.
func quoteKey(key string) string {
	if len(key) <= 64 {
		return strconv.Quote(key)
	}
	return strconv.Quote(key[:64]) + "..."
}

// LimitGroup returns the rate-limit group of a model ID, which a key of
// [RateLimitPolicy.Limits] configures: the API limits a model family as a whole, so
// every dated, platform and minor version of one family and major version
// shares a group. "claude-sonnet-4-5-20250929" and "claude-sonnet-4-6" are
// "claude-sonnet-4"; "claude-3-5-haiku-20241022" is "claude-3-5-haiku". An
// ID of another shape is its own group, without its date, in lower case;
// but one whose group would be empty, longer than 128 bytes or hold bytes
// other than the letters, digits and . _ : @ / - of model IDs is in the
// group "(other)", so that a group's name is always short and printable.
func LimitGroup(model string) string {
	if len(model) > 2*maxGroupName {
		return otherGroup
	}
	fam := modelFamily(model)
	parts := strings.Split(fam, "-")
	// claude-<name>-<major>[-<minor>]: one group per name and major version.
	if len(parts) >= 3 && parts[0] == "claude" && !isNumber(parts[1]) && isNumber(parts[2]) {
		fam = strings.Join(parts[:3], "-")
	}
	if fam == "" || len(fam) > maxGroupName {
		return otherGroup
	}
	for i := 0; i < len(fam); i++ { // fam is in lower case
		if !isModelByte(fam[i]) {
			return otherGroup
		}
	}
	return fam
}

const (
	// otherGroup is the group of the model IDs LimitGroup does not give
	// a group of their own, and of the models whose group would be new
	// while the limiter holds maxLimitGroups.
	otherGroup   = "(other)"
	maxGroupName = 128

	// maxLimitGroups bounds the groups a limiter holds, besides the
	// configured ones and otherGroup: every model a client names may be
	// a group of its own.
	maxLimitGroups = 256
	// groupIdle is how long a group is kept after its last attempt:
	// longer than a bucket takes to refill, so that a group dropped is
	// one whose buckets are full and which no attempt holds.
	groupIdle = 10 * time.Minute
	// sweepEvery is how often the limiter looks for idle groups.
	sweepEvery = time.Minute
)

func isNumber(s string) bool {
	_, err := strconv.Atoi(s)
	return err == nil
}

// cacheAwareITPM reports whether the input-token limit of group leaves out
// the tokens read from the prompt cache: it does for every model family
// but the older ones named here.
func cacheAwareITPM(group string) bool {
	switch group {
	case "claude-3-haiku", "claude-3-5-haiku", "claude-3-opus", "claude-3-sonnet", "claude-3-5-sonnet":
		return false
	}
	return true
}

// RateLimitState is one bucket of the rate limiter, as [Damper.RateLimits]
// reads it: its group (see [LimitGroup]), its kind, its limit and what
// remains, whether the limit was learned, and the end of a pause.
type RateLimitState = fleet.RateLimitState

// RateLimits returns every bucket of the Damper's rate limiter, by group
// then bucket; nil without Policy.RateLimit.
func (d *Damper) RateLimits() []RateLimitState {
	if d.primary.limiter == nil {
		return nil
	}
	return d.primary.limiter.state(d.clock.Now())
}

// limiter is the rate limiter as the engine sees it: a gate before every
// attempt, whose pass settles the attempt's reservation and reads the
// response's headers.
type limiter struct {
	p     *RateLimitPolicy
	clock Clock
	store fleet.Store
	tel   *telemetry

	mu     sync.Mutex
	groups map[string]*limitGroup // by group name; requires mu

	// byModel remembers each model ID's group, up to maxResolved IDs of
	// at most maxModelID bytes; a dropped group's IDs are forgotten.
	byModel      sync.Map // string → *limitGroup
	byModelCount atomic.Int32

	nextSweep atomic.Int64 // when to look for idle groups, in Unix nanoseconds
}

// limitGroup is one group's buckets, and how long its attempts take.
type limitGroup struct {
	name       string
	g          fleet.LimitBuckets
	kept       bool       // g is not in memory: its store outlives the call
	tel        *telemetry // for its store's errors
	cacheAware bool
	took       attemptTimes

	// shares are its tenants' shares of its limits; limits are the
	// limits known to this process, as float64 bits: the configured ones
	// and those its responses teach (see learn).
	shares     fleet.LimitShares
	limits     [3]atomic.Uint64
	configured [3]bool

	// users counts the attempts between their admission (a wait in line
	// included) and their settling; -1 once the group is dropped, after
	// which no attempt may use it.
	users   atomic.Int64
	lastUse atomic.Int64 // the last admission or settling, in Unix nanoseconds
}

// acquire counts an attempt in, unless g was dropped.
func (g *limitGroup) acquire(now time.Time) bool {
	for {
		n := g.users.Load()
		if n < 0 {
			return false
		}
		if g.users.CompareAndSwap(n, n+1) {
			g.lastUse.Store(now.UnixNano())
			return true
		}
	}
}

// release counts an attempt out.
func (g *limitGroup) release(now time.Time) {
	g.lastUse.Store(now.UnixNano())
	g.users.Add(-1)
}

// atRest reports whether dropping g loses nothing but its learned limits:
// its store keeps its state, or its buckets are full and not paused.
func (g *limitGroup) atRest(now time.Time) bool {
	if g.kept {
		return true
	}
	st, _ := g.g.State(context.Background(), now)
	for _, b := range st {
		if !b.PausedUntil.IsZero() || b.Limit > 0 && b.Remaining < b.Limit {
			return false
		}
	}
	return true
}

// attemptTimes follows how long a group's answered attempts take (to the
// whole answer, or to a stream's first content) as TCP follows round trips:
// a smoothed mean and mean deviation. An attempt is not started from the
// line unless the mean plus four deviations still fits before the caller's
// deadline: one sent at the deadline's edge would be counted by the API
// and then cut off by the deadline.
type attemptTimes struct {
	mu        sync.Mutex
	mean, dev time.Duration
	n         int
}

func (a *attemptTimes) add(d time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.n == 0 {
		a.mean, a.dev = d, d/2
	} else {
		diff := d - a.mean
		a.mean += diff / 8
		a.dev += (max(diff, -diff) - a.dev) / 4
	}
	a.n++
}

// room is the time to leave an attempt before the caller's deadline: at
// least minAttempt.
func (a *attemptTimes) room() time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	return max(minAttempt, a.mean+4*a.dev)
}

func newLimiter(p *RateLimitPolicy, clock Clock, store fleet.Store) *limiter {
	return &limiter{p: p, clock: clock, store: store, groups: map[string]*limitGroup{}}
}

// group returns the group of model, made on first use: while the limiter
// holds maxLimitGroups groups (idle ones dropped first), a model of a new
// group that is not configured goes to otherGroup.
func (l *limiter) group(model string) *limitGroup {
	if g, ok := l.byModel.Load(model); ok && g.(*limitGroup).users.Load() >= 0 {
		return g.(*limitGroup)
	}
	name := LimitGroup(model)
	l.mu.Lock()
	g, ok := l.groups[name]
	if !ok {
		now := l.clock.Now()
		if _, configured := l.p.Limits[name]; !configured && name != otherGroup && l.unconfigured() >= maxLimitGroups {
			l.sweep(now)
			if l.unconfigured() >= maxLimitGroups {
				name = otherGroup
				g, ok = l.groups[name]
			}
		}
		if !ok {
			g = &limitGroup{name: name, cacheAware: cacheAwareITPM(name), g: l.buckets(name), tel: l.tel, shares: l.shares(name)}
			g.kept = !fleet.InMemory(g.g)
			lim := l.p.Limits[name]
			for k, v := range [3]int{lim.RequestsPerMinute, lim.InputTokensPerMinute, lim.OutputTokensPerMinute} {
				g.configured[k] = v > 0
				g.limits[k].Store(math.Float64bits(float64(v)))
			}
			g.lastUse.Store(now.UnixNano())
			l.groups[name] = g
		}
	}
	l.mu.Unlock()
	if len(model) <= maxModelID {
		if _, ok := l.byModel.Load(model); ok {
			l.byModel.Store(model, g) // in place of a dropped group
		} else if l.byModelCount.Load() < maxResolved {
			if _, loaded := l.byModel.LoadOrStore(model, g); !loaded {
				l.byModelCount.Add(1)
			}
		}
	}
	return g
}

// unconfigured counts the groups that maxLimitGroups bounds; it requires
// l.mu.
func (l *limiter) unconfigured() int {
	n := len(l.groups)
	for name := range l.p.Limits {
		if _, ok := l.groups[name]; ok {
			n--
		}
	}
	if _, ok := l.groups[otherGroup]; ok {
		n--
	}
	return n
}

// sweep drops the groups unused for groupIdle that no attempt holds and
// whose buckets are at rest: one that comes back is new, its configured
// limits full and its learned ones learned again from the next response.
// It requires l.mu.
func (l *limiter) sweep(now time.Time) {
	l.nextSweep.Store(now.Add(sweepEvery).UnixNano())
	idleSince := now.Add(-groupIdle).UnixNano()
	dropped := false
	for name, g := range l.groups {
		if g.lastUse.Load() > idleSince || g.users.Load() != 0 || !g.atRest(now) || !g.users.CompareAndSwap(0, -1) {
			continue
		}
		delete(l.groups, name)
		dropped = true
	}
	if dropped {
		l.byModel.Range(func(model, g any) bool {
			if g.(*limitGroup).users.Load() < 0 && l.byModel.CompareAndDelete(model, g) {
				l.byModelCount.Add(-1)
			}
			return true
		})
	}
}

// maybeSweep sweeps when it is time, unless another goroutine holds l.mu.
func (l *limiter) maybeSweep(now time.Time) {
	if now.UnixNano() >= l.nextSweep.Load() && l.mu.TryLock() {
		l.sweep(now)
		l.mu.Unlock()
	}
}

// buckets makes the buckets of group: the store's, or, when it keeps none
// or fails, the buckets in memory.
func (l *limiter) buckets(group string) fleet.LimitBuckets {
	settings := fleet.LimitSettings{Group: group, Limits: l.p.Limits[group], BatchShare: l.p.BatchShare}
	var b fleet.LimitBuckets
	if s, ok := l.store.(fleet.LimitStore); ok {
		var err error
		if b, err = s.LimitBuckets(settings); err != nil {
			l.tel.logStoreError(context.Background(), partLimiter, "buckets", err)
			b = nil
		}
	}
	if b == nil {
		b, _ = fleet.MemoryStore{}.LimitBuckets(settings)
	}
	return b
}

// callRate is what the limiter knows of one call, worked out at its first
// attempt.
type callRate struct {
	group    *limitGroup
	cost     fleet.RateAmounts
	priority Priority
}

// forCall returns the call's group, cost and priority.
func (l *limiter) forCall(c *call) *callRate {
	r := c.route
	if r.rate == nil {
		p := l.p.Priority
		if v, ok := c.ctx.Value(priorityKey{}).(Priority); ok {
			p = v
		}
		g := l.group(r.model)
		r.rate = &callRate{group: g, priority: p,
			cost: fleet.RateAmounts{1, float64(c.inputTokens), float64(c.maxTokens)}}
		c.report.limitGroup(g.name)
	}
	return r.rate
}

// latest is the latest time an attempt of c asked for at now may be sent:
// within MaxWait, and early enough before the caller's deadline for an
// attempt of its group to end (see attemptTimes).
func (l *limiter) latest(c *call, cr *callRate, now time.Time) time.Time {
	latest := now.Add(l.p.MaxWait)
	if deadline, ok := c.ctx.Deadline(); ok {
		if d := deadline.Add(-cr.group.took.room()); d.Before(latest) {
			latest = d
		}
	}
	return latest
}

// admitAttempt reserves the attempt's cost, waiting in line as the group
// says (a batch attempt asks again at its slot), and then for any pause of
// the group, begun before the reservation or during its wait; it gives the
// reservation back when it refuses, or the wait is cut short.
func (l *limiter) admitAttempt(c *call, a *attempt, now time.Time) admission {
	cr := l.forCall(c)
	l.maybeSweep(now)
	for !cr.group.acquire(now) { // dropped while the call was between attempts
		cr.group = l.group(c.route.model)
	}
	g := cr.group
	latest := now
	if !a.hedge {
		latest = l.latest(c, cr, now)
	}
	start := now
	// A tenant's share first: what it takes waits in the group's line
	// with it, and goes back with the reservation.
	share, adm, now := l.takeShare(c, cr, now, latest)
	if adm.refused != nil || adm.canceled {
		g.release(now)
		return adm
	}
	var ticket *fleet.RateTicket
	if cr.priority == Batch {
		ticket = new(fleet.RateTicket)
	}
	var r fleet.RateReservation = noReservation{}
	for {
		due := now
		var err error
		if !r.Taken() {
			r, due, err = g.g.Reserve(c.ctx, now, cr.cost, cr.priority, latest, ticket)
			c.storeError(partLimiter, "reserve", err)
		} else {
			// It took, then waited for its due time: a pause begun
			// meanwhile holds it too.
			due, err = g.g.PausedUntil(c.ctx, now)
			c.storeError(partLimiter, "paused_until", err)
		}
		if r.Taken() && !due.After(now) {
			return admission{pass: &limitPass{group: g, r: r, ticket: ticket, share: share, cost: cr.cost, sent: now, ctx: g.ctx(c.ctx)}, queued: now.Sub(start)}
		}
		if due.After(latest) {
			g.cancel(c, r, ticket, share, now)
			g.release(now)
			return admission{refused: rateDenial(now, due), queued: now.Sub(start)}
		}
		refused, canceled := waitUntil(c, l, due)
		now = l.clock.Now()
		if refused != nil || canceled {
			g.cancel(c, r, ticket, share, now)
			g.release(now)
			return admission{refused: refused, canceled: canceled, queued: now.Sub(start)}
		}
	}
}

// ctx is the context of g's operations that record what the call began:
// without the call's cancellation when g's store outlives it.
func (g *limitGroup) ctx(ctx context.Context) context.Context {
	if g.kept {
		return context.WithoutCancel(ctx)
	}
	return ctx
}

// cancel gives back all that r and share took, and t's place in the
// batch line: its attempt was never sent.
func (g *limitGroup) cancel(c *call, r fleet.RateReservation, t *fleet.RateTicket, share *shareHold, now time.Time) {
	if r.Taken() {
		c.storeError(partLimiter, "settle", g.g.Settle(g.ctx(c.ctx), now, r, fleet.RateAmounts{}, [3]bool{true, true, true}))
	}
	c.storeError(partShares, "settle", share.settle(g.ctx(c.ctx), now, fleet.RateAmounts{}, [3]bool{true, true, true}))
	c.storeError(partLimiter, "leave", g.leave(g.ctx(c.ctx), t, now))
}

// leave takes t out of the batch line, if it holds a place there.
func (g *limitGroup) leave(ctx context.Context, t *fleet.RateTicket, now time.Time) error {
	if t == nil || t.Slot.IsZero() {
		return nil
	}
	return g.g.Leave(ctx, now, t)
}

func (l *limiter) refusesAt(c *call, now, at time.Time) *denial {
	cr := l.forCall(c)
	due, err := cr.group.g.Admits(c.ctx, now, at, cr.cost, cr.priority)
	c.storeError(partLimiter, "admits", err)
	if latest := l.latest(c, cr, at); due.After(latest) {
		return rateDenial(now, due)
	}
	return nil
}

// rateDenial is the limiter's refusal at now of an attempt it could admit
// at due.
func rateDenial(now, due time.Time) *denial {
	return &denial{gate: gateRateLimit, retryAfter: due.Sub(now), detail: rateNote{admitAt: due}}
}

// rateNote is when the rate limiter could admit an attempt it refused, for
// the caller's *Error.
type rateNote struct{ admitAt time.Time }

func (n rateNote) fillError(e *Error)       { e.AdmitAt = n.admitAt }
func (rateNote) noteReport(*callReport)     {}
func (rateNote) noteAttempt(*AttemptReport) {}

// noReservation is a request that took nothing.
type noReservation struct{}

func (noReservation) Taken() bool { return false }

func (l *limiter) state(now time.Time) []RateLimitState {
	l.mu.Lock()
	names := slices.Sorted(maps.Keys(l.groups))
	groups := make([]*limitGroup, len(names))
	for i, n := range names {
		groups[i] = l.groups[n]
	}
	l.mu.Unlock()
	out := make([]RateLimitState, 0, len(groups)*ratelimit.NumKinds)
	for _, g := range groups {
		buckets, err := g.g.State(context.Background(), now)
		l.tel.logStoreError(context.Background(), partLimiter, "state", err)
		for _, b := range buckets {
			b.Group = g.name
			out = append(out, b)
		}
	}
	return out
}

// limitPass is one admitted attempt's reservation.
type limitPass struct {
	group  *limitGroup
	r      fleet.RateReservation
	ticket *fleet.RateTicket // a batch attempt's place in the batch line
	share  *shareHold        // what it took from its tenant's share, if any
	cost   fleet.RateAmounts // what it asked for
	sent   time.Time         // when the line let it go
	ctx    context.Context   // the call's, without its cancellation when the store outlives the call
	done   atomic.Bool       // settled: the group is no longer held
}

// release lets the group go, once, when the reservation is settled.
func (p *limitPass) release(now time.Time) {
	if p.done.CompareAndSwap(false, true) {
		p.group.release(now)
	}
}

// settle corrects the buckets from the response's headers, pauses them
// after a rate-limit 429, and settles the reservation: by the answer's
// usage; for a failure, with the output it reserved given back (the
// request and its input may have counted); for an attempt never sent,
// entirely. A stream still open settles at its end (settleEnd).
func (p *limitPass) settle(now time.Time, e attemptEvent) {
	if !e.outcome.Success && e.failure == nil {
		p.settleBy(now, fleet.RateAmounts{}, [3]bool{true, true, true})
		p.storeError("leave", p.group.leave(p.ctx, p.ticket, now))
		p.release(now)
		return
	}
	if o, ok := rateHeaders(e.header); ok {
		p.storeError("observe", p.group.g.Observe(p.ctx, now, p.r, o))
		p.group.learn(o)
	}
	if e.outcome.Success {
		p.group.took.add(now.Sub(p.sent))
	}
	switch {
	case e.failure != nil:
		if e.class == Retryable && e.outcome.Signal == CallerTraffic {
			p.pause(now, e.header)
		}
		p.settleBy(now, fleet.RateAmounts{}, [3]bool{ratelimit.OutputTokens: true})
	case e.streamOpen:
		return // settled at the stream's end
	default:
		p.settleUsage(now, e.usage)
	}
	p.release(now)
}

// settleEnd settles a stream's reservation at the stream's end.
func (p *limitPass) settleEnd(now time.Time, u usage) {
	p.settleUsage(now, u)
	p.release(now)
}

// settleUsage settles the reservation by u; without usage the reservation
// stands as taken.
func (p *limitPass) settleUsage(now time.Time, u usage) {
	if !u.known {
		p.settleBy(now, fleet.RateAmounts{}, [3]bool{})
		return
	}
	in := u.input + u.cacheCreation
	if !p.group.cacheAware {
		in += u.cacheRead
	}
	p.settleBy(now, fleet.RateAmounts{1, float64(in), float64(u.output)}, [3]bool{true, true, true})
}

func (p *limitPass) settleBy(now time.Time, used fleet.RateAmounts, known [3]bool) {
	p.storeError("settle", p.group.g.Settle(p.ctx, now, p.r, used, known))
	if err := p.share.settle(p.ctx, now, used, known); err != nil {
		p.group.tel.logStoreError(p.ctx, partShares, "settle", err)
	}
}

func (p *limitPass) storeError(op string, err error) {
	if err != nil {
		p.group.tel.logStoreError(p.ctx, partLimiter, op, err)
	}
}

// pause empties the buckets a rate-limit 429 names (those whose remaining
// count is below what the attempt asked, or all three when the response
// names none) until its retry-after, or else each bucket's reset time.
func (p *limitPass) pause(now time.Time, h http.Header) {
	delay, hasDelay := parseRetryAfter(h, now)
	var named [ratelimit.NumKinds]bool
	any := false
	for k, keys := range rateHeaderKeys {
		if v, ok := headerFloat(h, keys.remaining); ok && v < max(p.cost[k], 1) {
			named[k], any = true, true
		}
	}
	for k := range named {
		if any && !named[k] {
			continue
		}
		until := now
		if hasDelay {
			until = now.Add(delay)
		} else if reset, err := time.Parse(time.RFC3339, h.Get(rateHeaderKeys[k].reset)); err == nil {
			until = reset
		}
		var one [ratelimit.NumKinds]bool
		one[k] = true
		p.storeError("pause", p.group.g.Pause(p.ctx, now, one, until))
	}
}

// rateHeaderKeys are the canonical names of each bucket's headers.
var rateHeaderKeys = [ratelimit.NumKinds]struct{ limit, remaining, reset string }{
	{"Anthropic-Ratelimit-Requests-Limit", "Anthropic-Ratelimit-Requests-Remaining", "Anthropic-Ratelimit-Requests-Reset"},
	{"Anthropic-Ratelimit-Input-Tokens-Limit", "Anthropic-Ratelimit-Input-Tokens-Remaining", "Anthropic-Ratelimit-Input-Tokens-Reset"},
	{"Anthropic-Ratelimit-Output-Tokens-Limit", "Anthropic-Ratelimit-Output-Tokens-Remaining", "Anthropic-Ratelimit-Output-Tokens-Reset"},
}

// rateHeaders reads the anthropic-ratelimit-* headers of a response: a
// bucket counts when both its limit and its remaining count parse.
func rateHeaders(h http.Header) (o fleet.RateObservation, ok bool) {
	if h == nil {
		return o, false
	}
	for k, keys := range rateHeaderKeys {
		limit, okL := headerFloat(h, keys.limit)
		rem, okR := headerFloat(h, keys.remaining)
		if okL && okR && limit > 0 {
			o.Has[k], o.Limit[k], o.Remaining[k] = true, limit, max(rem, 0)
			ok = true
		}
	}
	return o, ok
}

func headerFloat(h http.Header, key string) (float64, bool) {
	vs := h[key]
	if len(vs) == 0 {
		return 0, false
	}
	v := strings.TrimSpace(vs[0])
	// The API sends whole numbers: read them without ParseFloat.
	if n := len(v); n > 0 && n <= 15 {
		var x int64
		for i := 0; i < n; i++ {
			c := v[i]
			if c < '0' || c > '9' {
				x = -1
				break
			}
			x = x*10 + int64(c-'0')
		}
		if x >= 0 {
			return float64(x), true
		}
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, false
	}
	return f, true
}

// usage is an answer's token usage.
type usage struct {
	input, cacheCreation, cacheRead, output int64
	known                                   bool
}

// answerUsage reads the usage of a plain answer.
func answerUsage(body []byte) usage {
	u := gjson.GetBytes(body, "usage")
	if !u.IsObject() {
		return usage{}
	}
	return usage{
		input:         u.Get("input_tokens").Int(),
		cacheCreation: u.Get("cache_creation_input_tokens").Int(),
		cacheRead:     u.Get("cache_read_input_tokens").Int(),
		output:        u.Get("output_tokens").Int(),
		known:         true,
	}
}
