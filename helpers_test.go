package damper_test

import (
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/damper-ai/damper-go/fleet"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// half is a random source fixed at the middle of [0, 1), so that every
// jittered wait is exactly half of its range.
func half() float64 { return 0.5 }

// rig is a Damper on a virtual clock in front of a fake API.
type rig struct {
	clock  *dampertest.Clock
	srv    *dampertest.Server
	d      *damper.Damper
	client anthropic.Client
}

func newRig(t *testing.T, p damper.Policy, settings ...damper.Setting) *rig {
	t.Helper()
	// The clock starts at the next whole minute, so that a test's virtual
	// time falls in one budget window, and in the future, so that deadlines
	// taken from it have not passed in real time.
	clk := dampertest.NewClock(time.Now().Truncate(time.Minute).Add(time.Minute))
	srv := dampertest.NewServer(dampertest.WithClock(clk))
	t.Cleanup(srv.Close)
	d, err := damper.New(p, append([]damper.Setting{damper.WithClock(clk), damper.WithRand(half)}, settings...)...)
	if err != nil {
		t.Fatal(err)
	}
	opts := append([]option.RequestOption{d.Option()}, srv.Options()...)
	return &rig{clock: clk, srv: srv, d: d, client: anthropic.NewClient(opts...)}
}

func params(model string) anthropic.MessageNewParams {
	return anthropic.MessageNewParams{
		Model:     anthropic.Model(model),
		MaxTokens: 1024,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Explain retry storms"))},
	}
}

// mustBudget returns a window budget with valid arguments.
func mustBudget(tb testing.TB, ratio float64, window time.Duration, minTokens int) *fleet.WindowBudget {
	tb.Helper()
	b, err := fleet.NewWindowBudget(ratio, window, minTokens)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// planServer answers the n-th request with the n-th stream of plans (the
// last one repeating): the events of dampertest.Stream, cut by its Fault.
// Its stalls wait only on the request's context, so that it serves tests in
// synctest bubbles, where timeouts and stalls take no real time.
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
