// Package concurrency is the concurrency limit's gate: its Policy, a
// limit on the attempts in flight on each backend, fixed or following the
// provider's latency. Before every attempt it takes a slot, waiting in
// line for one; the attempt gives it back at its end, a stream at the
// stream's end. Its state is the process's own (see Policy).
package concurrency

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/conf"
	"github.com/damper-ai/damper-go/internal/core"
)

// The concurrency limit's gate: Policy.Concurrency, a limit on the
// attempts in flight on each backend, fixed or following the provider's
// latency. Before every attempt it takes a slot, waiting in line for one;
// the attempt gives it back at its end, a stream at the stream's end. Its
// state is the process's own (see Policy).

// OutcomeConcurrencyLimited: no slot of the concurrency limit came in time.
const OutcomeConcurrencyLimited core.Outcome = "concurrency_limited"

// ErrConcurrencyLimited: the concurrency limit had no slot for the attempt
// within Policy.MaxWait and the caller's deadline, so nothing
// was sent.
var ErrConcurrencyLimited = errors.New("damper: concurrency limited")

// Gate's refusal reaches a proxy's client as the API's own
// "overloaded" (529 overloaded_error): the backend has no room now. It
// moves a call on to a backend with room of its own.
var Gate = &core.Gate{
	Outcome: OutcomeConcurrencyLimited, Reason: ErrConcurrencyLimited,
	Status: 529, APIType: "overloaded_error", Moves: true,
	Instruments: instruments,
}

func init() { conf.Register((*Policy).check) }

// Policy configures the concurrency limit: at most a limit of
// attempts in flight on each backend, fixed (Max) or adaptive (Adaptive).
//
// A provider near saturation slows down before it fails: its latency
// climbs as requests queue, and only later come 529s and timeouts. The
// adaptive limit acts on the latency. It times the attempts of a cohort,
// the first 20 sent after its last change (once attempts fill a limit
// that grew, or 20 are sent that raise the attempts in flight no higher:
// the demand is then below it; one begun below the limit begins again
// when a surge fills it), at the provider: from the request
// written to a plain answer's first byte (the provider sends it once the
// answer is whole), or to a stream's first content (a stream's length
// says more of its output than of the provider's load). The wait for a
// connection, the reading of the body and the process's own scheduling
// are left out: they grow with the load of the process and its machine,
// and a limit that took them for the provider's would shrink for
// nothing.
// Once all 20 have ended, it compares their typical time (the geometric
// mean, which one slow answer moves little) with the best of that kind:
// a level in the low quarter of past cohorts' times, which a cohort sent
// while the limit was full does not raise. What it allows is the best ×
// Tolerance, or the best + Slack when that is more. Within it, the limit
// grows, by up to half at a time and less as the latency nears it, if an
// attempt found it full: a limit above the demand stays where it is, and
// its cohorts go on; beyond it, the limit shrinks in proportion
// (limit × allowed / typical, at most halved at a time), to where the
// latency would be back within it. A 529 or an attempt timeout in a
// cohort cuts it by 10 %. The best is learned on the way up,
// so start the limit below the provider's capacity; at Min and still too
// slow, the limit takes the provider for slower for good and relearns it.
// Against a provider that serves 100 attempts at once, 1 s each, the
// limit goes from 20 to between 100 and 150 within 300 attempts.
//
// An attempt that finds no slot waits in line, within its priority, for
// at most MaxWait and not past the caller's deadline, then fails with
// [ErrConcurrencyLimited]. A slot given back goes to the tenant (of a
// [Proxy] in key mode) that holds the fewest slots per unit of its
// [Tenant].Weight among those waiting, first come, first served within a
// tenant; calls without a tenant wait as one tenant of weight 1, so
// without tenants the line is first come, first served. Under contention
// each tenant with calls waiting thus holds at least its weight's share of
// the slots held by the tenants active, and a free slot is never left to
// an idle tenant. Batch calls use at most BatchShare of the limit, and
// wait behind interactive calls that wait. A hedge never waits: it is
// sent only when a slot is free at once.
// A slot is held from the attempt's admission to its end: a stream holds
// it until the stream ends (its caller reads it whole, closes it, or its
// context ends), since the provider works on the stream until then.
//
// The limit is each process's own, on each backend: a fleet is not
// limited as a whole, since a limit shared through a store would need a
// lease on every slot, to come back from a process that dies holding it,
// and two store round trips on every attempt. The adaptive limit needs no
// sharing: every process sees the same provider latency, so their limits
// together settle where the provider's latency is within Tolerance. A
// fixed Max is per process: a fleet of n holds up to n × Max.
//
// The zero value is a fixed limit that needs Max; a nil
// *Policy in a Policy means no limit.
type Policy struct {
	// Max is the most attempts in flight on one backend: the fixed limit
	// or, with Adaptive, the most the limit may grow to (zero: 1,000).
	// At most 100,000.
	Max int `key:"max" min:"0" max:"100000" zero:"1000 with adaptive, else an error"`
	// Adaptive makes the limit follow the provider's latency, from
	// Initial, between Min and Max.
	Adaptive bool `key:"adaptive"`
	// Initial is where the adaptive limit starts: below the provider's
	// capacity, as the best latency is learned while the limit grows.
	// Zero: 20, or Max when lower. At most Max.
	Initial int `key:"initial" min:"0" max:"100000" zero:"20, or Max when lower"`
	// Min is the least the adaptive limit shrinks to. Default 1; at most
	// Initial.
	Min int `key:"min" default:"1" min:"1" max:"100000"`
	// Tolerance is how much slower than their best the adaptive limit lets
	// attempts become: 1.5 lets a provider's latency climb by half before
	// the limit shrinks. Default 1.5, which holds against the heavy tail
	// of a model's answer times; a provider whose times spread little
	// allows less. Above 1, at most 10.
	Tolerance float64 `key:"tolerance" default:"1.5" in:"(1,10]"`
	// Slack is a slowdown, in time, that the adaptive limit lets attempts
	// have however quick their best: it shrinks only when their typical
	// time is beyond both best × Tolerance and best + Slack. Against a
	// provider that answers in a millisecond, jitter of a few milliseconds
	// (the network's, a busy machine's) is a ratio of several, not a
	// slowdown of the provider's. Default 50 ms, well below a model's
	// answer times; [None]: no slack. At most 1 minute.
	Slack time.Duration `key:"slack" default:"50ms" none:"means 0" min:"0" max:"1m"`
	// MaxWait is the longest an attempt waits for a slot. Default 1 s: a
	// slot frees when any attempt ends, so a longer wait only moves the
	// provider's queue into the caller. At most 24 h; [None] never waits.
	MaxWait time.Duration `key:"max_wait" default:"1s" none:"never waits" min:">0" max:"24h"`
	// Priority is the priority of calls whose context does not give one
	// (see ContextWithPriority). Default Interactive.
	Priority fleet.Priority `key:"priority" enum:"interactive:Interactive,batch:Batch"`
	// BatchShare is the share of the limit that batch calls may hold; the
	// rest is kept for interactive calls. Default 0.8; above 0, at most 1.
	BatchShare float64 `key:"batch_share" default:"0.8" in:"(0,1]" unit:"a share"`
}

