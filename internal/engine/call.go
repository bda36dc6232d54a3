package engine

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/core"
)

// A logical call: its state, its loop (run) and its single end.

// minAttempt is the least time worth giving another attempt: a retry whose
// wait leaves less than this before the deadline is not started.
const minAttempt = core.MinAttempt

// SendFunc sends one attempt: the next handler of the client's chain.
type SendFunc = func(*http.Request) (*http.Response, error)

// ClientAdapter is how the client in front of the engine reports a
// provider's errors: the engine builds the errors it returns with it, so
// that a caller gets what its client alone would give. Each adapter has
// its own (the SDK's sdkClient, the proxy's proxyClient).
type ClientAdapter struct {
	// statusError is the error for a response with an error status,
	// whose body (at most 1 MiB of it) is body.
	StatusError func(req *http.Request, res *http.Response, body []byte) error
	// eventError is the error for an SSE error event of a stream, whose
	// data is data.
	EventError func(res *http.Response, data []byte) error
}

// Front is what the adapter in front of the engine gives a call: all that
// is particular to that client, decided by the adapter, so that the
// engine never calls back into it.
type Front struct {
	Client *ClientAdapter // how the client reports the provider's errors
	Next   SendFunc       // what sends an attempt
	// changesRequest: next may change a request in place (an SDK
	// middleware after Damper's, such as a platform's signer).
	ChangesRequest bool
	Sink           *Report // the caller's destination of the report, if any
	// tenant is the configured tenant the client authenticated as (the
	// proxy's key mode), nil when none: its name is one of a bounded
	// set, so that it may label metrics as it is.
	Tenant *ProxyTenant
}

// call is one logical request: the state of Damper's retry loop for it.
// The loop runs in one goroutine; what a stream's Read or Close, or the
// end of the caller's context, may touch from elsewhere is the report
// (callReport, with its own lock) and the call's end (ending).
type call struct {
	d      *Damper
	client *ClientAdapter
	next   SendFunc
	ctx    context.Context
	req    *http.Request // the caller's, which its errors name
	out    request       // what the attempts send
	tenant *ProxyTenant  // front.tenant
	start  time.Time

	stream      bool
	inputTokens int
	maxTokens   int

	routes // where the attempts go (fallback.go)
	// routing is why a spread call starts where it does (routing.go);
	// "" under failover routing. affinity is what the cache affinity
	// table said of its cached prefix (affinity.go); "" when none.
	routing, affinity string

	report callReport
	ending endOnce // see end

	// What a call with one attempt needs, kept in the call itself: the
	// attempt (attempted: taken), its answer and the call's telemetry.
	firstAttempt attempt
	attempted    bool
	plain        plainBody
	traceBuf     callTrace

	// retryCost is the summed estimated cost of the retries and hedges
	// sent; the loop alone touches it.
	retryCost float64

	// latencyKey is the window of the hedge delay's statistics.
	latencyKey latencyKey

	trace *callTrace // spans, metrics and logs of this call (telemetry.go)
}

// NewCall starts the logical call of req, from the client in front f.
func (d *Damper) NewCall(req *http.Request, f Front) (*call, error) {
	c := &call{d: d, client: f.Client, next: f.Next, ctx: req.Context(), req: req, start: d.clock.Now(), tenant: f.Tenant}
	c.out = request{req: req, changes: f.ChangesRequest, parity: len(d.fallbacks) > 0, affinity: d.affinity != nil}
	for _, cc := range d.callContexts {
		c.ctx = cc.CallContext(c.ctx)
	}
	sink := f.Sink
	if sink == nil {
		sink, _ = c.ctx.Value(reportSinkKey{}).(*Report)
	}
	if err := c.out.readFacts(); err != nil {
		return nil, err
	}
	facts := &c.out.facts
	c.stream, c.inputTokens, c.maxTokens = facts.stream, facts.inputTokens, facts.maxTokens
	c.report.begin(providerOf(req), facts.model, f.Tenant.nameOf(), c.stream, sink)
	if d.hedge != nil {
		c.latencyKey = latencyKey{group: LimitGroup(facts.model), stream: c.stream}
	}
	c.first = route{b: d.primary, model: facts.model}
	c.first.priceBy(d.policy.PriceTable, c.inputTokens, c.maxTokens)
	if c.first.priced {
		c.report.priced(c.first.cost)
	}
	c.route = &c.first
	need := needsOf(req, facts.features)
	for _, sk := range c.plan(d, c.inputTokens, c.maxTokens, &need) {
		c.report.skipped(Skip{Backend: sk.b.name, Model: sk.model, Reason: sk.reason, Feature: sk.feature})
		sk.b.skipped(c.ctx, d.tel, sk.model, sk.reason, sk.feature)
	}
	if d.spread != nil {
		c.spread()
	}
	return c, nil
}

