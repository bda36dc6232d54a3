package damper_test

import (
	"context"
	"runtime"
	"slices"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// gaugeSeries lists, for each gauge of a Damper, the damper.name of every
// series it reports.
func gaugeSeries(t *testing.T, reader *sdkmetric.ManualReader) map[string][]string {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			var names []string
			switch g := m.Data.(type) {
			case metricdata.Gauge[float64]:
				for _, p := range g.DataPoints {
					v, _ := p.Attributes.Value("damper.name")
					names = append(names, v.AsString())
				}
			case metricdata.Gauge[int64]:
				for _, p := range g.DataPoints {
					v, _ := p.Attributes.Value("damper.name")
					names = append(names, v.AsString())
				}
			default:
				continue
			}
			slices.Sort(names)
			out[m.Name] = slices.Compact(names)
		}
	}
	return out
}

// A Damper replaced by another on the same MeterProvider reports its
// gauges until it is closed, then no more: the replacement's are the only
// series left. Its calls still run.
func TestCloseUnregistersGauges(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	srv := dampertest.NewServer()
	t.Cleanup(srv.Close)
	policy := damper.Policy{
		Concurrency: &damper.ConcurrencyPolicy{Max: 4},
		RateLimit:   &damper.RateLimitPolicy{Limits: map[string]damper.RateLimits{"claude-sonnet-4": {RequestsPerMinute: 100}}},
	}
	call := func(d *damper.Damper) {
		t.Helper()
		client := anthropic.NewClient(append([]option.RequestOption{d.Option()}, srv.Options()...)...)
		if _, err := client.Messages.New(context.Background(), anthropic.MessageNewParams{
			Model: "claude-sonnet-4-6", MaxTokens: 16,
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))},
		}); err != nil {
			t.Fatal(err)
		}
	}
	old, err := damper.New(policy, damper.WithMeterProvider(mp), damper.WithName("old"))
	if err != nil {
		t.Fatal(err)
	}
	call(old)
	replacement, err := damper.New(policy, damper.WithMeterProvider(mp), damper.WithName("new"))
	if err != nil {
		t.Fatal(err)
	}
	call(replacement)
	gauges := []string{"damper.retry_budget.balance", "damper.concurrency.limit", "damper.concurrency.in_flight", "damper.ratelimit.limit", "damper.ratelimit.remaining"}
	got := gaugeSeries(t, reader)
	for _, g := range gauges {
		if !slices.Equal(got[g], []string{"new", "old"}) {
			t.Fatalf("%s before Close: series of %q, want both Dampers'", g, got[g])
		}
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	if err := old.Close(); err != nil {
		t.Fatalf("a second Close: %v", err)
	}
	got = gaugeSeries(t, reader)
	for _, g := range gauges {
		if !slices.Equal(got[g], []string{"new"}) {
			t.Errorf("%s after the old Damper's Close: series of %q, want only the new one's", g, got[g])
		}
	}
	call(old) // closed, it still serves
	runtime.KeepAlive(old)
}
