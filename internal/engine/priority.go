package engine

import (
	"context"

	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/core"
)

// A call's priority, read by the gates that keep a line (the rate limiter
// and the concurrency limit) from the call's context.

// Priority is a call's place in the lines of the rate limiter and the
// concurrency limit.
type Priority = fleet.Priority

const (
	// Interactive calls may use all of every bucket: someone is waiting.
	Interactive = fleet.Interactive
	// Batch calls leave a share of every bucket to interactive calls (see
	// [RateLimitPolicy.BatchShare]), and wait behind interactive calls
	// that wait.
	Batch = fleet.Batch
)

// ContextWithPriority returns ctx marking the Messages calls made with it
// as of priority p, for the rate limiter and the concurrency limit; it
// overrides their policies' Priority.
func ContextWithPriority(ctx context.Context, p Priority) context.Context {
	return core.WithPriority(ctx, p)
}
