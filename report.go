package damper

import (
	"context"
	"net/http"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2/option"
)

// Outcome is how a logical request ended.
type Outcome string

// Outcomes of a logical request. The Denied* outcomes name the admission
// gate that refused a retry.
const (
	OutcomeSuccess           Outcome = "success"
	OutcomeError             Outcome = "error"              // a failure that is not retried
	OutcomeAttemptsExhausted Outcome = "attempts_exhausted" // MaxAttempts reached
	OutcomeBudgetExhausted   Outcome = "budget_exhausted"
	OutcomeCostCeiling       Outcome = "cost_ceiling"
	OutcomeRetryAfterTooLong Outcome = "retry_after_too_long"
	OutcomeDeadline          Outcome = "deadline"
	OutcomeCanceled          Outcome = "canceled" // the caller's context ended
	OutcomeAmbiguous         Outcome = "ambiguous"
)

// Report is the account of one logical request: what Damper tried, what it
// cost, and why it stopped. It is filled in when the call returns; a
// stream's is filled in when the stream is handed over, with no Outcome
// yet, and again when it ends (see the package documentation, Streams).
type Report struct {
	Provider string // "anthropic", or the platform the client is pointed at
	Model    string
	Stream   bool

	Attempts int
	// Outcome is how the call ended; empty while a stream is still open.
	Outcome Outcome

	// EstimatedCostUSD is the estimated cost of one attempt; Priced is
	// false when the model has no price, and the estimate is then 0.
	EstimatedCostUSD float64
	Priced           bool
	// RetryCostUSD is the summed estimated cost of the retries made.
	RetryCostUSD float64
	// BudgetBalance is the retry budget's balance when the call ended.
	BudgetBalance float64

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
	// StatusCode is the HTTP status, 0 when no response arrived.
	StatusCode int
	// Class and Kind classify a failed attempt (see [Classification]);
	// both are zero for a success.
	Class Class
	Kind  string
	// Err is the attempt's error text, for failures without a status.
	Err       string
	RequestID string
	Duration  time.Duration
	// Backoff is the wait before the next attempt, 0 when none followed.
	Backoff time.Duration
}

// reportSinkKey carries the *Report of [ReportInto] to Damper's middleware.
type reportSinkKey struct{}

// ReportInto is a per-call option that makes Damper write the call's
// [Report] into dst once the call returns (and again when a stream ends).
// It works whichever order it is given in with the Damper option; without
// a Damper on the client it leaves dst untouched.
func ReportInto(dst *Report) option.RequestOption {
	return option.WithMiddleware(func(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		if c, ok := req.Context().Value(callKey{}).(*call); ok {
			// The option is inside Damper's middleware: this is one attempt.
			c.setSink(dst)
			return next(req)
		}
		return next(req.WithContext(context.WithValue(req.Context(), reportSinkKey{}, dst)))
	})
}
