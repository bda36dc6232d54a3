package engine

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/damper-ai/damper-go/dampertest"
	"github.com/damper-ai/damper-go/internal/core"
	"github.com/damper-ai/damper-go/internal/gates/toy"
)

// The toy gate (package internal/gates/toy) is a gate as a real one is,
// a package of its own: it joins the engine by one line in the list.

const outcomeToy = toy.Outcome

var errToyRefused = toy.ErrRefused

const metricToyRefusals = toy.MetricRefusals

// withToy places the toy gate last in the list for the test's length,
// with policy part p: one line, as a gate's in gateList.
func withToy(t *testing.T, moves bool, p *toy.Policy) {
	t.Helper()
	saved := gateList
	gateList = append(slices.Clip(gateList), core.Use(toy.For(moves), toy.Part, func(*Policy) *toy.Policy { return p }))
	t.Cleanup(func() { gateList = saved })
}

// withToyGate places the toy gate, refusing every attempt on the
// primary, last in the list.
func withToyGate(t *testing.T, moves bool) {
	withToy(t, moves, &toy.Policy{RefusesOn: PrimaryBackend, Moves: moves})
}

// toyDamper is a Damper on a virtual clock, with a ManualReader of its
// metrics, and backends.
func toyDamper(t *testing.T, backends ...Backend) (*Damper, *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	clk := dampertest.NewClock(time.Now().Truncate(time.Minute).Add(time.Minute))
	d, err := New(Policy{}, WithClock(clk), WithRand(func() float64 { return 0.5 }),
		WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))), WithBackends(backends...))
	if err != nil {
		t.Fatal(err)
	}
	return d, reader
}

// toySums returns the sums of the counters named name, by the value of
// attribute key ("" for none).
func toySums(t *testing.T, reader *sdkmetric.ManualReader, name, key string) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if s, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == name {
				for _, p := range s.DataPoints {
					v, _ := p.Attributes.Value(attribute.Key(key))
					out[v.AsString()] += p.Value
				}
			}
		}
	}
	return out
}

// A gate added to the list alone, with no other change, refuses a call
// with its outcome and sentinel, and counts it in its own metric and in
// the denials (the proxy's answer to its refusal: the root package's
// TestToyGateRefusedAtTheProxy).
func TestToyGateRefusesThroughTheList(t *testing.T) {
	withToyGate(t, true)
	d, reader := toyDamper(t)
	srv := dampertest.NewServer(dampertest.InMemory())
	t.Cleanup(srv.Close)

	client := anthropic.NewClient(d.Option(), option.WithBaseURL(dampertest.MemoryURL), option.WithAPIKey("k"),
		option.WithHTTPClient(&http.Client{Transport: dampertest.Transport(srv.Handler())}))
	var rep Report
	_, err := client.Messages.New(context.Background(), hookParams(), ReportInto(&rep))
	var derr *Error
	if !errors.Is(err, errToyRefused) || !errors.As(err, &derr) {
		t.Fatalf("err = %v, want the toy gate's refusal", err)
	}
	if rep.Outcome != outcomeToy || rep.Attempts != 0 || srv.Count("") != 0 {
		t.Fatalf("report %+v, server %d requests; want the toy outcome and nothing sent", rep, srv.Count(""))
	}
	if got := toySums(t, reader, metricToyRefusals, ""); got[""] != 1 {
		t.Errorf("%s = %v, want 1", metricToyRefusals, got)
	}
	if got := toySums(t, reader, metricDenials, string(keyDenialReason)); got[string(outcomeToy)] != 1 {
		t.Errorf("%s = %v, want one toy_refused", metricDenials, got)
	}

}

