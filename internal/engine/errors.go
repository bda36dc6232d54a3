package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/damper-ai/damper-go/internal/core"
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
	ErrAttemptTimeout = core.ErrAttemptTimeout
)

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
