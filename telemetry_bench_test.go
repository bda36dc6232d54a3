package damper_test

import (
	"context"
	"net/http"
	"testing"

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
// in-memory exporter given to both the Anthropic SDK and Damper, and with
// a meter provider and manual reader as well. docs/BENCHMARKS.md records
// the ratios.
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

func benchCall(b *testing.B, exp *tracetest.InMemoryExporter, settings []damper.Setting, clientOpts ...option.RequestOption) {
	srv := dampertest.NewServer()
	defer srv.Close()
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
	ctx := context.Background()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, err := client.Messages.New(ctx, params); err != nil {
			b.Fatal(err)
		}
		if exp != nil && i%1024 == 0 {
			exp.Reset() // keep the exporter's memory bounded
		}
	}
}
