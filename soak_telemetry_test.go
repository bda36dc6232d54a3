package damper_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/damper-ai/damper-go"
)

// soakTelemetry collects every output of the soak's Dampers (spans,
// metrics, log lines) and the callers' errors and reports, and greps them
// for the clients' secrets.
type soakTelemetry struct {
	spans  *tracetest.InMemoryExporter
	reader *sdkmetric.ManualReader
	tp     *sdktrace.TracerProvider
	mp     *sdkmetric.MeterProvider

	mu     sync.Mutex
	logs   bytes.Buffer
	logger *slog.Logger

	// Figures: what was grepped.
	nSpans, nLogBytes, nErrors, nReports, nMetricBytes int
	// ended counts the damper.request spans ended, by outcome, as they end.
	ended outcomeCounter
}

// outcomeCounter is a span processor that counts the damper.request spans
// ended, by outcome.
type outcomeCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *outcomeCounter) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (c *outcomeCounter) Shutdown(context.Context) error                  { return nil }
func (c *outcomeCounter) ForceFlush(context.Context) error                { return nil }

func (c *outcomeCounter) OnEnd(s sdktrace.ReadOnlySpan) {
	if s.Name() != "damper.request" {
		return
	}
	for _, kv := range s.Attributes() {
		if kv.Key == "damper.outcome" {
			c.mu.Lock()
			c.n[kv.Value.AsString()]++
			c.mu.Unlock()
		}
	}
}

// counts returns a copy of the counts and their total.
func (c *outcomeCounter) counts() (map[string]int, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out, total := map[string]int{}, 0
	for k, v := range c.n {
		out[k] = v
		total += v
	}
	return out, total
}

func newSoakTelemetry(t *testing.T) *soakTelemetry {
	s := &soakTelemetry{spans: tracetest.NewInMemoryExporter(), reader: sdkmetric.NewManualReader(), ended: outcomeCounter{n: map[string]int{}}}
	s.tp = sdktrace.NewTracerProvider(sdktrace.WithSyncer(s.spans), sdktrace.WithSpanProcessor(&s.ended))
	s.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(s.reader))
	s.logger = slog.New(slog.NewJSONHandler(lockedWriter{s}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	t.Cleanup(func() {
		_ = s.tp.Shutdown(context.Background())
		_ = s.mp.Shutdown(context.Background())
		if !t.Failed() {
			t.Logf("secrets grepped in %d errors, %d reports, %d spans, %d bytes of logs, %d bytes of metrics",
				s.nErrors, s.nReports, s.nSpans, s.nLogBytes, s.nMetricBytes)
		}
	})
	return s
}

type lockedWriter struct{ s *soakTelemetry }

func (w lockedWriter) Write(p []byte) (int, error) {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	return w.s.logs.Write(p)
}

func (s *soakTelemetry) settings() []damper.Setting {
	return []damper.Setting{damper.WithTracerProvider(s.tp), damper.WithMeterProvider(s.mp), damper.WithLogger(s.logger)}
}

// leaks returns the secrets text holds.
func leaks(text string) []string {
	var found []string
	for _, secret := range []string{soakAPIKey, soakAuthToken, "SOAKSECRET", "SECRETBEARER"} {
		if strings.Contains(text, secret) {
			found = append(found, secret)
		}
	}
	return found
}

// check greps what one call handed its caller: the error, as text and as
// %+v, and the report as %+v.
func (s *soakTelemetry) check(ck *checker, where string, res soakResult) {
	texts := []string{fmt.Sprintf("%+v", res.report), fmt.Sprintf("%#v", res.report)}
	if res.err != nil {
		texts = append(texts, res.err.Error(), fmt.Sprintf("%+v", res.err), fmt.Sprintf("%v", res.err))
		if e, ok := res.err.(*damper.Error); ok && e.Report != nil {
			texts = append(texts, fmt.Sprintf("%+v", *e.Report))
		}
	}
	for _, text := range texts {
		if l := leaks(text); l != nil {
			ck.failf("%s: secret %q in %s", where, l, text)
		}
	}
	s.mu.Lock()
	s.nReports++
	if res.err != nil {
		s.nErrors++
	}
	s.mu.Unlock()
}

// flush greps and drops the spans, log lines and metrics collected so far.
func (s *soakTelemetry) flush(ck *checker) {
	for _, span := range s.spans.GetSpans() {
		var b strings.Builder
		fmt.Fprintf(&b, "%s %v %v", span.Name, span.Status, span.Attributes)
		for _, ev := range span.Events {
			fmt.Fprintf(&b, " %s %v", ev.Name, ev.Attributes)
		}
		if l := leaks(b.String()); l != nil {
			ck.failf("secret %q in span %s", l, b.String())
		}
		s.nSpans++
	}
	s.spans.Reset()

	s.mu.Lock()
	logs := s.logs.String()
	s.logs.Reset()
	s.nLogBytes += len(logs)
	s.mu.Unlock()
	if l := leaks(logs); l != nil {
		ck.failf("secret %q in the logs", l)
	}

	var rm metricdata.ResourceMetrics
	if err := s.reader.Collect(context.Background(), &rm); err != nil {
		ck.failf("collecting metrics: %v", err)
	}
	text := fmt.Sprintf("%+v", rm)
	s.nMetricBytes += len(text)
	if l := leaks(text); l != nil {
		ck.failf("secret %q in the metrics", l)
	}
}

// waitSpans waits until n damper.request spans have ended, or limit has
// passed, polling: over a socket, the last calls a context ended
// may still be ending on goroutines of their own.
func (s *soakTelemetry) waitSpans(ck *checker, n int, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for {
		_, got := s.ended.counts()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			ck.failf("%d damper.request spans ended after %v, want %d", got, limit, n)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// checkOutcomes checks that the spans and metrics, flushed, count the
// calls by the outcome of their reports; a report with none, a stream the
// SDK dropped, counts as canceled.
func (s *soakTelemetry) checkOutcomes(ck *checker, results []soakResult) {
	want := map[string]int{}
	for _, r := range results {
		want[string(cmpOr(r.report.Outcome, damper.OutcomeCanceled))]++
	}
	if spans, _ := s.ended.counts(); !equalCounts(spans, want) {
		ck.failf("damper.request spans by outcome %v, reports %v", spans, want)
	}
	got, err := metricOutcomes(s.reader)
	if err != nil {
		ck.failf("collecting metrics: %v", err)
		return
	}
	if !equalCounts(got, want) {
		ck.failf("damper.request.duration by outcome %v, reports %v", got, want)
	}
}

// heapAfterGC returns the bytes of live heap objects after a full collection.
func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
