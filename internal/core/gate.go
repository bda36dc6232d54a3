// Package core is the contract between Damper's call engine and its
// admission gates, and the vocabulary of a call they share.
//
// A gate is a package of its own under internal/gates: its descriptor
// (Gate: its refusal, its proxy answer, its telemetry), its Policy part and
// the part it makes on each backend (PartFunc), whose hooks (Hooks) are
// typed interfaces. The engine runs its list of gates before every
// attempt, before a retry and before a hedge:
//
//   - RetryCheck: before a retry, taking nothing;
//   - HedgeCheck: before a hedge, taking nothing;
//   - AttemptGate: before every attempt, the first and a hedge included,
//     maybe waiting, handing back a Pass that hears the attempt's end (and,
//     before a retry, asked whether it would refuse at the wait's end);
//   - Spender: before a retry or a hedge, taking what is not given back;
//   - Observer: after every attempt's end.
//
// Each admission runs, in the list's order, first every check, then every
// attempt gate, then every spender: nothing is taken for an admission a
// check refuses, and what an attempt gate took (a reservation, a probe) is
// given back when a later one refuses, while a spent unit never is.
//
// A gate sees a call through Call, an attempt as Attempt, its backend as
// Backend, a tenant as Tenant and the Damper's services through Env: never
// the engine itself, nor another gate.
package core

import (
	"context"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/damper-ai/damper-go/fleet"
)

// Gate is one admission gate's descriptor.
type Gate struct {
	Outcome Outcome // the outcome of a call it refuses
	Reason  error   // its refusal's sentinel; nil: the caller gets the last provider error as it is

	// Status and APIType are the proxy's answer to its refusal before any
	// answer came (0: the proxy's answer to any other error).
	Status  int
	APIType string
	// Moves: its refusal moves a call to its next backend or model, after
	// a failure of health or of rate (before a retry), or before an
	// attempt.
	Moves bool

	// Instruments makes the gate's instruments and gauges on meter, once
	// per Damper, after every backend has its parts (parts, the primary's
	// first, each the hooks the gate's part made there); what it returns
	// is the gate's to record into (Services.Instruments). keep keeps a
	// gauge's registration for Damper.Close; a gauge's callback holds the
	// gate's parts, never env. Nil: none.
	Instruments func(meter metric.Meter, env *Env, parts []Hooks, keep func(metric.Registration)) any
	// RecordCall records what the gate measures of every call at its end.
	RecordCall func(ctx context.Context, env *Env, inst any, rep Report)
	// CallSpan appends what the gate says of a call, from its report, to
	// the attributes of its damper.request span; AttemptSpan sets what it
	// says of an attempt, from its record, on the attempt's recording
	// span. Nil: nothing.
	// (By value: a pointer to the engine's copy would move it to the heap.)
	CallSpan    func(rep Report, attrs []attribute.KeyValue) []attribute.KeyValue
	AttemptSpan func(ar AttemptReport, span trace.Span)
}

// PartFunc makes a gate's part on backend b from its Policy part p (nil
// when the Policy has none of it: the part is then usually no hooks).
type PartFunc[P any] func(p *P, b *Backend, env *Env) (Hooks, error)

// Entry is a gate in an engine's list: its descriptor and its part, made
// from the engine's whole Policy (Pol).
type Entry[Pol any] struct {
	Gate *Gate
	Part func(pol *Pol, b *Backend, env *Env) (Hooks, error)
}

// Use places gate g in a list, its part made by part from the Policy part
// pick selects: the compiler checks that the part and the pick agree.
func Use[Pol, P any](g *Gate, part PartFunc[P], pick func(*Pol) *P) Entry[Pol] {
	return Entry[Pol]{Gate: g, Part: func(pol *Pol, b *Backend, env *Env) (Hooks, error) {
		return part(pick(pol), b, env)
	}}
}

// Hooks are what a gate's part on one backend does, each nil where it
// does not act. A part names every hook it acts through, so that the
// compiler checks each: a hook whose method is mistyped does not build.
type Hooks struct {
	Attempt AttemptGate // before every attempt
	// Retry is the check before a retry; a part with an attempt gate and
	// no retry check is asked, before a retry, whether it would refuse the
	// retry's attempt at the wait's end.
	Retry   RetryCheck
	Hedge   HedgeCheck
	Spend   Spender
	Observe Observer
	// Tenant hears of each tenant a Proxy makes, for the parts a tenant
	// has of its own on the backend.
	Tenant TenantPart
}

