package damper_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// endRig is a Damper with in-memory telemetry before an in-memory API, in a
// synctest bubble, so that a call's end on another goroutine is waited for
// exactly (synctest.Wait).
type endRig struct {
	spans  *tracetest.InMemoryExporter
	reader *sdkmetric.ManualReader
	d      *damper.Damper
}

func newEndRig(t *testing.T) *endRig {
	t.Helper()
	r := &endRig{spans: tracetest.NewInMemoryExporter(), reader: sdkmetric.NewManualReader()}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(r.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r.reader))
	d, err := damper.New(damper.Policy{}, damper.WithTracerProvider(tp), damper.WithMeterProvider(mp), damper.WithRand(half))
	if err != nil {
		t.Fatal(err)
	}
	r.d = d
	return r
}

// client is a client through r's Damper to h, with outer given before
// Damper's option: an outer middleware sees each logical request once.
func (r *endRig) client(h http.Handler, outer ...option.RequestOption) anthropic.Client {
	opts := append(outer, r.d.Option(), option.WithBaseURL("http://api.invalid"), option.WithAPIKey("test-key"),
		option.WithHTTPClient(&http.Client{Transport: dampertest.Transport(h)}))
	return anthropic.NewClient(opts...)
}

// spanOutcomes counts the damper.request spans ended, by outcome.
func spanOutcomes(exp *tracetest.InMemoryExporter) map[string]int {
	out := map[string]int{}
	for _, s := range exp.GetSpans() {
		if s.Name != "damper.request" {
			continue
		}
		for _, kv := range s.Attributes {
			if kv.Key == "damper.outcome" {
				out[kv.Value.AsString()]++
			}
		}
	}
	return out
}

// metricOutcomes counts the requests damper.request.duration recorded, by
// outcome.
func metricOutcomes(reader *sdkmetric.ManualReader) (map[string]int, error) {
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			h, ok := m.Data.(metricdata.Histogram[float64])
			if m.Name != "damper.request.duration" || !ok {
				continue
			}
			for _, p := range h.DataPoints {
				v, _ := p.Attributes.Value(attribute.Key("damper.outcome"))
				out[v.AsString()] += int(p.Count)
			}
		}
	}
	return out, nil
}

// checkEnded checks that r's Damper ended exactly one call, with outcome,
// in its spans and its metrics.
func (r *endRig) checkEnded(t *testing.T, outcome damper.Outcome) {
	t.Helper()
	want := map[string]int{string(outcome): 1}
	if got := spanOutcomes(r.spans); !equalCounts(got, want) {
		t.Errorf("damper.request spans by outcome %v, want %v", got, want)
	}
	if got, err := metricOutcomes(r.reader); err != nil || !equalCounts(got, want) {
		t.Errorf("damper.request.duration by outcome %v (%v), want %v", got, err, want)
	}
}

func equalCounts(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// cancelAfterDamper is an outer middleware that cancels the call's context
// as soon as Damper has answered: the SDK then finds the context done and
// returns its error, dropping the answer.
func cancelAfterDamper(cancel context.CancelFunc) option.RequestOption {
	return option.WithMiddleware(func(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		res, err := next(req)
		cancel()
		return res, err
	})
}

func sseOK(text string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for _, e := range (dampertest.Stream{Text: text}).Events() {
			_, _ = io.WriteString(w, e.String())
		}
	}
}

// A stream the SDK drops because the caller's context ended as Damper
// handed it over is never read nor closed: Damper ends the call itself, as
// canceled, in its span and metrics, and closes the body.
func TestStreamDroppedByTheSDKEndsCanceled(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	synctest.Test(t, func(t *testing.T) {
		r := newEndRig(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var rep damper.Report
		client := r.client(sseOK("dropped"), cancelAfterDamper(cancel))
		_, err := drain(client.Messages.NewStreaming(ctx, streamParams(), damper.ReportInto(&rep)))
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled from the SDK", err)
		}
		synctest.Wait()
		r.checkEnded(t, damper.OutcomeCanceled)
		// The report holds what was known when the stream was handed over:
		// no outcome, never a success the caller did not get.
		if rep.Outcome == damper.OutcomeSuccess || rep.Attempts != 1 {
			t.Errorf("report %+v, want one attempt and no success", rep)
		}
	})
}

