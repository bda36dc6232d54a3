// Package damper is reliability control for calls to the Anthropic
// Messages API through the official Go SDK.
//
// A [Damper] becomes the one owner of retries for POST /v1/messages, plain
// and streaming, made through any client built with [Damper.Option]:
//
//	d, err := damper.New(damper.Policy{MaxRetryCostUSD: 0.05})
//	client := anthropic.NewClient(d.Option())
//	var rep damper.Report
//	msg, err := client.Messages.New(ctx, params, damper.ReportInto(&rep))
//
// Every call through one Damper shares one retry budget, so retries stop
// when first attempts stop succeeding; each call has a ceiling on the
// estimated cost of its retries; failures are classified the Anthropic way
// (spend limits, x-should-retry, 529, transport failures); backoff is full
// jitter, provider delays are honoured up to a cap, and no wait or attempt
// is started that cannot finish before the caller's deadline.
//
// [RecommendedPolicy] adds a circuit breaker, which stops sending to a
// provider that fails most attempts on its health, and a retry throttle,
// which failures drain; both are off in the zero Policy.
//
// # Streams
//
// A stream (client.Messages.NewStreaming and its Beta twin) is retried only
// while nothing the caller can use has reached it.
//
// The first content of a stream is its first content_block_delta, or a
// content_block_start whose block already carries something: any block but
// a text or thinking block with empty text, or a tool call (tool_use,
// server_tool_use, mcp_tool_use) whose input is still empty. Until it
// arrives, an attempt's events (message_start, ping, empty blocks, and any
// other event) are held back; a failure of the attempt drops them, so the
// caller's one ssestream.Stream shows exactly one attempt's events. At most
// [Policy.MaxHoldBack] bytes (1 MiB by default) are held: a stream that
// sends more before its first content fails with [ErrHoldBackExceeded],
// not retried. One event is at most [Policy.MaxEventBytes] (16 MiB by
// default), as the SDK's decoder holds an event whole: a larger one fails
// the stream with [ErrEventTooLarge], not retried before the first
// content, and ambiguous after it, once the caller has the event's bytes
// up to the limit.
//
// Before content, these failures are retried under every gate of a plain
// call: an error status, an SSE error event of a transient type, a reset or
// EOF, an end without message_stop, and no first content within
// [Policy.PerAttemptTimeout]. The held bytes reach the
// caller together with the first content, so its time to first content
// does not grow; a stream that ends with message_stop and no content is
// released whole.
//
// After the first content, the body's bytes go to the caller as they
// arrive, read straight into the caller's buffer. A failure from then on is
// never retried: the body's Read returns an [*Error] whose Reason is
// [ErrAmbiguous] and whose Last is the cause, an *anthropic.Error built from
// an SSE error event (which the SDK's decoder never sees) or the transport
// error, so stream.Err() matches both. An end without message_stop is such
// a failure, where the SDK alone would report none, and so is a Read that
// waits longer than [Policy.StreamIdleTimeout], when set. The stream ends at
// message_stop: whatever the server sends after it is not read.
//
// A stream's call ends at the first of: the caller reading past
// message_stop (success), a failure (ambiguous), the caller closing the
// stream, or the call's context ending (canceled, unless the caller already
// has message_stop). Once the context has ended, the stream's next Read
// returns the context's error, so the caller and the report agree. The
// call's report ([ReportInto]) is written when the first content is
// released, with [Report.FirstContent] and no outcome yet, and again at the
// caller's first Read or Close after the end, with the outcome; spans and
// metrics are recorded at the end itself. When the caller's context ends
// at the very instant Damper hands the SDK its stream, the SDK returns the
// context's error and drops the stream unread: its span and metrics say
// canceled, and its report keeps no outcome.
//
// A plain call ends when the SDK closes the answer's body, once it has read
// it: canceled if the call's context has ended by then. The SDK looks at
// the caller's context once more after that, and may still return its error
// if the context ends in between: that instant is the SDK's, and no
// middleware can close it.
//
// Other endpoints pass through unchanged, with the SDK's own retries.
package damper

import (
	"fmt"
	"maps"
	"math/rand/v2"
)

// Damper owns the retries of Messages calls for every client built with its
// [Damper.Option]. It holds one retry budget, shared by all those calls and
// by no other Damper. A Damper is safe for concurrent use by any number of
// goroutines; its Policy is fixed at [New].
type Damper struct {
	policy Policy
	clock  Clock
	rand   func() float64
	// realClock is whether clock is the wall clock, so that an attempt's
	// timeout can be its context's deadline; timeoutCause is the error of
	// an attempt that ran out of PerAttemptTimeout.
	realClock    bool
	timeoutCause error
	tel          *telemetry
	telCfg       telemetryConfig // as the Settings left it, until New builds tel

	// primary is the backend of a call's own client; fallbacks are the
	// backends of WithBackends, in order (backend.go). Each holds the
	// engine's hooks (gates.go) for its attempts: gates that admit every
	// attempt, and observers that hear every attempt's end.
	primary      *backend
	fallbacks    []*backend
	backendSpecs []Backend // as WithBackends gave them, until New builds them

	budget Budget  // WithBudget's, until New gives it to the primary
	store  Store   // where the primary's gates keep their state
	hedge  *hedger // nil without Policy.Hedge

	// callContexts are the stores and budget that keep a note of each
	// call, in its context.
	callContexts []CallContexter
}

