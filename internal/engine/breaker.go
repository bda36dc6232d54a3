package engine

import (
	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/gates/breaker"
)

// The circuit breaker's names (package internal/gates/breaker).

// OutcomeCircuitOpen: the circuit breaker refused the attempt.
const OutcomeCircuitOpen = breaker.OutcomeCircuitOpen

// ErrCircuitOpen: the circuit breaker is open, or half-open with its
// probe in flight, so nothing was sent. [Error.NextProbe] holds when to
// try again, and [Error.RetryAfter] the time until then: open, until the
// open period ends; with a probe in flight, until the probe is due to
// answer (its PerAttemptTimeout, or its caller's deadline if sooner), or
// [fleet.CircuitOverdueWait] once that has passed. It is never longer
// than the current open period, however long PerAttemptTimeout.
var ErrCircuitOpen = breaker.ErrCircuitOpen

// BreakerPolicy configures the circuit breaker: when most attempts fail on
// the provider's health (5xx, 529, transport failures, attempt timeouts),
// Damper stops sending to the provider for a while, and then sends one
// probe at a time until one succeeds. Rate limits, spend limits, other 4xx
// and the caller's own cancellations never count.
//
// The zero value is a working breaker with the defaults written beside
// each field; a nil *BreakerPolicy in a Policy means no breaker.
type BreakerPolicy = breaker.Policy

// breakerConfig is the breaker's part of p.
func breakerConfig(p *Policy) *breaker.Config {
	return &breaker.Config{Policy: p.Breaker, AttemptLimit: p.PerAttemptTimeout}
}

// CircuitState is the state of a circuit breaker: closed, open or
// half-open. The zero value means that no breaker is configured.
type CircuitState = fleet.CircuitState

const (
	// CircuitClosed: attempts go through and are counted.
	CircuitClosed = fleet.CircuitClosed
	// CircuitOpen: every attempt is refused with [ErrCircuitOpen].
	CircuitOpen = fleet.CircuitOpen
	// CircuitHalfOpen: one attempt at a time, the probe, goes through.
	CircuitHalfOpen = fleet.CircuitHalfOpen
)

// CircuitChange is one change of a breaker's state, as
// [BreakerPolicy.OnStateChange] hears it; its Backend is the backend
// whose breaker it is: "primary" for the client's own (see
// [WithBackends]).
type CircuitChange = fleet.CircuitChange
