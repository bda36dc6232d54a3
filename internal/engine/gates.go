package engine

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/damper-ai/damper-go/internal/core"
	"github.com/damper-ai/damper-go/internal/gates/breaker"
	"github.com/damper-ai/damper-go/internal/gates/budget"
	"github.com/damper-ai/damper-go/internal/gates/concurrency"
	"github.com/damper-ai/damper-go/internal/gates/ratelimit"
	"github.com/damper-ai/damper-go/internal/gates/retry"
	"github.com/damper-ai/damper-go/internal/gates/throttle"
)

// A gate is a package of its own under internal/gates, behind the
// contract of internal/core: its policy, when it acts, its refusal, its
// share of the fleet's state and its telemetry. gateList places it; the
// functions below run the list before every attempt, before a retry and
// before a hedge (see package core for the hooks).

// The engine's names of the contract's types.
type (
	gate            = core.Gate
	hooks           = core.Hooks
	denial          = core.Denial
	admission       = core.Admission
	pass            = core.Pass
	endPass         = core.EndPass
	spanPass        = core.SpanPass
	latencyPass     = core.LatencyPass
	attemptGate     = core.AttemptGate
	retryCheck      = core.RetryCheck
	hedgeCheck      = core.HedgeCheck
	spender         = core.Spender
	attemptObserver = core.Observer
	gateNote        = core.Note
	attemptEvent    = core.Event
	retryAsk        = core.RetryAsk
	storePart       = core.StorePart
)

// gateList is every gate, in order, one line a gate, each with the part
// of the Policy it reads: the order in which admissions run their checks,
// attempt gates and spenders, observers hear an attempt's end, and a
// backend's parts are made from its store. The budget is a spender, which
// runs after every check and attempt gate wherever it stands; it stands
// before them so that it is made first and hears an attempt's end first.
var gateList = []core.Entry[Policy]{
	core.Use(retry.Attempts, retry.AttemptsPart, retryPolicy),
	core.Use(retry.RetryAfter, retry.RetryAfterPart, retryPolicy),
	core.Use(retry.Deadline, retry.DeadlinePart, retryPolicy),
	core.Use(retry.Cost, retry.CostPart, retryPolicy),
	core.Use(budget.Gate, budget.Part, budgetPolicy),
	core.Use(ratelimit.Gate, ratelimit.Part, func(p *Policy) *RateLimitPolicy { return p.RateLimit }),
	core.Use(concurrency.Gate, concurrency.Part, func(p *Policy) *ConcurrencyPolicy { return p.Concurrency }),
	core.Use(breaker.Gate, breaker.Part, breakerConfig),
	core.Use(throttle.Gate, throttle.Part, func(p *Policy) *ThrottlePolicy { return p.Throttle }),
}

// isDenial reports whether outcome is a gate's refusal.
func isDenial(o Outcome) bool {
	for _, g := range gateList {
		if g.Gate.Outcome == o {
			return true
		}
	}
	return false
}

// RefusedBy returns the gate whose refusal's sentinel is reason, or nil.
func RefusedBy(reason error) *gate {
	for _, g := range gateList {
		if g.Gate.Reason != nil && g.Gate.Reason == reason {
			return g.Gate
		}
	}
	return nil
}

// gates are a backend's parts, sorted by when they act, each slice in the
// list's order, and each gate's hooks by its place in the list.
type gates struct {
	parts        []hooks
	attemptGates []attemptGate // before every attempt
	retryChecks  []retryCheck  // before a retry
	hedgeChecks  []hedgeCheck  // before a hedge
	spenders     []spender     // before a retry or a hedge, after the rest
	observers    []attemptObserver
}