// The toy gate's flag decides whether its refusal moves a call to the next
// backend, which it does not refuse.
func TestToyGateMovesOnItsFlag(t *testing.T) {
	for _, moves := range []bool{true, false} {
		t.Run(map[bool]string{true: "moves", false: "stays"}[moves], func(t *testing.T) {
			withToyGate(t, moves)
			second := dampertest.NewServer(dampertest.InMemory())
			t.Cleanup(second.Close)
			d, _ := toyDamper(t, Backend{Name: "second", Provider: ProviderAnthropic, Options: []option.RequestOption{
				option.WithBaseURL(dampertest.MemoryURL), option.WithAPIKey("k2"),
				option.WithHTTPClient(&http.Client{Transport: dampertest.Transport(second.Handler())}),
			}})
			primary := dampertest.NewServer(dampertest.InMemory())
			t.Cleanup(primary.Close)
			client := anthropic.NewClient(d.Option(), option.WithBaseURL(dampertest.MemoryURL), option.WithAPIKey("k"),
				option.WithHTTPClient(&http.Client{Transport: dampertest.Transport(primary.Handler())}))
			var rep Report
			_, err := client.Messages.New(context.Background(), hookParams(), ReportInto(&rep))
			switch {
			case moves && (err != nil || rep.Backend != "second" || len(rep.Fallbacks) != 1 || rep.Fallbacks[0].Reason != string(outcomeToy)):
				t.Fatalf("err %v, report %+v; want an answer from second after a toy_refused move", err, rep)
			case !moves && (!errors.Is(err, errToyRefused) || rep.Outcome != outcomeToy || len(rep.Fallbacks) != 0):
				t.Fatalf("err %v, report %+v; want the toy gate's refusal, no move", err, rep)
			}
			if primary.Count("") != 0 || moves != (second.Count("") == 1) {
				t.Fatalf("primary %d, second %d requests", primary.Count(""), second.Count(""))
			}
		})
	}
}

// A gate's pass puts its attributes on the span of the attempt it admits,
// with no change to the attempt's or the telemetry's files.
func TestToyGateSpanAttributes(t *testing.T) {
	withToy(t, false, &toy.Policy{Admits: true})

	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	d, err := New(Policy{}, WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	srv := dampertest.NewServer(dampertest.InMemory())
	t.Cleanup(srv.Close)
	client := anthropic.NewClient(d.Option(), option.WithBaseURL(dampertest.MemoryURL), option.WithAPIKey("k"),
		option.WithHTTPClient(&http.Client{Transport: dampertest.Transport(srv.Handler())}))
	if _, err := client.Messages.New(context.Background(), hookParams()); err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, s := range spans.GetSpans() {
		if s.Name != spanAttempt {
			continue
		}
		for _, kv := range s.Attributes {
			if kv.Key == "damper.toy.admitted" && kv.Value.AsBool() {
				found++
			}
		}
	}
	if found != 1 {
		t.Fatalf("attempt spans with the toy gate's attribute: %d, want 1", found)
	}
}

// Every hook a part names in its hooks is run where the list runs it: a
// call that fails once with 529 and is then answered admits two attempts,
// checks and spends for one retry, and is heard twice; no hedge is asked
// for without a hedge policy.
func TestToyGateEveryHookRuns(t *testing.T) {
	h := &toy.Counts{}
	withToy(t, false, &toy.Policy{Counts: h, On: PrimaryBackend})

	clk := dampertest.NewClock(time.Now().Truncate(time.Minute).Add(time.Minute))
	srv := dampertest.NewServer(dampertest.WithClock(clk))
	t.Cleanup(srv.Close)
	srv.Script("", dampertest.Status(529), dampertest.OK())
	d, err := New(Policy{}, WithClock(clk), WithRand(func() float64 { return 0.5 }))
	if err != nil {
		t.Fatal(err)
	}
	client := anthropic.NewClient(append([]option.RequestOption{d.Option()}, srv.Options()...)...)
	if _, err := client.Messages.New(context.Background(), hookParams()); err != nil {
		t.Fatal(err)
	}
	if *h != (toy.Counts{Admits: 2, Retries: 1, Spends: 1, Observed: 2}) {
		t.Fatalf("hooks ran %+v, want 2 admissions, 1 retry check, 1 spend, 2 observations", *h)
	}
}