// run is the loop of one logical request: admit an attempt (moving to the
// next route while its gates refuse it), send it (raced against a hedge
// when one is due), judge its failure, then retry after a backoff or move
// to the next route, until an answer or a refusal ends the call.
//
// It returns the response to hand on (an answer, or an error status to
// pass on as it came) or the error that ends the call.
func (c *call) Run() (*http.Response, error) {
	if c.d.policy.MaxAttempts > 1 || len(c.d.fallbacks) > 0 || c.d.policy.Fallback != nil {
		c.out.keep()
	}
	c.trace = &c.traceBuf
	c.d.tel.startCall(c.trace, c.ctx, callFacts{
		provider: c.report.Provider, model: c.report.Model, tenant: c.report.Tenant, stream: c.stream,
		priced: c.report.Priced, estimateUSD: c.report.EstimatedCostUSD, start: c.start, routing: c.routing, affinity: c.affinity,
	}, c.req.URL)
	var r attemptResult // the last attempt's
	for n := 1; ; n++ {
		// Admit.
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
			return c.surface(r, refused.Gate.Outcome, refused.Err())
		}

		// Send, alone or raced against a hedge when one is due (race.go),
		// and judge a failure.
		c.startAttempt(a)
		var cls Classification
		room := c.report.Attempts-c.routeFrom < c.d.policy.MaxAttempts
		if delay, ok := c.d.hedge.due(c.ctx, c.latencyKey, room); ok {
			a, r, cls, canceled = newRace(c, delay).run(a)
			n = c.report.Attempts // the hedge counts
		} else {
			r = a.send()
			c.d.hedge.noteLatency(c.latencyKey, a.start, r.firstAt)
			if r.failure != nil {
				cls, canceled = c.judge(a, r)
			}
		}
		if r.failure == nil {
			// Answered: the call ends with its body. The report is
			// published now, without an outcome, and again then. A stream
			// also ends with the call's context, between its caller's
			// reads.
			e := attemptEvent{Outcome: fleet.AttemptOutcome{First: a.first, Success: true}, Header: r.res.Header, Usage: r.usage.public(), StreamOpen: c.stream}
			if a.timing != nil {
				e.Latency, e.Timed = a.timing.latency(c.stream), true
			}
			a.tell(e)
			if !c.stream {
				c.report.usage(r.usage) // a stream's, at its end
			}
			if c.report.hasSink() {
				c.report.settle("", c.d.clock.Now().Sub(c.start), 0)
				c.report.publish()
			}
			if r.stream != nil {
				r.stream.watch()
			}
			return r.res, nil
		}
		// Failed: the end, unless it is retryable (or a spend limit that
		// moves the call on).
		switch {
		case canceled:
			return c.surface(r, OutcomeCanceled, nil)
		case cls.Class == Ambiguous:
			return c.surface(r, OutcomeAmbiguous, nil)
		case cls.Class != Retryable:
			if c.moveOnFinal(cls) {
				CloseBody(r.res)
				continue
			}
			return c.surface(r, OutcomeError, nil)
		}

		// Retry after the backoff, or move to the next route at once; or
		// the end, with the refusal.
		wait, refused := admitRetry(c, n-c.routeFrom, r.failure, c.d.clock.Now(), c.retryCost, c.d.rand)
		if refused != nil && c.moveOnRefusal(cls, refused) {
			CloseBody(r.res)
			continue
		}
		if refused != nil {
			if refused.Detail != nil {
				c.report.note(refused.Detail)
			}
			return c.surface(r, refused.Gate.Outcome, refused.Err())
		}
		c.addRetryCost()
		c.trace.retry(a.n, c.report.backoff(wait), cls, wait, c.retryCost) // a.n: a race may end on its first attempt
		CloseBody(r.res)
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
		a.tell(attemptEvent{Outcome: fleet.AttemptOutcome{First: a.first}, Class: NotRetryable, Header: r.failure.Header, Failure: r.failure})
		return cls, true
	}
	cls = c.d.classify(*r.failure)
	a.end(failed(r.failure, cls))
	a.tell(attemptEvent{Outcome: fleet.AttemptOutcome{First: a.first, Signal: cls.Signal}, Class: cls.Class, Header: r.failure.Header, Failure: r.failure})
	return cls, false
}

