package damper

import (
	"context"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/damper-ai/damper-go/fleet"
)

// A gate is one unit, declared in its own file: its policy, when it acts,
// its refusal, its share of the fleet's state and its telemetry. gateList
// places it; the functions below run the list before every attempt, before
// a retry and before a hedge. A gate's part on a backend says when it acts
// by the hooks it fills in (hooks), each a typed interface:
//
//   - retryCheck: before a retry, taking nothing;
//   - hedgeCheck: before a hedge, taking nothing;
//   - attemptGate: before every attempt, the first and a hedge included,
//     maybe waiting, handing back a pass that hears the attempt's end (and,
//     before a retry, a check of whether it would refuse at the wait's end);
//   - spender: before a retry or a hedge, taking what is not given back;
//   - attemptObserver: after every attempt's end.
//
// Each admission runs, in the list's order, first every check, then every
// attempt gate, then every spender: nothing is taken for an admission a
// check refuses, and what an attempt gate took (a reservation, a probe) is
// given back when a later one refuses, while a spent unit never is.

// gate is one admission gate.
type gate struct {
	outcome Outcome // the outcome of a call it refuses
	reason  error   // its refusal's sentinel; nil: the caller gets the last provider error as it is

	// status and apiType are the proxy's answer to its refusal before any
	// answer came (0: the proxy's answer to any other error).
	status  int
	apiType string
	// moves: its refusal moves a call to its next backend or model, after
	// a failure of health or of rate (before a retry), or before an
	// attempt.
	moves bool

	// part makes the gate's part on backend b, from d's Policy and b's
	// Store, as the hooks it acts through: none when the Policy has none
	// of it. It runs once d.tel exists.
	part func(d *Damper, b *backend) (hooks, error)
	// instruments makes the gate's instruments and gauges on meter, once
	// per Damper, after every backend has its parts; what it returns is
	// the gate's to record into (instrumentsOf). Nil: none.
	instruments func(meter metric.Meter, d *Damper) any
	// recordCall records what the gate measures of every call at its end.
	recordCall func(ctx context.Context, m *metrics, inst any, rep Report)
	// callSpan appends what the gate says of a call, from its report, to
	// the attributes of its damper.request span; attemptSpan sets what it
	// says of an attempt, from its record, on the attempt's recording
	// span. Nil: nothing.
	// (By value: a pointer to the engine's copy would move it to the heap.)
	callSpan    func(rep Report, attrs []attribute.KeyValue) []attribute.KeyValue
	attemptSpan func(ar AttemptReport, span trace.Span)
}

// gateList is every gate, in order: the order in which admissions run
// their checks, attempt gates and spenders (see above), observers hear
// an attempt's end, and a backend's parts are made from its store. The
// budget is a spender, which runs after every check and attempt gate
// wherever it stands; it stands before them so that it is made first and
// hears an attempt's end first.
var gateList = []*gate{
	gateAttempts, gateRetryAfter, gateDeadline, gateCost, // gate_retry.go
	gateBudget,      // budget.go
	gateRateLimit,   // ratelimit.go
	gateConcurrency, // concurrency.go
	gateCircuit,     // breaker.go
	gateThrottle,    // throttle.go
}

// isDenial reports whether outcome is a gate's refusal.
func isDenial(o Outcome) bool {
	for _, g := range gateList {
		if g.outcome == o {
			return true
		}
	}
	return false
}

// refusedBy returns the gate whose refusal's sentinel is reason, or nil.
func refusedBy(reason error) *gate {
	for _, g := range gateList {
		if g.reason != nil && g.reason == reason {
			return g
		}
	}
	return nil
}

// retryCheck is a gate's check before a retry, which takes nothing.
type retryCheck interface {
	refusesRetry(c *call, r *retryAsk) *denial
}

// hedgeCheck is a gate's check before a hedge, which takes nothing.
type hedgeCheck interface {
	refusesHedge(c *call, now time.Time) *denial
}

// spender is a gate that takes, before a retry or a hedge, what is not
// given back when the retry or hedge is not made: the budget's unit.
type spender interface {
	spend(c *call, now time.Time) *denial
}

// gates are a backend's parts, sorted by when they act, each slice in the
// list's order.
type gates struct {
	attemptGates []attemptGate // before every attempt
	retryChecks  []retryCheck  // before a retry
	hedgeChecks  []hedgeCheck  // before a hedge
	spenders     []spender     // before a retry or a hedge, after the rest
	observers    []attemptObserver
}

// hooks are what a gate's part on one backend does, each nil where it
// does not act. A part names every hook it acts through, so that the
// compiler checks each: a hook whose method is mistyped does not build.
type hooks struct {
	attempt attemptGate // before every attempt
	// retry is the check before a retry; a part with an attempt gate and
	// no retry check is asked, before a retry, whether it would refuse the
	// retry's attempt at the wait's end (atWaitEnd).
	retry   retryCheck
	hedge   hedgeCheck
	spend   spender
	observe attemptObserver
}

