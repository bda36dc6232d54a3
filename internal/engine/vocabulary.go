package engine

import "github.com/damper-ai/damper-go/internal/core"

// The vocabulary of a call, shared by the engine and its gates: each a
// name of internal/core's, so that errors.Is, == and type switches on
// them hold whichever package made the value.

// Outcome is how a logical request ended.
type Outcome = core.Outcome

// Outcomes of a logical request that no gate decided. The outcomes of the
// admission gates, which refuse a retry, are declared with the gates.
const (
	OutcomeSuccess   = core.OutcomeSuccess
	OutcomeError     = core.OutcomeError    // a failure that is not retried
	OutcomeCanceled  = core.OutcomeCanceled // the caller's context ended
	OutcomeAmbiguous = core.OutcomeAmbiguous
)

// Report is the account of one logical request: what Damper tried, what it
// cost, and why it stopped. It is filled in when the call returns; a
// stream's is filled in when the stream is handed over, with no Outcome
// yet, and again when it ends (see the package documentation, Streams).
type Report = core.Report

// Usage is an answer's token usage: the input tokens, those written to
// and read from the prompt cache (apart from InputTokens, as the API
// counts them), and the output tokens.
type Usage = core.Usage

// AttemptReport describes one provider attempt.
type AttemptReport = core.AttemptReport

// Error is a call that Damper ended. Reason is one of the sentinels of this
// package; Last is the provider error of the final attempt (an
// *anthropic.Error for an error status, a transport error otherwise), so
// errors.As(err, &apiErr) and errors.Is(err, context.DeadlineExceeded) reach
// it through the Error.
type Error = core.Error

// Failure describes one failed attempt, for classification.
type Failure = core.Failure

// Class is what Damper does with a failed attempt.
type Class = core.Class

const (
	// Retryable failures are retried, subject to every admission gate.
	Retryable = core.Retryable
	// NotRetryable failures are returned to the caller at once.
	NotRetryable = core.NotRetryable
	// Ambiguous failures happened after content reached the caller: they
	// are returned, never retried.
	Ambiguous = core.Ambiguous
)

// A Fallback is one move of a call from a backend to the next.
type Fallback = core.Fallback

// A Skip is a backend a call cannot fall back to with one of its models.
type Skip = core.Skip

// Clock is the source of time for every wait and timeout Damper starts.
// The default is the real clock; a virtual one (such as the one in package
// dampertest) makes tests and simulations exact and keeps them from
// sleeping. Implementations must be safe for concurrent use.
type Clock = core.Clock
