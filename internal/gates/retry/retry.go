// Package retry is the built-in retry rules as gates: attempts left, the
// provider's delay, the caller's deadline and the retry cost ceiling. They
// keep no state of their own, read their Policy (the Damper's MaxAttempts,
// MaxRetryAfter and MaxRetryCostUSD) and the call, and act before a retry
// and before a hedge, taking nothing.
package retry

import (
	"errors"
	"time"

	"github.com/damper-ai/damper-go/internal/core"
)

// Policy is what the rules read of the Damper's Policy.
type Policy struct {
	MaxAttempts     int
	MaxRetryAfter   time.Duration
	MaxRetryCostUSD float64
}

// Outcomes of a call that a retry rule refused.
const (
	OutcomeAttemptsExhausted core.Outcome = "attempts_exhausted" // MaxAttempts reached
	OutcomeRetryAfterTooLong core.Outcome = "retry_after_too_long"
	OutcomeDeadline          core.Outcome = "deadline"
	OutcomeCostCeiling       core.Outcome = "cost_ceiling"
)

// Sentinels of the retry rules' refusals.
var (
	// ErrRetryAfterTooLong: the provider asked for a longer delay than
	// Policy.MaxRetryAfter. [core.Error.RetryAfter] holds the delay.
	ErrRetryAfterTooLong = errors.New("damper: provider retry delay exceeds MaxRetryAfter")
	// ErrDeadline: the backoff and another attempt cannot finish before the
	// caller's deadline, so no retry was started.
	ErrDeadline = errors.New("damper: retry would not finish before the deadline")
	// ErrRetryCostCeiling: the retry would cross Policy.MaxRetryCostUSD,
	// or the model has no price while a ceiling is set.
	ErrRetryCostCeiling = errors.New("damper: retry cost ceiling reached")
)

// The rules as gates. A refusal moves a call to its next backend, but the
// cost ceiling's: the ceiling is the call's, wherever it goes. The attempts
// rule refuses with no sentinel: the caller gets the last provider error.
var (
	Attempts   = &core.Gate{Outcome: OutcomeAttemptsExhausted, Moves: true}
	RetryAfter = &core.Gate{Outcome: OutcomeRetryAfterTooLong, Reason: ErrRetryAfterTooLong, Moves: true}
	Deadline   = &core.Gate{Outcome: OutcomeDeadline, Reason: ErrDeadline, Moves: true}
	Cost       = &core.Gate{Outcome: OutcomeCostCeiling, Reason: ErrRetryCostCeiling}
)

// AttemptsPart is the attempts rule on every backend.
func AttemptsPart(p *Policy, _ *core.Backend, _ *core.Env) (core.Hooks, error) {
	r := attemptsRule{p.MaxAttempts}
	return core.Hooks{Retry: r, Hedge: r}, nil
}

// RetryAfterPart is the provider delay's rule on every backend.
func RetryAfterPart(p *Policy, _ *core.Backend, _ *core.Env) (core.Hooks, error) {
	return core.Hooks{Retry: retryAfterRule{p.MaxRetryAfter}}, nil
}

// DeadlinePart is the deadline's rule on every backend.
func DeadlinePart(*Policy, *core.Backend, *core.Env) (core.Hooks, error) {
	return core.Hooks{Retry: deadlineRule{}, Hedge: deadlineRule{}}, nil
}

// CostPart is the cost ceiling's rule on every backend.
func CostPart(p *Policy, _ *core.Backend, _ *core.Env) (core.Hooks, error) {
	r := costRule{p.MaxRetryCostUSD}
	return core.Hooks{Retry: r, Hedge: r}, nil
}

// attemptsRule refuses a retry or hedge past MaxAttempts on the call's
// backend.
type attemptsRule struct{ max int }

func (r attemptsRule) RefusesRetry(_ core.Call, a *core.RetryAsk) *core.Denial {
	if a.N >= r.max {
		return &core.Denial{Gate: Attempts}
	}
	return nil
}

func (r attemptsRule) RefusesHedge(c core.Call, _ time.Time) *core.Denial {
	if c.Attempts()+1-c.RouteFrom() > r.max {
		return &core.Denial{Gate: Attempts}
	}
	return nil
}

// retryAfterRule refuses a retry whose provider delay is past
// MaxRetryAfter. It comes before the deadline: it is the more useful
// reason, since a queue can reschedule on it.
type retryAfterRule struct{ max time.Duration }

func (r retryAfterRule) RefusesRetry(_ core.Call, a *core.RetryAsk) *core.Denial {
	if w := a.Backoff(); w.HasHint && w.Hint > r.max {
		return &core.Denial{Gate: RetryAfter, RetryAfter: w.Hint}
	}
	return nil
}

// deadlineRule refuses a retry whose wait and least attempt, or a hedge
// whose least attempt, would end past the caller's deadline.
type deadlineRule struct{}

func (deadlineRule) RefusesRetry(c core.Call, a *core.RetryAsk) *core.Denial {
	if w := a.Backoff(); PastDeadline(c, a.Now.Add(w.Wait+core.MinAttempt)) {
		return &core.Denial{Gate: Deadline, RetryAfter: w.Hint}
	}
	return nil
}

func (deadlineRule) RefusesHedge(c core.Call, now time.Time) *core.Denial {
	if PastDeadline(c, now.Add(core.MinAttempt)) {
		return &core.Denial{Gate: Deadline}
	}
	return nil
}

// costRule refuses a retry or hedge that would cross the retry cost
// ceiling.
type costRule struct{ ceiling float64 }

func (r costRule) RefusesRetry(c core.Call, a *core.RetryAsk) *core.Denial {
	cost, priced := c.RouteCost()
	if PastCostCeiling(r.ceiling, a.RetryCost, cost, priced) {
		return &core.Denial{Gate: Cost}
	}
	return nil
}

func (r costRule) RefusesHedge(c core.Call, _ time.Time) *core.Denial {
	cost, priced := c.RouteCost()
	if PastCostCeiling(r.ceiling, c.RetryCost(), cost, priced) {
		return &core.Denial{Gate: Cost}
	}
	return nil
}

// PastCostCeiling reports whether one more attempt of cost (when priced),
// on top of retryCost spent so far, would cross ceiling; with a ceiling
// set, an unpriced model crosses it.
func PastCostCeiling(ceiling, retryCost, cost float64, priced bool) bool {
	return ceiling > 0 && (!priced || retryCost+cost > ceiling)
}

// PastDeadline reports whether t is past c's deadline.
func PastDeadline(c core.Call, t time.Time) bool {
	deadline, ok := c.Context().Deadline()
	return ok && t.After(deadline)
}
