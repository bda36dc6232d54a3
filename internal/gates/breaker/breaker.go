// Package breaker is the circuit breaker's gate: its Policy, over a
// [fleet.Breaker] from the backend's store. It admits every attempt (a
// probe, when half-open), and is asked before a retry whether it would
// refuse at the wait's end. Its changes of state are counted in
// damper.circuit.changes.
package breaker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/damper-ai/damper-go/fleet"
	ibreaker "github.com/damper-ai/damper-go/internal/breaker"
	"github.com/damper-ai/damper-go/internal/conf"
	"github.com/damper-ai/damper-go/internal/core"
)

// OutcomeCircuitOpen: the circuit breaker refused the attempt.
const OutcomeCircuitOpen core.Outcome = "circuit_open"

// ErrCircuitOpen: the circuit breaker is open, or half-open with its
// probe in flight, so nothing was sent. [core.Error.NextProbe] holds when
// to try again, and [core.Error.RetryAfter] the time until then.
var ErrCircuitOpen = errors.New("damper: circuit breaker open")

// Gate's refusal reaches a proxy's client as the API's overload
// (529 overloaded_error): the breaker opens on the provider's failures of
// health, which the API reports so. It moves a call on to a backend whose
// breaker is its own.
var Gate = &core.Gate{
	Outcome: OutcomeCircuitOpen, Reason: ErrCircuitOpen,
	Status: 529, APIType: "overloaded_error", Moves: true,
	Instruments: instruments, CallSpan: callSpan,
}

func init() { conf.Register((*Policy).check) }

const metricCircuitChanges = "damper.circuit.changes"

// The breaker's span attributes: its state on a call's span, its probe on
// an attempt's, and each change of state.
const (
	keyCircuitState = attribute.Key("damper.circuit.state")
	keyCircuitProbe = attribute.Key("damper.circuit.probe")
	keyCircuitFrom  = attribute.Key("damper.circuit.from")
	keyCircuitTo    = attribute.Key("damper.circuit.to")
)

// callSpan says the breaker's state, as it answered the call.
func callSpan(rep core.Report, attrs []attribute.KeyValue) []attribute.KeyValue {
	if rep.Circuit != 0 {
		attrs = append(attrs, keyCircuitState.String(rep.Circuit.String()))
	}
	return attrs
}

// partBreaker is the breaker's part of a store.
var partBreaker = core.NewStorePart("breaker", "damper: circuit breaker store error")

// Policy configures the circuit breaker: when most attempts fail on
// the provider's health (5xx, 529, transport failures, attempt timeouts),
// Damper stops sending to the provider for a while, and then sends one
// probe at a time until one succeeds. Rate limits, spend limits, other 4xx
// and the caller's own cancellations never count.
//
// The zero value is a working breaker with the defaults written beside
// each field; a nil *Policy in a Damper's Policy means no breaker.
type Policy struct {
	// FailureRatio is the share of failed attempts, among those with a
	// verdict in Window, at which the breaker opens. Default 0.5; above 0,
	// at most 1.
	FailureRatio float64 `key:"failure_ratio" default:"0.5" in:"(0,1]" unit:"a share"`
	// MinAttempts is the fewest attempts with a verdict in Window for the
	// breaker to open. Default 20; at least 1, at most 1,000,000.
	MinAttempts int `key:"min_attempts" default:"20" min:"1" max:"1000000"`
	// Window is how far back the closed breaker counts. Default 30 s; at
	// least 30 ns, at most 24 h.
	Window time.Duration `key:"window" default:"30s" min:">0" max:"24h"`
	// OpenFor is how long an open breaker refuses every attempt before it
	// admits a probe. Default 30 s; at most 24 h.
	OpenFor time.Duration `key:"open_for" default:"30s" min:">0" max:"24h"`
	// MaxOpenFor caps the open period, which each failed probe doubles.
	// Default 300 s; at least OpenFor, at most 24 h.
	MaxOpenFor time.Duration `key:"max_open_for" default:"300s" min:">0" max:"24h"`
	// OnStateChange, when set, hears every change of state, in order and
	// one at a time, with no lock held: it may call back into the Damper.
	// It runs on the goroutine of the call that caused the change, so it
	// should be quick.
	OnStateChange func(fleet.CircuitChange) `key:"-"` // code
}

// Config is what the breaker reads of a Damper's Policy: its Policy (nil:
// no breaker) and the Damper's PerAttemptTimeout, the most a probe takes.
type Config struct {
	*Policy
	AttemptLimit time.Duration
}

