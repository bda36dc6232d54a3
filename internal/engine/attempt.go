package engine

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptrace"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// One attempt: its admission's passes, its context and timer, its sending
// and its end.

// attempt is one provider attempt of a call. It owns its context, its
// timer and its span, and ends exactly once (end): a failed attempt when
// the loop has classified it, a plain answer once read, a stream when the
// stream ends. Its I/O may be over before its end (over): a failure's
// connection is released at once, its record written once classified.
type attempt struct {
	c     *call
	start time.Time
	ctx   context.Context
	// A plain attempt alone has its timeout as its context's deadline,
	// ended by stop, or none at all when the caller's deadline comes
	// first (inCallCtx). Any other (a stream, whose timer stops at its
	// first content; a hedge, cancelled with a cause; an attempt on a
	// virtual clock) has a timer of its own, and cancel.
	stop      context.CancelFunc
	cancel    context.CancelCauseFunc
	stopTimer func() bool
	inCallCtx bool          // ctx is the call's own: the caller's deadline bounds the attempt
	span      trace.Span    // nil without tracing
	n         int           // its number in the call, from 1
	route     *route        // where it goes
	first     bool          // the call's first attempt on its backend
	duration  time.Duration // set by over
	hedge     bool          // sent beside another attempt (race)
	queued    time.Duration // waited in the rate limiter's line before it
	timing    *sendTrace    // its exchange timed, when a pass compares the provider's latency
	isOver    atomic.Bool
	ended     atomic.Bool

	// passes are the gates' passes of the attempt, settled when it ends
	// (settle); the loop alone touches them. endPasses are those of a
	// stream handed to its caller that hear its end (settleEnd), which
	// touches them then.
	passes    []pass
	passBuf   [3]pass
	endPasses []endPass
	// notes are what the gates said of the attempt as they admitted it,
	// noted in its record as it ends.
	notes   []gateNote
	noteBuf [1]gateNote

	// race is the race the attempt runs in, nil when it runs alone: the
	// first attempt of a race to answer claims the win.
	race *race
}

// newAttempt is attempt n of c, before the gates admit it.
// The call's first attempt is kept in the call itself.
func (c *call) newAttempt(n int, hedge bool) *attempt {
	a := &c.firstAttempt
	if c.attempted {
		a = new(attempt)
	}
	c.attempted = true
	*a = attempt{c: c, n: n, hedge: hedge, route: c.route, first: !hedge && n == c.routeFrom+1}
	a.passes, a.notes = a.passBuf[:0], a.noteBuf[:0]
	return a
}

// startAttempt starts attempt a, admitted: its context, under the call's,
// carries the attempt's span, and its timer cancels it after
// PerAttemptTimeout.
func (c *call) startAttempt(a *attempt) {
	a.start = c.d.clock.Now()
	var ctx context.Context
	if c.d.realClock && c.d.hedge == nil && !c.stream {
		deadline := a.start.Add(c.d.policy.PerAttemptTimeout)
		if d, ok := c.ctx.Deadline(); ok && !d.After(deadline) {
			// The caller's deadline comes first and bounds the attempt,
			// whose I/O is over once its answer is read: it needs no
			// context of its own.
			ctx, a.stop, a.inCallCtx = c.ctx, func() {}, true
		} else {
			// One timer, the context's own.
			ctx, a.stop = context.WithDeadlineCause(c.ctx, deadline, c.d.timeoutCause)
		}
	} else {
		var cancel context.CancelCauseFunc
		ctx, cancel = context.WithCancelCause(c.ctx)
		a.cancel = cancel
		a.stopTimer = c.d.clock.AfterFunc(c.d.policy.PerAttemptTimeout, func() { cancel(c.d.timeoutCause) })
	}
	a.ctx, a.span = c.trace.attemptStart(ctx, a.start, a.n, a.hedge)
	if a.span != nil {
		for _, p := range a.passes {
			if sp, ok := p.(spanPass); ok {
				a.span.SetAttributes(sp.SpanAttributes()...)
			}
		}
	}
	a.inCallCtx = a.inCallCtx && a.span == nil // a span comes in a context of its own
	c.report.started(a.n, a.queued, a.hedge)
}