// The adaptive limit's constants.
const (
	concWindow      = 20   // samples behind each change of the limit
	concKindSamples = 5    // a kind's fewest answers in a cohort for it to move the kind's best
	concGrowth      = 1.5  // the most the limit grows at a time
	concCut         = 0.5  // the most it shrinks at a time, on latency
	concOverloadCut = 0.9  // its cut on a 529 or an attempt timeout
	concDefaultMax  = 1000 // Max with Adaptive, when not given
	concInitial     = 20
)

// check is what the tags of Policy cannot say: Max is needed
// for a fixed limit, and Min ≤ Initial ≤ Max.
func (p *Policy) check(Policy) error {
	if p.Max == 0 {
		if !p.Adaptive {
			return &conf.FieldError{Field: "Max", Value: 0, Why: "a fixed limit needs a maximum; or make the limit adaptive"}
		}
		p.Max = concDefaultMax
	}
	if !p.Adaptive {
		return nil
	}
	if p.Initial == 0 {
		p.Initial = min(concInitial, p.Max)
	}
	if p.Initial > p.Max {
		return &conf.FieldError{Field: "Initial", Value: p.Initial, Why: fmt.Sprintf("must not exceed Max (%d)", p.Max)}
	}
	if p.Min > p.Initial {
		return &conf.FieldError{Field: "Min", Value: p.Min, Why: fmt.Sprintf("must not exceed Initial (%d)", p.Initial)}
	}
	return nil
}

