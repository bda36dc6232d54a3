package damper_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
	"github.com/damper-ai/damper-go/internal/syncbuf"
)

// backendRig is a Proxy on loopback whose upstream, the primary, is a fake
// API on loopback, with a second fake API, the fallback backend "second",
// in memory. The primary's answers carry a Damper-Backend and a
// Damper-Attempts of their own, as another proxy's would. The proxy is in
// key mode (its fallback spends the operator's key): the client presents
// testKey, tenant "svc"'s. The proxy sends the fakes no header of the
// client's but the allowed ones, so the rig tells them the scenario of
// the call itself.
type backendRig struct {
	primary, second *dampertest.Server
	proxy           http.Handler
	logs            *syncbuf.Buffer
	lines           int // the log's lines before the last call
	scenario        atomic.Pointer[string]
}

// rigUpstreamKey is the operator's key for the rig's upstream.
const rigUpstreamKey = "sk-ant-api03-rigoperatorkey"

// withScenario is h, given the rig's scenario of the call in progress.
func (r *backendRig) withScenario(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if s := r.scenario.Load(); s != nil && *s != "" {
			req.Header.Set(dampertest.ScenarioHeader, *s)
		}
		h.ServeHTTP(w, req)
	})
}

func newBackendRig(t *testing.T, p damper.Policy) *backendRig {
	t.Helper()
	clock := dampertest.NewClock(time.Now().Truncate(time.Minute).Add(time.Minute))
	r := &backendRig{
		primary: dampertest.NewServer(dampertest.InMemory(), dampertest.WithClock(clock)),
		second:  dampertest.NewServer(dampertest.InMemory(), dampertest.WithClock(clock)),
		logs:    &syncbuf.Buffer{},
	}
	t.Cleanup(r.primary.Close)
	t.Cleanup(r.second.Close)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Damper-Backend", "upstream-own")
		w.Header().Set(damper.HeaderAttempts, "9")
		r.withScenario(r.primary.Handler()).ServeHTTP(w, req)
	}))
	t.Cleanup(up.Close)
	second := damper.Backend{Name: "second", Provider: damper.ProviderAnthropic, Options: []option.RequestOption{
		option.WithBaseURL(dampertest.MemoryURL), option.WithAPIKey("second-key"),
		option.WithHTTPClient(&http.Client{Transport: dampertest.Transport(r.withScenario(r.second.Handler()))}),
	}}
	logger := slog.New(slog.NewJSONHandler(r.logs, nil))
	d, err := damper.New(p, damper.WithClock(clock), damper.WithRand(half), damper.WithBackends(second))
	if err != nil {
		t.Fatal(err)
	}
	px, err := damper.NewProxy(d, damper.ProxyConfig{Upstream: up.URL, Logger: logger,
		Tenants: []damper.Tenant{{Name: "svc", KeySHA256: []string{damper.ClientKeyHash(testKey)}}}, UpstreamAPIKey: rigUpstreamKey})
	if err != nil {
		t.Fatal(err)
	}
	r.proxy = px
	return r
}

// post sends a Messages call in scenario and returns its answer, its body
// and the request's log line.
func (r *backendRig) post(t *testing.T, scenario, body string) (*http.Response, string, map[string]any) {
	t.Helper()
	r.scenario.Store(&scenario)
	srv := httptest.NewServer(r.proxy)
	defer srv.Close()
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/messages", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Api-Key", testKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(dampertest.ScenarioHeader, scenario)
	res, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	srv.Close() // every handler has returned, its log line written
	var line map[string]any
	lines := r.logs.Lines()
	lines, r.lines = lines[r.lines:], len(lines)
	for _, l := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		if m["msg"] == "damper proxy: request" {
			if line != nil {
				t.Fatalf("two request lines:\n%s", r.logs)
			}
			line = m
		}
	}
	if line == nil {
		t.Fatalf("no request line:\n%s", r.logs)
	}
	return res, string(b), line
}

