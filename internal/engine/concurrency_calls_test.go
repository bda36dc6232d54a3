package engine

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/damper-ai/damper-go/dampertest"
)

// The concurrency limit's calls run in synctest bubbles, on the real
// clock: time moves only when every goroutine waits, so a wait for a slot
// ends at an exact time, and an attempt that holds its slot is a step with
// a Delay.

type concRig struct {
	d      *Damper
	srv    *dampertest.Server
	client anthropic.Client
	spans  *tracetest.SpanRecorder
	reader *sdkmetric.ManualReader
}

func newConcRig(t *testing.T, p Policy) *concRig {
	t.Helper()
	spans := tracetest.NewSpanRecorder()
	reader := sdkmetric.NewManualReader()
	d, err := New(p, WithRand(func() float64 { return 0.5 }),
		WithTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))),
		WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	if err != nil {
		t.Fatal(err)
	}
	srv := dampertest.NewServer(dampertest.InMemory())
	t.Cleanup(srv.Close)
	client := anthropic.NewClient(append([]option.RequestOption{d.Option()}, srv.Options()...)...)
	return &concRig{d: d, srv: srv, client: client, spans: spans, reader: reader}
}

// held is the slots held, and the attempts waiting, on the primary.
func (r *concRig) held() (held, waiting int) { return r.d.primary.conc.Held() }

func concParams() anthropic.MessageNewParams {
	return anthropic.MessageNewParams{
		Model:     "claude-sonnet-4-6",
		MaxTokens: 64,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))},
	}
}

// call makes one plain call, returning its report and error.
func (r *concRig) call(ctx context.Context) (Report, error) {
	var rep Report
	_, err := r.client.Messages.New(ctx, concParams(), ReportInto(&rep))
	var de *Error
	if rep.Outcome == "" && errors.As(err, &de) && de.Report != nil {
		rep = *de.Report
	}
	return rep, err
}

// background runs a plain call on its own goroutine, and returns what
// waits for its end.
func (r *concRig) background(ctx context.Context) func() (Report, error) {
	var (
		rep Report
		err error
		wg  sync.WaitGroup
	)
	wg.Go(func() { rep, err = r.call(ctx) })
	synctest.Wait()
	return func() (Report, error) {
		wg.Wait()
		return rep, err
	}
}

func (r *concRig) assertNoneHeld(t *testing.T) {
	t.Helper()
	if held, waiting := r.held(); held != 0 || waiting != 0 {
		t.Errorf("%d slots held, %d waiting at the end; want none", held, waiting)
	}
}

// An attempt that finds no slot waits MaxWait, not a moment more, and
// fails with ErrConcurrencyLimited, having sent nothing.
func TestConcurrencyWaitEndsAtMaxWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newConcRig(t, Policy{Concurrency: &ConcurrencyPolicy{Max: 1, MaxWait: 5 * time.Second}})
		r.srv.Script("", dampertest.Step{Delay: 30 * time.Second}, dampertest.OK())
		first := r.background(context.Background())

		start := time.Now()
		rep, err := r.call(context.Background())
		if !errors.Is(err, ErrConcurrencyLimited) || rep.Outcome != OutcomeConcurrencyLimited || rep.Attempts != 0 {
			t.Errorf("err %v, report %+v; want ErrConcurrencyLimited with nothing sent", err, rep)
		}
		if waited := time.Since(start); waited != 5*time.Second {
			t.Errorf("waited %v, want MaxWait, 5s", waited)
		}
		if _, err := first(); err != nil || r.srv.Count("") != 1 {
			t.Fatalf("first call: %v, %d requests; want it answered, alone", err, r.srv.Count(""))
		}
		r.assertNoneHeld(t)
	})
}

// A wait ends at the caller's deadline, when it comes before MaxWait: the
// call's outcome says it was still in line.
func TestConcurrencyWaitEndsAtDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newConcRig(t, Policy{Concurrency: &ConcurrencyPolicy{Max: 1, MaxWait: 5 * time.Second}})
		r.srv.Script("", dampertest.Step{Delay: 30 * time.Second}, dampertest.OK())
		first := r.background(context.Background())

		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		rep, err := r.call(ctx)
		// The wait's end and the deadline are one instant: the SDK answers
		// with the context's error when it sees the context ended first.
		// The report says what ended the call either way.
		if !(errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrConcurrencyLimited)) ||
			rep.Outcome != OutcomeConcurrencyLimited || rep.Attempts != 0 {
			t.Errorf("err %v, report %+v; want the deadline, reached in line", err, rep)
		}
		if waited := time.Since(start); waited != 2*time.Second {
			t.Errorf("waited %v, want the deadline, 2s", waited)
		}
		_, _ = first()
		r.assertNoneHeld(t)
	})
}

