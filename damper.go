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
// Other endpoints pass through unchanged, with the SDK's own retries.
package damper

import (
	"fmt"
	"math/rand/v2"
	"net/http"

	"github.com/anthropics/anthropic-sdk-go/v2/option"
)

// Damper owns the retries of Messages calls for every client built with its
// [Damper.Option]. It holds one retry budget, shared by all those calls and
// by no other Damper. A Damper is safe for concurrent use by any number of
// goroutines; its Policy is fixed at [New].
type Damper struct {
	policy Policy
	budget Budget
	clock  Clock
	rand   func() float64
	tel    *telemetry
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
// b, such as one shared by a fleet.
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
	if d.budget == nil {
		d.budget = NewWindowBudget(p.RetryBudgetRatio, p.RetryBudgetWindow, p.RetryBudgetMinTokens)
	}
	d.tel = newTelemetry(d)
	return d, nil
}

// Policy returns the Damper's policy, with every default filled in.
func (d *Damper) Policy() Policy { return d.policy }

// Budget returns the Damper's retry budget.
func (d *Damper) Budget() Budget { return d.budget }

// Option returns the SDK option that puts Damper in charge of a client's
// Messages calls. Give it to anthropic.NewClient (or to one call).
//
// Damper works as SDK middleware, so its place among other middleware
// matters: middleware given before it sees each logical request once,
// middleware given after it sees every attempt. With Bedrock or Vertex,
// give Damper's option before bedrock.WithConfig / vertex.WithGoogleAuth so
// that each attempt is signed afresh; the other order is refused with an
// error on the first call.
//
// The SDK's own retry loop never runs for a Messages call through Damper:
// every response Damper returns says x-should-retry: false. The SDK's
// request timeout (option.WithRequestTimeout, 10 minutes by default for
// Messages.New) wraps Damper's whole loop, so it becomes the deadline of
// the logical request, retries and waits included; PerAttemptTimeout bounds
// each attempt.
func (d *Damper) Option() option.RequestOption {
	return option.WithMiddleware(d.middleware)
}

// middleware is the SDK middleware: it runs Damper's retry loop for
// Messages calls and passes everything else through.
func (d *Damper) middleware(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
	if !isMessagesCall(req) {
		if isSignedPlatformCall(req) {
			return nil, errOptionOrder
		}
		return next(req)
	}
	c, err := d.newCall(req)
	if err != nil {
		return nil, err
	}
	return c.run(next)
}
