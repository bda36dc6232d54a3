package core

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/damper-ai/damper-go/fleet"
)

// The vocabulary of a call: what the engine, the gates and the adapters
// say of it. The root package names each by an alias (damper.Report is
// core.Report), so that these are its public types.

// CircuitState is the state of a circuit breaker (fleet's).
type CircuitState = fleet.CircuitState

// Priority is a call's place in the lines of the rate limiter and the
// concurrency limit (fleet's).
type Priority = fleet.Priority

// ErrAttemptTimeout: one attempt took longer than
// Policy.PerAttemptTimeout. It is what a timed-out attempt's error wraps.
var ErrAttemptTimeout = errors.New("damper: attempt timed out")

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
	// Tenant is the tenant the call was made for: in [Proxy]'s key mode,
	// the configured [Tenant] whose key the client presented; "" when
	// none (pass-through mode, or a call made through the SDK).
	Tenant string
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
	// CacheAffinity is what cache affinity did for a call whose prompt has
	// a cache breakpoint, under spread routing (see
	// [FallbackPolicy].CacheAffinity): "hit", it started on the backend
	// that last served the prompt's cached prefix; "moved", that backend
	// lacked headroom or was refused; "new", none had served it. Empty
	// for any other call.
	CacheAffinity string

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
	// LimitGroup is the rate limiter's group of the call's model, its
	// family and major version ("claude-sonnet-4"); empty when the Policy
	// has no rate limiter.
	LimitGroup string
	// RateLimitWait is the time the call's attempts waited in the rate
	// limiter's line, in all.
	RateLimitWait time.Duration
	// Usage is the token usage of the answer the caller got, as the
	// provider reported it (a plain answer's body; a stream's
	// message_start and message_delta events, as far as the stream was
	// read): a plain answer's from its hand-over, a stream's from its end.
	// Attempts that failed or lost a race are not in it. Damper reads it
	// when the call's report has a destination ([ReportInto],
	// [ContextWithReport], the [Proxy]'s), when the Policy has a rate
	// limiter or the token metrics record, and for a [Tenant] with a
	// daily cost ceiling; otherwise, and when the answer reported none,
	// Known is false.
	Usage Usage
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

// Usage is an answer's token usage: the input tokens, those written to
// and read from the prompt cache (apart from InputTokens, as the API
// counts them), and the output tokens.
type Usage struct {
	InputTokens              int64
	CacheCreationInputTokens int64
	CacheReadInputTokens     int64
	OutputTokens             int64
	// Known is whether the answer's usage was read (see [Report].Usage).
	Known bool
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
	// Lost is true for an attempt its race cancelled, its Kind
	// "hedge_lost": another attempt of its call answered first, or failed
	// with a failure that ends the race. A lost attempt is ended once the
	// race is decided, so its record may follow that of the attempt the
	// call ended on; it says nothing of how the call ended.
	Lost bool
}

// Error is a call that Damper ended. Reason is one of the sentinels of this
// package; Last is the provider error of the final attempt (an
// *anthropic.Error for an error status, a transport error otherwise), so
// errors.As(err, &apiErr) and errors.Is(err, context.DeadlineExceeded) reach
// it through the Error.
type Error struct {
	Reason error
	Last   error
	// RetryAfter is the provider's delay, for ErrRetryAfterTooLong, the
	// time until NextProbe, for ErrCircuitOpen, or the time until
	// AdmitAt, for ErrRateLimited.
	RetryAfter time.Duration
	// NextProbe is, for ErrCircuitOpen, when to try again: when the
	// breaker's open period ends, or when its probe in flight is due to
	// answer; never later than the current open period from the refusal
	// (see ErrCircuitOpen).
	NextProbe time.Time
	// AdmitAt is when the rate limiter could have admitted the attempt,
	// for ErrRateLimited.
	AdmitAt time.Time
	Report  *Report
}

func (e *Error) Error() string {
	msg := e.Reason.Error()
	if e.RetryAfter > 0 {
		msg += fmt.Sprintf(" (retry after %v)", e.RetryAfter)
	}
	if e.Report != nil {
		if e.Report.Attempts == 1 {
			msg += " (1 attempt)"
		} else {
			msg += fmt.Sprintf(" (%d attempts)", e.Report.Attempts)
		}
	}
	if e.Last != nil {
		msg += ": " + e.Last.Error()
	}
	return msg
}

