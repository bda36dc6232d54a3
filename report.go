package damper

import (
	"time"
)

// Outcome is how a logical request ended.
type Outcome string

// Outcomes of a logical request that no gate decided. The outcomes of the
// admission gates, which refuse a retry, are declared with the gates
// (gates.go).
const (
	OutcomeSuccess   Outcome = "success"
	OutcomeError     Outcome = "error"    // a failure that is not retried
	OutcomeCanceled  Outcome = "canceled" // the caller's context ended
	OutcomeAmbiguous Outcome = "ambiguous"
)

// Report is the account of one logical request: what Damper tried, what it
// cost, and why it stopped. It is filled in when the call returns; a
// stream's is filled in when the stream is handed over, with no Outcome
// yet, and again when it ends (see the package documentation, Streams).
type Report struct {
	// Provider is the platform of the backend the last attempt went to:
	// for the client's own, "anthropic" or the platform it is pointed at.
	Provider string
	// Model is the model the caller asked for; each attempt's record says
	// what it sent.
	Model  string
	Stream bool
	// Backend is the backend the last attempt went to, the one that
	// answered if any: "primary" for the client's own (see [WithBackends]).
	Backend string
	// Fallbacks lists the call's moves from a backend or a model to the
	// next, in order (see [FallbackPolicy]).
	Fallbacks []Fallback
	// Skipped lists the backends of [WithBackends] the call cannot move
	// to with its model, or with a sibling of [FallbackPolicy].Models, and
	// why: it falls back to the others alone, or not at all. It is known
	// when the call starts, so it is filled in whether or not the call
	// needed to move.
	Skipped []Skip

	Attempts int
	// Outcome is how the call ended; empty while a stream is still open.
	Outcome Outcome

	// EstimatedCostUSD is the estimated cost of one attempt; Priced is
	// false when the model has no price, and the estimate is then 0.
	EstimatedCostUSD float64
	Priced           bool
	// RetryCostUSD is the summed estimated cost of the attempts made
	// beyond the first: retries, hedges and fallbacks.
	RetryCostUSD float64
	// BudgetBalance is the retry budget's balance when the call ended.
	BudgetBalance float64
	// Circuit is the breaker's state when it last admitted or refused an
	// attempt of the call; zero when the Policy has no breaker.
	Circuit CircuitState
	// LimitGroup is the rate limiter's group of the call's model (see
	// [LimitGroup]); empty when the Policy has no rate limiter.
	LimitGroup string
	// RateLimitWait is the time the call's attempts waited in the rate
	// limiter's line, in all.
	RateLimitWait time.Duration
	// Hedges is the number of hedges sent (see [HedgePolicy]); HedgeWon is
	// whether one of them gave the answer the caller got.
	Hedges   int
	HedgeWon bool

	// Duration is the time from the first attempt to the end of the call.
	Duration time.Duration
	// FirstContent is, for a stream, the time from the start of the call to
	// the first content reaching the caller.
	FirstContent time.Duration

	// AttemptLog has one entry per attempt that has ended, in order. A
	// stream's last attempt ends with the stream, so while a stream is
	// open its report counts one more attempt than it logs.
	AttemptLog []AttemptReport
}

// AttemptReport describes one provider attempt.
type AttemptReport struct {
	// StatusCode is the HTTP status of the attempt's response: 0 when none
	// arrived, or when a stream's 200 failed before its first content (the
	// failure is its SSE error event or its transport's); a stream that
	// failed after content keeps its 200.
	StatusCode int
	// Class and Kind classify a failed attempt (see [Classification]);
	// both are zero for a success.
	Class Class
	Kind  string
	// Err is the attempt's error text, for failures without a status.
	Err       string
	RequestID string
	// Backend is the backend the attempt went to ("primary" for the
	// client's own) and Model the model it sent, as that backend names it.
	Backend, Model string
	Duration       time.Duration
	// Backoff is the wait before the next attempt, 0 when none followed.
	Backoff time.Duration
	// Probe is true for the attempt a half-open breaker let through.
	Probe bool
	// RateLimitWait is the time the attempt waited in the rate limiter's
	// line before it was sent.
	RateLimitWait time.Duration
	// Hedge is true for an attempt sent beside another (see
	// [HedgePolicy]).
	Hedge bool
	// Lost is true for an attempt cancelled because another attempt of its
	// call answered first; its Kind is "hedge_lost".
	Lost bool
}