// check is what the tags of Policy cannot say.
func (p *Policy) check(Policy) error {
	if p.Window < ibreaker.Buckets {
		return &conf.FieldError{Field: "Window", Value: p.Window, Why: fmt.Sprintf("must be at least %v", time.Duration(ibreaker.Buckets))}
	}
	if p.MaxOpenFor < p.OpenFor {
		return &conf.FieldError{Field: "MaxOpenFor", Value: p.MaxOpenFor, Why: fmt.Sprintf("must not be shorter than OpenFor (%v)", p.OpenFor)}
	}
	return nil
}

// Part makes backend b's breaker from its store, or none without p.
func Part(p *Config, b *core.Backend, env *core.Env) (core.Hooks, error) {
	if p.Policy == nil {
		return core.Hooks{}, nil
	}
	g := &Circuit{env: env}
	s := settings(p, env, b.Name)
	s.OnChange = g.view.hears(s.OnChange)
	br, err := core.FromStore("Breaker", b.Store, fleet.BreakerStore.Breaker, fleet.MemoryStore.Breaker, s)
	if err != nil {
		return core.Hooks{}, err
	}
	g.b = br
	return core.Hooks{Attempt: g}, nil
}

// Of is the breaker among a backend's parts, or nil.
func Of(parts []core.Hooks) *Circuit {
	for _, h := range parts {
		if g, ok := h.Attempt.(*Circuit); ok {
			return g
		}
	}
	return nil
}

// instruments makes the counter of the breaker's changes.
func instruments(meter metric.Meter, _ *core.Env, _ []core.Hooks, _ func(metric.Registration)) any {
	var none noop.Meter
	return core.Instrument(meter.Int64Counter(metricCircuitChanges, metric.WithUnit("{change}"),
		metric.WithDescription("Changes of the circuit breaker's state, by the state left and the state entered.")))(none.Int64Counter(metricCircuitChanges))
}

// change records a change of the breaker's state: a metric and a log
// line. It belongs to no call, so it has no span.
func change(env *core.Env, c fleet.CircuitChange) {
	ctx := context.Background()
	if changes, _ := env.Instruments(OutcomeCircuitOpen).(metric.Int64Counter); changes != nil && changes.Enabled(ctx) {
		kvs := []attribute.KeyValue{keyCircuitFrom.String(c.From.String()), keyCircuitTo.String(c.To.String())}
		if kv, ok := env.BackendLabel(c.Backend); ok {
			kvs = append(kvs, kv)
		}
		changes.Add(ctx, 1, env.Attrs(kvs...))
	}
	logChange(env.Logger(), c)
}

// logChange writes the line of a change of the breaker's state: at Warn
// when it opens, at Info otherwise.
func logChange(log *slog.Logger, c fleet.CircuitChange) {
	level := slog.LevelInfo
	if c.To == fleet.CircuitOpen {
		level = slog.LevelWarn
	}
	ctx := context.Background()
	if log == nil || !log.Enabled(ctx, level) {
		return
	}
	attrs := []slog.Attr{slog.String("from", c.From.String()), slog.String("to", c.To.String())}
	if c.To == fleet.CircuitOpen {
		attrs = append(attrs, slog.Duration("open_for", c.NextProbe.Sub(c.At)))
	}
	log.LogAttrs(ctx, level, "damper: circuit breaker "+c.To.String(), attrs...)
}

// settings are the settings of p's breaker, for a Store: every change of
// state reaches the telemetry, then the policy's callback.
func settings(p *Config, env *core.Env, backend string) fleet.BreakerSettings {
	user := p.OnStateChange
	s := fleet.BreakerSettings{
		FailureRatio: p.FailureRatio, MinAttempts: p.MinAttempts, Window: p.Window,
		OpenFor: p.OpenFor, MaxOpenFor: p.MaxOpenFor, ProbeLimit: p.AttemptLimit,
	}
	s.OnChange = func(c fleet.CircuitChange) {
		c.Backend = backend
		change(env, c)
		if user != nil {
			user(c)
		}
	}
	return s
}

// Circuit is a backend's breaker as the engine sees it: a gate before
// every attempt, whose pass tells it how the attempt ended, and its state
// as last heard, for spread routing.
type Circuit struct {
	b    fleet.Breaker
	env  *core.Env
	view circuitView
}

// Breaker is the breaker's fleet part.
func (g *Circuit) Breaker() fleet.Breaker { return g.b }

func (g *Circuit) AdmitAttempt(c core.Call, _ core.Attempt, now time.Time) core.Admission {
	a, err := g.b.Allow(c.Context(), now)
	c.StoreError(partBreaker, "allow", err)
	if !a.OK {
		return core.Admission{Refused: denial(now, a.NextProbe, a.State)}
	}
	seen := circuitSeen(a.State)
	if a.Ticket.Probe {
		seen |= probeBit
	}
	return core.Admission{Note: seen, Pass: circuitPass{g, a.Ticket, core.KeepGoing(c.Context(), g.b)}}
}