// addRetryCost counts one more attempt beyond the first, a retry or a
// hedge, at the estimated cost of an attempt.
func (c *call) addRetryCost() {
	c.retryCost += c.route.cost
	c.report.retryCost(c.retryCost)
}

// storeError logs a failure of a part's store, if any.
func (c *call) storeError(part storePart, op string, err error) {
	if err != nil {
		c.d.tel.logStoreError(c.ctx, part, op, err)
	}
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
	c.end(outcome)
	c.report.publish()
	if refusal != nil {
		refusal.Report = c.report.snapshot()
	} else if e, ok := err.(*Error); ok && e.Report == nil {
		e.Report = c.report.snapshot() // an *Error of the attempt, such as ErrHoldBackExceeded
	}
	if err != nil {
		CloseBody(a.res)
		return nil, err
	}
	return a.res, nil // an error status, handed on as it came
}

// providerError is the error the client would have returned for a.
func (a attemptResult) providerError(c *call) error {
	if a.failure == nil || a.failure.StatusCode == 0 {
		return a.err
	}
	req := c.req
	if c.route.b.client != nil && a.res.Request != nil {
		req = a.res.Request // the backend's, which answered
	}
	return c.client.StatusError(req, a.res, a.failure.Body)
}

// end ends the call, once, with outcome (see close). A stream ends the
// call itself, after its own end (StreamBody.finish).
func (c *call) end(outcome Outcome) {
	if c.ending.begin() {
		c.close(outcome)
		c.ending.done()
	}
}

// close records how the call ended, its duration and the budget's balance
// in its report, and ends its telemetry; once, under ending. It does not
// publish the report: only the caller's own goroutines do (publish), so
// that what the caller reads is never written under it.
func (c *call) close(outcome Outcome) {
	now := c.d.clock.Now()
	var balance float64
	// The balance is the budget's when the call ended: no store is asked
	// for it while the call goes on. A budget that knows it (in memory, or
	// as last heard from its store) tells it at no cost; another's costs a
	// round trip, which an answered call makes only for a report someone
	// reads: the caller's destination or a recording span. A failed call's
	// report also goes on its error and its log line.
	b := c.route.b.budget
	if kb, ok := b.(fleet.KnownBalancer); ok {
		balance = kb.KnownBalance(now)
	} else if outcome != OutcomeSuccess || c.report.hasSink() || c.trace.request != nil && c.trace.request.IsRecording() {
		var err error
		balance, err = b.Available(keepGoing(c.ctx, b), now)
		c.storeError(partBudget, "available", err)
	}
	c.report.settle(outcome, now.Sub(c.start), balance)
	if key := c.out.facts.prefix; key != 0 && outcome == OutcomeSuccess {
		c.d.affinity.record(key, c.route.b) // the backend that served the prefix: its cache holds it now
	}
	rep, last, n := c.report.final()
	c.spend(rep.Usage, now)
	c.trace.end(&rep, last, n, now)
}

// wantsUsage reports whether the call reads its answer's usage: for the
// rate limiter, the token metrics, its tenant's daily cost ceiling, or a
// report someone reads.
func (c *call) wantsUsage() bool {
	return c.d.policy.RateLimit != nil || c.trace.tokensOn() || c.tenant.HasCeiling() || c.report.hasSink()
}

// spend counts the cost of the answer's usage u, priced as the route the
// call ended on, in the day of its tenant's daily cost ceiling holding
// now: once, as the call ends, whatever its outcome (a canceled plain
// answer was paid for all the same). A model with no price counts nothing.
func (c *call) spend(u Usage, now time.Time) {
	t := c.tenant
	if !t.HasCeiling() || !u.Known || !c.route.priced {
		return
	}
	cost := usageCost(c.route.price, usage{input: u.InputTokens, cacheCreation: u.CacheCreationInputTokens,
		cacheRead: u.CacheReadInputTokens, output: u.OutputTokens})
	if cost > 0 {
		c.storeError(PartSpend, "add", t.spend.Add(keepGoing(c.ctx, t.spend), now, cost))
	}
}

// endOnce is a sync.Once in two halves, so that a stream can run its own
// end before the call's under the same once, with no function handed
// over: begin claims the end and holds it until done; any later begin
// waits until then, and reports false.
type endOnce struct {
	mu    sync.Mutex
	ended bool
}

// begin claims the end; true: the caller must call done.
func (e *endOnce) begin() bool {
	e.mu.Lock()
	if e.ended {
		e.mu.Unlock()
		return false
	}
	e.ended = true
	return true
}

// done lets the ends that wait for the first go on.
func (e *endOnce) done() { e.mu.Unlock() }
