package damper_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/damper-ai/damper-go/fleet"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// TestFailureCatalog runs every situation of the SDK retry article through
// the real SDK against the fake API, with the default policy on a virtual
// clock, and checks attempts, waits, outcome and error for each.
func TestFailureCatalog(t *testing.T) {
	const ms = time.Millisecond
	tests := []struct {
		name     string
		policy   damper.Policy
		steps    []dampertest.Step
		attempts int
		waits    []time.Duration
		outcome  damper.Outcome
		status   int   // the *anthropic.Error status reachable with errors.As, 0 for none
		is       error // a sentinel errors.Is must match, nil for none
		ok       bool
	}{
		{
			name:     "429 always",
			steps:    []dampertest.Step{dampertest.Status(429)},
			attempts: 3, waits: []time.Duration{500 * ms, 1000 * ms},
			outcome: damper.OutcomeAttemptsExhausted, status: 429,
		},
		{
			name:     "429 retry-after 2",
			steps:    []dampertest.Step{dampertest.Status(429).RetryAfter("2"), dampertest.OK()},
			attempts: 2, waits: []time.Duration{2100 * ms}, // 2 s plus half of a tenth
			outcome: damper.OutcomeSuccess, ok: true,
		},
		{
			name:     "429 retry-after-ms 300",
			steps:    []dampertest.Step{dampertest.Status(429).RetryAfterMs("300"), dampertest.OK()},
			attempts: 2, waits: []time.Duration{315 * ms},
			outcome: damper.OutcomeSuccess, ok: true,
		},
		{
			name:     "429 retry-after 120",
			steps:    []dampertest.Step{dampertest.Status(429).RetryAfter("120"), dampertest.OK()},
			attempts: 1, waits: nil,
			outcome: damper.OutcomeRetryAfterTooLong, status: 429, is: damper.ErrRetryAfterTooLong,
		},
		{
			name:     "529 twice",
			steps:    []dampertest.Step{dampertest.Status(529), dampertest.Status(529), dampertest.OK()},
			attempts: 3, waits: []time.Duration{500 * ms, 1000 * ms},
			outcome: damper.OutcomeSuccess, ok: true,
		},
		{
			name:     "400 invalid request",
			steps:    []dampertest.Step{dampertest.Status(400)},
			attempts: 1, outcome: damper.OutcomeError, status: 400,
		},
		{
			name:     "500 with x-should-retry false",
			steps:    []dampertest.Step{dampertest.Status(500).ShouldRetry(false)},
			attempts: 1, outcome: damper.OutcomeError, status: 500,
		},
		{
			name:     "400 with x-should-retry true",
			steps:    []dampertest.Step{dampertest.Status(400).ShouldRetry(true), dampertest.OK()},
			attempts: 2, waits: []time.Duration{500 * ms},
			outcome: damper.OutcomeSuccess, ok: true,
		},
		{
			name:     "spend limit 429",
			steps:    []dampertest.Step{dampertest.SpendLimit()},
			attempts: 1, outcome: damper.OutcomeError, status: 429,
		},
		{
			name:     "dropped connection",
			steps:    []dampertest.Step{dampertest.OK().WithDrop(dampertest.DropBeforeHeaders)},
			attempts: 3, waits: []time.Duration{500 * ms, 1000 * ms},
			outcome: damper.OutcomeAttemptsExhausted,
		},
		{
			name:     "body dropped mid-way, then success",
			steps:    []dampertest.Step{dampertest.OK().WithDrop(dampertest.DropMidBody), dampertest.OK()},
			attempts: 2, waits: []time.Duration{500 * ms},
			outcome: damper.OutcomeSuccess, ok: true,
		},
		{
			name:     "3 s response past a 1 s attempt timeout",
			policy:   damper.Policy{PerAttemptTimeout: time.Second},
			steps:    []dampertest.Step{dampertest.OK().WithDelay(3 * time.Second)},
			attempts: 3, waits: []time.Duration{500 * ms, 1000 * ms},
			outcome: damper.OutcomeAttemptsExhausted, is: context.DeadlineExceeded,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, tt.policy)
			r.srv.Script("", tt.steps...)
			var rep damper.Report
			msg, err := r.client.Messages.New(context.Background(), params("claude-sonnet-4-6"), damper.ReportInto(&rep))

			if got := r.srv.Count(""); got != tt.attempts {
				t.Errorf("provider attempts = %d, want %d", got, tt.attempts)
			}
			if rep.Attempts != tt.attempts {
				t.Errorf("report attempts = %d, want %d", rep.Attempts, tt.attempts)
			}
			if got := r.clock.Sleeps(); !slices.Equal(got, tt.waits) {
				t.Errorf("waits = %v, want %v", got, tt.waits)
			}
			if rep.Outcome != tt.outcome {
				t.Errorf("outcome = %q, want %q", rep.Outcome, tt.outcome)
			}
			if tt.ok {
				if err != nil || msg == nil || msg.Content[0].Text != "ok" {
					t.Fatalf("got (%v, %v), want the message", msg, err)
				}
				return
			}
			if err == nil {
				t.Fatal("got no error")
			}
			var apiErr *anthropic.Error
			if got := errors.As(err, &apiErr); got != (tt.status != 0) {
				t.Fatalf("errors.As(*anthropic.Error) = %v for %v", got, err)
			}
			if apiErr != nil && apiErr.StatusCode != tt.status {
				t.Errorf("status = %d, want %d", apiErr.StatusCode, tt.status)
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("error %v is not %v", err, tt.is)
			}
		})
	}
}

