package damper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/breaker"
)

// The circuit breaker's gate: Policy.Breaker, over a [fleet.Breaker] from the
// backend's store. It admits every attempt (a probe, when half-open), and
// is asked before a retry whether it would refuse at the wait's end. Its
// changes of state are counted in damper.circuit.changes.

// OutcomeCircuitOpen: the circuit breaker refused the attempt.
const OutcomeCircuitOpen Outcome = "circuit_open"

// ErrCircuitOpen: the circuit breaker is open, or half-open with its
// probe in flight, so nothing was sent. [Error.NextProbe] holds when to
// try again, and [Error.RetryAfter] the time until then: open, until the
// open period ends; with a probe in flight, until the probe is due to
// answer (its PerAttemptTimeout, or its caller's deadline if sooner), or
// [fleet.CircuitOverdueWait] once that has passed. It is never longer
// than the current open period, however long PerAttemptTimeout.
var ErrCircuitOpen = errors.New("damper: circuit breaker open")

// gateCircuit's refusal reaches a proxy's client as the API's overload
// (529 overloaded_error): the breaker opens on the provider's failures of
// health, which the API reports so. It moves a call on to a backend whose
// breaker is its own.
var gateCircuit = &gate{
	outcome: OutcomeCircuitOpen, reason: ErrCircuitOpen,
	status: 529, apiType: "overloaded_error", moves: true,
	part: newCircuitGate, instruments: circuitInstruments, callSpan: circuitSpan,
}

const metricCircuitChanges = "damper.circuit.changes"

// The breaker's span attributes: its state on a call's span, its probe on
// an attempt's, and each change of state.
const (
	keyCircuitState = attribute.Key("damper.circuit.state")
	keyCircuitProbe = attribute.Key("damper.circuit.probe")
	keyCircuitFrom  = attribute.Key("damper.circuit.from")
	keyCircuitTo    = attribute.Key("damper.circuit.to")
)

// circuitSpan says the breaker's state, as it answered the call.
func circuitSpan(rep Report, attrs []attribute.KeyValue) []attribute.KeyValue {
	if rep.Circuit != 0 {
		attrs = append(attrs, keyCircuitState.String(rep.Circuit.String()))
	}
	return attrs
}

// partBreaker is the breaker's part of a store.
var partBreaker = newStorePart("breaker", "damper: circuit breaker store error")

// newCircuitGate makes backend b's breaker from its store, or nil without
// Policy.Breaker.
func newCircuitGate(d *Damper, b *backend) (hooks, error) {
	p := &d.policy
	if p.Breaker == nil {
		return hooks{}, nil
	}
	s := breakerSettings(p.Breaker, p.PerAttemptTimeout, d.tel, b.name)
	if d.spread != nil {
		s.OnChange = b.circuit.hears(s.OnChange)
	}
	br, err := fromStore("Breaker", b.store, fleet.BreakerStore.Breaker, fleet.MemoryStore.Breaker, s)
	if err != nil {
		return hooks{}, err
	}
	b.breaker = br
	return hooks{attempt: circuitGate{b: br, tel: d.tel}}, nil
}

// circuitInstruments makes the counter of the breaker's changes.
func circuitInstruments(meter metric.Meter, _ *Damper) any {
	var none noop.Meter
	return instrument(meter.Int64Counter(metricCircuitChanges, metric.WithUnit("{change}"),
		metric.WithDescription("Changes of the circuit breaker's state, by the state left and the state entered.")))(none.Int64Counter(metricCircuitChanges))
}

// circuitChange records a change of the breaker's state: a metric and a
// log line. It belongs to no call, so it has no span.
func (t *telemetry) circuitChange(c CircuitChange) {
	ctx := context.Background()
	m := &t.m
	if changes, _ := m.instrumentsOf(OutcomeCircuitOpen).(metric.Int64Counter); changes != nil && changes.Enabled(ctx) {
		kvs := []attribute.KeyValue{keyCircuitFrom.String(c.From.String()), keyCircuitTo.String(c.To.String())}
		if m.backends {
			kvs = append(kvs, keyBackend.String(c.Backend))
		}
		changes.Add(ctx, 1, m.attrs(kvs...))
	}
	t.logCircuitChange(c)
}

// logCircuitChange writes the line of a change of the breaker's state: at
// Warn when it opens, at Info otherwise.
func (t *telemetry) logCircuitChange(c CircuitChange) {
	level := slog.LevelInfo
	if c.To == CircuitOpen {
		level = slog.LevelWarn
	}
	ctx := context.Background()
	if t.log == nil || !t.log.Enabled(ctx, level) {
		return
	}
	attrs := []slog.Attr{slog.String("from", c.From.String()), slog.String("to", c.To.String())}
	if c.To == CircuitOpen {
		attrs = append(attrs, slog.Duration("open_for", c.NextProbe.Sub(c.At)))
	}
	t.log.LogAttrs(ctx, level, "damper: circuit breaker "+c.To.String(), attrs...)
}