// A caller who gives up while waiting leaves the line at once.
func TestConcurrencyWaitEndsOnCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newConcRig(t, Policy{Concurrency: &ConcurrencyPolicy{Max: 1, MaxWait: 5 * time.Second}})
		r.srv.Script("", dampertest.Step{Delay: 30 * time.Second}, dampertest.OK())
		first := r.background(context.Background())

		ctx, cancel := context.WithCancel(context.Background())
		second := r.background(ctx)
		if held, waiting := r.held(); held != 1 || waiting != 1 {
			t.Errorf("%d held, %d waiting; want one of each", held, waiting)
		}
		start := time.Now()
		cancel()
		rep, err := second()
		if !errors.Is(err, context.Canceled) || rep.Outcome != OutcomeCanceled || time.Since(start) != 0 {
			t.Errorf("err %v, outcome %q after %v; want the cancellation at once", err, rep.Outcome, time.Since(start))
		}
		if _, waiting := r.held(); waiting != 0 {
			t.Errorf("%d still waiting after the cancel", waiting)
		}
		_, _ = first()
		r.assertNoneHeld(t)
	})
}

// The attempt that gives a slot back hands it to the one that waits
// longest, at that moment; the attempt's span says how long it waited
// and under what limit.
func TestConcurrencySlotPassesToTheLine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newConcRig(t, Policy{Concurrency: &ConcurrencyPolicy{Max: 1, MaxWait: 10 * time.Second}})
		r.srv.Script("", dampertest.Step{Delay: 3 * time.Second}, dampertest.Step{Delay: time.Second})
		first := r.background(context.Background())

		start := time.Now()
		rep, err := r.call(context.Background())
		if err != nil || rep.Attempts != 1 {
			t.Errorf("err %v, report %+v; want an answer", err, rep)
		}
		if took := time.Since(start); took != 4*time.Second {
			t.Errorf("took %v, want 3s in line and 1s of attempt", took)
		}
		_, _ = first()
		var waits []float64
		for _, s := range r.spans.Ended() {
			for _, kv := range s.Attributes() {
				if kv.Key == "damper.concurrency.wait_s" {
					waits = append(waits, kv.Value.AsFloat64())
				}
			}
		}
		if len(waits) != 2 || waits[0]+waits[1] != 3 {
			t.Errorf("damper.concurrency.wait on the attempts' spans: %v, want 0 and 3", waits)
		}
		r.assertNoneHeld(t)
	})
}

// A hedge never waits for a slot: with none free when it is due, it is
// not sent, and the attempt it would have raced goes on alone.
func TestConcurrencyHedgeNeverWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newConcRig(t, Policy{
			Concurrency: &ConcurrencyPolicy{Max: 1, MaxWait: time.Minute},
			Hedge:       &HedgePolicy{Delay: time.Second},
		})
		r.srv.Script("", dampertest.Step{Delay: 10 * time.Second}, dampertest.OK())
		start := time.Now()
		rep, err := r.call(context.Background())
		if err != nil || rep.Hedges != 0 || r.srv.Count("") != 1 {
			t.Fatalf("err %v, %d hedges, %d requests; want the first attempt alone", err, rep.Hedges, r.srv.Count(""))
		}
		if took := time.Since(start); took != 10*time.Second {
			t.Errorf("took %v, want the first attempt's 10s", took)
		}
		r.assertNoneHeld(t)
	})
}

// A retry takes a slot anew: the failed attempt gave its own back.
func TestConcurrencyRetryTakesASlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newConcRig(t, Policy{Concurrency: &ConcurrencyPolicy{Max: 1, MaxWait: None}})
		r.srv.Script("", dampertest.Status(529), dampertest.OK())
		rep, err := r.call(context.Background())
		if err != nil || rep.Attempts != 2 {
			t.Fatalf("err %v, %d attempts; want an answer at the retry", err, rep.Attempts)
		}
		r.assertNoneHeld(t)
	})
}