// cause turns the transport's "context canceled" into the attempt's
// timeout when its timer, not the caller, ended it, and into errHedgeLost
// when another attempt of its race answered first.
func (a *attempt) cause(err error) error {
	if err == nil || a.c.ctx.Err() != nil {
		return err
	}
	switch cause := context.Cause(a.ctx); {
	case errors.Is(cause, ErrAttemptTimeout):
		return a.c.d.timeoutCause
	case cause == errHedgeLost:
		return errHedgeLost
	}
	return err
}

// over ends the attempt's I/O, once: it stops the timer, cancels the
// attempt's context (so the transport lets go of the connection) and
// fixes the attempt's duration.
func (a *attempt) over() {
	if !a.isOver.CompareAndSwap(false, true) {
		return
	}
	if a.stop != nil {
		a.stop()
	} else {
		a.stopTimer()
		a.cancel(nil)
	}
	a.duration = a.c.d.clock.Now().Sub(a.start)
}

// end ends the attempt, once, and records it in the report and telemetry.
func (a *attempt) end(ar AttemptReport) {
	a.over()
	if !a.ended.CompareAndSwap(false, true) {
		return
	}
	ar.Duration = a.duration
	for _, n := range a.notes {
		ar = n.NoteAttempt(ar)
	}
	ar.Hedge = a.hedge
	ar.RateLimitWait = a.queued
	ar.Backend, ar.Model = a.route.b.name, a.route.sentModel()
	a.c.report.record(a.n, ar)
	a.c.trace.attemptEnd(a.span, ar)
}

// tell tells the attempt's passes (settle) and its backend's observers
// how it ended.
func (a *attempt) tell(e attemptEvent) {
	e.Tenant = a.c.tenant.forGates()
	a.settle(e)
	now := a.c.d.clock.Now()
	for _, o := range a.route.b.observers {
		o.ObserveAttempt(a.c.ctx, now, e)
	}
}

// settle settles the attempt's passes with e; those of a stream handed to
// its caller that hear its end are kept for it (settleEnd).
func (a *attempt) settle(e attemptEvent) {
	if len(a.passes) == 0 {
		return
	}
	now := a.c.d.clock.Now()
	for _, p := range a.passes {
		p.Settle(now, e)
		if ep, ok := p.(endPass); ok && e.StreamOpen {
			a.endPasses = append(a.endPasses, ep)
		}
	}
	a.passes = a.passes[:0]
}

// settleEnd settles the passes kept for a stream's end with the usage of
// its answer.
func (a *attempt) settleEnd(u usage) {
	if len(a.endPasses) == 0 {
		return
	}
	now := a.c.d.clock.Now()
	for _, p := range a.endPasses {
		p.SettleEnd(now, u.public())
	}
	a.endPasses = nil
}

// succeeded is the record of an answered attempt.
func succeeded(res *http.Response) AttemptReport {
	return AttemptReport{StatusCode: res.StatusCode, RequestID: res.Header.Get("Request-Id")}
}

// failed is the record of a failed attempt, as classified.
func failed(f *Failure, cls Classification) AttemptReport {
	ar := AttemptReport{StatusCode: f.StatusCode, Class: cls.Class, Kind: cls.Kind}
	if f.Header != nil {
		ar.RequestID = f.Header.Get("Request-Id")
	}
	if f.Err != nil {
		ar.Err = f.Err.Error()
	}
	return ar
}

// attemptResult is what an attempt came to: a response to hand over, a
// failure to classify, or both (an error status).
type attemptResult struct {
	res     *http.Response
	err     error // the transport error, as the SDK would return it
	failure *Failure
	stream  *StreamBody // res.Body of an answered stream, which ends with the call's context
	usage   usage       // a plain answer's, read for the rate limiter
	// firstAt is when a plain answer's headers, or a stream's first
	// content, came: zero when they did not.
	firstAt time.Time
}

