package engine

import (
	"time"

	"github.com/damper-ai/damper-go/internal/gates/retry"
)

// The built-in retry rules' names (package internal/gates/retry): attempts
// left, the provider's delay, the caller's deadline and the retry cost
// ceiling.

// Outcomes of a call that a retry rule refused.
const (
	OutcomeAttemptsExhausted = retry.OutcomeAttemptsExhausted // MaxAttempts reached
	OutcomeRetryAfterTooLong = retry.OutcomeRetryAfterTooLong
	OutcomeDeadline          = retry.OutcomeDeadline
	OutcomeCostCeiling       = retry.OutcomeCostCeiling
)

// Sentinels of the retry rules' refusals.
var (
	// ErrRetryAfterTooLong: the provider asked for a longer delay than
	// Policy.MaxRetryAfter. [Error.RetryAfter] holds the delay.
	ErrRetryAfterTooLong = retry.ErrRetryAfterTooLong
	// ErrDeadline: the backoff and another attempt cannot finish before the
	// caller's deadline, so no retry was started.
	ErrDeadline = retry.ErrDeadline
	// ErrRetryCostCeiling: the retry would cross Policy.MaxRetryCostUSD,
	// or the model has no price while a ceiling is set.
	ErrRetryCostCeiling = retry.ErrRetryCostCeiling
)

// retryPolicy is the retry rules' part of p: fields of the Policy itself.
func retryPolicy(p *Policy) *retry.Policy {
	return &retry.Policy{MaxAttempts: p.MaxAttempts, MaxRetryAfter: p.MaxRetryAfter, MaxRetryCostUSD: p.MaxRetryCostUSD}
}

// pastCostCeiling reports whether one more attempt beyond the first, on
// route r, on top of retryCost spent so far, would cross c's retry cost
// ceiling; with a ceiling set, an unpriced model crosses it.
func pastCostCeiling(c *call, retryCost float64, r *route) bool {
	return retry.PastCostCeiling(c.d.policy.MaxRetryCostUSD, retryCost, r.cost, r.priced)
}

// pastDeadline reports whether t is past c's deadline.
func pastDeadline(c *call, t time.Time) bool {
	return retry.PastDeadline(c.forGates(), t)
}