// Part makes backend b's concurrency limit, or none without p.
func Part(p *Policy, b *core.Backend, env *core.Env) (core.Hooks, error) {
	if p == nil {
		return core.Hooks{}, nil
	}
	return core.Hooks{Attempt: newLimit(p, env.Clock, b.Name)}, nil
}

// Of is the concurrency limit among a backend's parts, or nil.
func Of(parts []core.Hooks) *Limit {
	for _, h := range parts {
		if l, ok := h.Attempt.(*Limit); ok {
			return l
		}
	}
	return nil
}

// Limit is one backend's concurrency limit: its slots, its line and,
// when adaptive, its latency windows.
type Limit struct {
	p       *Policy
	clock   core.Clock
	backend string

	mu     sync.Mutex
	limit  float64
	held   [2]int               // slots held, by priority
	line   [2]slotLine          // attempts waiting for a slot, by priority
	heldBy map[*core.Tenant]int // slots held, by tenant (nil: calls without one); none at zero
	seq    uint64               // numbers the waiters in order of arrival
	// The adaptive limit's samples come from a cohort: the first
	// concWindow attempts sent once the limit last changed and, when it
	// grew, filled up or met a demand below it. Waiting for all of them
	// to end, not for the first concWindow ends, keeps the quick ones
	// from standing for all.
	epoch    uint64            // bumped when a cohort starts
	filling  bool              // the limit has grown, and attempts have not filled it yet
	peak     int               // the most held while filling
	unfilled int               // attempts sent while filling that held no more than peak
	cohort   int               // the attempts of this epoch's cohort sent so far
	below    bool              // the cohort began with the limit not full
	short    bool              // an attempt found no free slot since the cohort began
	win      concWindowSamples // the window under way
	kinds    [2]latencyBest    // the best of plain answers and of streams
}

const (
	kindPlain  = 0
	kindStream = 1
)

func newLimit(p *Policy, clock core.Clock, backend string) *Limit {
	l := &Limit{p: p, clock: clock, backend: backend, limit: float64(p.Max)}
	if p.Adaptive {
		l.limit = float64(p.Initial)
	}
	return l
}

// slots is the limit in whole slots.
func (l *Limit) slots() int { return max(1, int(l.limit)) }

// free reports whether an attempt of priority p may take a slot now,
// ahead of none that waits before it. The caller holds l.mu.
func (l *Limit) free(p fleet.Priority) bool {
	if l.line[fleet.Interactive].n > 0 || (p == fleet.Batch && l.line[fleet.Batch].n > 0) {
		return false
	}
	return l.room(p)
}

// room reports whether the limit has a slot for priority p, whoever waits.
// The caller holds l.mu.
func (l *Limit) room(p fleet.Priority) bool {
	if l.held[fleet.Interactive]+l.held[fleet.Batch] >= l.slots() {
		return false
	}
	return p == fleet.Interactive || l.held[fleet.Batch] < max(1, int(l.p.BatchShare*float64(l.slots())))
}

// take takes a slot for priority p. The caller holds l.mu.
func (l *Limit) take(p fleet.Priority) {
	l.held[p]++
	if !l.filling {
		// A cohort begun under a demand below the limit, with answers in
		// already, is begun again once the demand first fills the limit:
		// those answers came from a provider emptier than a surge leaves
		// it.
		if l.below && l.held[fleet.Interactive]+l.held[fleet.Batch] >= l.slots() {
			if l.below = false; l.win.ended > 0 {
				l.newCohort()
			}
		}
		return
	}
	// A limit that grew waits for attempts to fill it, or for concWindow
	// attempts sent that take the attempts in flight no higher than they
	// have been since: the demand has then levelled out below the limit,
	// and the provider sees what it will see. Waiting for the limit alone
	// would take no more samples, and the limit would follow no later
	// slowdown.
	switch n := l.held[fleet.Interactive] + l.held[fleet.Batch]; {
	case n >= l.slots():
		l.newCohort()
	case n > l.peak:
		l.peak = n
	default:
		if l.unfilled++; l.unfilled >= concWindow {
			l.newCohort()
		}
	}
}

// grant takes slots for the attempts waiting in line while there is
// room: each to the tenant with the fewest slots per unit of weight
// (slotLine.pop). The caller holds l.mu.
func (l *Limit) grant() {
	for _, p := range [...]fleet.Priority{fleet.Interactive, fleet.Batch} {
		// Batch calls wait behind every interactive one.
		for l.line[p].n > 0 && l.room(p) && (p == fleet.Interactive || l.line[fleet.Interactive].n == 0) {
			w := l.line[p].pop(l.heldOf)
			l.takeFor(p, w.tenant)
			w.granted = true
			w.cancel()
		}
	}
}

