package damper_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// BenchmarkTelemetry measures a successful Messages.New call through
// Damper, served in memory, with no telemetry provider configured (the
// global no-op ones), with the OpenTelemetry SDK's tracer provider and an
// in-memory exporter given to both the Anthropic SDK and Damper, with it
// given to Damper only (Damper's own share), and with a meter provider and
// manual reader as well. docs/BENCHMARKS.md records the ratios.
func BenchmarkTelemetry(b *testing.B) {
	b.Run("none", func(b *testing.B) {
		benchCall(b, nil, nil)
	})
	b.Run("traces", func(b *testing.B) {
		exp := tracetest.NewInMemoryExporter()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
		defer func() { _ = tp.Shutdown(context.Background()) }()
		benchCall(b, exp, []damper.Setting{damper.WithTracerProvider(tp)}, option.WithTracerProvider(tp))
	})
	b.Run("damper-traces-only", func(b *testing.B) {
		exp := tracetest.NewInMemoryExporter()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
		defer func() { _ = tp.Shutdown(context.Background()) }()
		benchCall(b, exp, []damper.Setting{damper.WithTracerProvider(tp)})
	})
	b.Run("traces+metrics", func(b *testing.B) {
		exp := tracetest.NewInMemoryExporter()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
		defer func() {
			_ = tp.Shutdown(context.Background())
			_ = mp.Shutdown(context.Background())
		}()
		benchCall(b, exp, []damper.Setting{damper.WithTracerProvider(tp), damper.WithMeterProvider(mp)}, option.WithTracerProvider(tp))
	})
}

// BenchmarkTelemetryPaired makes, in every iteration, one successful
// call through each of three clients in turn: no provider configured, the
// OpenTelemetry SDK's tracer provider with an in-memory exporter given to
// both the Anthropic SDK and Damper, and that plus a meter provider. All
// three see the same machine load, so the ratios it reports hold even on
// a busy machine, where the separate runs of BenchmarkTelemetry do not.
func BenchmarkTelemetryPaired(b *testing.B) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	defer func() {
		_ = tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	}()
	srv := dampertest.NewServer()
	defer srv.Close()
	calls := []func() error{
		benchClient(b, srv, nil),
		benchClient(b, srv, []damper.Setting{damper.WithTracerProvider(tp)}, option.WithTracerProvider(tp)),
		benchClient(b, srv, []damper.Setting{damper.WithTracerProvider(tp), damper.WithMeterProvider(mp)}, option.WithTracerProvider(tp)),
	}
	spent := make([]time.Duration, len(calls))
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		for k := range calls {
			j := (i + k) % len(calls) // rotate which goes first
			start := time.Now()
			if err := calls[j](); err != nil {
				b.Fatal(err)
			}
			spent[j] += time.Since(start)
		}
		if i%1024 == 0 {
			exp.Reset()
		}
	}
	n := float64(b.N)
	b.ReportMetric(float64(spent[0].Nanoseconds())/n, "none-ns/call")
	b.ReportMetric(float64(spent[1].Nanoseconds())/n, "traces-ns/call")
	b.ReportMetric(float64(spent[2].Nanoseconds())/n, "traces+metrics-ns/call")
	b.ReportMetric(float64(spent[1])/float64(spent[0]), "traces/none")
	b.ReportMetric(float64(spent[2])/float64(spent[0]), "traces+metrics/none")
}

func benchCall(b *testing.B, exp *tracetest.InMemoryExporter, settings []damper.Setting, clientOpts ...option.RequestOption) {
	srv := dampertest.NewServer()
	defer srv.Close()
	call := benchClient(b, srv, settings, clientOpts...)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if err := call(); err != nil {
			b.Fatal(err)
		}
		if exp != nil && i%1024 == 0 {
			exp.Reset() // keep the exporter's memory bounded
		}
	}
}

// benchClient returns a function that makes one successful Messages.New
// call through a new Damper with settings, served by srv in memory.
func benchClient(b *testing.B, srv *dampertest.Server, settings []damper.Setting, clientOpts ...option.RequestOption) func() error {
	d, err := damper.New(damper.Policy{}, settings...)
	if err != nil {
		b.Fatal(err)
	}
	opts := append([]option.RequestOption{
		d.Option(),
		option.WithBaseURL("http://dampertest.invalid"),
		option.WithAPIKey("test-key"),
		option.WithHTTPClient(&http.Client{Transport: dampertest.Transport(srv.Handler())}),
	}, clientOpts...)
	client := anthropic.NewClient(opts...)
	params := telParams(pricedModel)
	return func() error {
		_, err := client.Messages.New(context.Background(), params)
		return err
	}
}
