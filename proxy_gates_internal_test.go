package damper

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go/dampertest"
	"github.com/damper-ai/damper-go/internal/core"
	"github.com/damper-ai/damper-go/internal/engine"
	"github.com/damper-ai/damper-go/internal/gates/toy"
)

// The proxy's answers to the gates' refusals; the refusals themselves are
// internal/engine's tests.

// A gate added to the list alone, with no other change: the proxy answers
// its refusal with its status and type (internal/engine's
// TestToyGateRefusesThroughTheList: its outcome, sentinel and metrics).
func TestToyGateRefusedAtTheProxy(t *testing.T) {
	p := &toy.Policy{RefusesOn: PrimaryBackend, Moves: true}
	t.Cleanup(engine.AddGateForTest(core.Use(toy.For(true), toy.Part, func(*Policy) *toy.Policy { return p })))
	clk := dampertest.NewClock(time.Now().Truncate(time.Minute).Add(time.Minute))
	d, err := New(Policy{}, WithClock(clk), WithRand(func() float64 { return 0.5 }))
	if err != nil {
		t.Fatal(err)
	}

	px, err := NewProxy(d, ProxyConfig{Upstream: "http://upstream.invalid"})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	body := `{"model":"claude-sonnet-4-6","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`
	px.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/messages", strings.NewReader(body)))
	var e struct {
		Error struct{ Type string } `json:"error"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil {
		t.Fatalf("proxy body %q: %v", rec.Body, err)
	}
	if rec.Code != http.StatusServiceUnavailable || e.Error.Type != "toy_error" || rec.Header().Get(headerOutcome) != string(toy.Outcome) {
		t.Fatalf("proxy answered %d %q, outcome %q; want 503 toy_error, toy_refused", rec.Code, e.Error.Type, rec.Header().Get(headerOutcome))
	}
}

// The proxy answers a concurrency refusal as the API answers an
// overloaded provider.
func TestConcurrencyRefusalAtTheProxy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d, err := New(Policy{Concurrency: &ConcurrencyPolicy{Max: 1, MaxWait: None}}, WithRand(func() float64 { return 0.5 }))
		if err != nil {
			t.Fatal(err)
		}
		srv := dampertest.NewServer(dampertest.InMemory())
		t.Cleanup(srv.Close)
		client := anthropic.NewClient(append([]option.RequestOption{d.Option()}, srv.Options()...)...)
		srv.Script("", dampertest.Step{Delay: 10 * time.Second})
		var wg sync.WaitGroup
		wg.Go(func() {
			_, _ = client.Messages.New(context.Background(), anthropic.MessageNewParams{
				Model: "claude-sonnet-4-6", MaxTokens: 64,
				Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))},
			})
		})
		synctest.Wait()
		first := wg.Wait

		px, err := NewProxy(d, ProxyConfig{Upstream: "http://upstream.invalid"})
		if err != nil {
			t.Error(err)
			first()
			return
		}
		rec := httptest.NewRecorder()
		body := `{"model":"claude-sonnet-4-6","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`
		px.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/messages", strings.NewReader(body)))
		var e struct {
			Type  string `json:"type"`
			Error struct{ Type string }
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil {
			t.Errorf("proxy body %q: %v", rec.Body, err)
		}
		if rec.Code != 529 || e.Type != "error" || e.Error.Type != "overloaded_error" ||
			rec.Header().Get(headerOutcome) != string(OutcomeConcurrencyLimited) || rec.Header().Get("x-should-retry") != "false" {
			t.Errorf("proxy answered %d %+v, headers %v; want 529 overloaded_error, concurrency_limited, x-should-retry: false", rec.Code, e, rec.Header())
		}
		first()
		if held, waiting := d.e.ConcurrencyHeldForTest(); held != 0 || waiting != 0 {
			t.Errorf("%d slots held, %d waiting at the end; want none", held, waiting)
		}
	})
}