// send sends attempt a and reads its answer within it: a plain one whole
// (readWhole, answer.go), a stream up to its first content (holdBack,
// stream.go). A plain answer's attempt ends here; a failure's I/O is
// over; a stream's attempt goes on while its caller reads it.
func (a *attempt) send() attemptResult {
	c := a.c
	ctx, inCallCtx := a.ctx, a.inCallCtx
	if a.timesProvider() {
		a.timing = &sendTrace{clock: c.d.clock}
		ctx, inCallCtx = httptrace.WithClientTrace(ctx, a.timing.clientTrace()), false
	}
	areq, err := c.out.forAttempt(ctx, a.n, inCallCtx, a.route.body != nil)
	if err != nil {
		a.over()
		return attemptResult{err: err, failure: &Failure{Err: err}}
	}
	if a.timing != nil {
		a.timing.sent = c.d.clock.Now()
	}
	res, err := a.route.send(areq, c.next)
	if a.timing != nil {
		a.timing.head = c.d.clock.Now()
	}
	if err != nil {
		err = a.cause(err)
		a.over()
		CloseBody(res)
		return attemptResult{err: err, failure: &Failure{Err: err}}
	}
	if c.stream && res.StatusCode < 400 {
		r := a.holdBack(res)
		if a.timing != nil {
			a.timing.content = r.firstAt
		}
		return r
	}
	return a.readWhole(res)
}

// timesProvider reports whether a pass of the attempt wants its exchange
// timed (sendTrace).
func (a *attempt) timesProvider() bool {
	for _, p := range a.passes {
		if lp, ok := p.(latencyPass); ok && lp.TimesProvider() {
			return true
		}
	}
	return false
}

// sendTrace times an attempt's exchange with the provider on the Damper's
// clock: when the request went to the transport and when the transport
// wrote it, when the answer's first byte came and when its headers were
// handed back, and a stream's first content. The transport reports the
// writing and the first byte (httptrace), from goroutines of its own; one
// that does not (a RoundTripper that is not net/http's) leaves the times
// the request is handed over and the headers handed back.
type sendTrace struct {
	clock   Clock
	sent    time.Time // the request handed to the transport
	head    time.Time // the response's headers handed back
	content time.Time // a stream's first content
	// wrote and firstByte are nanoseconds after sent, plus 1; 0 until the
	// transport reports them.
	wrote, firstByte atomic.Int64
	hooks            httptrace.ClientTrace // in the same allocation
}

func (t *sendTrace) clientTrace() *httptrace.ClientTrace {
	t.hooks.WroteRequest = func(info httptrace.WroteRequestInfo) {
		if info.Err == nil {
			t.wrote.Store(int64(t.clock.Now().Sub(t.sent)) + 1)
		}
	}
	t.hooks.GotFirstResponseByte = func() { t.firstByte.Store(int64(t.clock.Now().Sub(t.sent)) + 1) }
	return &t.hooks
}

// latency is the provider's part of an answered attempt's time: from its
// request written to its answer's first byte (a plain answer, which the
// provider sends once it is whole) or to a stream's first content. Not in
// it: the wait for a connection and the writing of the request, the
// reading of a plain answer's body, and the process's own scheduling
// around them, all of which grow with the load of the process and of its
// machine, not with the provider's.
func (t *sendTrace) latency(stream bool) time.Duration {
	from, to := t.sent, t.head
	if w := t.wrote.Load(); w > 0 {
		from = t.sent.Add(time.Duration(w - 1))
	}
	switch f := t.firstByte.Load(); {
	case stream:
		to = t.content
	case f > 0:
		to = t.sent.Add(time.Duration(f - 1))
	}
	return max(to.Sub(from), 0)
}
