package damper

// The vocabulary of a call as the package names it: aliases of the
// engine's types, and its outcomes and errors re-declared from the
// engine's, so that == and errors.Is hold across both names.

import (
	"context"
	"github.com/damper-ai/damper-go/internal/engine"
)

// Outcome is how a logical request ended.
type Outcome = engine.Outcome

// The outcomes no gate decides.
const (
	// OutcomeSuccess: the call got its answer.
	OutcomeSuccess = engine.OutcomeSuccess
	// OutcomeError: a failure that is not retried.
	OutcomeError = engine.OutcomeError
	// OutcomeCanceled: the caller's context ended.
	OutcomeCanceled = engine.OutcomeCanceled
	// OutcomeAmbiguous: a failure after part of the answer may have
	// reached the caller, so not retried.
	OutcomeAmbiguous = engine.OutcomeAmbiguous
)

// Report is the account of one logical request: what Damper tried, what it
// cost, and why it stopped. It is filled in when the call returns; a
// stream's is filled in when the stream is handed over, with no Outcome
// yet, and again when it ends (see the package documentation, Streams).
//
// Its fields are documented on [github.com/damper-ai/damper-go/internal/core.Report].
type Report = engine.Report

// Usage is an answer's token usage: the input tokens, those written to
// and read from the prompt cache (apart from InputTokens, as the API
// counts them), and the output tokens.
//
// Its fields are documented on [github.com/damper-ai/damper-go/internal/core.Usage].
type Usage = engine.Usage

// AttemptReport describes one provider attempt.
//
// Its fields are documented on [github.com/damper-ai/damper-go/internal/core.AttemptReport].
type AttemptReport = engine.AttemptReport

// Error is a call that Damper ended. Reason is one of the sentinels of this
// package; Last is the provider error of the final attempt (an
// *anthropic.Error for an error status, a transport error otherwise), so
// errors.As(err, &apiErr) and errors.Is(err, context.DeadlineExceeded) reach
// it through the Error.
//
// Its fields are documented on [github.com/damper-ai/damper-go/internal/core.Error].
type Error = engine.Error

// Failure describes one failed attempt, for classification.
//
// Its fields are documented on [github.com/damper-ai/damper-go/internal/core.Failure].
type Failure = engine.Failure

// Class is what Damper does with a failed attempt.
type Class = engine.Class

// Retryable failures are retried, subject to every admission gate.
const Retryable = engine.Retryable

// NotRetryable failures are returned to the caller at once.
const NotRetryable = engine.NotRetryable

// Ambiguous failures happened after content reached the caller: they
// are returned, never retried.
const Ambiguous = engine.Ambiguous

// A Fallback is one move of a call from a backend to the next.
//
// Its fields are documented on [github.com/damper-ai/damper-go/internal/core.Fallback].
type Fallback = engine.Fallback

// A Skip is a backend a call cannot fall back to with one of its models.
//
// Its fields are documented on [github.com/damper-ai/damper-go/internal/core.Skip].
type Skip = engine.Skip

// Clock is the source of time for every wait and timeout Damper starts.
// The default is the real clock; a virtual one (such as the one in package
// dampertest) makes tests and simulations exact and keeps them from
// sleeping. Implementations must be safe for concurrent use.
type Clock = engine.Clock

// ErrAmbiguous: a stream failed after content reached the caller; it is
// not retried because the caller may already hold part of the answer.
var ErrAmbiguous = engine.ErrAmbiguous

// ErrHoldBackExceeded: a stream sent more data before its first content
// than Damper holds back.
var ErrHoldBackExceeded = engine.ErrHoldBackExceeded

// ErrEventTooLarge: a stream sent an SSE event larger than
// Policy.MaxEventBytes.
var ErrEventTooLarge = engine.ErrEventTooLarge

// ErrAttemptTimeout: one attempt took longer than
// Policy.PerAttemptTimeout. It is what a timed-out attempt's error wraps.
var ErrAttemptTimeout = engine.ErrAttemptTimeout

// Signal says whose health a failure speaks of. A circuit breaker listens
// to provider signals only; a rate limiter to caller traffic.
type Signal = engine.Signal

// NoSignal: the failure says nothing about load (a bad request, a
// cancelled context).
const NoSignal = engine.NoSignal

// ProviderHealth: 5xx, 529 and transport failures.
const ProviderHealth = engine.ProviderHealth

// CallerTraffic: 429, the caller's own rate or spend.
const CallerTraffic = engine.CallerTraffic

// Classification is the verdict on one failed attempt.
//
// Its fields are documented on [github.com/damper-ai/damper-go/internal/engine.Classification].
type Classification = engine.Classification

// Classifier decides what to do with a failed attempt. It is given
// Damper's own verdict (builtin) and returns the one to act on, so it can
// override any decision or keep it.
//
// The built-in verdict: any failure after content reached the caller is
// ambiguous. Before that, an explicit x-should-retry header wins (retrying
// even a 400 when true); spend-limit 429s are final, other 429s and every
// 5xx are retried, other 4xx are not; an SSE error event is retried when
// its type is transient (the API's overloaded_error, api_error and
// rate_limit_error, or a transient Bedrock exception turned into an error
// event by the SDK's bedrock package); transport failures are retried. It is called once per failed attempt, without
// any Damper lock held, and must be safe for concurrent use.
type Classifier = engine.Classifier

// ContextWithReport returns a copy of ctx that makes Damper write the
// [Report] of a call made with it into dst, as [ReportInto] does, for
// every call, including one refused before its first attempt. Give each
// call its own destination.
func ContextWithReport(ctx context.Context, dst *Report) context.Context {
	return engine.ContextWithReport(ctx, dst)
}

// Price is what one model costs, in US dollars per million tokens.
//
// Its fields are documented on [github.com/damper-ai/damper-go/internal/engine.Price].
type Price = engine.Price

// PriceTable maps model families to prices. It is used only to estimate
// the cost of retries; it is not billing data. A table is read-only once
// built and safe for concurrent use.
type PriceTable = engine.PriceTable

// NewPriceTable returns a table with the given prices, keyed by model
// family ("claude-sonnet-4-6") or exact model ID. It rejects negative, NaN
// or infinite prices, naming the model and the value.
func NewPriceTable(version string, prices map[string]Price) (*PriceTable, error) {
	return engine.NewPriceTable(version, prices)
}

// DefaultPriceTable returns the built-in snapshot. Entries marked
// Unconfirmed are prices known in November 2026 that were not checked
// against the published price list.
func DefaultPriceTable() *PriceTable { return engine.DefaultPriceTable() }
