package damper_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/damper-ai/damper-go"
)

// Two Dampers on one MeterProvider, one per tenant, keep their series
// apart when named, and their request spans say which is which.
func TestWithNameKeepsSeriesApart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reader := sdkmetric.NewManualReader()
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		spans := tracetest.NewInMemoryExporter()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
		for name, calls := range map[string]int{"tenant-a": 1, "tenant-b": 2} {
			d, err := damper.New(damper.Policy{}, damper.WithName(name), damper.WithMeterProvider(mp), damper.WithTracerProvider(tp))
			if err != nil {
				t.Fatal(err)
			}
			client := memClient(d, http.HandlerFunc(okHandler))
			for range calls {
				if _, err := client.Messages.New(context.Background(), params("claude-sonnet-4-5")); err != nil {
					t.Fatal(err)
				}
			}
		}
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(context.Background(), &rm); err != nil {
			t.Fatal(err)
		}
		got := map[string]uint64{}
		balances := map[string]bool{}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				switch data := m.Data.(type) {
				case metricdata.Histogram[float64]:
					if m.Name == "damper.request.duration" {
						for _, p := range data.DataPoints {
							v, _ := p.Attributes.Value(attribute.Key("damper.name"))
							got[v.AsString()] += p.Count
						}
					}
				case metricdata.Gauge[float64]:
					for _, p := range data.DataPoints {
						v, _ := p.Attributes.Value(attribute.Key("damper.name"))
						balances[v.AsString()] = true
					}
				}
			}
		}
		if got["tenant-a"] != 1 || got["tenant-b"] != 2 || len(got) != 2 {
			t.Errorf("requests by damper.name %v, want tenant-a 1, tenant-b 2", got)
		}
		if !balances["tenant-a"] || !balances["tenant-b"] || len(balances) != 2 {
			t.Errorf("budget balance series %v, want one per name", balances)
		}
		named := map[string]int{}
		for _, s := range spans.GetSpans() {
			for _, kv := range s.Attributes {
				if s.Name == "damper.request" && kv.Key == "damper.name" {
					named[kv.Value.AsString()]++
				}
			}
		}
		if named["tenant-a"] != 1 || named["tenant-b"] != 2 {
			t.Errorf("damper.request spans by name %v", named)
		}
	})
}

func TestWithNameRefusesBadNames(t *testing.T) {
	for _, name := range []string{"", "has space", "tab\tname", strings.Repeat("x", 65), "é"} {
		_, err := damper.New(damper.Policy{}, damper.WithName(name))
		if err == nil || !strings.Contains(err.Error(), "WithName(") {
			t.Errorf("WithName(%q): err %v, want an error naming the setting", name, err)
		}
	}
}