func TestRetryAfterTooLongCarriesDelay(t *testing.T) {
	r := newRig(t, damper.Policy{})
	r.srv.Script("", dampertest.Status(429).RetryAfter("120"))
	start := time.Now()
	_, err := r.client.Messages.New(context.Background(), params("claude-sonnet-4-6"))
	if elapsed := time.Since(start); elapsed > time.Second {
		t.Errorf("took %v of real time, want well under a second", elapsed)
	}
	var derr *damper.Error
	if !errors.As(err, &derr) || derr.RetryAfter != 120*time.Second {
		t.Fatalf("err = %v, want a *damper.Error with RetryAfter 2m0s", err)
	}
	if derr.Report == nil || derr.Report.Attempts != 1 {
		t.Errorf("report on the error = %+v, want one attempt", derr.Report)
	}
}

func TestSpendLimitKeepsErrorCode(t *testing.T) {
	r := newRig(t, damper.Policy{})
	r.srv.Script("", dampertest.SpendLimit())
	_, err := r.client.Messages.New(context.Background(), params("claude-sonnet-4-6"))
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.ErrorCode() != "enforced_spend_limit_reached" {
		t.Fatalf("err = %v, want the spend-limit *anthropic.Error", err)
	}
	if apiErr.RequestID == "" {
		t.Error("the request id was lost")
	}
}

func TestPassthroughOnBudgetExhausted(t *testing.T) {
	for _, mode := range []damper.BudgetExhaustedAction{0 /* the default: raise */, damper.PassthroughBudgetExhausted} {
		t.Run(mode.String(), func(t *testing.T) {
			// A budget that starts empty: the first retry is refused.
			r := newRig(t, damper.Policy{OnBudgetExhausted: mode}, damper.WithBudget(mustBudget(t, 0.1, time.Minute, 0)))
			r.srv.Script("", dampertest.Status(529))
			var rep damper.Report
			_, err := r.client.Messages.New(context.Background(), params("claude-sonnet-4-6"), damper.ReportInto(&rep))
			if rep.Outcome != damper.OutcomeBudgetExhausted || r.srv.Count("") != 1 {
				t.Fatalf("report = %+v after %d attempts; want budget_exhausted after 1", rep, r.srv.Count(""))
			}
			var apiErr *anthropic.Error
			if !errors.As(err, &apiErr) || apiErr.StatusCode != 529 {
				t.Fatalf("err = %v, want the 529 reachable", err)
			}
			if got := errors.Is(err, damper.ErrRetryBudgetExhausted); got != (mode == 0) {
				t.Errorf("errors.Is(ErrRetryBudgetExhausted) = %v in %s mode", got, mode)
			}
		})
	}
}

