package damper_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// These tests run in synctest bubbles on the in-memory dampertest.Transport,
// so that timeouts and stalls take no real time: the bubble's clock jumps
// as soon as every goroutine waits. They serve the streams with planServer,
// whose stalls wait only on the request's context, as a bubble requires
// (dampertest.Server's stall also waits on the server's own close channel,
// made outside any bubble).

// planServer answers the n-th request with the n-th stream of plans (the
// last one repeating): the events of dampertest.Stream, cut by its Fault.
type planServer struct {
	plans []dampertest.Stream

	mu sync.Mutex
	n  int
}

func (s *planServer) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

func (s *planServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	s.mu.Lock()
	s.n++
	n := s.n
	s.mu.Unlock()
	st := s.plans[min(n, len(s.plans))-1]

	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.Header().Set("Request-Id", fmt.Sprintf("req_%d", n))
	w.WriteHeader(http.StatusOK)
	_ = http.NewResponseController(w).Flush()
	evs := st.Events()
	at := len(evs) + 1
	if st.Fault != dampertest.FaultNone {
		at = min(max(st.At, 0), len(evs))
	}
	for i := 0; i < len(evs) && i < at; i++ {
		if _, err := io.WriteString(w, evs[i].String()); err != nil {
			return
		}
	}
	switch {
	case at > len(evs):
	case st.Fault == dampertest.FaultErrorEvent:
		errorType := st.ErrorType
		if errorType == "" {
			errorType = "overloaded_error"
		}
		_, _ = fmt.Fprintf(w, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":%q,\"message\":\"scripted\"}}\n\n", errorType)
	case st.Fault == dampertest.FaultReset:
		panic(http.ErrAbortHandler)
	case st.Fault == dampertest.FaultStall:
		<-r.Context().Done()
	}
}

// memClient is an SDK client through Damper d to h, in memory.
func memClient(d *damper.Damper, h http.Handler) anthropic.Client {
	return anthropic.NewClient(d.Option(),
		option.WithBaseURL("http://api.invalid"), option.WithAPIKey("test-key"),
		option.WithHTTPClient(&http.Client{Transport: dampertest.Transport(h)}))
}

func newDamper(t *testing.T, p damper.Policy) *damper.Damper {
	t.Helper()
	d, err := damper.New(p, damper.WithRand(func() float64 { return 0.5 }))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// A stream with no first content within PerAttemptTimeout is retried.
func TestStreamStallBeforeContentIsRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		first := dampertest.Stream{Text: firstText, Fault: dampertest.FaultStall, At: 1}
		second := dampertest.Stream{Text: secondText}
		srv := &planServer{plans: []dampertest.Stream{first, second}}
		client := memClient(newDamper(t, damper.Policy{PerAttemptTimeout: 5 * time.Second}), srv)

		var rep damper.Report
		start := time.Now()
		evs, err := drain(client.Messages.NewStreaming(context.Background(), streamParams(), damper.ReportInto(&rep)))
		if err != nil {
			t.Fatal(err)
		}
		checkEvents(t, evs, seen(second, len(second.Events())), secondText)
		// 5 s of timeout, then half of the 1 s backoff.
		if rep.Attempts != 2 || rep.AttemptLog[0].Kind != "timeout" || rep.FirstContent != 5500*time.Millisecond || time.Since(start) != 5500*time.Millisecond {
			t.Fatalf("report %+v after %v", rep, time.Since(start))
		}
	})
}