// heldOf is the slots t holds. The caller holds l.mu.
func (l *Limit) heldOf(t *core.Tenant) int { return l.heldBy[t] }

// takeFor takes a slot of priority p for a call of tenant t. The caller
// holds l.mu.
func (l *Limit) takeFor(p fleet.Priority, t *core.Tenant) {
	if l.heldBy == nil {
		l.heldBy = make(map[*core.Tenant]int)
	}
	l.heldBy[t]++
	l.take(p)
}

// priorityOf is the priority of c's attempts.
func (l *Limit) priorityOf(c core.Call) fleet.Priority {
	if v, ok := core.PriorityOf(c.Context()); ok && v <= fleet.Batch {
		return v
	}
	return l.p.Priority
}

// AdmitAttempt takes a slot for a, waiting in line for one until MaxWait
// or the caller's deadline; a hedge takes one only if it is free at once.
func (l *Limit) AdmitAttempt(c core.Call, a core.Attempt, now time.Time) core.Admission {
	p, t := l.priorityOf(c), c.Tenant()
	l.mu.Lock()
	if l.free(p) {
		l.takeFor(p, t)
		pass := l.newPass(p, t, now, 0)
		l.mu.Unlock()
		return core.Admission{Pass: pass}
	}
	l.short = true
	l.mu.Unlock()
	latest, atDeadline := now.Add(l.p.MaxWait), false
	if deadline, ok := c.Context().Deadline(); ok && deadline.Before(latest) {
		latest, atDeadline = deadline, true
	}
	if a.Hedge || !latest.After(now) {
		return core.Admission{Refused: &core.Denial{Gate: Gate}}
	}
	if refused := c.LaterRefusal(l, now, latest); refused != nil {
		return core.Admission{Refused: refused}
	}
	w := &slotWaiter{tenant: t}
	ctx, cancel := context.WithCancel(c.Context())
	w.cancel = cancel
	l.mu.Lock()
	freed := l.free(p) // a slot came back since
	if freed {
		l.takeFor(p, t)
		w.granted = true
	} else {
		l.seq++
		w.seq = l.seq
		l.line[p].push(w)
	}
	l.mu.Unlock()
	if !freed {
		_ = l.clock.Sleep(ctx, latest.Sub(now))
	}
	cancel()
	l.mu.Lock()
	granted := w.granted
	if !granted {
		l.line[p].remove(w)
	}
	at := l.clock.Now()
	var pass *concPass
	if granted && c.Context().Err() == nil {
		pass = l.newPass(p, t, at, at.Sub(now))
	} else if granted {
		l.release(p, t)
	}
	l.mu.Unlock()
	switch err := c.Context().Err(); {
	case pass != nil:
		return core.Admission{Pass: pass}
	case err != nil && !(atDeadline && errors.Is(err, context.DeadlineExceeded)):
		return core.Admission{Canceled: true}
	}
	// No slot by MaxWait or by the caller's deadline, whichever ended the
	// wait first (the deadline's timer and the wait's may fire together).
	return core.Admission{Refused: &core.Denial{Gate: Gate}}
}

// RefusesAt never refuses ahead: whether a slot is free then depends on
// attempts yet to end.
func (l *Limit) RefusesAt(core.Call, time.Time, time.Time) *core.Denial { return nil }

// release gives back a slot of priority p that tenant t held, and hands
// the free room to the line. The caller holds l.mu.
func (l *Limit) release(p fleet.Priority, t *core.Tenant) {
	l.held[p]--
	if n := l.heldBy[t] - 1; n > 0 {
		l.heldBy[t] = n
	} else {
		delete(l.heldBy, t)
	}
	l.grant()
}

// newPass is the pass of an attempt that took a slot at now after waiting
// waited. The caller holds l.mu.
func (l *Limit) newPass(p fleet.Priority, t *core.Tenant, now time.Time, waited time.Duration) *concPass {
	pass := &concPass{l: l, prio: p, tenant: t, sent: now, waited: waited, limit: l.slots()}
	if l.p.Adaptive && !l.filling && l.cohort < concWindow {
		l.cohort++
		pass.epoch, pass.inCohort = l.epoch, true
	}
	return pass
}