// TestDeadline: no wait is started that cannot end, with a minimal
// attempt, before the caller's deadline; and errors.Is still reaches the
// context's error when the caller's own deadline ends an attempt.
func TestDeadline(t *testing.T) {
	t.Run("refused before waiting", func(t *testing.T) {
		r := newRig(t, damper.Policy{})
		r.srv.Script("", dampertest.Status(429).RetryAfter("5"), dampertest.OK())
		ctx, cancel := context.WithDeadline(context.Background(), r.clock.Now().Add(3*time.Second))
		defer cancel()
		var rep damper.Report
		_, err := r.client.Messages.New(ctx, params("claude-sonnet-4-6"), damper.ReportInto(&rep))
		if !errors.Is(err, damper.ErrDeadline) || rep.Outcome != damper.OutcomeDeadline {
			t.Fatalf("err = %v, outcome %q; want ErrDeadline", err, rep.Outcome)
		}
		if len(r.clock.Sleeps()) != 0 || r.srv.Count("") != 1 {
			t.Errorf("waited %v over %d attempts; want no wait, one attempt", r.clock.Sleeps(), r.srv.Count(""))
		}
	})
	t.Run("fits", func(t *testing.T) {
		r := newRig(t, damper.Policy{})
		r.srv.Script("", dampertest.Status(429).RetryAfter("1"), dampertest.OK())
		ctx, cancel := context.WithDeadline(context.Background(), r.clock.Now().Add(3*time.Second))
		defer cancel()
		if _, err := r.client.Messages.New(ctx, params("claude-sonnet-4-6")); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("canceled context", func(t *testing.T) {
		r := newRig(t, damper.Policy{})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := r.client.Messages.New(ctx, params("claude-sonnet-4-6"))
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
	})
}

// TestWaitEndsWithContext: a wait on the real clock ends the moment the
// caller's context does.
func TestWaitEndsWithContext(t *testing.T) {
	srv := dampertest.NewServer()
	defer srv.Close()
	srv.Script("", dampertest.Status(429).RetryAfter("30"))
	failed := make(chan struct{}, 1)
	d, err := damper.New(damper.Policy{Classifier: func(f damper.Failure, c damper.Classification) damper.Classification {
		failed <- struct{}{}
		return c
	}})
	if err != nil {
		t.Fatal(err)
	}
	client := anthropic.NewClient(append([]option.RequestOption{d.Option()}, srv.Options()...)...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var rep damper.Report
	go func() {
		_, err := client.Messages.New(ctx, params("claude-sonnet-4-6"), damper.ReportInto(&rep))
		done <- err
	}()
	<-failed // the first attempt failed; Damper is about to wait 30 s
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if rep.Outcome != damper.OutcomeCanceled || srv.Count("") != 1 {
		t.Errorf("outcome %q after %d attempts; want canceled after 1", rep.Outcome, srv.Count(""))
	}
}

func TestTransportErrorIsReturnedAsIs(t *testing.T) {
	r := newRig(t, damper.Policy{MaxAttempts: 2})
	r.srv.Script("", dampertest.OK().WithDrop(dampertest.DropBeforeHeaders))
	_, err := r.client.Messages.New(context.Background(), params("claude-sonnet-4-6"))
	var derr *damper.Error
	var apiErr *anthropic.Error
	if err == nil || errors.As(err, &derr) || errors.As(err, &apiErr) {
		t.Fatalf("err = %#v; attempts running out should return the transport error as the SDK would", err)
	}
	var netErr net.Error
	if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.As(err, &netErr) {
		t.Fatalf("err = %v, want a transport error", err)
	}
}

// seenFailures records what a Policy.Classifier is shown, and renames the kind
// so that its verdict is seen to be the one acted on.
type seenFailures struct {
	mu   sync.Mutex
	seen []damper.Failure
}

func (v *seenFailures) classify(f damper.Failure, builtin damper.Classification) damper.Classification {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.seen = append(v.seen, f)
	builtin.Kind = "mine_" + builtin.Kind
	return builtin
}

// A stream's failure after content goes through the Policy's Classifier
// like any other; it stays ambiguous whatever the verdict, and the
// attempt's record carries the verdict.
func TestClassifierSeesStreamFailureAfterContent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := &seenFailures{}
		st := dampertest.Stream{Text: firstText, ChunkSize: 4, Fault: dampertest.FaultReset}
		st.At = len(st.Events()) - 2 // after several deltas
		srv := &planServer{plans: []dampertest.Stream{st}}
		client := memClient(newDamper(t, damper.Policy{Classifier: v.classify}), srv)
		var rep damper.Report
		_, err := drain(client.Messages.NewStreaming(context.Background(), streamParams(), damper.ReportInto(&rep)))
		if !errors.Is(err, damper.ErrAmbiguous) {
			t.Fatalf("err = %v, want ErrAmbiguous", err)
		}
		if len(v.seen) != 1 || !v.seen[0].AfterContent {
			t.Fatalf("the classifier saw %+v, want the one failure after content", v.seen)
		}
		last := rep.AttemptLog[len(rep.AttemptLog)-1]
		if rep.Outcome != damper.OutcomeAmbiguous || rep.Attempts != 1 || last.Class != damper.Ambiguous || last.Kind != "mine_transport" {
			t.Fatalf("report %+v, want one ambiguous attempt of kind mine_transport", rep)
		}
	})
}