// A stall after content is an ambiguous error once StreamIdleTimeout has
// passed; without the limit, only the caller's context ends it.
func TestStreamStallAfterContent(t *testing.T) {
	st := dampertest.Stream{Text: firstText, ChunkSize: 4, Fault: dampertest.FaultStall}
	st.At = st.ContentIndex() + 2
	want := seen(st, st.At)
	synctest.Test(t, func(t *testing.T) {
		srv := &planServer{plans: []dampertest.Stream{st}}
		client := memClient(newDamper(t, damper.Policy{StreamIdleTimeout: 10 * time.Second}), srv)
		var rep damper.Report
		start := time.Now()
		evs, err := drain(client.Messages.NewStreaming(context.Background(), streamParams(), damper.ReportInto(&rep)))
		if !errors.Is(err, damper.ErrAmbiguous) || !strings.Contains(err.Error(), "stalled") {
			t.Fatalf("error %v, want an ambiguous stall", err)
		}
		checkEvents(t, evs, want, firstText[:8])
		if time.Since(start) != 10*time.Second || rep.Outcome != damper.OutcomeAmbiguous || rep.AttemptLog[0].Kind != "stall" || srv.count() != 1 {
			t.Fatalf("after %v: report %+v, %d requests", time.Since(start), rep, srv.count())
		}
	})
	synctest.Test(t, func(t *testing.T) {
		srv := &planServer{plans: []dampertest.Stream{st}}
		client := memClient(newDamper(t, damper.Policy{}), srv)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
		defer cancel()
		var rep damper.Report
		evs, err := drain(client.Messages.NewStreaming(ctx, streamParams(), damper.ReportInto(&rep)))
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, damper.ErrAmbiguous) {
			t.Fatalf("error %v, want the context's", err)
		}
		checkEvents(t, evs, want, firstText[:8])
		if rep.Outcome != damper.OutcomeCanceled || rep.Duration != 30*time.Minute {
			t.Fatalf("report %+v", rep)
		}
	})
}

// A server that sends pre-content data without end is read up to
// MaxHoldBack and no further, and the call is not retried.
func TestStreamHoldBackCutsOffUnboundedData(t *testing.T) {
	const bound = 64 << 10
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		written, requests := 0, 0
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			requests++
			mu.Unlock()
			w.Header().Set("Content-Type", "text/event-stream")
			start := dampertest.Stream{}.Events()[0].String()
			pad := ": " + strings.Repeat("x", 1021) + "\n"
			for i := 0; ; i++ {
				chunk := pad
				if i == 0 {
					chunk = start
				}
				n, err := io.WriteString(w, chunk)
				mu.Lock()
				written += n
				mu.Unlock()
				if err != nil {
					return
				}
			}
		})
		client := memClient(newDamper(t, damper.Policy{MaxHoldBack: bound}), h)
		var rep damper.Report
		evs, err := drain(client.Messages.NewStreaming(context.Background(), streamParams(), damper.ReportInto(&rep)))
		if !errors.Is(err, damper.ErrHoldBackExceeded) || len(evs) != 0 {
			t.Fatalf("%d events, error %v; want none, ErrHoldBackExceeded", len(evs), err)
		}
		synctest.Wait() // the handler has seen the connection close
		mu.Lock()
		defer mu.Unlock()
		if written != bound || requests != 1 || rep.Attempts != 1 {
			t.Fatalf("server wrote %d bytes in %d requests (%d attempts); want %d in 1", written, requests, rep.Attempts, bound)
		}
	})
}

// faults are the ways a planned attempt can go wrong.
var faults = []dampertest.Fault{dampertest.FaultErrorEvent, dampertest.FaultReset, dampertest.FaultTruncate, dampertest.FaultStall}

// randomPlans draws three attempts, each clean or failing at a random event.
func randomPlans(rng *rand.Rand, run int) []dampertest.Stream {
	plans := make([]dampertest.Stream, 3)
	for k := range plans {
		st := dampertest.Stream{
			Text:      fmt.Sprintf("run %d attempt %d: %s", run, k+1, strings.Repeat("é-", rng.IntN(40))),
			ChunkSize: 1 + rng.IntN(12),
			Pings:     rng.IntN(3),
		}
		if rng.IntN(4) > 0 {
			st.Fault = faults[rng.IntN(len(faults))]
			st.At = rng.IntN(len(st.Events()) + 1)
			if st.Fault == dampertest.FaultErrorEvent {
				st.ErrorType = []string{"overloaded_error", "api_error", "rate_limit_error", "invalid_request_error"}[rng.IntN(4)]
			}
		}
		plans[k] = st
	}
	return plans
}