// concPass is one attempt's slot.
type concPass struct {
	l        *Limit
	prio     fleet.Priority
	tenant   *core.Tenant // whose slot it is; nil: a call without a tenant
	epoch    uint64       // the cohort's, when inCohort
	inCohort bool
	sent     time.Time
	waited   time.Duration
	limit    int
	released bool
}

// Settle takes the attempt's time and gives its slot back; a stream
// handed to its caller keeps its slot until its end (SettleEnd).
func (p *concPass) Settle(now time.Time, e core.Event) {
	l := p.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if p.inCohort && p.epoch == l.epoch && !p.released {
		kind := kindPlain
		if e.StreamOpen {
			kind = kindStream
		}
		took := now.Sub(p.sent) // untimed: from the slot to the end
		if e.Timed {
			took = e.Latency // the provider's part of it
		}
		l.sample(took, kind, e)
	}
	if !e.StreamOpen {
		p.free()
	}
}

// TimesProvider: an attempt of a cohort is timed at the provider.
func (p *concPass) TimesProvider() bool { return p.inCohort }

func (p *concPass) SettleEnd(time.Time, core.Usage) {
	p.l.mu.Lock()
	p.free()
	p.l.mu.Unlock()
}

// free gives the slot back, once. The caller holds the limit's lock.
func (p *concPass) free() {
	if !p.released {
		p.released = true
		p.l.release(p.prio, p.tenant)
	}
}

// The concurrency limit's span attributes.
const (
	keyConcurrencyWait  = attribute.Key("damper.concurrency.wait_s")
	keyConcurrencyLimit = attribute.Key("damper.concurrency.limit")
)

func (p *concPass) SpanAttributes() []attribute.KeyValue {
	return []attribute.KeyValue{keyConcurrencyWait.Float64(p.waited.Seconds()), keyConcurrencyLimit.Int(p.limit)}
}

// The concurrency limit's metrics.
const (
	metricConcurrencyLimit = "damper.concurrency.limit"
	metricConcurrencyHeld  = "damper.concurrency.in_flight"
)

// instruments registers the gauges of every backend's limit and the
// slots its attempts hold.
func instruments(meter metric.Meter, env *core.Env, parts []core.Hooks, keep func(metric.Registration)) any {
	var limits []*Limit
	for _, h := range parts {
		if l, ok := h.Attempt.(*Limit); ok {
			limits = append(limits, l)
		}
	}
	if len(limits) == 0 {
		return nil
	}
	var none noop.Meter
	limit := core.Instrument(meter.Int64ObservableGauge(metricConcurrencyLimit, metric.WithUnit("{attempt}"),
		metric.WithDescription("The concurrency limit of each backend: the attempts it lets be in flight at once.")))(none.Int64ObservableGauge(metricConcurrencyLimit))
	held := core.Instrument(meter.Int64ObservableGauge(metricConcurrencyHeld, metric.WithUnit("{attempt}"),
		metric.WithDescription("The attempts in flight on each backend under its concurrency limit.")))(none.Int64ObservableGauge(metricConcurrencyHeld))
	name, named := env.Name()
	labels := make([][]attribute.KeyValue, len(limits))
	for i, l := range limits {
		if kv, ok := env.BackendLabel(l.backend); ok {
			labels[i] = append(labels[i], kv)
		}
		if named {
			labels[i] = append(labels[i], name)
		}
	}
	reg, err := meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for i, l := range limits {
			l.mu.Lock()
			n, h := l.slots(), l.held[fleet.Interactive]+l.held[fleet.Batch]
			l.mu.Unlock()
			o.ObserveInt64(limit, int64(n), metric.WithAttributes(labels[i]...))
			o.ObserveInt64(held, int64(h), metric.WithAttributes(labels[i]...))
		}
		return nil
	}, limit, held)
	if err != nil {
		otel.Handle(err)
		return nil
	}
	keep(reg)
	return nil
}

// Full reports whether an attempt of c would find no free slot now.
func (l *Limit) Full(c core.Call) bool {
	p := l.priorityOf(c)
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.free(p)
}

// Held is the slots held, and the attempts waiting in line.
func (l *Limit) Held() (held, waiting int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.held[fleet.Interactive] + l.held[fleet.Batch], l.line[fleet.Interactive].n + l.line[fleet.Batch].n
}

// Slots is the limit in whole slots now.
func (l *Limit) Slots() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.slots()
}