// add sorts a part's hooks into the slices of when they act.
func (gs *gates) add(h hooks) {
	gs.parts = append(gs.parts, h)
	if h.Attempt != nil {
		gs.attemptGates = append(gs.attemptGates, h.Attempt)
	}
	if h.Retry != nil {
		gs.retryChecks = append(gs.retryChecks, h.Retry)
	} else if h.Attempt != nil {
		gs.retryChecks = append(gs.retryChecks, atWaitEnd{h.Attempt})
	}
	if h.Hedge != nil {
		gs.hedgeChecks = append(gs.hedgeChecks, h.Hedge)
	}
	if h.Spend != nil {
		gs.spenders = append(gs.spenders, h.Spend)
	}
	if h.Observe != nil {
		gs.observers = append(gs.observers, h.Observe)
	}
}

// wire makes backend b's part of every gate in the list, and keeps what
// the engine reads of them: the budget, the breaker, the limits.
func (d *Damper) wire(b *backend) error {
	b.gb = core.Backend{Name: b.name, Provider: b.provider, Store: b.store, Budget: b.budget}
	for _, g := range gateList {
		h, err := g.Part(&d.policy, &b.gb, d.env)
		if err != nil {
			return err
		}
		b.add(h)
	}
	b.budget = b.gb.Budget
	b.limiter = ratelimit.Of(b.parts)
	b.breaker = breaker.Of(b.parts)
	b.conc = concurrency.Of(b.parts)
	return nil
}

// atWaitEnd is an attempt gate before a retry: asked, taking nothing,
// whether it would refuse the retry's attempt once the wait is over (an
// open breaker, no room in the limiter by then).
type atWaitEnd struct{ g attemptGate }

func (w atWaitEnd) RefusesRetry(c core.Call, r *retryAsk) *denial {
	return w.g.RefusesAt(c, r.Now, r.Now.Add(r.Backoff().Wait))
}

// admitRetry runs the gates of c's backend on the retry that would follow
// failed attempt n, and returns the wait before it, or the refusal of the
// first gate that refuses it: the checks in the list's order (attempts,
// provider delay, deadline, cost ceiling, the attempt gates at the wait's
// end, the throttle), then the spenders (the budget), so that no unit is
// spent, and no wait started, for a retry that another gate refuses.
//
// rnd draws the jitter; it is called only for a retry that the attempts
// gate admits.
func admitRetry(c *call, n int, f *Failure, now time.Time, retryCost float64, rnd func() float64) (time.Duration, *denial) {
	r := retryAsk{N: n, Failure: f, Now: now, RetryCost: retryCost, Policy: &c.d.backoff, Rnd: rnd}
	b := c.route.b
	for _, g := range b.retryChecks {
		if refused := g.RefusesRetry(c.forGates(), &r); refused != nil {
			return 0, refused
		}
	}
	for _, s := range b.spenders {
		if refused := s.Spend(c.forGates(), now); refused != nil {
			return 0, refused
		}
	}
	return r.Backoff().Wait, nil
}

// admitHedge admits and starts the hedge of c's attempt under way, or
// returns nil when a gate refuses it. A hedge waits for nothing: the
// checks (attempts left, the deadline, the cost ceiling, since a hedge
// costs a whole attempt, a cancelled one may still be billed for its
// input; the throttle), then the attempt gates with no wait, then the
// spenders (the budget), whose refusal gives back the attempt gates' passes.
func admitHedge(c *call) *attempt {
	refused := func() *attempt {
		c.trace.hedgeResult(hedgeRefused)
		return nil
	}
	b := c.route.b
	now := c.d.clock.Now()
	for _, g := range b.hedgeChecks {
		if g.RefusesHedge(c.forGates(), now) != nil {
			return refused()
		}
	}
	a := c.newAttempt(c.report.Attempts+1, true)
	if denied, canceled := admitAttempt(c, a); denied != nil || canceled {
		return refused()
	}
	for _, s := range b.spenders {
		if s.Spend(c.forGates(), c.d.clock.Now()) != nil {
			a.settle(attemptEvent{})
			return refused()
		}
	}
	c.addRetryCost()
	c.startAttempt(a)
	return a
}

