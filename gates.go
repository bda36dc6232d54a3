package damper

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/damper-ai/damper-go/fleet"
)

// The admission gates. Each is declared here with the outcome its refusal
// ends a call with and the sentinel the refusal's error matches, so that a
// new gate (a circuit breaker, a rate limiter) is one entry here and one
// check where it runs: before a retry (admitRetry) or before every attempt,
// the first included (attemptGate).

// Outcomes of a call that a gate refused.
const (
	OutcomeAttemptsExhausted Outcome = "attempts_exhausted" // MaxAttempts reached
	OutcomeRetryAfterTooLong Outcome = "retry_after_too_long"
	OutcomeDeadline          Outcome = "deadline"
	OutcomeCostCeiling       Outcome = "cost_ceiling"
	OutcomeBudgetExhausted   Outcome = "budget_exhausted"
	OutcomeCircuitOpen       Outcome = "circuit_open"
	OutcomeRetryThrottled    Outcome = "retry_throttled"
	OutcomeRateLimited       Outcome = "rate_limited"
)

// Sentinels of the gates' refusals.
var (
	// ErrRetryAfterTooLong: the provider asked for a longer delay than
	// Policy.MaxRetryAfter. [Error.RetryAfter] holds the delay.
	ErrRetryAfterTooLong = errors.New("damper: provider retry delay exceeds MaxRetryAfter")
	// ErrDeadline: the backoff and another attempt cannot finish before the
	// caller's deadline, so no retry was started.
	ErrDeadline = errors.New("damper: retry would not finish before the deadline")
	// ErrRetryCostCeiling: the retry would cross Policy.MaxRetryCostUSD,
	// or the model has no price while a ceiling is set.
	ErrRetryCostCeiling = errors.New("damper: retry cost ceiling reached")
	// ErrRetryBudgetExhausted: the shared retry budget had no unit left.
	ErrRetryBudgetExhausted = errors.New("damper: retry budget exhausted")
	// ErrCircuitOpen: the circuit breaker is open, or half-open with its
	// probe in flight, so nothing was sent. [Error.NextProbe] holds when
	// the breaker admits a probe, and [Error.RetryAfter] the time until
	// then.
	ErrCircuitOpen = errors.New("damper: circuit breaker open")
	// ErrRetryThrottled: the retry throttle had half of its tokens or
	// fewer left (see [ThrottlePolicy]).
	ErrRetryThrottled = errors.New("damper: retry throttled")
	// ErrRateLimited: the rate limiter could not admit the attempt within
	// RateLimitPolicy.MaxWait and the caller's deadline, so nothing was
	// sent. [Error.AdmitAt] holds when it could have been admitted, and
	// [Error.RetryAfter] the time until then.
	ErrRateLimited = errors.New("damper: rate limited")
)

// gate is one admission gate: the outcome of a call it refuses, and the
// sentinel of its refusal (nil: the caller gets the last provider error as
// it is).
type gate struct {
	outcome Outcome
	reason  error
}

var (
	gateAttempts   = gate{OutcomeAttemptsExhausted, nil}
	gateRetryAfter = gate{OutcomeRetryAfterTooLong, ErrRetryAfterTooLong}
	gateDeadline   = gate{OutcomeDeadline, ErrDeadline}
	gateCost       = gate{OutcomeCostCeiling, ErrRetryCostCeiling}
	gateBudget     = gate{OutcomeBudgetExhausted, ErrRetryBudgetExhausted}
	gateCircuit    = gate{OutcomeCircuitOpen, ErrCircuitOpen}
	gateThrottle   = gate{OutcomeRetryThrottled, ErrRetryThrottled}
	gateRateLimit  = gate{OutcomeRateLimited, ErrRateLimited}
)

// gates lists every gate.
var gates = []gate{gateAttempts, gateRetryAfter, gateDeadline, gateCost, gateBudget, gateCircuit, gateThrottle, gateRateLimit}

// isDenial reports whether outcome is a gate's refusal.
func isDenial(o Outcome) bool {
	for _, g := range gates {
		if g.outcome == o {
			return true
		}
	}
	return false
}

// denial is a gate's refusal.
type denial struct {
	gate       gate
	retryAfter time.Duration // the provider's delay, or the time to nextProbe or admitAt
	nextProbe  time.Time     // when an open breaker admits a probe
	admitAt    time.Time     // when the rate limiter could admit the attempt
	circuit    CircuitState  // the breaker's state, when the breaker refused
	asIs       bool          // the caller gets the last provider error as it is
}

// err is the *Error the caller gets for d, or nil when it gets the last
// provider error as it is.
func (d *denial) err() *Error {
	if d.asIs || d.gate.reason == nil {
		return nil
	}
	return &Error{Reason: d.gate.reason, RetryAfter: d.retryAfter, NextProbe: d.nextProbe, AdmitAt: d.admitAt}
}

