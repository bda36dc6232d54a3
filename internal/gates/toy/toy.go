// Package toy is a gate made for tests alone, declared as a real gate is,
// in one package: its refusal (outcome, sentinel, the proxy's answer,
// whether a call moves on), its part on each backend and its metric, a
// count of its refusals. Adding it to the engine's list is one line.
package toy

import (
	"context"
	"errors"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/damper-ai/damper-go/internal/core"
)

// Outcome is the toy gate's refusal's outcome.
const Outcome core.Outcome = "toy_refused"

// ErrRefused is the toy gate's refusal's sentinel.
var ErrRefused = errors.New("toy gate: refused")

// MetricRefusals counts the toy gate's refusals.
const MetricRefusals = "damper.toy.refusals"

// The toy gate's descriptors: its refusal moves a call on, or does not.
var (
	Moving  = newGate(true)
	Staying = newGate(false)
)

// For is the descriptor whose refusal moves a call on, or not.
func For(moves bool) *core.Gate {
	if moves {
		return Moving
	}
	return Staying
}

func newGate(moves bool) *core.Gate {
	return &core.Gate{
		Outcome: Outcome, Reason: ErrRefused,
		Status: http.StatusServiceUnavailable, APIType: "toy_error", Moves: moves,
		Instruments: func(meter metric.Meter, _ *core.Env, _ []core.Hooks, _ func(metric.Registration)) any {
			c, err := meter.Int64Counter(MetricRefusals)
			if err != nil {
				return nil
			}
			return c
		},
	}
}

// Policy is the toy gate's part of a Policy.
type Policy struct {
	// RefusesOn: the part on the backend of this name refuses every
	// attempt; on the others it admits them.
	RefusesOn string
	// Moves picks the descriptor of its refusal (For).
	Moves bool
	// Admits: every part admits every attempt with a pass that marks the
	// attempt's span (damper.toy.admitted).
	Admits bool
	// Counts: the part on the backend named On acts through every hook,
	// counting its calls in Counts.
	Counts *Counts
	On     string
}

// Part makes the toy gate's part on b.
func Part(p *Policy, b *core.Backend, env *core.Env) (core.Hooks, error) {
	switch {
	case p == nil:
		return core.Hooks{}, nil
	case p.Counts != nil:
		if b.Name != p.On {
			return core.Hooks{}, nil
		}
		h := p.Counts
		return core.Hooks{Attempt: h, Retry: h, Hedge: h, Spend: h, Observe: h}, nil
	case p.Admits:
		return core.Hooks{Attempt: admits{}}, nil
	}
	return core.Hooks{Attempt: refuser{refuses: b.Name == p.RefusesOn, gate: For(p.Moves), env: env}}, nil
}

// refuser is the toy gate on one backend: an attempt gate.
type refuser struct {
	refuses bool
	gate    *core.Gate
	env     *core.Env
}

func (p refuser) AdmitAttempt(c core.Call, _ core.Attempt, _ time.Time) core.Admission {
	if !p.refuses {
		return core.Admission{}
	}
	if n, ok := p.env.Instruments(Outcome).(metric.Int64Counter); ok {
		n.Add(c.Context(), 1)
	}
	return core.Admission{Refused: &core.Denial{Gate: p.gate}}
}

func (refuser) RefusesAt(core.Call, time.Time, time.Time) *core.Denial { return nil }

// admits admits every attempt with a pass.
type admits struct{}

func (admits) AdmitAttempt(core.Call, core.Attempt, time.Time) core.Admission {
	return core.Admission{Pass: pass{}}
}
func (admits) RefusesAt(core.Call, time.Time, time.Time) *core.Denial { return nil }

// pass is what the toy gate hands an attempt it admits: its span
// attribute, set from the gate's own package.
type pass struct{}

func (pass) Settle(time.Time, core.Event) {}
func (pass) SpanAttributes() []attribute.KeyValue {
	return []attribute.KeyValue{attribute.Bool("damper.toy.admitted", true)}
}

// Counts is a toy part that acts through every hook, counting its calls.
type Counts struct{ Admits, Retries, Hedges, Spends, Observed int }

func (h *Counts) AdmitAttempt(core.Call, core.Attempt, time.Time) core.Admission {
	h.Admits++
	return core.Admission{}
}
func (*Counts) RefusesAt(core.Call, time.Time, time.Time) *core.Denial { return nil }
func (h *Counts) RefusesRetry(core.Call, *core.RetryAsk) *core.Denial {
	h.Retries++
	return nil
}
func (h *Counts) RefusesHedge(core.Call, time.Time) *core.Denial { h.Hedges++; return nil }
func (h *Counts) Spend(core.Call, time.Time) *core.Denial        { h.Spends++; return nil }
func (h *Counts) ObserveAttempt(context.Context, time.Time, core.Event) {
	h.Observed++
}