// add sorts a part's hooks into the slices of when they act.
func (gs *gates) add(h hooks) {
	if h.attempt != nil {
		gs.attemptGates = append(gs.attemptGates, h.attempt)
	}
	if h.retry != nil {
		gs.retryChecks = append(gs.retryChecks, h.retry)
	} else if h.attempt != nil {
		gs.retryChecks = append(gs.retryChecks, atWaitEnd{h.attempt})
	}
	if h.hedge != nil {
		gs.hedgeChecks = append(gs.hedgeChecks, h.hedge)
	}
	if h.spend != nil {
		gs.spenders = append(gs.spenders, h.spend)
	}
	if h.observe != nil {
		gs.observers = append(gs.observers, h.observe)
	}
}

// wire makes backend b's part of every gate in the list.
func (d *Damper) wire(b *backend) error {
	for _, g := range gateList {
		h, err := g.part(d, b)
		if err != nil {
			return err
		}
		b.add(h)
	}
	return nil
}

// atWaitEnd is an attempt gate before a retry: asked, taking nothing,
// whether it would refuse the retry's attempt once the wait is over (an
// open breaker, no room in the limiter by then).
type atWaitEnd struct{ g attemptGate }

func (w atWaitEnd) refusesRetry(c *call, r *retryAsk) *denial {
	return w.g.refusesAt(c, r.now, r.now.Add(r.backoff(c).wait))
}

// denial is a gate's refusal.
type denial struct {
	gate       *gate
	retryAfter time.Duration // the provider's delay, or the time until the gate could admit
	asIs       bool          // the caller gets the last provider error as it is
	detail     gateNote      // what the gate says of it beyond its sentinel; nil: nothing
}

// err is the *Error the caller gets for d, or nil when it gets the last
// provider error as it is.
func (d *denial) err() *Error {
	if d.asIs || d.gate.reason == nil {
		return nil
	}
	e := &Error{Reason: d.gate.reason, RetryAfter: d.retryAfter}
	if d.detail != nil {
		d.detail.fillError(e)
	}
	return e
}

// note notes what the refusing gate says of it in the call's report.
func (d *denial) note(r *callReport) {
	if d.detail != nil {
		d.detail.noteReport(r)
	}
}

// gateNote is what a gate says of an attempt it admitted or refused,
// beyond its pass: the breaker's state and probe, its next probe, the rate
// limiter's time of admission. It fills in the *Error of a refusal, and
// notes itself in the call's report and the attempt's record, so that
// these fields are the gate's own.
type gateNote interface {
	fillError(e *Error)
	noteReport(r *callReport)
	// noteAttempt returns ar with the note in it: by value, so that the
	// record stays on the stack.
	noteAttempt(ar AttemptReport) AttemptReport
}

// retryAsk is the retry a retry check is asked about: the one that would
// follow failed attempt n (counted on the call's backend), whose failure is
// f, at now, with retryCost spent on retries so far.
type retryAsk struct {
	n         int
	f         *Failure
	now       time.Time
	retryCost float64
	rnd       func() float64
	wait      retryWait // once drawn
	drawn     bool
}

// retryWait is the wait before a retry: full jitter, or the provider's
// delay (hint), honoured up to MaxRetryAfter.
type retryWait struct {
	wait, hint time.Duration
	hasHint    bool
}

// backoff is r's wait, drawn once, by the first check that needs it: the
// attempts gate, first in the list, needs none, so that a call's last
// attempt draws nothing.
func (r *retryAsk) backoff(c *call) retryWait {
	if !r.drawn {
		p, w := &c.d.policy, &r.wait
		if !p.IgnoreRetryAfter && r.f.Header != nil {
			w.hint, w.hasHint = parseRetryAfter(r.f.Header, r.now)
		}
		w.wait = backoff(r.n, p.BackoffBase, p.BackoffMax, min(w.hint, p.MaxRetryAfter), w.hasHint, p.MaxRetryAfter, r.rnd())
		r.drawn = true
	}
	return r.wait
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
	r := retryAsk{n: n, f: f, now: now, retryCost: retryCost, rnd: rnd}
	b := c.route.b
	for _, g := range b.retryChecks {
		if refused := g.refusesRetry(c, &r); refused != nil {
			return 0, refused
		}
	}
	for _, s := range b.spenders {
		if refused := s.spend(c, now); refused != nil {
			return 0, refused
		}
	}
	return r.backoff(c).wait, nil
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
		if g.refusesHedge(c, now) != nil {
			return refused()
		}
	}
	a := c.newAttempt(c.report.Attempts+1, true)
	if denied, canceled := admitAttempt(c, a); denied != nil || canceled {
		return refused()
	}
	for _, s := range b.spenders {
		if s.spend(c, c.d.clock.Now()) != nil {
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
		adm := g.admitAttempt(c, a, c.d.clock.Now())
		a.queued += adm.queued
		if adm.note != nil {
			adm.note.noteReport(&c.report)
			a.notes = append(a.notes, adm.note)
		}
		if adm.pass != nil {
			a.passes = append(a.passes, adm.pass)
		}
		if adm.refused != nil || adm.canceled {
			a.settle(attemptEvent{})
			if adm.refused != nil {
				adm.refused.note(&c.report)
			}
			c.report.queued(a.queued)
			return adm.refused, adm.canceled
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
			if refused := g.refusesAt(c, now, until); refused != nil {
				return refused
			}
		}
		later = later || g == after
	}
	return nil
}

