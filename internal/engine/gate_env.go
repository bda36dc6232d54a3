package engine

import (
	"context"
	"log/slog"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/damper-ai/damper-go/internal/core"
)

// gateServices are a Damper's telemetry as its gates see it
// (core.Services). It holds the telemetry, never the Damper: a gauge's
// callback that holds a gate's part must let the Damper be collected.
type gateServices struct{ t *telemetry }

// newGateEnv is what d's gates see of it.
func newGateEnv(clock Clock, t *telemetry) *core.Env {
	return &core.Env{Clock: clock, Services: gateServices{t}}
}

func (s gateServices) LogStoreError(ctx context.Context, part core.StorePart, op string, err error) {
	s.t.logStoreError(ctx, part, op, err)
}

func (s gateServices) Instruments(outcome Outcome) any { return s.t.m.instrumentsOf(outcome) }

func (s gateServices) Attrs(kvs ...attribute.KeyValue) metric.MeasurementOption {
	return s.t.m.attrs(kvs...)
}

func (s gateServices) With() []metric.ObserveOption { return s.t.m.with() }

func (s gateServices) BackendLabel(backend string) (attribute.KeyValue, bool) {
	return keyBackend.String(backend), s.t.m.backends
}

func (s gateServices) Name() (attribute.KeyValue, bool) { return s.t.m.name, s.t.m.named }

func (s gateServices) GroupLabel(group string) string { return s.t.m.groups.label(group) }

func (s gateServices) Logger() *slog.Logger { return s.t.log }