// A caller's deadline that ends an attempt is the caller's: recorded as
// canceled, never shown to a classifier as a failure of the provider's,
// never heard by the budget as one.
func TestCallerDeadlineDuringAttemptIsTheCallers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := &seenFailures{}
		b := &storeBudget{grant: true}
		srv := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			<-r.Context().Done() // never answers
		})
		d, err := damper.New(damper.Policy{PerAttemptTimeout: time.Minute, Classifier: v.classify}, damper.WithBudget(b))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		var rep damper.Report
		client := memClient(d, srv)
		_, err = client.Messages.New(ctx, params("claude-sonnet-4-5"), damper.ReportInto(&rep))
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want context.DeadlineExceeded", err)
		}
		if rep.Outcome != damper.OutcomeCanceled || rep.Attempts != 1 || rep.AttemptLog[0].Kind != "canceled" || rep.AttemptLog[0].Class != damper.NotRetryable {
			t.Fatalf("report %+v, want one attempt of kind canceled", rep)
		}
		if len(v.seen) != 0 {
			t.Errorf("the classifier saw %+v, want nothing", v.seen)
		}
		if len(b.observed) != 1 || b.observed[0] != (fleet.AttemptOutcome{First: true}) {
			t.Errorf("the budget heard %+v, want one first attempt without a signal", b.observed)
		}
	})
}

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

// Jitter is drawn once per retry and never for the last attempt, so that a
// run on a seeded random source gives the same waits whatever the gates.
func TestJitterDrawnOnlyForRetries(t *testing.T) {
	var draws int
	r := newRig(t, damper.Policy{}, damper.WithRand(func() float64 { draws++; return 0.5 }))
	r.srv.Script("", dampertest.Status(529), dampertest.Status(529), dampertest.Status(529))
	var rep damper.Report
	if _, err := r.client.Messages.New(context.Background(), params("claude-sonnet-4-6"), damper.ReportInto(&rep)); err == nil {
		t.Fatal("want the last 529")
	}
	if rep.Attempts != 3 || rep.Outcome != damper.OutcomeAttemptsExhausted || draws != 2 {
		t.Fatalf("%d attempts, outcome %q, %d draws; want 3 attempts exhausted after 2 draws", rep.Attempts, rep.Outcome, draws)
	}
}