// attemptGate admits each attempt n of call c, the first included, before
// it is sent: it may refuse it, or hand it a pass that hears how it ended.
// A gate that makes the attempt wait does so with waitUntil, which first
// asks the gates after it whether they would refuse the attempt by then.
// The rate limiter, the concurrency limit and the circuit breaker are
// attempt gates, in that order: the breaker admits its probe at the
// moment the attempt leaves.
type attemptGate interface {
	// admitAttempt admits attempt a of c at now; a hedge (a.hedge) must
	// find room at once, with no wait.
	admitAttempt(c *call, a *attempt, now time.Time) admission
	// refusesAt reports, taking nothing, whether the gate would refuse an
	// attempt of c at the later time at, as far as it can tell at now: an
	// attempt it refuses is not waited for, nor paid for.
	refusesAt(c *call, now, at time.Time) *denial
}

// admission is an attempt gate's answer.
type admission struct {
	refused  *denial
	canceled bool // the caller's context ended during the gate's wait
	pass     pass // nil when the gate needs no word of the attempt's end
	queued   time.Duration
	note     gateNote // what the gate says of an attempt it admitted; nil: nothing
}

// pass is a gate's admission of one attempt: it hears how that attempt
// ended, or a zero event when it was never sent.
type pass interface {
	settle(now time.Time, e attemptEvent)
}

// spanPass is a pass that says what its gate did to the attempt on the
// attempt's span (a concurrency limit's wait for a slot, say), so that a
// gate's span attributes live in its own file.
type spanPass interface {
	pass
	spanAttributes() []attribute.KeyValue
}

// attemptEvent is what an observer hears of an attempt as it ends.
type attemptEvent struct {
	outcome fleet.AttemptOutcome
	class   Class       // a failure's; zero for an answered attempt
	header  http.Header // the response's, when one came
	failure *Failure    // nil for an answered attempt
	// usage is a plain answer's token usage, read only for a rate limiter.
	usage usage
	// streamOpen marks a stream handed to its caller: its usage is known
	// at its end, when its endPasses settle.
	streamOpen bool
	// latency is an answer's time at the provider (sendTrace.latency),
	// when timed: its attempt was timed for a latencyPass.
	latency time.Duration
	timed   bool
	// tenant is the call's, for the parts it has of its own.
	tenant *tenant
}

// endPass is a pass that, for a stream, also hears the stream's end, with
// the usage of the whole answer: the rate limiter's and the concurrency
// limit's.
type endPass interface {
	pass
	settleEnd(now time.Time, u usage)
}

// attemptObserver hears the end of every attempt: the budget and the
// throttle do.
type attemptObserver interface {
	observeAttempt(ctx context.Context, now time.Time, e attemptEvent)
}

// keepGoing returns ctx without its cancellation, for a part's store to
// finish what the call began; a part in memory needs no context, and is
// spared the allocation.
func keepGoing(ctx context.Context, part any) context.Context {
	if fleet.InMemory(part) {
		return ctx
	}
	return context.WithoutCancel(ctx)
}

// gateInstruments is what one gate's instruments func made for a Damper.
type gateInstruments struct {
	g    *gate
	inst any
}

// registerGates makes every gate's instruments for Damper d, whose
// backends are wired.
func (m *metrics) registerGates(d *Damper) {
	for _, g := range gateList {
		if g.instruments != nil {
			m.gates = append(m.gates, gateInstruments{g, g.instruments(m.meter, d)})
		}
	}
}

// instrumentsOf returns what the instruments func of the gate refusing
// with outcome made, or nil. (A gate's own hooks name it by its outcome:
// its descriptor, which names them, cannot be named back.)
func (m *metrics) instrumentsOf(outcome Outcome) any {
	for _, gi := range m.gates {
		if gi.g.outcome == outcome {
			return gi.inst
		}
	}
	return nil
}

// recordGates records what every gate measures of a call at its end.
func (m *metrics) recordGates(ctx context.Context, rep *Report) {
	for _, gi := range m.gates {
		if gi.g.recordCall != nil {
			gi.g.recordCall(ctx, m, gi.inst, *rep)
		}
	}
}
