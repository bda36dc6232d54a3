package brownout

import (
	"context"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/embedded"
	"go.opentelemetry.io/otel/metric/noop"
)

// gaugeReader is a metric.MeterProvider that reads one Damper's Int64
// gauges on demand: its meter records nothing, but keeps the callbacks
// registered, which read calls. It lets a run sample a gauge, such as
// the concurrency limit, in virtual time.
type gaugeReader struct {
	noop.MeterProvider
	m *gaugeMeter
}

func newGaugeReader() *gaugeReader { return &gaugeReader{m: &gaugeMeter{}} }

func (g *gaugeReader) Meter(string, ...metric.MeterOption) metric.Meter { return g.m }

// read returns the value the gauge called name last reported, and whether
// it reported one.
func (g *gaugeReader) read(name string) (int64, bool) {
	o := &gaugeObserver{name: name}
	for _, f := range g.m.callbacks {
		_ = f(context.Background(), o)
	}
	return o.value, o.seen
}

type gaugeMeter struct {
	noop.Meter
	callbacks []metric.Callback
}

// namedGauge is an Int64 gauge that knows its name.
type namedGauge struct {
	noop.Int64ObservableGauge
	name string
}

func (m *gaugeMeter) Int64ObservableGauge(name string, _ ...metric.Int64ObservableGaugeOption) (metric.Int64ObservableGauge, error) {
	return namedGauge{name: name}, nil
}

func (m *gaugeMeter) RegisterCallback(f metric.Callback, _ ...metric.Observable) (metric.Registration, error) {
	m.callbacks = append(m.callbacks, f)
	return noop.Registration{}, nil
}

type gaugeObserver struct {
	embedded.Observer
	name  string
	value int64
	seen  bool
}

func (o *gaugeObserver) ObserveFloat64(metric.Float64Observable, float64, ...metric.ObserveOption) {}

func (o *gaugeObserver) ObserveInt64(obs metric.Int64Observable, v int64, _ ...metric.ObserveOption) {
	if g, ok := obs.(namedGauge); ok && g.name == o.name {
		o.value, o.seen = v, true
	}
}