// BreakerPolicy configures the circuit breaker: when most attempts fail on
// the provider's health (5xx, 529, transport failures, attempt timeouts),
// Damper stops sending to the provider for a while, and then sends one
// probe at a time until one succeeds. Rate limits, spend limits, other 4xx
// and the caller's own cancellations never count.
//
// The zero value is a working breaker with the defaults written beside
// each field; a nil *BreakerPolicy in a Policy means no breaker.
type BreakerPolicy struct {
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
	OnStateChange func(CircuitChange) `key:"-"` // code
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

// check is what the tags of BreakerPolicy cannot say.
func (p *BreakerPolicy) check(BreakerPolicy) error {
	if p.Window < breaker.Buckets {
		return fieldError("Window", p.Window, fmt.Sprintf("must be at least %v", time.Duration(breaker.Buckets)))
	}
	if p.MaxOpenFor < p.OpenFor {
		return fieldError("MaxOpenFor", p.MaxOpenFor, fmt.Sprintf("must not be shorter than OpenFor (%v)", p.OpenFor))
	}
	return nil
}

// circuitGate is the breaker as the engine sees it: a gate before every
// attempt, whose pass tells it how the attempt ended.
type circuitGate struct {
	b   fleet.Breaker
	tel *telemetry
}

// breakerSettings are the settings of p's breaker, for a Store: every
// change of state reaches the telemetry, then the policy's callback.
func breakerSettings(p *BreakerPolicy, attemptLimit time.Duration, tel *telemetry, backend string) fleet.BreakerSettings {
	user := p.OnStateChange
	s := fleet.BreakerSettings{
		FailureRatio: p.FailureRatio, MinAttempts: p.MinAttempts, Window: p.Window,
		OpenFor: p.OpenFor, MaxOpenFor: p.MaxOpenFor, ProbeLimit: attemptLimit,
	}
	s.OnChange = func(c CircuitChange) {
		c.Backend = backend
		tel.circuitChange(c)
		if user != nil {
			user(c)
		}
	}
	return s
}

func (g circuitGate) admitAttempt(c *call, _ *attempt, now time.Time) admission {
	a, err := g.b.Allow(c.ctx, now)
	c.storeError(partBreaker, "allow", err)
	if !a.OK {
		return admission{refused: circuitDenial(now, a.NextProbe, a.State)}
	}
	seen := circuitSeen(a.State)
	if a.Ticket.Probe {
		seen |= probeBit
	}
	return admission{note: seen, pass: circuitPass{g, a.Ticket, keepGoing(c.ctx, g.b)}}
}

func (g circuitGate) refusesAt(c *call, now, at time.Time) *denial {
	refused, next, err := g.b.RefusesAt(c.ctx, now, at)
	c.storeError(partBreaker, "refuses_at", err)
	if !refused {
		return nil
	}
	state, err := g.b.State(c.ctx, now)
	c.storeError(partBreaker, "state", err)
	return circuitDenial(now, next, state)
}

// circuitDenial is the breaker's refusal at now, in state, of an attempt
// it admits no sooner than next.
func circuitDenial(now, next time.Time, state CircuitState) *denial {
	return &denial{gate: gateCircuit, retryAfter: next.Sub(now), detail: circuitNote{state: state, nextProbe: next}}
}

// circuitNote is the breaker's refusal: its state, for the call's report,
// and when it admits a probe, for the caller's *Error.
type circuitNote struct {
	state     CircuitState
	nextProbe time.Time
}

func (n circuitNote) fillError(e *Error)                       { e.NextProbe = n.nextProbe }
func (n circuitNote) noteReport(r *callReport)                 { r.circuit(n.state) }
func (circuitNote) noteAttempt(ar AttemptReport) AttemptReport { return ar }

// circuitSeen is the breaker's state as it admitted an attempt, for the
// call's report, and whether the attempt is its probe (probeBit), for the
// attempt's record: one byte, so that noting it allocates nothing.
type circuitSeen uint8

const probeBit circuitSeen = 1 << 7

func (circuitSeen) fillError(*Error)           {}
func (s circuitSeen) noteReport(r *callReport) { r.circuit(CircuitState(s &^ probeBit)) }
func (s circuitSeen) noteAttempt(ar AttemptReport) AttemptReport {
	ar.Probe = s&probeBit != 0
	return ar
}

// circuitPass is one admitted attempt, which the breaker hears the end of
// whatever becomes of the call (ctx has no cancellation).
type circuitPass struct {
	g   circuitGate
	t   fleet.CircuitTicket
	ctx context.Context
}

// spanAttributes marks the probe's attempt on its span.
func (p circuitPass) spanAttributes() []attribute.KeyValue {
	if !p.t.Probe {
		return nil
	}
	return []attribute.KeyValue{keyCircuitProbe.Bool(true)}
}

func (p circuitPass) settle(now time.Time, e attemptEvent) {
	v := fleet.CircuitNeutral
	switch {
	case e.outcome.Success:
		v = fleet.CircuitSuccess
	case e.outcome.Signal == ProviderHealth:
		v = fleet.CircuitFailure
	}
	if err := p.g.b.Done(p.ctx, p.t, now, v); err != nil {
		p.g.tel.logStoreError(p.ctx, partBreaker, "done", err)
	}
}
