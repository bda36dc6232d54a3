// Package ratelimit is the rate limiter's gate: its Policy, over one [fleet.LimitBuckets] per
// limit group from the backend's store. It admits every attempt, waiting
// in line, and is asked before a retry whether it would have room at the
// wait's end. Each call's wait is recorded in damper.ratelimit.wait, and
// the primary backend's buckets in two gauges.
package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/conf"
	"github.com/damper-ai/damper-go/internal/core"
	"github.com/damper-ai/damper-go/internal/ratelimit"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
)

// OutcomeRateLimited: the rate limiter could not admit the attempt in time.
const OutcomeRateLimited core.Outcome = "rate_limited"

// ErrRateLimited: the rate limiter could not admit the attempt within
// Policy.MaxWait and the caller's deadline, so nothing was
// sent. [Error.AdmitAt] holds when it could have been admitted, and
// [Error.RetryAfter] the time until then.
var ErrRateLimited = errors.New("damper: rate limited")

// Gate's refusal reaches a proxy's client as the API's own rate limit
// (429 rate_limit_error). It moves a call on to a backend with limits of
// its own.
var Gate = &core.Gate{
	Outcome: OutcomeRateLimited, Reason: ErrRateLimited,
	Status: http.StatusTooManyRequests, APIType: "rate_limit_error", Moves: true,
	Instruments: instruments, RecordCall: recordWait,
	CallSpan: callSpan, AttemptSpan: attemptSpan,
}

func init() { conf.Register((*Policy).check) }

// The limiter's span attributes: a call's group and its wait in line, an
// attempt's wait, and, on a learned limit's log line, its bucket.
const (
	keyRateGroup   = attribute.Key("damper.ratelimit.group")
	keyRateWait    = attribute.Key("damper.ratelimit.wait_s")
	keyRateBucket  = attribute.Key("damper.ratelimit.bucket")
	keyRateLearned = attribute.Key("damper.ratelimit.learned")
	keyProvider    = attribute.Key("damper.provider")
)

// callSpan says a call's limit group and its wait in the group's line.
func callSpan(rep core.Report, attrs []attribute.KeyValue) []attribute.KeyValue {
	if rep.LimitGroup != "" {
		attrs = append(attrs, keyRateGroup.String(core.BoundedText(rep.LimitGroup)), keyRateWait.Float64(rep.RateLimitWait.Seconds()))
	}
	return attrs
}

// attemptSpan says an attempt's wait in line.
func attemptSpan(ar core.AttemptReport, span trace.Span) {
	if ar.RateLimitWait > 0 {
		span.SetAttributes(keyRateWait.Float64(ar.RateLimitWait.Seconds()))
	}
}

// partLimiter is the limiter's part of a store.
var partLimiter = core.NewStorePart("limiter", "damper: rate limiter store error")

// Part makes backend b's limiter, or none without p.
func Part(p *Policy, b *core.Backend, env *core.Env) (core.Hooks, error) {
	if p == nil {
		return core.Hooks{}, nil
	}
	l := newLimiter(p, env.Clock, b.Store)
	l.env = env
	return core.Hooks{Attempt: l}, nil
}

// Of is the rate limiter among a backend's parts, or nil.
func Of(parts []core.Hooks) *Limiter {
	for _, h := range parts {
		if l, ok := h.Attempt.(*Limiter); ok {
			return l
		}
	}
	return nil
}

// The limiter's metrics.
const (
	metricRateWait      = "damper.ratelimit.wait"
	metricRateLimit     = "damper.ratelimit.limit"
	metricRateRemaining = "damper.ratelimit.remaining"
)

