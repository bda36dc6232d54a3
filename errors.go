package damper

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Sentinels for the ends of a call that no gate decided. Every error
// Damper returns for one of them, and for a gate's refusal (gates.go), is
// an [*Error], which matches the sentinel with errors.Is and wraps the last
// provider error.
var (
	// ErrAmbiguous: a stream failed after content reached the caller; it is
	// not retried because the caller may already hold part of the answer.
	ErrAmbiguous = errors.New("damper: stream failed after content was delivered")
	// ErrHoldBackExceeded: a stream sent more data before its first content
	// than Damper holds back.
	ErrHoldBackExceeded = errors.New("damper: stream sent too much before its first content")
	// ErrEventTooLarge: a stream sent an SSE event larger than
	// Policy.MaxEventBytes.
	ErrEventTooLarge = errors.New("damper: stream sent an SSE event larger than Policy.MaxEventBytes")
	// ErrAttemptTimeout: one attempt took longer than
	// Policy.PerAttemptTimeout. It is what a timed-out attempt's error wraps.
	ErrAttemptTimeout = errors.New("damper: attempt timed out")
)

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

// attemptTimeoutError is a per-attempt timeout: it is ErrAttemptTimeout and,
// like the SDK's own timeouts, context.DeadlineExceeded.
type attemptTimeoutError struct{ d time.Duration }

func (e attemptTimeoutError) Error() string {
	return fmt.Sprintf("damper: attempt timed out after %v", e.d)
}

func (e attemptTimeoutError) Is(target error) bool {
	return target == ErrAttemptTimeout || target == context.DeadlineExceeded
}

// Timeout reports true, as net.Error timeouts do.
func (attemptTimeoutError) Timeout() bool { return true }
