package damper

import (
	"context"
	"errors"
	"net/http"
	"time"
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
)

// gates lists every gate.
var gates = []gate{gateAttempts, gateRetryAfter, gateDeadline, gateCost, gateBudget}

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
	retryAfter time.Duration // the provider's delay, when it had one
	asIs       bool          // the caller gets the last provider error as it is
}

// err is the *Error the caller gets for d, or nil when it gets the last
// provider error as it is.
func (d *denial) err() *Error {
	if d.asIs || d.gate.reason == nil {
		return nil
	}
	return &Error{Reason: d.gate.reason, RetryAfter: d.retryAfter}
}

// admitRetry runs the retry gates, in order, on the retry that would follow
// failed attempt n, and returns the wait before it, or the refusal of the
// first gate that refuses it. A provider delay past MaxRetryAfter is
// refused before the deadline is weighed: it is the more useful reason,
// since a queue can reschedule on it. The budget goes last, so that no
// unit is spent on a retry that another gate refuses.
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
	case p.MaxRetryCostUSD > 0 && (!c.report.Priced || retryCost+c.report.EstimatedCostUSD > p.MaxRetryCostUSD):
		return 0, &denial{gate: gateCost}
	}
	granted, err := c.d.budget.Acquire(c.ctx, now)
	c.budgetError("acquire", err)
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
		hint, hasHint = ParseRetryAfter(f.Header, now)
	}
	wait = backoff(n, p.BackoffBase, p.BackoffMax, min(hint, p.MaxRetryAfter), hasHint, p.MaxRetryAfter, rnd)
	return wait, hint, hasHint
}

// pastDeadline reports whether t is past the call's deadline.
func (c *call) pastDeadline(t time.Time) bool {
	deadline, ok := c.ctx.Deadline()
	return ok && t.After(deadline)
}

// attemptGate admits each attempt of a call, the first included, before it
// is sent: it may ask for a wait first, or refuse. No built-in gate runs
// there yet; a circuit breaker and a rate limiter are such gates.
type attemptGate interface {
	admitAttempt(ctx context.Context, n int, now time.Time) (wait time.Duration, refused *denial)
}

// attemptEvent is what an observer hears of an attempt as it ends.
type attemptEvent struct {
	outcome AttemptOutcome
	header  http.Header // the response's, when one came
	failure *Failure    // nil for an answered attempt
}

// attemptObserver hears the end of every attempt: the budget does, and a
// breaker or a limiter would, to learn the provider's health and limits.
type attemptObserver interface {
	observeAttempt(ctx context.Context, now time.Time, e attemptEvent)
}

// budgetObserver tells the retry budget of every attempt.
type budgetObserver struct {
	b   Budget
	tel *telemetry
}

func (o budgetObserver) observeAttempt(ctx context.Context, now time.Time, e attemptEvent) {
	// The budget's books are kept whatever becomes of the caller.
	if err := o.b.Observe(context.WithoutCancel(ctx), now, e.outcome); err != nil {
		o.tel.logBudgetError(ctx, "observe", err)
	}
}