// Unwrap returns the reason and the last provider error.
func (e *Error) Unwrap() []error {
	if e.Last == nil {
		return []error{e.Reason}
	}
	return []error{e.Reason, e.Last}
}

// Class is what Damper does with a failed attempt.
type Class int

const (
	// Retryable failures are retried, subject to every admission gate.
	Retryable Class = iota + 1
	// NotRetryable failures are returned to the caller at once.
	NotRetryable
	// Ambiguous failures happened after content reached the caller: they
	// are returned, never retried.
	Ambiguous
)

func (c Class) String() string {
	switch c {
	case Retryable:
		return "retryable"
	case NotRetryable:
		return "not_retryable"
	case Ambiguous:
		return "ambiguous"
	}
	return "none"
}

// Failure describes one failed attempt, for classification.
type Failure struct {
	// StatusCode is the HTTP status, or 0 when no response arrived (or a
	// stream failed after its 200 header).
	StatusCode int
	// Header holds the response headers, when a response arrived.
	Header http.Header
	// Body is the start of the error body (at most 1 MiB), or the data of
	// an SSE error event.
	Body []byte
	// Err is the transport or stream error, when there is one.
	Err error
	// AfterContent is true when content had already reached the caller.
	AfterContent bool
}

// A Fallback is one move of a call from a backend to the next.
type Fallback struct {
	// From and To are the backends' names ("primary" for the client's own).
	From, To string
	// Model is the model sent to To, as To names it.
	Model string
	// Reason is why the call moved: the outcome of the gate that refused
	// the next attempt where it was (OutcomeCircuitOpen, OutcomeRateLimited,
	// OutcomeBudgetExhausted, OutcomeAttemptsExhausted, ...), or
	// "spend_limit".
	Reason string
}

// A Skip is a backend a call cannot fall back to with one of its models.
type Skip struct {
	// Backend is the backend's name.
	Backend string
	// Model is the model, as the caller, or Policy.Fallback for a sibling,
	// names it.
	Model string
	// Reason is why: "no_model_id", the backend has no ID for the model:
	// neither its Models nor Damper's table for its Provider gives one
	// (Backend.Models is the cure); or a feature the request uses that the
	// backend's platform is documented to lack, named by Feature:
	// "unsupported_beta" (an anthropic-beta value), "top_level_cache_control"
	// (automatic prompt caching), "inference_geo", "mcp_servers" (the MCP
	// connector), "unsupported_server_tool" (web_search, web_fetch or
	// code_execution). The fallback guide has the table.
	Reason string
	// Feature is the feature the platform lacks ("" for no_model_id): the
	// beta value, the body member, or the server tool's family.
	Feature string
}

// Clock is the source of time for every wait and timeout Damper starts.
// The default is the real clock; a virtual one (such as the one in package
// dampertest) makes tests and simulations exact and keeps them from
// sleeping. Implementations must be safe for concurrent use.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// Sleep waits for d, or until ctx is done, and then returns ctx.Err().
	Sleep(ctx context.Context, d time.Duration) error
	// AfterFunc calls f once d has passed, unless stop is called first;
	// stop reports whether it prevented the call.
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

// WallClock is the real clock (inside a synctest bubble, the bubble's).
type WallClock struct{}

func (WallClock) Now() time.Time { return time.Now() }

func (WallClock) Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func (WallClock) AfterFunc(d time.Duration, f func()) func() bool { return time.AfterFunc(d, f).Stop }

type priorityKey struct{}

// WithPriority returns ctx marking the calls made with it as of priority p.
func WithPriority(ctx context.Context, p Priority) context.Context {
	return context.WithValue(ctx, priorityKey{}, p)
}

// PriorityOf is the priority ctx marks, if any.
func PriorityOf(ctx context.Context) (Priority, bool) {
	p, ok := ctx.Value(priorityKey{}).(Priority)
	return p, ok
}