func (g *Circuit) RefusesAt(c core.Call, now, at time.Time) *core.Denial {
	refused, next, err := g.b.RefusesAt(c.Context(), now, at)
	c.StoreError(partBreaker, "refuses_at", err)
	if !refused {
		return nil
	}
	state, err := g.b.State(c.Context(), now)
	c.StoreError(partBreaker, "state", err)
	return denial(now, next, state)
}

// RefusesNow reports whether the breaker would refuse an attempt of c at
// once, as far as can be told at no cost: open as last heard (asked,
// taking no probe, only once its open period is over or while half-open).
func (g *Circuit) RefusesNow(c core.Call, now time.Time) bool {
	state, next := g.view.last()
	switch {
	case state == 0 || state == fleet.CircuitClosed:
		return false
	case state == fleet.CircuitOpen && now.Before(next):
		return true
	}
	refused, _, err := g.b.RefusesAt(core.KeepGoing(c.Context(), g.b), now, now)
	c.StoreError(partBreaker, "refuses_at", err)
	return refused
}

// denial is the breaker's refusal at now, in state, of an attempt it
// admits no sooner than next.
func denial(now, next time.Time, state fleet.CircuitState) *core.Denial {
	return &core.Denial{Gate: Gate, RetryAfter: next.Sub(now), Detail: circuitNote{state: state, nextProbe: next}}
}

// circuitNote is the breaker's refusal: its state, for the call's report,
// and when it admits a probe, for the caller's *Error.
type circuitNote struct {
	state     fleet.CircuitState
	nextProbe time.Time
}

func (n circuitNote) FillError(e *core.Error)                            { e.NextProbe = n.nextProbe }
func (n circuitNote) NoteReport(r *core.Report)                          { r.Circuit = n.state }
func (circuitNote) NoteAttempt(ar core.AttemptReport) core.AttemptReport { return ar }

// circuitSeen is the breaker's state as it admitted an attempt, for the
// call's report, and whether the attempt is its probe (probeBit), for the
// attempt's record: one byte, so that noting it allocates nothing.
type circuitSeen uint8

const probeBit circuitSeen = 1 << 7

func (circuitSeen) FillError(*core.Error)       {}
func (s circuitSeen) NoteReport(r *core.Report) { r.Circuit = fleet.CircuitState(s &^ probeBit) }
func (s circuitSeen) NoteAttempt(ar core.AttemptReport) core.AttemptReport {
	ar.Probe = s&probeBit != 0
	return ar
}

// circuitPass is one admitted attempt, which the breaker hears the end of
// whatever becomes of the call (ctx has no cancellation).
type circuitPass struct {
	g   *Circuit
	t   fleet.CircuitTicket
	ctx context.Context
}

// SpanAttributes marks the probe's attempt on its span.
func (p circuitPass) SpanAttributes() []attribute.KeyValue {
	if !p.t.Probe {
		return nil
	}
	return []attribute.KeyValue{keyCircuitProbe.Bool(true)}
}

func (p circuitPass) Settle(now time.Time, e core.Event) {
	v := fleet.CircuitNeutral
	switch {
	case e.Outcome.Success:
		v = fleet.CircuitSuccess
	case e.Outcome.Signal == fleet.ProviderHealth:
		v = fleet.CircuitFailure
	}
	if err := p.g.b.Done(p.ctx, p.t, now, v); err != nil {
		p.g.env.LogStoreError(p.ctx, partBreaker, "done", err)
	}
}

// circuitView is a backend's breaker as last heard: its state and, when
// open, when it admits a probe, as its changes tell them.
type circuitView struct {
	state atomic.Uint32 // a CircuitState; 0 before any change
	next  atomic.Int64  // Unix nanoseconds
}

// hears returns then, after noting each change in v.
func (v *circuitView) hears(then func(fleet.CircuitChange)) func(fleet.CircuitChange) {
	return func(c fleet.CircuitChange) {
		v.next.Store(c.NextProbe.UnixNano())
		v.state.Store(uint32(c.To))
		if then != nil {
			then(c)
		}
	}
}

// last returns the state last heard, and when an open breaker admits a
// probe.
func (v *circuitView) last() (fleet.CircuitState, time.Time) {
	return fleet.CircuitState(v.view()), time.Unix(0, v.next.Load())
}

func (v *circuitView) view() uint32 { return v.state.Load() }
