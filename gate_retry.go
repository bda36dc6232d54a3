package damper

import (
	"errors"
	"time"
)

// The built-in retry rules: attempts left, the provider's delay, the
// caller's deadline and the retry cost ceiling. They keep no state of
// their own, read the Policy's fields (MaxAttempts, MaxRetryAfter,
// IgnoreRetryAfter, MaxRetryCostUSD) and the call, and act before a retry
// and before a hedge, taking nothing.

// Outcomes of a call that a retry rule refused.
const (
	OutcomeAttemptsExhausted Outcome = "attempts_exhausted" // MaxAttempts reached
	OutcomeRetryAfterTooLong Outcome = "retry_after_too_long"
	OutcomeDeadline          Outcome = "deadline"
	OutcomeCostCeiling       Outcome = "cost_ceiling"
)

// Sentinels of the retry rules' refusals.
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
)

// The rules as gates. A refusal moves a call to its next backend, but the
// cost ceiling's: the ceiling is the call's, wherever it goes. The attempts
// rule refuses with no sentinel: the caller gets the last provider error.
var (
	gateAttempts   = &gate{outcome: OutcomeAttemptsExhausted, moves: true, part: always(hooks{retry: attemptsRule{}, hedge: attemptsRule{}})}
	gateRetryAfter = &gate{outcome: OutcomeRetryAfterTooLong, reason: ErrRetryAfterTooLong, moves: true, part: always(hooks{retry: retryAfterRule{}})}
	gateDeadline   = &gate{outcome: OutcomeDeadline, reason: ErrDeadline, moves: true, part: always(hooks{retry: deadlineRule{}, hedge: deadlineRule{}})}
	gateCost       = &gate{outcome: OutcomeCostCeiling, reason: ErrRetryCostCeiling, part: always(hooks{retry: costRule{}, hedge: costRule{}})}
)

// always is the part func of a rule every backend has, acting through h.
func always(h hooks) func(*Damper, *backend) (hooks, error) {
	return func(*Damper, *backend) (hooks, error) { return h, nil }
}

// attemptsRule refuses a retry or hedge past MaxAttempts on the call's
// backend.
type attemptsRule struct{}

func (attemptsRule) refusesRetry(c *call, r *retryAsk) *denial {
	if r.n >= c.d.policy.MaxAttempts {
		return &denial{gate: gateAttempts}
	}
	return nil
}

func (attemptsRule) refusesHedge(c *call, _ time.Time) *denial {
	if c.report.Attempts+1-c.routeFrom > c.d.policy.MaxAttempts {
		return &denial{gate: gateAttempts}
	}
	return nil
}

// retryAfterRule refuses a retry whose provider delay is past
// MaxRetryAfter. It comes before the deadline: it is the more useful
// reason, since a queue can reschedule on it.
type retryAfterRule struct{}

func (retryAfterRule) refusesRetry(c *call, r *retryAsk) *denial {
	if w := r.backoff(c); w.hasHint && w.hint > c.d.policy.MaxRetryAfter {
		return &denial{gate: gateRetryAfter, retryAfter: w.hint}
	}
	return nil
}

// deadlineRule refuses a retry whose wait and least attempt, or a hedge
// whose least attempt, would end past the caller's deadline.
type deadlineRule struct{}

func (deadlineRule) refusesRetry(c *call, r *retryAsk) *denial {
	if w := r.backoff(c); pastDeadline(c, r.now.Add(w.wait+minAttempt)) {
		return &denial{gate: gateDeadline, retryAfter: w.hint}
	}
	return nil
}

func (deadlineRule) refusesHedge(c *call, now time.Time) *denial {
	if pastDeadline(c, now.Add(minAttempt)) {
		return &denial{gate: gateDeadline}
	}
	return nil
}

// costRule refuses a retry or hedge that would cross the retry cost
// ceiling.
type costRule struct{}

func (costRule) refusesRetry(c *call, r *retryAsk) *denial {
	if pastCostCeiling(c, r.retryCost, c.route) {
		return &denial{gate: gateCost}
	}
	return nil
}

func (costRule) refusesHedge(c *call, _ time.Time) *denial {
	if pastCostCeiling(c, c.retryCost, c.route) {
		return &denial{gate: gateCost}
	}
	return nil
}

// pastCostCeiling reports whether one more attempt beyond the first, on
// route r, on top of retryCost spent so far, would cross c's retry cost
// ceiling; with a ceiling set, an unpriced model crosses it.
func pastCostCeiling(c *call, retryCost float64, r *route) bool {
	ceiling := c.d.policy.MaxRetryCostUSD
	return ceiling > 0 && (!r.priced || retryCost+r.cost > ceiling)
}

// pastDeadline reports whether t is past c's deadline.
func pastDeadline(c *call, t time.Time) bool {
	deadline, ok := c.ctx.Deadline()
	return ok && t.After(deadline)
}