// expectation is what a caller must get from plans under the default
// policy: the attempt whose events it sees (0 for none), how many attempts
// were made, and how the call ends.
type expectation struct {
	attempts int
	shown    int // 1-based attempt whose events reach the caller, 0 for none
	upTo     int // events of that attempt before the fault
	outcome  damper.Outcome
}

func expect(plans []dampertest.Stream) expectation {
	for k, st := range plans {
		n := len(st.Events())
		at := min(st.At, n)
		if st.Fault == dampertest.FaultNone || at == n {
			return expectation{attempts: k + 1, shown: k + 1, upTo: n, outcome: damper.OutcomeSuccess}
		}
		if at > st.ContentIndex() {
			return expectation{attempts: k + 1, shown: k + 1, upTo: at, outcome: damper.OutcomeAmbiguous}
		}
		if st.Fault == dampertest.FaultErrorEvent && st.ErrorType == "invalid_request_error" {
			return expectation{attempts: k + 1, outcome: damper.OutcomeError}
		}
	}
	return expectation{attempts: len(plans), outcome: damper.OutcomeAttemptsExhausted}
}

// Over thousands of random fault points, the caller sees exactly the
// events of one attempt, in order, never one of another attempt or twice,
// and every call ends.
func TestStreamPropertyRandomFaults(t *testing.T) {
	runs := 3000
	if testing.Short() {
		runs = 300
	}
	rng := rand.New(rand.NewPCG(3, 9))
	counts := map[damper.Outcome]int{}
	for run := range runs {
		plans := randomPlans(rng, run)
		want := expect(plans)
		counts[want.outcome]++
		synctest.Test(t, func(t *testing.T) {
			srv := &planServer{plans: plans}
			d := newDamper(t, damper.Policy{PerAttemptTimeout: 5 * time.Second, StreamIdleTimeout: 10 * time.Second})
			var rep damper.Report
			client := memClient(d, srv)
			evs, err := drain(client.Messages.NewStreaming(context.Background(), streamParams(), damper.ReportInto(&rep)))

			var wantEvents []string
			text := ""
			if want.shown > 0 {
				wantEvents = seen(plans[want.shown-1], want.upTo)
				text = shownText(plans[want.shown-1], want.upTo)
			}
			checkEvents(t, evs, wantEvents, text)
			if srv.count() != want.attempts || rep.Attempts != want.attempts || rep.Outcome != want.outcome {
				t.Fatalf("run %d plans %+v: %d requests, report %+v; want %+v", run, plans, srv.count(), rep, want)
			}
			var apiErr *anthropic.Error
			switch want.outcome {
			case damper.OutcomeSuccess:
				if err != nil {
					t.Fatalf("run %d: error %v", run, err)
				}
			case damper.OutcomeAmbiguous:
				if !errors.Is(err, damper.ErrAmbiguous) {
					t.Fatalf("run %d: error %v, want ErrAmbiguous", run, err)
				}
				if plans[want.shown-1].Fault == dampertest.FaultErrorEvent && !errors.As(err, &apiErr) {
					t.Fatalf("run %d: error %v does not reach the event's *anthropic.Error", run, err)
				}
			default:
				if err == nil || errors.Is(err, damper.ErrAmbiguous) {
					t.Fatalf("run %d: error %v, want the last attempt's", run, err)
				}
			}
		})
	}
	for _, o := range []damper.Outcome{damper.OutcomeSuccess, damper.OutcomeAmbiguous, damper.OutcomeError, damper.OutcomeAttemptsExhausted} {
		if counts[o] == 0 {
			t.Errorf("no run ended %q: the draw does not cover every outcome", o)
		}
	}
}

// shownText is the text a caller holds once the events of st before at have
// arrived, cut from st.Text by the script's own chunking (a delta of
// ChunkSize runes per event from ContentIndex on) rather than taken from
// its events, so that events of the wrong attempt, or text dropped or
// repeated on the way, show in the text as well. st sets Text and
// ChunkSize, as randomPlans does.
func shownText(st dampertest.Stream, at int) string {
	deltas := max(at-st.ContentIndex(), 0)
	r := []rune(st.Text)
	return string(r[:min(deltas*st.ChunkSize, len(r))])
}