// admitAttempt runs the attempt gates of a's backend on attempt a, in
// order, and notes on it their passes, whether it is the breaker's probe
// and how long it waited in line; or returns the first refusal, or whether
// the caller's context ended during a wait. The passes of an attempt that
// is not sent are given back at once. A hedge waits for nothing: a gate
// that has no room for it at once refuses it.
func admitAttempt(c *call, a *attempt) (refused *denial, canceled bool) {
	for _, g := range a.route.b.attemptGates {
		adm := g.AdmitAttempt(c.forGates(), core.Attempt{N: a.n, Hedge: a.hedge}, c.d.clock.Now())
		a.queued += adm.Queued
		if adm.Note != nil {
			c.report.note(adm.Note)
			a.notes = append(a.notes, adm.Note)
		}
		if adm.Pass != nil {
			a.passes = append(a.passes, adm.Pass)
		}
		if adm.Refused != nil || adm.Canceled {
			a.settle(attemptEvent{})
			if adm.Refused != nil && adm.Refused.Detail != nil {
				c.report.note(adm.Refused.Detail)
			}
			c.report.queued(a.queued)
			return adm.Refused, adm.Canceled
		}
	}
	return nil, false
}

// waitUntil is an attempt gate's wait, until until: it first asks the gates
// after that gate whether they would refuse the attempt by then (no wait
// is started that a later gate would refuse), then sleeps on the Damper's
// clock, and reports a refusal, or whether the caller's context ended.
func waitUntil(c *call, after attemptGate, until time.Time) (refused *denial, canceled bool) {
	now := c.d.clock.Now()
	if !until.After(now) {
		return nil, false
	}
	if refused := laterRefusal(c, after, now, until); refused != nil {
		return refused, false
	}
	return nil, c.d.clock.Sleep(c.ctx, until.Sub(now)) != nil
}

// laterRefusal asks the attempt gates after gate after whether they would
// refuse c's attempt at until, taking nothing: a gate about to wait, until
// a time or for an event, starts no wait that a later gate would refuse.
func laterRefusal(c *call, after attemptGate, now, until time.Time) *denial {
	later := false
	for _, g := range c.route.b.attemptGates {
		if later {
			if refused := g.RefusesAt(c.forGates(), now, until); refused != nil {
				return refused
			}
		}
		later = later || g == after
	}
	return nil
}

// gateInstruments is what one gate's instruments func made for a Damper.
type gateInstruments struct {
	g    *gate
	inst any
}

// registerGates makes every gate's instruments for Damper d, whose
// backends are wired.
func (m *metrics) registerGates(d *Damper) {
	bs := append([]*backend{d.primary}, d.fallbacks...)
	keep := func(reg metric.Registration) { d.tel.keepGauges(d, reg) }
	m.env = d.env
	for i, g := range gateList {
		if g.Gate.Instruments == nil {
			continue
		}
		parts := make([]hooks, len(bs))
		for j, b := range bs {
			parts[j] = b.parts[i]
		}
		m.gates = append(m.gates, gateInstruments{g.Gate, g.Gate.Instruments(m.meter, d.env, parts, keep)})
	}
}

// instrumentsOf returns what the instruments func of the gate refusing
// with outcome made, or nil. (A gate's own hooks name it by its outcome:
// its descriptor, which names them, cannot be named back.)
func (m *metrics) instrumentsOf(outcome Outcome) any {
	for _, gi := range m.gates {
		if gi.g.Outcome == outcome {
			return gi.inst
		}
	}
	return nil
}

// recordGates records what every gate measures of a call at its end.
func (m *metrics) recordGates(ctx context.Context, rep *Report) {
	for _, gi := range m.gates {
		if gi.g.RecordCall != nil {
			gi.g.RecordCall(ctx, m.env, gi.inst, *rep)
		}
	}
}