// TestProxyNamesTheBackend: the answer's Damper-Backend header and the
// request's log line name the backend whose answer the client got, by the
// name the Damper's settings give it: the primary while it answers, the
// fallback once it is down; for a provider's error passed on after a
// fallback's gate refused, the backend that sent it. An upstream's own
// Damper-* headers give way to the proxy's.
func TestProxyNamesTheBackend(t *testing.T) {
	for _, tc := range []struct {
		name    string
		policy  damper.Policy
		script  func(r *backendRig)
		calls   int // the calls in the scenario; the last is checked
		body    string
		status  int
		backend string
		outcome string
		sent    [2]int // the requests the primary and the second got, in all
	}{
		{name: "primary up", body: plainBody, status: 200, backend: "primary", outcome: "success", sent: [2]int{1, 0}},
		{name: "primary up, a stream", body: streamBody, status: 200, backend: "primary", outcome: "success", sent: [2]int{1, 0}},
		{name: "primary down", body: plainBody, status: 200, backend: "second", outcome: "success", sent: [2]int{3, 1},
			script: func(r *backendRig) { r.primary.Script("s", dampertest.Status(529)) }},
		{name: "primary down, a stream", body: streamBody, status: 200, backend: "second", outcome: "success", sent: [2]int{3, 1},
			script: func(r *backendRig) { r.primary.Script("s", dampertest.Status(529)) }},
		{name: "the primary's 400", body: plainBody, status: 400, backend: "primary", outcome: "error", sent: [2]int{1, 0},
			script: func(r *backendRig) { r.primary.Script("s", dampertest.Status(400)) }},
		{name: "both down", body: plainBody, status: 529, backend: "second", outcome: "attempts_exhausted", sent: [2]int{3, 3},
			script: func(r *backendRig) {
				r.primary.Script("s", dampertest.Status(529))
				r.second.Script("s", dampertest.Status(529))
			}},
		{
			// The first call opens the second's breaker; the second call's
			// spend limit on the primary moves it to the second, whose
			// breaker refuses: the client gets the primary's 429.
			name: "the primary's error after the fallback's refusal", body: plainBody, status: 429, backend: "primary", outcome: "circuit_open",
			policy: damper.Policy{
				Breaker:  &damper.BreakerPolicy{MinAttempts: 3, OpenFor: time.Hour, MaxOpenFor: time.Hour},
				Fallback: &damper.FallbackPolicy{OnSpendLimit: true},
			},
			calls: 2,
			sent:  [2]int{2, 3},
			script: func(r *backendRig) {
				r.primary.Script("s", dampertest.SpendLimit())
				r.second.Script("s", dampertest.Status(529))
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newBackendRig(t, tc.policy)
			if tc.script != nil {
				tc.script(r)
			}
			for range max(tc.calls, 1) - 1 {
				r.post(t, "s", tc.body)
			}
			res, body, line := r.post(t, "s", tc.body)
			if res.StatusCode != tc.status {
				t.Fatalf("%d %s, want %d", res.StatusCode, body, tc.status)
			}
			if got := res.Header.Values("Damper-Backend"); len(got) != 1 || got[0] != tc.backend {
				t.Errorf("Damper-Backend %q, want %q alone", got, tc.backend)
			}
			if got := res.Header.Values(damper.HeaderAttempts); len(got) != 1 || got[0] == "9" {
				t.Errorf("Damper-Attempts %q: the upstream's own stood", got)
			}
			outcome := res.Header.Get(damper.HeaderOutcome)
			if outcome == "" {
				outcome = res.Trailer.Get(damper.HeaderOutcome)
			}
			if outcome != tc.outcome {
				t.Errorf("Damper-Outcome %q, want %q", outcome, tc.outcome)
			}
			if sent := [2]int{r.primary.Count("s"), r.second.Count("s")}; sent != tc.sent {
				t.Errorf("the primary and the second got %v requests, want %v", sent, tc.sent)
			}
			if line["backend"] != tc.backend {
				t.Errorf("the log line's backend is %v, want %q: %v", line["backend"], tc.backend, line)
			}
		})
	}
}

// TestProxyNamesNoBackendAtTheDoor: a request refused before any backend
// names none, in its header or its log line.
func TestProxyNamesNoBackendAtTheDoor(t *testing.T) {
	r := newBackendRig(t, damper.Policy{})
	res, body, line := r.post(t, "", `{"max_tokens":64,"messages":[]}`)
	if res.StatusCode != http.StatusBadRequest {
		t.Fatalf("%d %s, want 400", res.StatusCode, body)
	}
	if got, ok := res.Header["Damper-Backend"]; ok {
		t.Errorf("Damper-Backend %q, want none", got)
	}
	if got, ok := line["backend"]; ok {
		t.Errorf("the log line's backend is %v, want none", got)
	}
	if n := r.primary.Count("") + r.second.Count(""); n != 0 {
		t.Errorf("%d requests sent, want 0", n)
	}
}
