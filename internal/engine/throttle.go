package engine

import "github.com/damper-ai/damper-go/internal/gates/throttle"

// The retry throttle's names (package internal/gates/throttle).

// OutcomeRetryThrottled: the retry throttle refused the retry.
const OutcomeRetryThrottled = throttle.OutcomeRetryThrottled

// ErrRetryThrottled: the retry throttle had half of its tokens or
// fewer left (see [ThrottlePolicy]).
var ErrRetryThrottled = throttle.ErrRetryThrottled

// ThrottlePolicy configures the retry throttle, the rule of gRPC's retry
// throttling: a count of tokens that starts full at MaxTokens; each failed
// attempt that could be retried costs one token, each answered attempt
// earns TokenRatio, and no retry is made while half of MaxTokens or fewer
// are left. Unlike the retry budget, failures drain it, so a provider that
// answers nothing gets almost no retries. A retry needs both the throttle
// and the retry budget.
//
// The zero value is a working throttle with the defaults written beside
// each field; a nil *ThrottlePolicy in a Policy means no throttle.
type ThrottlePolicy = throttle.Policy