// admitRetry runs the retry gates, in order, on the retry that would follow
// failed attempt n, and returns the wait before it, or the refusal of the
// first gate that refuses it. A provider delay past MaxRetryAfter is
// refused before the deadline is weighed: it is the more useful reason,
// since a queue can reschedule on it. The attempt gates are asked whether
// they would refuse the retry once its wait is over (an open breaker),
// and the throttle is asked, before the budget, which goes last: no unit is
// spent, and no wait started, for a retry that another gate refuses.
//
// rnd draws the jitter; it is called only for a retry that the attempts
// gate admits, so that a call's last attempt draws nothing.
func (c *call) admitRetry(n int, f *Failure, now time.Time, retryCost float64, rnd func() float64) (time.Duration, *denial) {
	p := &c.d.policy
	if n >= p.MaxAttempts {
		return 0, &denial{gate: gateAttempts}
	}
	wait, hint, hasHint := c.retryWait(n, f, now, rnd())
	switch {
	case hasHint && hint > p.MaxRetryAfter:
		return 0, &denial{gate: gateRetryAfter, retryAfter: hint}
	case c.pastDeadline(now.Add(wait + minAttempt)):
		return 0, &denial{gate: gateDeadline, retryAfter: hint}
	case c.pastCostCeiling(retryCost, c.route):
		return 0, &denial{gate: gateCost}
	}
	b := c.route.b
	for _, g := range b.attemptGates {
		if refused := g.refusesAt(c, now, now.Add(wait)); refused != nil {
			return 0, refused
		}
	}
	if t := b.throttle; t != nil && !t.allows(c) {
		return 0, &denial{gate: gateThrottle}
	}
	granted, err := b.budget.Acquire(c.ctx, now)
	c.storeError(partBudget, "acquire", err)
	if !granted {
		return 0, &denial{gate: gateBudget, asIs: p.OnBudgetExhausted == PassthroughBudgetExhausted}
	}
	return wait, nil
}

// retryWait is the wait before the retry that follows failed attempt n:
// full jitter, or the provider's delay (hint), honoured up to MaxRetryAfter.
func (c *call) retryWait(n int, f *Failure, now time.Time, rnd float64) (wait, hint time.Duration, hasHint bool) {
	p := &c.d.policy
	if !p.IgnoreRetryAfter && f.Header != nil {
		hint, hasHint = parseRetryAfter(f.Header, now)
	}
	wait = backoff(n, p.BackoffBase, p.BackoffMax, min(hint, p.MaxRetryAfter), hasHint, p.MaxRetryAfter, rnd)
	return wait, hint, hasHint
}

// pastCostCeiling reports whether one more attempt beyond the first, on
// route r, on top of retryCost spent so far, would cross the retry cost
// ceiling; with a ceiling set, an unpriced model crosses it.
func (c *call) pastCostCeiling(retryCost float64, r *route) bool {
	ceiling := c.d.policy.MaxRetryCostUSD
	return ceiling > 0 && (!r.priced || retryCost+r.cost > ceiling)
}

// pastDeadline reports whether t is past the call's deadline.
func (c *call) pastDeadline(t time.Time) bool {
	deadline, ok := c.ctx.Deadline()
	return ok && t.After(deadline)
}

// attemptGate admits each attempt n of call c, the first included, before
// it is sent: it may refuse it, or hand it a pass that hears how it ended.
// A gate that makes the attempt wait does so with c.waitUntil, which first
// asks the gates after it whether they would refuse the attempt by then.
// The rate limiter and the circuit breaker are attempt gates, in that order:
// the breaker admits its probe at the moment the attempt leaves.
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

	// What the breaker said, for the report and the attempt's span.
	circuit CircuitState
	probe   bool
}

// pass is a gate's admission of one attempt: it hears how that attempt
// ended, or a zero event when it was never sent.
type pass interface {
	settle(now time.Time, e attemptEvent)
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
}

// endPass is a pass that, for a stream, also hears the stream's end, with
// the usage of the whole answer: the rate limiter's.
type endPass interface {
	pass
	settleEnd(now time.Time, u usage)
}

// attemptObserver hears the end of every attempt: the budget and the
// throttle do, and a limiter would, to learn the provider's limits.
type attemptObserver interface {
	observeAttempt(ctx context.Context, now time.Time, e attemptEvent)
}

// budgetObserver tells the retry budget of every attempt.
type budgetObserver struct {
	b   fleet.Budget
	tel *telemetry
}

func (o budgetObserver) observeAttempt(ctx context.Context, now time.Time, e attemptEvent) {
	// The budget's books are kept whatever becomes of the caller.
	if err := o.b.Observe(keepGoing(ctx, o.b), now, e.outcome); err != nil {
		o.tel.logStoreError(ctx, partBudget, "observe", err)
	}
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