// RetryCheck is a gate's check before a retry, which takes nothing.
type RetryCheck interface {
	RefusesRetry(c Call, r *RetryAsk) *Denial
}

// HedgeCheck is a gate's check before a hedge, which takes nothing.
type HedgeCheck interface {
	RefusesHedge(c Call, now time.Time) *Denial
}

// Spender is a gate that takes, before a retry or a hedge, what is not
// given back when the retry or hedge is not made: the budget's unit.
type Spender interface {
	Spend(c Call, now time.Time) *Denial
}

// AttemptGate admits each attempt of call c, the first included, before
// it is sent: it may refuse it, or hand it a pass that hears how it ended.
// A gate that makes the attempt wait does so with Call.Wait, which first
// asks the gates after it whether they would refuse the attempt by then.
type AttemptGate interface {
	// AdmitAttempt admits attempt a of c at now; a hedge (a.Hedge) must
	// find room at once, with no wait.
	AdmitAttempt(c Call, a Attempt, now time.Time) Admission
	// RefusesAt reports, taking nothing, whether the gate would refuse an
	// attempt of c at the later time at, as far as it can tell at now: an
	// attempt it refuses is not waited for, nor paid for.
	RefusesAt(c Call, now, at time.Time) *Denial
}

// Observer hears the end of every attempt.
type Observer interface {
	ObserveAttempt(ctx context.Context, now time.Time, e Event)
}

// TenantPart makes a gate's part of one tenant on its backend.
type TenantPart interface {
	AddTenant(t *Tenant) error
}

// Admission is an attempt gate's answer.
type Admission struct {
	Refused  *Denial
	Canceled bool // the caller's context ended during the gate's wait
	Pass     Pass // nil when the gate needs no word of the attempt's end
	Queued   time.Duration
	Note     Note // what the gate says of an attempt it admitted; nil: nothing
}

// Pass is a gate's admission of one attempt: it hears how that attempt
// ended, or a zero event when it was never sent.
type Pass interface {
	Settle(now time.Time, e Event)
}

// EndPass is a pass that, for a stream, also hears the stream's end, with
// the usage of the whole answer.
type EndPass interface {
	Pass
	SettleEnd(now time.Time, u Usage)
}

// SpanPass is a pass that says what its gate did to the attempt on the
// attempt's span, so that a gate's span attributes live in its package.
type SpanPass interface {
	Pass
	SpanAttributes() []attribute.KeyValue
}

// LatencyPass is a pass that compares the provider's latency: its
// attempt's exchange is timed (Event.Latency) when TimesProvider says so.
type LatencyPass interface {
	Pass
	TimesProvider() bool
}

// Event is what a pass and an observer hear of an attempt as it ends.
type Event struct {
	Outcome fleet.AttemptOutcome
	Class   Class       // a failure's; zero for an answered attempt
	Header  http.Header // the response's, when one came
	Failure *Failure    // nil for an answered attempt
	// Usage is a plain answer's token usage, read only for a rate limiter.
	Usage Usage
	// StreamOpen marks a stream handed to its caller: its usage is known
	// at its end, when its EndPasses settle.
	StreamOpen bool
	// Latency is an answer's time at the provider, when Timed: its
	// attempt was timed for a LatencyPass.
	Latency time.Duration
	Timed   bool
	// Tenant is the call's, nil for none.
	Tenant *Tenant
}

// Denial is a gate's refusal.
type Denial struct {
	Gate       *Gate
	RetryAfter time.Duration // the provider's delay, or the time until the gate could admit
	AsIs       bool          // the caller gets the last provider error as it is
	Detail     Note          // what the gate says of it beyond its sentinel; nil: nothing
}

// Err is the *Error the caller gets for d, or nil when it gets the last
// provider error as it is.
func (d *Denial) Err() *Error {
	if d.AsIs || d.Gate.Reason == nil {
		return nil
	}
	e := &Error{Reason: d.Gate.Reason, RetryAfter: d.RetryAfter}
	if d.Detail != nil {
		d.Detail.FillError(e)
	}
	return e
}

// Note is what a gate says of an attempt it admitted or refused, beyond
// its pass: the breaker's state and probe, the rate limiter's time of
// admission. It fills in the *Error of a refusal, and notes itself in the
// call's report (with the report's lock held) and the attempt's record,
// so that these fields are the gate's own.
type Note interface {
	FillError(e *Error)
	NoteReport(r *Report)
	// NoteAttempt returns ar with the note in it: by value, so that the
	// record stays on the stack.
	NoteAttempt(ar AttemptReport) AttemptReport
}