// Setting configures what a Damper runs on rather than how it behaves:
// its clock, randomness, budget store and telemetry.
type Setting func(*Damper) error

// WithClock makes the Damper read time and wait on c. Use a virtual clock
// (dampertest.NewClock) for exact tests and simulations.
func WithClock(c Clock) Setting {
	return func(d *Damper) error {
		if c == nil {
			return fmt.Errorf("damper: WithClock(nil): a clock is required")
		}
		d.clock = c
		return nil
	}
}

// WithRand makes the Damper draw its jitter from f, which must return
// numbers in [0, 1) and be safe for concurrent use.
func WithRand(f func() float64) Setting {
	return func(d *Damper) error {
		if f == nil {
			return fmt.Errorf("damper: WithRand(nil): a random source is required")
		}
		d.rand = f
		return nil
	}
}

// WithBudget replaces the in-memory retry budget built from the Policy with
// b, such as one shared by a fleet, for the client's own backend; the
// backends of [WithBackends] keep their own.
func WithBudget(b Budget) Setting {
	return func(d *Damper) error {
		if b == nil {
			return fmt.Errorf("damper: WithBudget(nil): a budget is required")
		}
		d.budget = b
		return nil
	}
}

// New returns a Damper with policy p. It returns an error that names the
// field and its value when p holds a value that cannot be used.
func New(p Policy, settings ...Setting) (*Damper, error) {
	p, err := p.withDefaults()
	if err != nil {
		return nil, err
	}
	d := &Damper{policy: p, clock: realClock{}, rand: rand.Float64}
	for _, s := range settings {
		if err := s(d); err != nil {
			return nil, err
		}
	}
	_, d.realClock = d.clock.(realClock)
	d.timeoutCause = attemptTimeoutError{d: p.PerAttemptTimeout}
	if d.store == nil {
		d.store = MemoryStore{}
	}
	d.noteCalls(d.store)
	d.noteCalls(d.budget)
	d.primary = d.newBackend(PrimaryBackend, d.store, d.budget)
	d.budget = nil
	for _, spec := range d.backendSpecs {
		s := spec.Store
		if s == nil {
			s = MemoryStore{}
		}
		d.noteCalls(s)
		b := d.newBackend(spec.Name, s, nil)
		b.provider, b.models, b.client = spec.Provider, spec.Models, newBackendClient(spec.Options)
		d.fallbacks = append(d.fallbacks, b)
	}
	d.tel = newTelemetry(d.telCfg, &d.policy, d.clock)
	d.tel.m.backends = len(d.fallbacks) > 0
	if err := d.wire(d.primary); err != nil {
		return nil, err
	}
	for _, b := range d.fallbacks {
		if err := d.wire(b); err != nil {
			return nil, fmt.Errorf("%w (backend %q)", err, b.name)
		}
	}
	d.tel.m.registerGates(d)
	d.backendSpecs = nil
	if p.Hedge != nil {
		d.hedge = newHedger(*p.Hedge, d.clock)
	}
	return d, nil
}

// Policy returns a copy of the Damper's policy, with every default filled
// in; changing it changes nothing in the Damper.
func (d *Damper) Policy() Policy {
	p := d.policy
	if p.Breaker != nil {
		b := *p.Breaker
		p.Breaker = &b
	}
	if p.Throttle != nil {
		t := *p.Throttle
		p.Throttle = &t
	}
	if p.RateLimit != nil {
		r := *p.RateLimit
		r.Limits = maps.Clone(r.Limits)
		p.RateLimit = &r
	}
	if p.Hedge != nil {
		h := *p.Hedge
		p.Hedge = &h
	}
	if p.Fallback != nil {
		p.Fallback = p.Fallback.clone()
	}
	return p
}

// noteCalls keeps x if it keeps a note of each call.
func (d *Damper) noteCalls(x any) {
	if c, ok := x.(CallContexter); ok {
		d.callContexts = append(d.callContexts, c)
	}
}

// fromStore makes a part with the store's method made, or in memory when
// the store keeps none.
func fromStore[S, T any](part string, made func(S) (T, error), inMemory func(MemoryStore, S) (T, error), s S) (T, error) {
	t, err := made(s)
	if err != nil {
		return t, fmt.Errorf("damper: the store's %s: %w", part, err)
	}
	if any(t) == nil {
		// The policy was validated: the store in memory cannot fail.
		return inMemory(MemoryStore{}, s)
	}
	return t, nil
}

// Budget returns the Damper's retry budget.
func (d *Damper) Budget() Budget { return d.primary.budget }