// A stream keeps its slot until its end, whatever ends it: read whole, cut
// by the provider, left by its caller, or a panic in the caller's read.
func TestConcurrencyStreamHoldsItsSlotToItsEnd(t *testing.T) {
	for _, tt := range []struct {
		name  string
		step  dampertest.Step
		read  func(s interface{ Next() bool }) // reads the stream, after its first event
		panic bool
	}{
		{name: "read whole", step: dampertest.Step{Stream: &dampertest.Stream{Text: "a longer answer"}},
			read: func(s interface{ Next() bool }) {
				for s.Next() {
				}
			}},
		{name: "cut by the provider", step: dampertest.Step{Stream: &dampertest.Stream{Text: "a longer answer", Fault: dampertest.FaultReset, At: 5}},
			read: func(s interface{ Next() bool }) {
				for s.Next() {
				}
			}},
		{name: "closed early", step: dampertest.Step{Stream: &dampertest.Stream{Text: "a longer answer"}},
			read: func(interface{ Next() bool }) {}},
		{name: "panic in the read", step: dampertest.Step{Stream: &dampertest.Stream{Text: "a longer answer"}},
			read: func(interface{ Next() bool }) { panic("caller's bug") }, panic: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := newConcRig(t, Policy{Concurrency: &ConcurrencyPolicy{Max: 1, MaxWait: None}})
				r.srv.Script("", tt.step)
				var heldOpen int
				func() {
					defer func() {
						if p := recover(); (p != nil) != tt.panic {
							t.Errorf("recovered %v", p)
						}
					}()
					s := r.client.Messages.NewStreaming(context.Background(), concParams())
					defer s.Close()
					if !s.Next() {
						t.Fatalf("no first event: %v", s.Err())
					}
					heldOpen, _ = r.held()
					tt.read(s)
				}()
				synctest.Wait()
				if heldOpen != 1 {
					t.Errorf("%d slots held while the stream was open, want 1", heldOpen)
				}
				r.assertNoneHeld(t)
			})
		})
	}
}

// A call cancelled while its attempt is in flight gives its slot back.
func TestConcurrencyCancelGivesTheSlotBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newConcRig(t, Policy{Concurrency: &ConcurrencyPolicy{Max: 1, MaxWait: None}})
		r.srv.Script("", dampertest.Step{Delay: 30 * time.Second})
		ctx, cancel := context.WithCancel(context.Background())
		first := r.background(ctx)
		if held, _ := r.held(); held != 1 {
			t.Errorf("%d held while the attempt is in flight, want 1", held)
		}
		cancel()
		if _, err := first(); !errors.Is(err, context.Canceled) {
			t.Fatalf("err %v, want the cancellation", err)
		}
		r.assertNoneHeld(t)
	})
}

// Batch calls hold at most BatchShare of the limit and wait behind
// interactive calls that wait: a slot given back goes to the interactive
// call, though a batch call waited longer.
func TestConcurrencyPriorities(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newConcRig(t, Policy{Concurrency: &ConcurrencyPolicy{Max: 2, BatchShare: 0.5, MaxWait: time.Minute, Priority: Batch}})
		r.srv.Script("", dampertest.Step{Delay: 10 * time.Second}, dampertest.Step{Delay: 20 * time.Second},
			dampertest.Step{Delay: time.Second}, dampertest.Step{Delay: time.Second})
		interactive := ContextWithPriority(context.Background(), Interactive)

		batch1 := r.background(context.Background()) // the batch share: one slot
		batch2 := r.background(context.Background())
		if held, waiting := r.held(); held != 1 || waiting != 1 {
			t.Errorf("%d held, %d waiting; want the second batch call in line with a slot free", held, waiting)
		}
		inter1 := r.background(interactive) // takes the free slot at once
		if held, waiting := r.held(); held != 2 || waiting != 1 {
			t.Errorf("%d held, %d waiting; want the interactive call sent at once", held, waiting)
		}
		start := time.Now()
		inter2 := r.background(interactive) // in line behind the batch call
		_, err := inter2()
		if err != nil || time.Since(start) != 11*time.Second {
			t.Errorf("second interactive call: err %v after %v; want the first slot back at 10s, then 1s", err, time.Since(start))
		}
		for _, wait := range []func() (Report, error){batch1, batch2, inter1} {
			if _, err := wait(); err != nil {
				t.Error(err)
			}
		}
		r.assertNoneHeld(t)
	})
}

// The gauges say each backend's limit and the attempts it holds.
func TestConcurrencyGauges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newConcRig(t, Policy{Concurrency: &ConcurrencyPolicy{Adaptive: true, Initial: 7}})
		r.srv.Script("", dampertest.Step{Delay: 10 * time.Second})
		first := r.background(context.Background())
		gauges := func() map[string]int64 {
			var rm metricdata.ResourceMetrics
			if err := r.reader.Collect(context.Background(), &rm); err != nil {
				t.Error(err)
			}
			out := map[string]int64{}
			for _, sm := range rm.ScopeMetrics {
				for _, m := range sm.Metrics {
					if g, ok := m.Data.(metricdata.Gauge[int64]); ok && len(g.DataPoints) == 1 {
						out[m.Name] = g.DataPoints[0].Value
					}
				}
			}
			return out
		}
		if g := gauges(); g["damper.concurrency.limit"] != 7 || g["damper.concurrency.in_flight"] != 1 {
			t.Errorf("gauges %v during the attempt, want limit 7 and 1 in flight", g)
		}
		_, _ = first()
		if g := gauges(); g["damper.concurrency.in_flight"] != 0 {
			t.Errorf("gauges %v after it, want none in flight", g)
		}
	})
}
