package engine

import "github.com/damper-ai/damper-go/internal/gates/concurrency"

// The concurrency limit's names (package internal/gates/concurrency).

// OutcomeConcurrencyLimited: no slot of the concurrency limit came in time.
const OutcomeConcurrencyLimited = concurrency.OutcomeConcurrencyLimited

// ErrConcurrencyLimited: the concurrency limit had no slot for the attempt
// within ConcurrencyPolicy.MaxWait and the caller's deadline, so nothing
// was sent.
var ErrConcurrencyLimited = concurrency.ErrConcurrencyLimited

// ConcurrencyPolicy configures the concurrency limit: at most a limit of
// attempts in flight on each backend, fixed (Max) or adaptive (Adaptive),
// which follows the provider's latency. An attempt that finds no slot
// waits in line, within its priority (see [ContextWithPriority]) and its
// [Tenant]'s weight, for at most MaxWait and not past the caller's
// deadline, then fails with [ErrConcurrencyLimited]. The concurrency
// guide tells the adaptive limit's rule.
//
// The zero value is a fixed limit that needs Max; a nil
// *ConcurrencyPolicy in a Policy means no limit.
type ConcurrencyPolicy = concurrency.Policy
