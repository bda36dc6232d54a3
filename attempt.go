package damper

import (
	"context"
	"errors"
	"net/http"
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
	probe     bool          // the breaker's probe
	hedge     bool          // sent beside another attempt (race)
	queued    time.Duration // waited in the rate limiter's line before it
	isOver    atomic.Bool
	ended     atomic.Bool

	// passes are the gates' passes of the attempt, settled when it ends
	// (settle); the loop alone touches them. endPasses are those of a
	// stream handed to its caller that hear its end (settleEnd), which
	// touches them then.
	passes    []pass
	passBuf   [3]pass
	endPasses []endPass

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
	a.passes = a.passBuf[:0]
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
	a.ctx, a.span = c.trace.attemptStart(ctx, a.start, a.n, a.probe, a.hedge)
	if a.span != nil {
		for _, p := range a.passes {
			if sp, ok := p.(spanPass); ok {
				a.span.SetAttributes(sp.spanAttributes()...)
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
	ar.Probe = a.probe
	ar.Hedge = a.hedge
	ar.RateLimitWait = a.queued
	ar.Backend, ar.Model = a.route.b.name, a.route.sentModel()
	a.c.report.record(a.n, ar)
	a.c.trace.attemptEnd(a.span, ar)
}

// tell tells the attempt's passes (settle) and its backend's observers
// how it ended.
func (a *attempt) tell(e attemptEvent) {
	a.settle(e)
	now := a.c.d.clock.Now()
	for _, o := range a.route.b.observers {
		o.observeAttempt(a.c.ctx, now, e)
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
		p.settle(now, e)
		if ep, ok := p.(endPass); ok && e.streamOpen {
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
		p.settleEnd(now, u)
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
	stream  *streamBody // res.Body of an answered stream, which ends with the call's context
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
	areq, err := c.out.forAttempt(a.ctx, a.n, a.inCallCtx, a.route.body != nil)
	if err != nil {
		a.over()
		return attemptResult{err: err, failure: &Failure{Err: err}}
	}
	res, err := a.route.send(areq, c.next)
	if err != nil {
		err = a.cause(err)
		a.over()
		closeBody(res)
		return attemptResult{err: err, failure: &Failure{Err: err}}
	}
	if c.stream && res.StatusCode < 400 {
		return a.holdBack(res)
	}
	return a.readWhole(res)
}