// instruments makes the histogram of the calls' waits in line and,
// when the primary backend (parts[0]) has a limiter, the gauges of its
// buckets.
func instruments(meter metric.Meter, env *core.Env, parts []core.Hooks, keep func(metric.Registration)) any {
	var none noop.Meter
	wait := core.Instrument(meter.Float64Histogram(metricRateWait, metric.WithUnit("s"),
		metric.WithDescription("Time a Messages request waited in the rate limiter's line, by limit group."),
		metric.WithExplicitBucketBoundaries(0, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60)))(none.Float64Histogram(metricRateWait))
	if l, ok := parts[0].Attempt.(*Limiter); ok {
		gauges(meter, env, l, keep)
	}
	return wait
}

// recordWait records a call's wait in its group's line.
func recordWait(ctx context.Context, env *core.Env, inst any, rep core.Report) {
	wait := inst.(metric.Float64Histogram)
	if rep.LimitGroup != "" && wait.Enabled(ctx) {
		wait.Record(ctx, rep.RateLimitWait.Seconds(), env.Attrs(keyProvider.String(rep.Provider), keyRateGroup.String(env.GroupLabel(rep.LimitGroup))))
	}
}

// gauges registers the gauges of the rate limiter's buckets: each one's
// limit and what remains, by group and bucket. The callback holds the
// limiter, the clock and the telemetry, never the Damper.
func gauges(meter metric.Meter, env *core.Env, lim *Limiter, keep func(metric.Registration)) {
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
	clock, services := env.Clock, env.Services
	name, named := services.Name()
	reg, err := meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for _, s := range lim.State(clock.Now()) {
			group := services.GroupLabel(s.Group)
			if s.Limit == 0 || group == core.OtherLabel {
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
	keep(reg)
}

// Policy configures the rate limiter: it keeps every goroutine of
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
// each field; a nil *Policy in a Policy means no limiter.
type Policy struct {
	// Limits configures the limits of limit groups, each key a model ID
	// or a group's name and applying to its group, the model's family
	// and major version: "claude-sonnet-4-5" configures "claude-sonnet-4". Two keys of one
	// group are an error; at most 256 keys, each at most 256 bytes of UTF-8; the
	// Policy a Damper reports has the groups' names as keys. A zero field
	// is learned. A configured limit may be lower than the API's, to leave
	// room for other services: the headers then only lower the bucket's
	// level, never its limit.
	Limits map[string]fleet.RateLimits `key:"limits" max:"256" unit:"groups"`
	// MaxWait is the longest an attempt waits in line. Default 30 s; at
	// most 24 h; [None] never waits: an attempt that finds no room fails
	// at once with [ErrRateLimited].
	MaxWait time.Duration `key:"max_wait" default:"30s" none:"never waits" min:">0" max:"24h"`
	// Priority is the priority of calls whose context does not give one
	// (see [ContextWithPriority]). Default [Interactive].
	Priority fleet.Priority `key:"priority" enum:"interactive:Interactive,batch:Batch"`
	// BatchShare is the share of each bucket that batch calls may use; the
	// rest is kept for interactive calls. Default 0.8; above 0, at most 1;
	// 1 keeps nothing back.
	BatchShare float64 `key:"batch_share" default:"0.8" in:"(0,1]" unit:"a share"`
}

// Clone copies p with a map of limits of its own, for Damper.Policy.
func Clone(p *Policy) *Policy {
	r := *p
	r.Limits = maps.Clone(r.Limits)
	return &r
}

// check is what the tags of Policy cannot say: each key of
// Limits names a group, once, and becomes the group's name.
func (p *Policy) check(Policy) error {
	limits := make(map[string]fleet.RateLimits, len(p.Limits))
	keyOf := make(map[string]string, len(p.Limits)) // the key that named each group
	for _, key := range slices.Sorted(maps.Keys(p.Limits)) {
		group := LimitGroup(key)
		switch {
		case key == "":
			return &conf.FieldError{Field: "Limits", Value: conf.Text(`""`), Why: "a limit group needs a name (see LimitGroup)"}
		case !core.BoundedName(key):
			return &conf.FieldError{Field: "Limits", Value: conf.Text(quoteKey(key)), Why: fmt.Sprintf("a key is a model ID or a limit group's name, at most %d bytes of UTF-8", core.MaxModelID)}
		case keyOf[group] != "":
			return &conf.FieldError{Field: fmt.Sprintf("Limits[%q]", key), Value: conf.Text(strconv.Quote(key)), Why: fmt.Sprintf("names the limit group %q, as %q does: give each group its limits once", group, keyOf[group])}
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
// [Policy.Limits] configures: the API limits a model family as a whole, so
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
	fam := core.ModelFamily(model)
	parts := strings.Split(fam, "-")
	// claude-<name>-<major>[-<minor>]: one group per name and major version.
	if len(parts) >= 3 && parts[0] == "claude" && !isNumber(parts[1]) && isNumber(parts[2]) {
		fam = strings.Join(parts[:3], "-")
	}
	if fam == "" || len(fam) > maxGroupName {
		return otherGroup
	}
	for i := 0; i < len(fam); i++ { // fam is in lower case
		if !core.IsModelByte(fam[i]) {
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

// Limiter is the rate limiter as the engine sees it: a gate before every
// attempt, whose pass settles the attempt's reservation and reads the
// response's headers.
type Limiter struct {
	p     *Policy
	clock core.Clock
	store fleet.Store
	env   *core.Env

	mu     sync.Mutex
	groups map[string]*limitGroup // by group name; requires mu

	// byModel remembers each model ID's group, up to maxResolved IDs of
	// at most core.MaxModelID bytes; a dropped group's IDs are forgotten.
	byModel      sync.Map // string → *limitGroup
	byModelCount atomic.Int32

	nextSweep atomic.Int64 // when to look for idle groups, in Unix nanoseconds
}

func newLimiter(p *Policy, clock core.Clock, store fleet.Store) *Limiter {
	return &Limiter{p: p, clock: clock, store: store, groups: map[string]*limitGroup{}}
}

// callRate is what the limiter knows of one call, worked out at its first
// attempt.
type callRate struct {
	group    *limitGroup
	cost     fleet.RateAmounts
	priority fleet.Priority
}

// forCall returns the call's group, cost and priority.
func (l *Limiter) forCall(c core.Call) *callRate {
	st := c.RouteState()
	if cr, ok := (*st).(*callRate); ok {
		return cr
	}
	p := l.p.Priority
	if v, ok := core.PriorityOf(c.Context()); ok {
		p = v
	}
	g := l.group(c.Model())
	cr := &callRate{group: g, priority: p,
		cost: fleet.RateAmounts{1, float64(c.InputTokens()), float64(c.MaxTokens())}}
	*st = cr
	c.Note(g)
	return cr
}

// latest is the latest time an attempt of c asked for at now may be sent:
// within MaxWait, and early enough before the caller's deadline for an
// attempt of its group to end (see attemptTimes).
func (l *Limiter) latest(c core.Call, cr *callRate, now time.Time) time.Time {
	latest := now.Add(l.p.MaxWait)
	if deadline, ok := c.Context().Deadline(); ok {
		if d := deadline.Add(-cr.group.took.room()); d.Before(latest) {
			latest = d
		}
	}
	return latest
}

// AdmitAttempt reserves the attempt's cost, waiting in line as the group
// says (a batch attempt asks again at its slot), and then for any pause of
// the group, begun before the reservation or during its wait; it gives the
// reservation back when it refuses, or the wait is cut short.
func (l *Limiter) AdmitAttempt(c core.Call, a core.Attempt, now time.Time) core.Admission {
	cr := l.forCall(c)
	l.maybeSweep(now)
	for !cr.group.acquire(now) { // dropped while the call was between attempts
		cr.group = l.group(c.Model())
	}
	g := cr.group
	latest := now
	if !a.Hedge {
		latest = l.latest(c, cr, now)
	}
	start := now
	// A tenant's share first: what it takes waits in the group's line
	// with it, and goes back with the reservation.
	share, adm, now := l.takeShare(c, cr, now, latest)
	if adm.Refused != nil || adm.Canceled {
		g.release(now)
		return adm
	}
	var ticket *fleet.RateTicket
	if cr.priority == fleet.Batch {
		ticket = new(fleet.RateTicket)
	}
	var r fleet.RateReservation = noReservation{}
	for {
		due := now
		var err error
		if !r.Taken() {
			r, due, err = g.g.Reserve(c.Context(), now, cr.cost, cr.priority, latest, ticket)
			c.StoreError(partLimiter, "reserve", err)
		} else {
			// It took, then waited for its due time: a pause begun
			// meanwhile holds it too.
			due, err = g.g.PausedUntil(c.Context(), now)
			c.StoreError(partLimiter, "paused_until", err)
		}
		if r.Taken() && !due.After(now) {
			return core.Admission{Pass: &limitPass{group: g, r: r, ticket: ticket, share: share, cost: cr.cost, sent: now, ctx: g.ctx(c.Context())}, Queued: now.Sub(start)}
		}
		if due.After(latest) {
			g.cancel(c, r, ticket, share, now)
			g.release(now)
			return core.Admission{Refused: rateDenial(now, due), Queued: now.Sub(start)}
		}
		refused, canceled := c.Wait(l, due)
		now = l.clock.Now()
		if refused != nil || canceled {
			g.cancel(c, r, ticket, share, now)
			g.release(now)
			return core.Admission{Refused: refused, Canceled: canceled, Queued: now.Sub(start)}
		}
	}
}

func (l *Limiter) RefusesAt(c core.Call, now, at time.Time) *core.Denial {
	cr := l.forCall(c)
	due, err := cr.group.g.Admits(c.Context(), now, at, cr.cost, cr.priority)
	c.StoreError(partLimiter, "admits", err)
	if latest := l.latest(c, cr, at); due.After(latest) {
		return rateDenial(now, due)
	}
	return nil
}

// rateDenial is the limiter's refusal at now of an attempt it could admit
// at due.
func rateDenial(now, due time.Time) *core.Denial {
	return &core.Denial{Gate: Gate, RetryAfter: due.Sub(now), Detail: rateNote{admitAt: due}}
}

// rateNote is when the rate limiter could admit an attempt it refused, for
// the caller's *Error.
type rateNote struct{ admitAt time.Time }

func (n rateNote) FillError(e *core.Error)                            { e.AdmitAt = n.admitAt }
func (rateNote) NoteReport(*core.Report)                              {}
func (rateNote) NoteAttempt(ar core.AttemptReport) core.AttemptReport { return ar }

// A group notes itself as the call's group in the call's report.
func (g *limitGroup) FillError(*core.Error)                                {}
func (g *limitGroup) NoteReport(r *core.Report)                            { r.LimitGroup = g.name }
func (g *limitGroup) NoteAttempt(ar core.AttemptReport) core.AttemptReport { return ar }

// noReservation is a request that took nothing.
type noReservation struct{}

func (noReservation) Taken() bool { return false }

// State is every bucket of the limiter, by group then bucket.
func (l *Limiter) State(now time.Time) []fleet.RateLimitState {
	l.mu.Lock()
	names := slices.Sorted(maps.Keys(l.groups))
	groups := make([]*limitGroup, len(names))
	for i, n := range names {
		groups[i] = l.groups[n]
	}
	l.mu.Unlock()
	out := make([]fleet.RateLimitState, 0, len(groups)*ratelimit.NumKinds)
	for _, g := range groups {
		buckets, err := g.g.State(context.Background(), now)
		l.env.LogStoreError(context.Background(), partLimiter, "state", err)
		for _, b := range buckets {
			b.Group = g.name
			out = append(out, b)
		}
	}
	return out
}