// A plain call whose context ends as Damper answers: the SDK reads the
// body, closes it and returns the context's error; the call ends canceled,
// in its report too.
func TestPlainCallDroppedByTheSDKEndsCanceled(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	synctest.Test(t, func(t *testing.T) {
		r := newEndRig(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var rep damper.Report
		client := r.client(http.HandlerFunc(okHandler), cancelAfterDamper(cancel))
		_, err := client.Messages.New(ctx, params("claude-sonnet-4-5"), damper.ReportInto(&rep))
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled from the SDK", err)
		}
		if rep.Outcome != damper.OutcomeCanceled || rep.Attempts != 1 {
			t.Errorf("report %+v, want one attempt, canceled", rep)
		}
		synctest.Wait()
		r.checkEnded(t, damper.OutcomeCanceled)
	})
}

// A stream whose context ends between two of the caller's reads ends then:
// canceled, with the caller's next read returning the context's error,
// unless the caller already has message_stop, when it succeeded.
func TestStreamContextEndsBetweenReads(t *testing.T) {
	for _, tt := range []struct {
		name    string
		text    string
		readTo  string // the event after which the context ends
		outcome damper.Outcome
		err     error
	}{
		{"after the first event", strings.Repeat("many words ", 2000), "message_start", damper.OutcomeCanceled, context.Canceled},
		{"after message_stop", "whole", "message_stop", damper.OutcomeSuccess, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := newEndRig(t)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				var rep damper.Report
				client := r.client(sseOK(tt.text))
				stream := client.Messages.NewStreaming(ctx, streamParams(), damper.ReportInto(&rep))
				defer stream.Close()
				for stream.Next() && stream.Current().Type != tt.readTo {
				}
				if got := stream.Current().Type; got != tt.readTo {
					t.Fatalf("last event %q, err %v; want %s", got, stream.Err(), tt.readTo)
				}
				cancel()
				synctest.Wait()
				r.checkEnded(t, tt.outcome) // before the caller reads again
				for stream.Next() {
				}
				if !errors.Is(stream.Err(), tt.err) || (tt.err == nil) != (stream.Err() == nil) {
					t.Fatalf("stream.Err() = %v, want %v", stream.Err(), tt.err)
				}
				if rep.Outcome != tt.outcome {
					t.Errorf("report outcome %q after the next read, want %q", rep.Outcome, tt.outcome)
				}
			})
		})
	}
}

// A context that ends after its calls have ended changes none of them:
// each call ends once, and stops its watch on the context as it does.
func TestContextEndAfterCallsChangesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newEndRig(t)
		ctx, cancel := context.WithCancel(context.Background())
		plain, streams := r.client(http.HandlerFunc(okHandler)), r.client(sseOK("short"))
		for range 50 {
			if _, err := plain.Messages.New(ctx, params("claude-sonnet-4-5")); err != nil {
				t.Fatal(err)
			}
			if _, err := drain(streams.Messages.NewStreaming(ctx, streamParams())); err != nil {
				t.Fatal(err)
			}
		}
		cancel() // a watch still registered would end its call again
		synctest.Wait()
		if got := spanOutcomes(r.spans); !equalCounts(got, map[string]int{"success": 100}) {
			t.Errorf("spans by outcome %v, want 100 successes", got)
		}
		if got, err := metricOutcomes(r.reader); err != nil || !equalCounts(got, map[string]int{"success": 100}) {
			t.Errorf("metrics by outcome %v (%v), want 100 successes", got, err)
		}
	})
}
