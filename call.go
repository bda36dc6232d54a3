package damper

import (
	"context"
	"net/http"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// minAttempt is the least time worth giving another attempt: a retry whose
// wait leaves less than this before the deadline is not started.
const minAttempt = 500 * time.Millisecond

// call is one logical request: the state of Damper's retry loop for it.
// The loop runs in one goroutine; mu guards only what a stream read or
// ReportInto may touch from elsewhere.
type call struct {
	d      *Damper
	client *clientAdapter // how the client in front reports the provider's errors
	ctx    context.Context
	req    *http.Request // every attempt sends a copy, its body from GetBody
	start  time.Time

	// The first attempt sends req's URL and headers themselves. A
	// middleware after Damper's (a platform's signer) may change them in
	// place (changes, from changesRequest, which also makes the first
	// attempt send a copy), so a retry is then rebuilt from kept, taken
	// before it.
	changes bool
	kept    *keptRequest

	stream      bool
	inputTokens int
	maxTokens   int

	// route is where the next attempt goes: first, the primary with the
	// request's own model, when the call has nowhere else to go, else one
	// of routes, at index at; routeFrom is the number of attempts made
	// before it (fallback.go).
	route     *route
	first     route
	routes    []route
	at        int
	routeFrom int

	mu        sync.Mutex
	report    Report
	sink      *Report
	stopWatch func() bool // stops the watch on ctx of an answered call; requires mu

	ending sync.Once // see end

	// What a call with one attempt needs, kept in the call itself: the
	// report's log, the attempt (attempted: taken), its answer, the
	// reader of the request's facts, and the call's telemetry.
	firstLog     [1]AttemptReport
	firstAttempt attempt
	attempted    bool
	plain        plainBody
	facts        factsWriter
	traceBuf     callTrace

	// endPasses are the passes of a stream handed to its caller that hear
	// its end (settleEnd).
	endPasses []endPass

	// retryCost is the summed estimated cost of the retries and hedges
	// sent; the loop alone touches it.
	retryCost float64

	// What hedging needs: the delay's statistics key, and a body of the
	// call's own when GetBody's readers are one (see ownBody).
	latencyKey latencyKey
	bodyCopy   []byte

	trace *callTrace // spans, metrics and logs of this call (telemetry.go)
}

// newCall starts the logical call of req, a Messages request from the
// client that client stands for.
func (d *Damper) newCall(req *http.Request, client *clientAdapter) (*call, error) {
	c := &call{d: d, client: client, ctx: req.Context(), req: req, start: d.clock.Now()}
	for _, cc := range d.callContexts {
		c.ctx = cc.CallContext(c.ctx)
	}
	c.report.AttemptLog = c.firstLog[:0]
	if sink, ok := c.ctx.Value(reportSinkKey{}).(*Report); ok {
		c.sink = sink
	}
	c.report.Provider = providerOf(req)
	c.report.Backend = PrimaryBackend
	if err := c.readFacts(); err != nil {
		return nil, err
	}
	c.report.Stream = c.stream
	if d.hedge != nil {
		c.latencyKey = latencyKey{group: LimitGroup(c.report.Model), stream: c.stream}
	}
	c.first = route{b: d.primary, model: c.report.Model}
	if p, ok := d.policy.PriceTable.Lookup(c.report.Model); ok {
		c.first.price, c.first.priced = p, true
		c.first.cost = attemptCost(p, c.inputTokens, c.maxTokens)
		c.report.Priced = true
		c.report.EstimatedCostUSD = c.first.cost
	}
	c.route = &c.first
	c.planRoutes()
	return c, nil
}

// run is the retry loop of one logical request.
//
// It returns the response to hand on (an answer, or an error status to
// pass on as it came) or the error that ends the call.
func (c *call) run(next sendFunc) (*http.Response, error) {
	c.changes = changesRequest(next)
	if c.d.policy.MaxAttempts > 1 || len(c.d.fallbacks) > 0 || c.d.policy.Fallback != nil {
		c.keepRequest()
	}
	c.trace = &c.traceBuf
	c.d.tel.startCall(c.trace, c.ctx, callFacts{
		provider: c.report.Provider, model: c.report.Model, stream: c.stream,
		priced: c.report.Priced, estimateUSD: c.report.EstimatedCostUSD, start: c.start,
	}, c.req.URL)
	var r attemptResult // the last attempt's
	for n := 1; ; n++ {
		a := c.newAttempt(n, false)
		refused, canceled := admitAttempt(c, a)
		for refused != nil && c.moveOnAt(refused) {
			a = c.newAttempt(n, false)
			refused, canceled = admitAttempt(c, a)
		}
		switch {
		case canceled:
			return c.surface(r, OutcomeCanceled, nil)
		case refused != nil:
			return c.surface(r, refused.gate.outcome, refused.err())
		}
		c.startAttempt(a)
		var cls Classification
		if delay, ok := c.hedgeDelay(); ok {
			a, r, cls, canceled = c.race(a, next, delay)
			n = c.report.Attempts
		} else {
			r = c.send(a, next)
			c.noteLatency(a, r)
			if r.failure != nil {
				cls, canceled = c.judge(a, r)
			}
		}
		if r.failure == nil {
			c.observe(a, attemptEvent{outcome: AttemptOutcome{First: a.first, Success: true}, header: r.res.Header, usage: r.usage, streamOpen: c.stream})
			// The call ends with its body: the report is written now,
			// without an outcome, and again then. A stream also ends with
			// the call's context, between its caller's reads.
			c.settle()
			if r.stream != nil {
				c.mu.Lock()
				c.stopWatch = context.AfterFunc(c.ctx, r.stream.contextDone)
				c.mu.Unlock()
			}
			return r.res, nil
		}
		switch {
		case canceled:
			return c.surface(r, OutcomeCanceled, nil)
		case cls.Class == Ambiguous:
			return c.surface(r, OutcomeAmbiguous, nil)
		case cls.Class != Retryable:
			if c.moveOnFinal(cls) {
				closeBody(r.res)
				continue
			}
			return c.surface(r, OutcomeError, nil)
		}
		wait, refused := admitRetry(c, n-c.routeFrom, r.failure, c.d.clock.Now(), c.retryCost, c.d.rand)
		if refused != nil && c.moveOnRefusal(cls, refused) {
			closeBody(r.res)
			continue
		}
		if refused != nil {
			if refused.circuit != 0 {
				c.noteCircuit(refused.circuit)
			}
			return c.surface(r, refused.gate.outcome, refused.err())
		}
		c.addRetryCost()
		c.mu.Lock()
		c.report.AttemptLog[len(c.report.AttemptLog)-1].Backoff = wait
		c.mu.Unlock()
		c.trace.retry(n, c.report.AttemptLog[len(c.report.AttemptLog)-1], cls, wait, c.retryCost)
		closeBody(r.res)

		if err := c.d.clock.Sleep(c.ctx, wait); err != nil {
			return c.surface(r, OutcomeCanceled, nil)
		}
	}
}

// judge classifies failed attempt a, whose result is r, ends it and tells
// its passes and the observers; canceled reports that the caller's context
// ended, which is recorded as such before any classifier sees it: the
// caller's own end is no failure of the provider's.
func (c *call) judge(a *attempt, r attemptResult) (cls Classification, canceled bool) {
	if c.ctx.Err() != nil {
		cls = Classification{Class: NotRetryable, Kind: "canceled"}
		a.end(failed(r.failure, cls))
		c.observe(a, attemptEvent{outcome: AttemptOutcome{First: a.first}, class: NotRetryable, header: r.failure.Header, failure: r.failure})
		return cls, true
	}
	cls = c.classify(*r.failure)
	a.end(failed(r.failure, cls))
	c.observe(a, attemptEvent{outcome: AttemptOutcome{First: a.first, Signal: cls.Signal}, class: cls.Class, header: r.failure.Header, failure: r.failure})
	return cls, false
}

// addRetryCost counts one more attempt beyond the first, a retry or a
// hedge, at the estimated cost of an attempt.
func (c *call) addRetryCost() {
	c.retryCost += c.route.cost
	c.mu.Lock()
	c.report.RetryCostUSD = c.retryCost
	c.mu.Unlock()
}

// classify is the one classification of a failed attempt: the built-in
// verdict, then the Policy's Classifier, which may change it.
func (c *call) classify(f Failure) Classification {
	cls := Classify(f)
	if c.d.policy.Classifier != nil {
		cls = c.d.policy.Classifier(f, cls)
	}
	return cls
}

// noteQueued adds a wait in the rate limiter's line to the report.
func (c *call) noteQueued(d time.Duration) {
	if d > 0 {
		c.mu.Lock()
		c.report.RateLimitWait += d
		c.mu.Unlock()
	}
}

// observe tells attempt a's passes and every observer how it ended.
func (c *call) observe(a *attempt, e attemptEvent) {
	a.settle(e)
	now := c.d.clock.Now()
	for _, o := range a.route.b.observers {
		o.observeAttempt(c.ctx, now, e)
	}
}

// noteCircuit records the breaker's state as it answered the call.
func (c *call) noteCircuit(s CircuitState) {
	c.mu.Lock()
	c.report.Circuit = s
	c.mu.Unlock()
}

// settleEnd settles the passes kept for a stream's end with the usage of
// its answer.
func (c *call) settleEnd(u usage) {
	if len(c.endPasses) == 0 {
		return
	}
	now := c.d.clock.Now()
	for _, p := range c.endPasses {
		p.settleEnd(now, u)
	}
	c.endPasses = nil
}

// storeError logs a failure of a part's store, if any.
func (c *call) storeError(part storePart, op string, err error) {
	if err != nil {
		c.d.tel.logStoreError(c.ctx, part, op, err)
	}
}

// record appends an attempt to the report and ends its telemetry, its
// span among it.
func (c *call) record(span trace.Span, ar AttemptReport) {
	c.mu.Lock()
	c.report.AttemptLog = append(c.report.AttemptLog, ar)
	c.mu.Unlock()
	c.trace.attemptEnd(span, ar)
}

// surface ends the call with the failure of attempt a. With refusal nil the
// caller gets exactly what the client alone would give for that attempt:
// its error, or its response with an error status; else an *Error with the
// refusal's reason, wrapping the attempt's error as the client would have
// reported it.
func (c *call) surface(a attemptResult, outcome Outcome, refusal *Error) (*http.Response, error) {
	var err error
	switch {
	case outcome == OutcomeCanceled:
		err = c.ctx.Err()
	case refusal != nil:
		refusal.Last = a.providerError(c)
		err = refusal
	case a.err == nil && c.route.b.client != nil:
		// An error status from a fallback: the client in front would name
		// its own request's URL, not the backend's that answered.
		err = a.providerError(c)
	default:
		err = a.err
	}
	err = c.finish(outcome, err)
	if refusal != nil {
		refusal.Report = c.snapshot()
	} else if e, ok := err.(*Error); ok && e.Report == nil {
		e.Report = c.snapshot() // an *Error of the attempt, such as ErrHoldBackExceeded
	}
	if err != nil {
		closeBody(a.res)
		return nil, err
	}
	return a.res, nil // an error status, handed on as it came
}

// sendFunc sends one attempt: the next handler of the client's chain.
type sendFunc = func(*http.Request) (*http.Response, error)

// providerError is the error the client would have returned for a.
func (a attemptResult) providerError(c *call) error {
	if a.failure == nil || a.failure.StatusCode == 0 {
		return a.err
	}
	req := c.req
	if c.route.b.client != nil && a.res.Request != nil {
		req = a.res.Request // the backend's, which answered
	}
	return c.client.statusError(req, a.res, a.failure.Body)
}

// finish ends the call and writes the report to the caller's sink. err is
// returned for convenience.
func (c *call) finish(outcome Outcome, err error) error {
	c.end(outcome, err, nil)
	c.publish()
	return err
}

// end ends the call, once: the first end stops the watch on the call's
// context, runs cleanup (when not nil), records the outcome in the report
// and ends the request's telemetry, and reports true. Any other end waits
// until the first is over and changes nothing. end does not write the
// caller's sink: only the caller's own goroutines do (publish), so that
// what the caller reads is never written under it.
func (c *call) end(outcome Outcome, err error, cleanup func()) (first bool) {
	c.ending.Do(func() {
		first = true
		c.mu.Lock()
		stop := c.stopWatch
		c.stopWatch = nil
		c.mu.Unlock()
		if stop != nil {
			stop()
		}
		if cleanup != nil {
			cleanup()
		}
		now := c.recordOutcome(outcome)
		rep, last := c.lastOf()
		c.trace.end(&rep, last, now)
	})
	return first
}

// settle writes the report of an answered call, which ends with its body,
// to the caller's sink, if any, with no outcome yet. The sink is set
// before the loop begins, and never after.
func (c *call) settle() {
	if c.sink == nil {
		return
	}
	c.recordOutcome("")
	c.publish()
}

// recordOutcome sets the outcome, duration and budget balance of the
// report, as of now, which it returns.
func (c *call) recordOutcome(outcome Outcome) (now time.Time) {
	now = c.d.clock.Now()
	var balance float64
	if outcome != "" && c.readsBalance(outcome) {
		// The balance is the budget's when the call ended: no store is
		// asked for it while the call goes on.
		var err error
		b := c.route.b.budget
		balance, err = b.Available(keepGoing(c.ctx, b), now)
		c.storeError(partBudget, "available", err)
	}
	c.mu.Lock()
	c.report.Outcome = outcome
	c.report.Duration = now.Sub(c.start)
	c.report.BudgetBalance = balance
	c.mu.Unlock()
	return now
}

// lastOf returns the report, without its log, and its last attempt.
func (c *call) lastOf() (Report, AttemptReport) {
	c.mu.Lock()
	defer c.mu.Unlock()
	rep := c.report
	rep.AttemptLog = nil
	var last AttemptReport
	if n := len(c.report.AttemptLog); n > 0 {
		last = c.report.AttemptLog[n-1]
	}
	return rep, last
}

// readsBalance reports whether anyone may read the budget's balance at the
// call's end. A budget in memory tells it at no cost; a store's costs a
// round trip, which an answered call makes only for a report someone
// reads: the caller's destination or a recording span. A failed call's
// report also goes on its error and its log line.
func (c *call) readsBalance(outcome Outcome) bool {
	if _, inMemory := c.route.b.budget.(*WindowBudget); inMemory || outcome != OutcomeSuccess {
		return true
	}
	c.mu.Lock()
	sink := c.sink
	c.mu.Unlock()
	return sink != nil || c.trace.request != nil && c.trace.request.IsRecording()
}

// publish copies the report to the ReportInto destination, if any.
func (c *call) publish() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sink != nil {
		*c.sink = c.report
		c.sink.AttemptLog = append([]AttemptReport(nil), c.report.AttemptLog...)
	}
}

// snapshot returns a copy of the report.
func (c *call) snapshot() *Report {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.report
	r.AttemptLog = append([]AttemptReport(nil), c.report.AttemptLog...)
	return &r
}
