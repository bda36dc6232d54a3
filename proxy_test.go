package damper_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
	"github.com/damper-ai/damper-go/internal/syncbuf"
)

// testKey is the credential the proxy's clients send; no log, metric or
// error may hold it.
const testKey = "sk-ant-api03-proxytestsecret"

// proxyRig is a Damper on a virtual clock behind a Proxy on loopback, in
// front of a fake API on loopback that notes every request's host and key.
type proxyRig struct {
	clock   *dampertest.Clock
	srv     *dampertest.Server
	d       *damper.Damper
	up      *httptest.Server
	proxy   *httptest.Server
	logs    *syncbuf.Buffer
	metrics *sdkmetric.ManualReader

	mu    sync.Mutex
	seen  []string // "host key" of each request the upstream got
	paths []string
}

func newProxyRig(t *testing.T, p damper.Policy) *proxyRig {
	t.Helper()
	return newProxyRigAt(t, p, time.Now().Truncate(time.Minute).Add(time.Minute))
}

// newProxyRigAt is newProxyRig with its virtual clock at start.
func newProxyRigAt(t *testing.T, p damper.Policy, start time.Time) *proxyRig {
	t.Helper()
	r := &proxyRig{
		clock:   dampertest.NewClock(start),
		logs:    &syncbuf.Buffer{},
		metrics: sdkmetric.NewManualReader(),
	}
	r.srv = dampertest.NewServer(dampertest.InMemory(), dampertest.WithClock(r.clock))
	api := r.srv.Handler()
	r.up = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.seen = append(r.seen, req.Host+" "+req.Header.Get("X-Api-Key"))
		r.paths = append(r.paths, req.URL.RequestURI())
		r.mu.Unlock()
		api.ServeHTTP(w, req)
	}))
	t.Cleanup(r.up.Close)
	logger := slog.New(slog.NewJSONHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	d, err := damper.New(p, damper.WithClock(r.clock), damper.WithRand(half), damper.WithLogger(logger),
		damper.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(r.metrics))))
	if err != nil {
		t.Fatal(err)
	}
	r.d = d
	px, err := damper.NewProxy(d, damper.ProxyConfig{Upstream: r.up.URL, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	r.proxy = httptest.NewServer(px)
	t.Cleanup(r.proxy.Close)
	return r
}

// post sends a Messages call to the proxy in scenario, as curl would.
func (r *proxyRig) post(t *testing.T, scenario, body string, header ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, r.proxy.URL+"/v1/messages", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Api-Key", testKey)
	req.Header.Set("Anthropic-Version", "2023-06-01")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(dampertest.ScenarioHeader, scenario)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res, err := r.proxy.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, b
}

func (r *proxyRig) upstreamSeen() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.seen...)
}

// noKeyAnywhere fails the test if the client's key is in the logs or the
// metrics.
func (r *proxyRig) noKeyAnywhere(t *testing.T) {
	t.Helper()
	if strings.Contains(r.logs.String(), testKey) {
		t.Errorf("the key is in the logs:\n%s", r.logs)
	}
	var rm metricdata.ResourceMetrics
	if err := r.metrics.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	if b, _ := json.Marshal(rm); bytes.Contains(b, []byte(testKey)) || len(rm.ScopeMetrics) == 0 {
		t.Errorf("the key is in the metrics, or there are none: %s", b)
	}
}

const plainBody = `{"model":"claude-sonnet-4-6","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`
const streamBody = `{"model":"claude-sonnet-4-6","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}`

func wantHeader(t *testing.T, res *http.Response, k, v string) {
	t.Helper()
	if got := res.Header.Get(k); got != v {
		t.Errorf("%s = %q, want %q", k, got, v)
	}
}

// apiError reads an error body of the API's shape.
func apiError(t *testing.T, b []byte) (typ, code string) {
	t.Helper()
	var e struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
			Details struct {
				ErrorCode string `json:"error_code"`
			} `json:"details"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &e); err != nil || e.Type != "error" || e.Error.Type == "" || e.Error.Message == "" {
		t.Fatalf("not an API error body (%v): %s", err, b)
	}
	return e.Error.Type, e.Error.Details.ErrorCode
}

func TestProxyPlainCalls(t *testing.T) {
	r := newProxyRig(t, damper.Policy{})
	r.srv.Script("ok", dampertest.OK().WithText("hello"))
	r.srv.Script("overloaded", dampertest.Status(529), dampertest.OK())
	r.srv.Script("spend", dampertest.SpendLimit())
	r.srv.Script("bad", dampertest.Status(400))

	t.Run("answered", func(t *testing.T) {
		res, b := r.post(t, "ok", plainBody)
		if res.StatusCode != 200 || !bytes.Contains(b, []byte(`"hello"`)) {
			t.Fatalf("%d %s", res.StatusCode, b)
		}
		wantHeader(t, res, damper.HeaderAttempts, "1")
		wantHeader(t, res, damper.HeaderOutcome, "success")
		wantHeader(t, res, "Request-Id", "req_dampertest_ok_1")
	})
	t.Run("a 529 retried", func(t *testing.T) {
		res, _ := r.post(t, "overloaded", plainBody)
		if res.StatusCode != 200 || r.srv.Count("overloaded") != 2 {
			t.Fatalf("status %d after %d attempts, want 200 after 2", res.StatusCode, r.srv.Count("overloaded"))
		}
		wantHeader(t, res, damper.HeaderAttempts, "2")
		wantHeader(t, res, damper.HeaderRetryCost, "0.001029") // Sonnet 4.6: 23 input tokens estimated from the body, and max_tokens 64
	})
	t.Run("a spend limit at once", func(t *testing.T) {
		res, b := r.post(t, "spend", plainBody)
		if typ, code := apiError(t, b); res.StatusCode != 429 || typ != "rate_limit_error" || code != "enforced_spend_limit_reached" {
			t.Fatalf("%d %s", res.StatusCode, b)
		}
		if n := r.srv.Count("spend"); n != 1 {
			t.Errorf("%d attempts, want 1", n)
		}
		wantHeader(t, res, "X-Should-Retry", "false")
		wantHeader(t, res, damper.HeaderOutcome, "error")
	})
	t.Run("a 400 as it came", func(t *testing.T) {
		res, b := r.post(t, "bad", plainBody)
		if typ, _ := apiError(t, b); res.StatusCode != 400 || typ != "invalid_request_error" || r.srv.Count("bad") != 1 {
			t.Fatalf("%d %s after %d attempts", res.StatusCode, b, r.srv.Count("bad"))
		}
	})
	for _, s := range r.upstreamSeen() {
		if s != strings.TrimPrefix(r.up.URL, "http://")+" "+testKey {
			t.Errorf("the upstream got %q: want its own host and the client's key", s)
		}
	}
	r.noKeyAnywhere(t)
}

// TestProxyKeepsSDKRetriesOff: the client's SDK, left with its own two
// retries, makes one request per call, so that Damper's attempts are all
// the provider sees.
func TestProxyKeepsSDKRetriesOff(t *testing.T) {
	r := newProxyRig(t, damper.Policy{})
	r.srv.Script("down", dampertest.Status(529))
	client := anthropic.NewClient(option.WithBaseURL(r.proxy.URL), option.WithAPIKey(testKey),
		option.WithHTTPClient(r.proxy.Client()), dampertest.Scenario("down"))
	_, err := client.Messages.New(context.Background(), params("claude-sonnet-4-6"))
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 529 {
		t.Fatalf("err = %v, want the provider's 529", err)
	}
	if n := r.srv.Count("down"); n != 3 {
		t.Errorf("the provider got %d attempts, want Damper's 3 and no more", n)
	}
	if got := apiErr.Response.Header.Get(damper.HeaderOutcome); got != "attempts_exhausted" {
		t.Errorf("outcome %q, want attempts_exhausted", got)
	}
}

func TestProxyStreams(t *testing.T) {
	r := newProxyRig(t, damper.Policy{})
	st := dampertest.Stream{Text: "a streamed answer, in several chunks"}
	r.srv.Script("clean", dampertest.OK().WithStream(st))
	before := st
	before.Fault, before.At = dampertest.FaultReset, st.ContentIndex()
	r.srv.Script("before", dampertest.OK().WithStream(before), dampertest.OK().WithStream(st))
	cut := st
	cut.Fault, cut.At = dampertest.FaultTruncate, st.ContentIndex()+1
	r.srv.Script("cut", dampertest.OK().WithStream(cut))
	evt := st
	evt.Fault, evt.At = dampertest.FaultErrorEvent, st.ContentIndex()+1
	r.srv.Script("event", dampertest.OK().WithStream(evt))

	var whole string // the clean stream's events
	t.Run("clean", func(t *testing.T) {
		res, b := r.post(t, "clean", streamBody)
		whole = string(b)
		if res.StatusCode != 200 || !strings.HasSuffix(string(b), "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n") {
			t.Fatalf("%d %q", res.StatusCode, b)
		}
		wantHeader(t, res, damper.HeaderAttempts, "1")
		if got := res.Trailer.Get(damper.HeaderOutcome); got != "success" {
			t.Errorf("trailer %s = %q, want success", damper.HeaderOutcome, got)
		}
	})
	t.Run("failed before content, retried", func(t *testing.T) {
		res, b := r.post(t, "before", streamBody)
		if res.StatusCode != 200 || r.srv.Count("before") != 2 || strings.Count(string(b), "event: message_start") != 1 {
			t.Fatalf("%d after %d attempts: %q", res.StatusCode, r.srv.Count("before"), b)
		}
		wantHeader(t, res, damper.HeaderAttempts, "2")
	})
	for _, tc := range []struct {
		scenario, errType string
	}{{"cut", "api_error"}, {"event", "overloaded_error"}} {
		t.Run(tc.scenario+" after content", func(t *testing.T) {
			res, b := r.post(t, tc.scenario, streamBody)
			s := string(b)
			head, ev, ok := strings.Cut(s, "event: error\ndata: ")
			if res.StatusCode != 200 || !ok || !strings.HasSuffix(ev, "\n\n") || r.srv.Count(tc.scenario) != 1 {
				t.Fatalf("%d after %d attempts: %q", res.StatusCode, r.srv.Count(tc.scenario), s)
			}
			if !strings.HasPrefix(whole, head) || !strings.HasSuffix(head, "\n\n") {
				t.Errorf("the events before the error are not whole events of the answer: %q", head)
			}
			if typ, _ := apiError(t, []byte(strings.TrimSpace(ev))); typ != tc.errType {
				t.Errorf("error type %q, want %q", typ, tc.errType)
			}
			if got := res.Trailer.Get(damper.HeaderOutcome); got != "ambiguous" {
				t.Errorf("trailer %s = %q, want ambiguous", damper.HeaderOutcome, got)
			}
		})
	}
	r.noKeyAnywhere(t)
}

func TestProxyRefusals(t *testing.T) {
	t.Run("breaker open: 529 overloaded_error", func(t *testing.T) {
		r := newProxyRig(t, damper.Policy{MaxAttempts: 1, Breaker: &damper.BreakerPolicy{MinAttempts: 2, OpenFor: 30 * time.Second}})
		r.srv.Script("down", dampertest.Status(500))
		for range 2 {
			r.post(t, "down", plainBody)
		}
		res, b := r.post(t, "down", plainBody)
		if typ, _ := apiError(t, b); res.StatusCode != 529 || typ != "overloaded_error" || r.srv.Count("down") != 2 {
			t.Fatalf("%d %s after %d attempts", res.StatusCode, b, r.srv.Count("down"))
		}
		wantHeader(t, res, "Retry-After", "30")
		wantHeader(t, res, "X-Should-Retry", "false")
		wantHeader(t, res, damper.HeaderOutcome, "circuit_open")
		wantHeader(t, res, damper.HeaderAttempts, "0")
	})
	t.Run("deadline: the provider's last answer", func(t *testing.T) {
		r := newProxyRig(t, damper.Policy{})
		r.srv.Script("slow", dampertest.Status(529).RetryAfter("5"))
		res, b := r.post(t, "slow", plainBody, damper.HeaderTimeout, "2")
		if typ, _ := apiError(t, b); res.StatusCode != 529 || typ != "overloaded_error" || r.srv.Count("slow") != 1 {
			t.Fatalf("%d %s after %d attempts", res.StatusCode, b, r.srv.Count("slow"))
		}
		wantHeader(t, res, damper.HeaderOutcome, "deadline")
		wantHeader(t, res, "Request-Id", "req_dampertest_slow_1")
	})
	t.Run("the SDK's own timeout is the deadline", func(t *testing.T) {
		r := newProxyRig(t, damper.Policy{})
		r.srv.Script("slow", dampertest.Status(529).RetryAfter("5"))
		res, _ := r.post(t, "slow", plainBody, "X-Stainless-Timeout", "3")
		wantHeader(t, res, damper.HeaderOutcome, "deadline")
		res, _ = r.post(t, "slow", plainBody, "X-Stainless-Timeout", "600")
		wantHeader(t, res, damper.HeaderAttempts, "3")
	})
	t.Run("bad input", func(t *testing.T) {
		r := newProxyRig(t, damper.Policy{})
		for _, v := range []string{"soon", "0", "-1", "NaN"} {
			res, b := r.post(t, "", plainBody, damper.HeaderTimeout, v)
			if typ, _ := apiError(t, b); res.StatusCode != 400 || typ != "invalid_request_error" ||
				!strings.Contains(string(b), damper.HeaderTimeout) || !strings.Contains(string(b), v) {
				t.Errorf("%s %q: %d %s", damper.HeaderTimeout, v, res.StatusCode, b)
			}
		}
		if n := len(r.upstreamSeen()); n != 0 {
			t.Errorf("the upstream got %d requests", n)
		}
	})
}

// TestProxyClientHangsUp: a client that hangs up cancels its call, and
// the attempt under way with it.
func TestProxyClientHangsUp(t *testing.T) {
	r := newProxyRig(t, damper.Policy{})
	arrived, ended := make(chan struct{}), make(chan struct{})
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		_, _ = io.ReadAll(req.Body) // net/http sees a hang-up only once the body is read
		close(arrived)
		<-req.Context().Done()
		close(ended)
	}))
	defer hung.Close()
	px, err := damper.NewProxy(r.d, damper.ProxyConfig{Upstream: hung.URL, Logger: slog.New(slog.NewJSONHandler(r.logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(px)
	defer front.Close()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, front.URL+"/v1/messages", strings.NewReader(plainBody))
	go func() {
		<-arrived
		cancel()
	}()
	if _, err := front.Client().Do(req); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the attempt went on after its client hung up")
	}
	// The log line is written as the handler returns.
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(r.logs.String(), `"outcome":"canceled"`) {
		if time.Now().After(deadline) {
			t.Fatalf("no log line of a canceled call:\n%s", r.logs)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// smallProxy serves a second proxy of r's Damper whose bodies are limited
// to 1000 bytes.
func smallProxy(t *testing.T, r *proxyRig) *httptest.Server {
	t.Helper()
	px, err := damper.NewProxy(r.d, damper.ProxyConfig{Upstream: r.up.URL, MaxRequestBytes: 1000})
	if err != nil {
		t.Fatal(err)
	}
	small := httptest.NewServer(px)
	t.Cleanup(small.Close)
	return small
}

func TestProxyRequestLimits(t *testing.T) {
	r := newProxyRig(t, damper.Policy{})
	small := smallProxy(t, r)
	body := `{"model":"claude-sonnet-4-6","max_tokens":64,"messages":[{"role":"user","content":"` + strings.Repeat("x", 1000) + `"}]}`
	res, err := http.Post(small.URL+"/v1/messages", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if typ, _ := apiError(t, b); res.StatusCode != 413 || typ != "request_too_large" || !strings.Contains(string(b), "1000 bytes") {
		t.Errorf("%d %s", res.StatusCode, b)
	}
	// A body sent in chunks, with no length declared, is cut at the limit.
	res, err = http.Post(small.URL+"/v1/messages", "application/json", struct{ io.Reader }{strings.NewReader(body)})
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 413 || !strings.Contains(string(b), "1000 bytes") {
		t.Errorf("chunked: %d %s", res.StatusCode, b)
	}
	if n := len(r.upstreamSeen()); n != 0 {
		t.Errorf("the upstream got %d requests", n)
	}
}

// TestProxyGoesNowhereElse: whatever a request names, it reaches the one
// upstream, or nothing.
func TestProxyGoesNowhereElse(t *testing.T) {
	r := newProxyRig(t, damper.Policy{})
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		t.Error("a request reached another host")
	}))
	defer elsewhere.Close()
	other := strings.TrimPrefix(elsewhere.URL, "http://")
	raw := func(request string) string { return rawRequest(t, r.proxy.URL, request) }
	for _, req := range []string{
		"GET http://" + other + "/v1/models HTTP/1.1\r\nHost: " + other + "\r\nConnection: close\r\n\r\n",
		"POST http://" + other + "/v1/messages HTTP/1.1\r\nHost: " + other + "\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
		"CONNECT " + other + " HTTP/1.1\r\nHost: " + other + "\r\nConnection: close\r\n\r\n",
	} {
		if status := raw(req); !strings.Contains(status, " 400 ") {
			t.Errorf("%q: %s, want 400", strings.SplitN(req, "\r\n", 2)[0], status)
		}
	}
	// A Host header of another host, and a path that looks like one, go to
	// the upstream.
	for _, path := range []string{"/v1/models", "//" + other + "/v1/models", "/v1/messages/count_tokens"} {
		status := raw("GET " + path + " HTTP/1.1\r\nHost: " + other + "\r\nX-Api-Key: " + testKey + "\r\nConnection: close\r\n\r\n")
		if !strings.Contains(status, " 404 ") { // the fake API has no such endpoint
			t.Errorf("GET %s: %s, want the upstream's 404", path, status)
		}
	}
	res, b := r.post(t, "", plainBody, "Host", other)
	if res.StatusCode != 200 {
		t.Errorf("a Messages call with Host %s: %d %s", other, res.StatusCode, b)
	}
	seen := r.upstreamSeen()
	if len(seen) != 4 {
		t.Errorf("the upstream got %d requests, want 4", len(seen))
	}
	for _, s := range seen {
		if !strings.HasPrefix(s, strings.TrimPrefix(r.up.URL, "http://")+" ") {
			t.Errorf("the upstream got Host %q", s)
		}
	}
	r.mu.Lock()
	if r.paths[1] != "//"+other+"/v1/models" {
		t.Errorf("paths %q: a path is passed on as it is", r.paths)
	}
	r.mu.Unlock()
	r.noKeyAnywhere(t)
}

func TestNewProxyErrors(t *testing.T) {
	d, err := damper.New(damper.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		cfg  damper.ProxyConfig
		want string
	}{
		{damper.ProxyConfig{}, "ProxyConfig.Upstream"},
		{damper.ProxyConfig{Upstream: "api.anthropic.com"}, `"api.anthropic.com"`},
		{damper.ProxyConfig{Upstream: "ftp://api.anthropic.com"}, "http or https"},
		{damper.ProxyConfig{Upstream: "https://user:" + testKey + "@api.anthropic.com"}, "credentials"},
		{damper.ProxyConfig{Upstream: "https://user:" + testKey + "@api.anthropic.com:x"}, `"https://xxxxx@api.anthropic.com:x": is not a URL`},
		{damper.ProxyConfig{Upstream: "https://api.anthropic.com/?x=1"}, "query"},
		{damper.ProxyConfig{Upstream: "https://api.anthropic.com/v1?password=" + testKey}, `"https://api.anthropic.com/v1?xxxxx": must not have a query`},
		{damper.ProxyConfig{Upstream: "https://api.anthropic.com/#" + testKey}, `"https://api.anthropic.com/#xxxxx": must not have a query`},
		{damper.ProxyConfig{Upstream: "https://api.anthropic.com:x/?token=" + testKey}, `"https://api.anthropic.com:x/?xxxxx": is not a URL`},
		{damper.ProxyConfig{Upstream: "https://api.anthropic.com", MaxRequestBytes: -1}, "ProxyConfig.MaxRequestBytes"},
		{damper.ProxyConfig{Upstream: "https://api.anthropic.com", MaxRequestBytes: 1 << 62}, "ProxyConfig.MaxRequestBytes = 4611686018427387904: must be at most 536870912"},
		{damper.ProxyConfig{Upstream: "https://api.anthropic.com", WriteTimeout: 25 * time.Hour}, "ProxyConfig.WriteTimeout = 25h0m0s: must be at most 24h0m0s"},
	} {
		_, err := damper.NewProxy(d, tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), testKey) {
			t.Errorf("%+v: %v, want an error naming %s", tc.cfg, err, tc.want)
		}
	}
	if _, err := damper.NewProxy(nil, damper.ProxyConfig{Upstream: "https://api.anthropic.com"}); err == nil {
		t.Error("a nil Damper was taken")
	}
}

// rawRequest sends request as it is to the proxy at base and returns the
// status line of the answer.
func rawRequest(t *testing.T, base, request string) string {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, request); err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(conn)
	status, _, _ := strings.Cut(string(b), "\r\n")
	return status
}

// scrape collects the Damper's metrics through the OpenTelemetry
// Prometheus exporter, as damper proxy serves them, and returns the
// /metrics status and body.
func scrape(t *testing.T, reg *prometheus.Registry) (int, []byte) {
	t.Helper()
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	return rec.Code, rec.Body.Bytes()
}

// promDamper is a Damper on clock whose metrics a Prometheus registry
// serves.
func promDamper(t testing.TB, clock *dampertest.Clock, p damper.Policy, logger *slog.Logger) (*damper.Damper, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	d, err := damper.New(p, damper.WithClock(clock), damper.WithRand(half), damper.WithLogger(logger), damper.WithMeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}
	return d, reg
}

// TestProxyChecksAtTheDoor: what Damper decides on is checked before
// anything is sent; a bad value is refused with 400 naming the field and
// showing the value, escaped and cut, and /metrics still scrapes.
func TestProxyChecksAtTheDoor(t *testing.T) {
	r := newProxyRig(t, damper.Policy{})
	d, reg := promDamper(t, r.clock, damper.Policy{}, slog.New(slog.NewJSONHandler(r.logs, nil)))
	px, err := damper.NewProxy(d, damper.ProxyConfig{Upstream: r.up.URL})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(px)
	defer front.Close()
	r.proxy = front
	rest := `,"messages":[{"role":"user","content":"hi"}]}`
	long := strings.Repeat("m", 257)
	for _, tc := range []struct {
		name, body, field, shown string
	}{
		{"invalid UTF-8", `{"model":"bad` + "\xff\xfe" + `","max_tokens":64` + rest, "model", `bad\xff\xfe`},
		{"too long", `{"model":"` + long + `","max_tokens":64` + rest, "model", "257 bytes"},
		{"256 KiB", `{"model":"` + strings.Repeat("x", 256<<10) + `","max_tokens":64` + rest, "model", "262144 bytes"},
		{"a space", `{"model":"claude sonnet","max_tokens":64` + rest, "model", `"claude sonnet"`},
		{"a newline, escaped", `{"model":"claude\nsonnet","max_tokens":64` + rest, "model", `claude\\nsonnet`},
		{"an escaped é", `{"model":"claud\u00e9","max_tokens":64` + rest, "model", `claud\\u00e9`},
		{"a number", `{"model":4,"max_tokens":64` + rest, "model", `"4"`},
		{"empty", `{"model":"","max_tokens":64` + rest, "model", "empty"},
		{"missing", `{"max_tokens":64` + rest, "model", "required"},
		{"max_tokens 0", `{"model":"claude-sonnet-4-6","max_tokens":0` + rest, "max_tokens", `"0"`},
		{"max_tokens negative", `{"model":"claude-sonnet-4-6","max_tokens":-1` + rest, "max_tokens", `"-1"`},
		{"max_tokens a fraction", `{"model":"claude-sonnet-4-6","max_tokens":1.5` + rest, "max_tokens", `"1.5"`},
		{"max_tokens an exponent", `{"model":"claude-sonnet-4-6","max_tokens":1e3` + rest, "max_tokens", `"1e3"`},
		{"max_tokens a string", `{"model":"claude-sonnet-4-6","max_tokens":"64"` + rest, "max_tokens", `"\"64\""`},
		{"max_tokens huge", `{"model":"claude-sonnet-4-6","max_tokens":99999999999999999999` + rest, "max_tokens", "99999999999999999999"},
		{"max_tokens missing", `{"model":"claude-sonnet-4-6"` + rest, "max_tokens", "required"},
		{"stream a string", `{"model":"claude-sonnet-4-6","max_tokens":64,"stream":"true"` + rest, "stream", `"\"true\""`},
		{"stream null", `{"model":"claude-sonnet-4-6","max_tokens":64,"stream":null` + rest, "stream", `"null"`},
		{"model repeated", `{"model":"claude-haiku-4-5","max_tokens":64,"model":"claude-opus-4-1"` + rest, "model", "repeated"},
		{"model repeated, escaped", `{"model":"claude-haiku-4-5","max_tokens":64,"mod\u0065l":"claude-opus-4-1"` + rest, "model", "repeated"},
		{"stream repeated", `{"model":"claude-sonnet-4-6","stream":false,"max_tokens":64,"stream":true` + rest, "stream", "repeated"},
		{"max_tokens repeated", `{"model":"claude-sonnet-4-6","max_tokens":1,"max_tokens":64000` + rest, "max_tokens", "repeated"},
		{"not an object", `[{"model":"claude-sonnet-4-6"}]`, "JSON object", ""},
		{"not JSON", `model=claude`, "JSON object", ""},
		{"two objects", `{"model":"claude-sonnet-4-6","max_tokens":64}{"model":"x"}`, "JSON object", ""},
		{"cut short", `{"model":"claude-sonnet-4-6","max_tokens":64,"messages":[`, "JSON object", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, b := r.post(t, "", tc.body)
			typ, _ := apiError(t, b)
			var e struct {
				Error struct{ Message string } `json:"error"`
			}
			_ = json.Unmarshal(b, &e)
			if res.StatusCode != 400 || typ != "invalid_request_error" || !strings.Contains(e.Error.Message, tc.field) ||
				!strings.Contains(e.Error.Message, tc.shown) || len(e.Error.Message) > 300 {
				t.Errorf("%d %s: want 400 invalid_request_error naming %s and showing %s", res.StatusCode, b, tc.field, tc.shown)
			}
		})
	}
	if n := len(r.upstreamSeen()); n != 0 {
		t.Errorf("the upstream got %d requests: want none", n)
	}
	if code, b := scrape(t, reg); code != 200 || len(b) > 64<<10 {
		t.Errorf("/metrics: %d, %d bytes", code, len(b))
	}
	// The IDs of every platform pass.
	for _, model := range []string{
		"claude-sonnet-4-5-20250929",
		"anthropic.claude-sonnet-4-5-20250929-v1:0",
		"us.anthropic.claude-sonnet-4-5-20250929-v1:0",
		"arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-sonnet-4-5-20250929-v1:0",
		"claude-sonnet-4-5@20250929",
		"claude-sonnet-4-5_x",
		strings.Repeat("m", 256),
	} {
		res, b := r.post(t, "", `{"model":"`+model+`","max_tokens":64,"stream":false`+rest)
		if res.StatusCode != 200 || res.Header.Get(damper.HeaderAttempts) != "1" {
			t.Errorf("model %s: %d %s", model, res.StatusCode, b)
		}
	}
	if code, b := scrape(t, reg); code != 200 {
		t.Errorf("/metrics: %d %s", code, b)
	}
}

// TestProxyTimeoutHeaders: a timeout header that is not a usable number of
// seconds is refused, naming the header and showing the value, rather
// than read as no deadline.
func TestProxyTimeoutHeaders(t *testing.T) {
	r := newProxyRig(t, damper.Policy{})
	for _, h := range []struct{ name, value string }{
		{damper.HeaderTimeout, "1e-10"},
		{damper.HeaderTimeout, "0.0000001"},
		{damper.HeaderTimeout, "-1"},
		{damper.HeaderTimeout, "NaN"},
		{damper.HeaderTimeout, "Inf"},
		{damper.HeaderTimeout, "1e400"},
		{damper.HeaderTimeout, "0x10"},
		{damper.HeaderTimeout, "100000"},
		{damper.HeaderTimeout, "0"},
		{"X-Stainless-Timeout", "-5"},
		{"X-Stainless-Timeout", "Infinity"},
		{"X-Stainless-Timeout", "1e9"},
		{"X-Stainless-Timeout", "999999999999999999999"},
	} {
		res, b := r.post(t, "", plainBody, h.name, h.value)
		if typ, _ := apiError(t, b); res.StatusCode != 400 || typ != "invalid_request_error" ||
			!strings.Contains(string(b), h.name) || !strings.Contains(string(b), h.value) {
			t.Errorf("%s: %s: %d %s", h.name, h.value, res.StatusCode, b)
		}
	}
	// Repeated, with values that disagree.
	req, _ := http.NewRequest(http.MethodPost, r.proxy.URL+"/v1/messages", strings.NewReader(plainBody))
	req.Header["Damper-Timeout"] = []string{"30", "0.001"}
	res, err := r.proxy.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 400 || !strings.Contains(string(b), "repeated") {
		t.Errorf("a repeated Damper-Timeout: %d %s", res.StatusCode, b)
	}
	if n := len(r.upstreamSeen()); n != 0 {
		t.Errorf("the upstream got %d requests: want none", n)
	}
	// What the SDKs send passes.
	for _, v := range []string{"600", "0", "2.5"} {
		if res, b := r.post(t, "", plainBody, "X-Stainless-Timeout", v); res.StatusCode != 200 {
			t.Errorf("X-Stainless-Timeout %s: %d %s", v, res.StatusCode, b)
		}
	}
}

// TestProxyBodyGrowsAsItArrives: a declared Content-Length is not
// allocated before the bytes come: a request that declares 32 MiB and
// sends one byte holds far less.
func TestProxyBodyGrowsAsItArrives(t *testing.T) {
	r := newProxyRig(t, damper.Policy{})
	px, err := damper.NewProxy(r.d, damper.ProxyConfig{Upstream: r.up.URL})
	if err != nil {
		t.Fatal(err)
	}
	waiting, release := make(chan struct{}), make(chan struct{})
	body := &stallingBody{first: []byte("{"), waiting: waiting, release: release}
	req := httptest.NewRequest(http.MethodPost, "/v1/messages", body)
	req.ContentLength = 32 << 20
	var before, during runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	done := make(chan *httptest.ResponseRecorder)
	go func() {
		rec := httptest.NewRecorder()
		px.ServeHTTP(rec, req)
		done <- rec
	}()
	<-waiting // the proxy has the first byte and waits for more
	runtime.ReadMemStats(&during)
	close(release)
	rec := <-done
	if grown := during.TotalAlloc - before.TotalAlloc; grown > 4<<20 {
		t.Errorf("%d bytes allocated for a body of which one byte had come: the declared length was allocated", grown)
	}
	if rec.Code != 400 || len(r.upstreamSeen()) != 0 {
		t.Errorf("a body cut short: %d %s, %d requests upstream", rec.Code, rec.Body, len(r.upstreamSeen()))
	}
}

// stallingBody sends first, then waits for release and ends.
type stallingBody struct {
	first            []byte
	waiting, release chan struct{}
	sent             bool
}

func (b *stallingBody) Read(p []byte) (int, error) {
	if !b.sent {
		b.sent = true
		return copy(p, b.first), nil
	}
	close(b.waiting)
	<-b.release
	return 0, io.ErrUnexpectedEOF
}

// TestProxyPassThroughTooLarge: a body over the limit on another path is
// answered with 413: at once when it declares its length, with nothing
// sent; when it does not, once the limit is passed.
func TestProxyPassThroughTooLarge(t *testing.T) {
	r := newProxyRig(t, damper.Policy{})
	small := smallProxy(t, r)
	big := strings.Repeat("x", 100<<10)
	res, err := http.Post(small.URL+"/v1/files", "application/octet-stream", strings.NewReader(big))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if typ, _ := apiError(t, b); res.StatusCode != 413 || typ != "request_too_large" {
		t.Errorf("declared: %d %s", res.StatusCode, b)
	}
	if n := len(r.upstreamSeen()); n != 0 {
		t.Errorf("the upstream got %d requests: want none", n)
	}
	res, err = http.Post(small.URL+"/v1/files", "application/octet-stream", struct{ io.Reader }{strings.NewReader(big)})
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 413 || !strings.Contains(string(b), "1000 bytes") {
		t.Errorf("chunked: %d %s", res.StatusCode, b)
	}
}

// TestProxyInvalidJSONOutcome: a 200 whose body is not JSON ends the call
// in error, and the Damper-Outcome header, the log line and the metrics
// all say so.
func TestProxyInvalidJSONOutcome(t *testing.T) {
	r := newProxyRig(t, damper.Policy{})
	r.srv.Script("junk", dampertest.OK().WithBody([]byte("not json!")))
	res, b := r.post(t, "junk", plainBody)
	if res.StatusCode != 200 || string(b) != "not json!" || r.srv.Count("junk") != 1 {
		t.Fatalf("%d %q after %d attempts", res.StatusCode, b, r.srv.Count("junk"))
	}
	wantHeader(t, res, damper.HeaderOutcome, "error")
	var line struct {
		Msg     string `json:"msg"`
		Outcome string `json:"outcome"`
	}
	for l := range strings.Lines(r.logs.String()) {
		if err := json.Unmarshal([]byte(l), &line); err == nil && line.Msg == "damper proxy: request" {
			break
		}
	}
	if line.Outcome != "error" {
		t.Errorf("the log line says outcome %q, want error:\n%s", line.Outcome, r.logs)
	}
	var rm metricdata.ResourceMetrics
	if err := r.metrics.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	outcomes := map[string]bool{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if h, ok := m.Data.(metricdata.Histogram[float64]); ok && m.Name == "damper.request.duration" {
				for _, p := range h.DataPoints {
					v, _ := p.Attributes.Value("damper.outcome")
					outcomes[v.AsString()] = true
				}
			}
		}
	}
	if !outcomes["error"] || len(outcomes) != 1 {
		t.Errorf("the metrics say outcomes %v, want error alone", outcomes)
	}
}

// TestProxyMessagesPaths: every path the upstream may take for Messages
// goes through Damper, sent as /v1/messages; a path with a dot segment is
// refused and nothing is sent.
func TestProxyMessagesPaths(t *testing.T) {
	r := newProxyRig(t, damper.Policy{})
	r.srv.Script("down", dampertest.Status(529))
	host := strings.TrimPrefix(r.proxy.URL, "http://")
	post := func(path string) string {
		return "POST " + path + " HTTP/1.1\r\nHost: " + host + "\r\nX-Api-Key: " + testKey + "\r\n" + dampertest.ScenarioHeader +
			": down\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(plainBody)) + "\r\nConnection: close\r\n\r\n" + plainBody
	}
	for i, path := range []string{"/v1/messages/", "//v1/messages", "/v1//messages", "/v1/messages//?beta=true"} {
		if status := rawRequest(t, r.proxy.URL, post(path)); !strings.Contains(status, " 529 ") {
			t.Errorf("POST %s: %s, want the provider's 529", path, status)
		}
		if n := r.srv.Count("down"); n != 3*(i+1) {
			t.Errorf("POST %s: the upstream got %d requests in all, want %d: Damper's three attempts each", path, n, 3*(i+1))
		}
	}
	r.mu.Lock()
	for _, p := range r.paths {
		if p != "/v1/messages" && p != "/v1/messages?beta=true" {
			t.Errorf("sent upstream as %q, want /v1/messages", p)
		}
	}
	r.mu.Unlock()
	sent := len(r.upstreamSeen())
	for _, path := range []string{"/v1/../v1/messages", "/v1/%2e%2e/v1/messages", "/v1/%2E%2e/v1/models", "/./v1/messages", "/v1/messages/.", "/v1/.%2e/x"} {
		if status := rawRequest(t, r.proxy.URL, post(path)); !strings.Contains(status, " 400 ") {
			t.Errorf("POST %s: %s, want 400", path, status)
		}
		get := "GET " + path + " HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n\r\n"
		if status := rawRequest(t, r.proxy.URL, get); !strings.Contains(status, " 400 ") {
			t.Errorf("GET %s: %s, want 400", path, status)
		}
	}
	if n := len(r.upstreamSeen()); n != sent {
		t.Errorf("the upstream got %d requests with dot segments", n-sent)
	}
	// Other endpoints under /v1/messages are not Messages calls.
	if status := rawRequest(t, r.proxy.URL, post("/v1/messages/count_tokens")); !strings.Contains(status, " 404 ") {
		t.Errorf("count_tokens: %s, want the fake API's 404 as it came", status)
	}
}

// pausedStream serves a stream up to its first content, then waits for
// proceed (or the request's end, which it reports on cut) before the rest.
func pausedStream(proceed <-chan struct{}, cut chan<- struct{}) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		st := dampertest.Stream{Text: "a long answer"}
		for i, e := range st.Events() {
			if i == st.ContentIndex()+1 {
				select {
				case <-proceed:
				case <-r.Context().Done():
					close(cut)
					return
				}
			}
			_, _ = io.WriteString(w, e.String())
			w.(http.Flusher).Flush()
		}
	}
}

// TestProxyStainlessTimeoutIsToTheHeaders: the SDKs' X-Stainless-Timeout
// bounds the time to the answer's headers, as in the SDKs: a stream that
// runs longer finishes, where Damper-Timeout, the deadline of the whole
// call, cuts it. The Damper's clock is its own, well behind the wall
// clock: the deadlines are kept on it.
func TestProxyStainlessTimeoutIsToTheHeaders(t *testing.T) {
	for _, tc := range []struct {
		header string
		cut    bool
	}{{"X-Stainless-Timeout", false}, {damper.HeaderTimeout, true}} {
		t.Run(tc.header, func(t *testing.T) {
			r := newProxyRigAt(t, damper.Policy{}, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
			proceed, cut := make(chan struct{}), make(chan struct{})
			up := httptest.NewServer(pausedStream(proceed, cut))
			defer up.Close()
			px, err := damper.NewProxy(r.d, damper.ProxyConfig{Upstream: up.URL})
			if err != nil {
				t.Fatal(err)
			}
			front := httptest.NewServer(px)
			defer front.Close()
			req, _ := http.NewRequest(http.MethodPost, front.URL+"/v1/messages", strings.NewReader(streamBody))
			req.Header.Set(tc.header, "600")
			res, err := front.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			br := bufio.NewReader(res.Body)
			for line := ""; !strings.Contains(line, "content_block_delta"); {
				if line, err = br.ReadString('\n'); err != nil {
					t.Fatalf("%d before the first content: %v", res.StatusCode, err)
				}
			}
			r.clock.Advance(time.Hour) // the stream runs an hour
			if tc.cut {
				<-cut
			}
			close(proceed)
			rest, err := io.ReadAll(br)
			if err != nil {
				t.Fatal(err)
			}
			finished := strings.HasSuffix(string(rest), "data: {\"type\":\"message_stop\"}\n\n")
			if finished == tc.cut || res.Trailer.Get(damper.HeaderOutcome) == "success" == tc.cut {
				t.Errorf("outcome %q, the stream ends with %q; want it cut: %v", res.Trailer.Get(damper.HeaderOutcome), rest, tc.cut)
			}
		})
	}
}

// TestProxyStainlessTimeoutCutsSlowHeaders: an attempt whose headers take
// longer than X-Stainless-Timeout is cut at it, on the Damper's clock.
func TestProxyStainlessTimeoutCutsSlowHeaders(t *testing.T) {
	r := newProxyRig(t, damper.Policy{})
	r.srv.Script("slow", dampertest.OK().WithDelay(30*time.Second), dampertest.OK())
	start := r.clock.Now()
	res, b := r.post(t, "slow", plainBody, "X-Stainless-Timeout", "10")
	if typ, _ := apiError(t, b); res.StatusCode != 504 || typ != "timeout_error" || r.srv.Count("slow") != 1 {
		t.Fatalf("%d %s after %d attempts; want 504 after 1", res.StatusCode, b, r.srv.Count("slow"))
	}
	if waited := r.clock.Now().Sub(start); waited < 10*time.Second || waited >= 30*time.Second {
		t.Errorf("cut after %v, want 10s", waited)
	}
}

// TestProxyWriteDeadline: a client that stops reading a stream has its
// call ended after the write timeout, and the upstream connection freed.
func TestProxyWriteDeadline(t *testing.T) {
	r := newProxyRig(t, damper.Policy{})
	freed := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		_, _ = io.ReadAll(req.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		evs := dampertest.Stream{Text: "x"}.Events()
		for _, e := range evs[:3] {
			_, _ = io.WriteString(w, e.String())
		}
		delta := "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"" +
			strings.Repeat("x", 64<<10) + "\"}}\n\n"
		for req.Context().Err() == nil {
			if _, err := io.WriteString(w, delta); err != nil {
				break
			}
			w.(http.Flusher).Flush()
		}
		close(freed)
	}))
	defer up.Close()
	logs := &syncbuf.Buffer{}
	px, err := damper.NewProxy(r.d, damper.ProxyConfig{Upstream: up.URL, WriteTimeout: 200 * time.Millisecond,
		Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(px)
	defer front.Close()
	conn, err := net.Dial("tcp", strings.TrimPrefix(front.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = io.WriteString(conn, "POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "+
		strconv.Itoa(len(streamBody))+"\r\n\r\n"+streamBody) // and never read
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-freed:
	case <-time.After(20 * time.Second):
		t.Fatal("the upstream connection is still held 20 s after the client stopped reading")
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), `"outcome":"canceled"`) {
		if time.Now().After(deadline) {
			t.Fatalf("no log line of the call ended:\n%s", logs)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// FuzzProxy drives arbitrary requests through the proxy's handler, in
// front of the fake API in memory: the handler returns, with a status a
// server may send; a request refused at the door sends nothing upstream;
// /metrics still scrapes and stays small; and the log stays small.
func FuzzProxy(f *testing.F) {
	for _, seed := range []struct {
		method, path, header, body string
	}{
		{"POST", "/v1/messages", "Content-Type: application/json", plainBody},
		{"POST", "/v1/messages", "X-Stainless-Timeout: 600", streamBody},
		{"POST", "/v1/messages", "Damper-Timeout: 1e-10", plainBody},
		{"POST", "/v1/messages", "Damper-Timeout: 0.001\nX-Stainless-Timeout: 0", plainBody},
		{"POST", "/v1/messages/", "", `{"model":"bad` + "\xff\xfe" + `","max_tokens":64,"messages":[]}`},
		{"POST", "//v1/messages", "", `{"model":"claude-haiku-4-5","model":"claude-opus-4-1","max_tokens":64,"messages":[]}`},
		{"POST", "/v1/messages", "", `{"model":"` + strings.Repeat("m", 4096) + `","max_tokens":64,"messages":[]}`},
		{"POST", "/v1/messages", "", `{"model":"us.anthropic.claude-sonnet-4-5-20250929-v1:0","max_tokens":1000000,"stream":true,"messages":[]}`},
		{"POST", "/v1/messages", "", `{"mod\u0065l":"claude-sonnet-4-5@20250929","max_tokens":64,"messages":[{"role":"user","content":[{"type":"image","source":{"data":"AAAA"}}]}]}`},
		{"POST", "/v1/../v1/messages", "", plainBody},
		{"GET", "/v1/models", "X-Api-Key: k", ""},
		{"POST", "/v1/files", "Content-Type: application/octet-stream", "\x00\x01"},
		{"POST", "/v1/messages", dampertest.ScenarioHeader + ": nope", `{"model":"claude-sonnet-4-6","max_tokens":64,"stream":1}`},
	} {
		f.Add(seed.method, seed.path, seed.header, []byte(seed.body))
	}
	f.Fuzz(func(t *testing.T, method, path, header string, body []byte) {
		if !strings.HasPrefix(path, "/") {
			path = "/" + path
		}
		req, err := http.NewRequest(method, "http://proxy.test/", bytes.NewReader(body))
		if err != nil {
			t.Skip() // not a method a server would read
		}
		u, err := url.ParseRequestURI(path)
		if err != nil {
			t.Skip() // not a target a server would read
		}
		req.URL, req.RequestURI = u, path
		for line := range strings.Lines(header) {
			if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && k != "" && !strings.ContainsAny(k, " \t\r\n") {
				req.Header.Add(k, strings.TrimSpace(v))
			}
		}
		clock := dampertest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
		srv := dampertest.NewServer(dampertest.InMemory(), dampertest.WithClock(clock))
		logs := &syncbuf.Buffer{}
		logger := slog.New(slog.NewJSONHandler(logs, nil))
		d, reg := promDamper(t, clock, damper.Policy{}, logger)
		px, err := damper.NewProxy(d, damper.ProxyConfig{Upstream: dampertest.MemoryURL, Transport: dampertest.Transport(srv.Handler()),
			MaxRequestBytes: 1 << 20, Logger: logger})
		if err != nil {
			t.Fatal(err)
		}
		rec := httptest.NewRecorder()
		done := make(chan struct{})
		go func() {
			defer close(done)
			px.ServeHTTP(rec, req)
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s %s: the handler has not returned after 10 s", method, path)
		}
		if rec.Code < 200 || rec.Code > 599 {
			t.Fatalf("status %d", rec.Code)
		}
		if rec.Code == 400 && bytes.Contains(rec.Body.Bytes(), []byte(`"message":"damper proxy:`)) && len(srv.Requests()) != 0 {
			t.Fatalf("refused at the door (%s), yet sent upstream", rec.Body)
		}
		if code, b := scrape(t, reg); code != 200 || len(b) > 256<<10 {
			t.Fatalf("/metrics: %d, %d bytes: %.2000s", code, len(b), b)
		}
		if n := len(logs.String()); n > 16<<10 {
			t.Fatalf("%d bytes of log for one request", n)
		}
	})
}

// With the recommended policy (open for 2 s, attempts of up to 60 s), a
// call refused while the breaker's probe is in flight is answered 529
// with retry-after and retry-after-ms until the probe is due to answer,
// never longer than the open period: 2 s, not the minute the probe could
// take; and the rest of the probe's own deadline when that comes first.
func TestProxyCircuitOpenRetryAfterBoundedByOpenPeriod(t *testing.T) {
	clk := dampertest.NewClock(time.Now().Truncate(time.Minute).Add(time.Minute))
	srv := dampertest.NewServer(dampertest.InMemory(), dampertest.WithClock(clk))
	t.Cleanup(srv.Close)
	gate := &holdGate{next: srv.Handler()}
	up := httptest.NewServer(gate)
	t.Cleanup(up.Close)
	p := damper.RecommendedPolicy()
	p.MaxAttempts, p.Breaker.MinAttempts = 1, 2
	d, err := damper.New(p, damper.WithClock(clk), damper.WithRand(half))
	if err != nil {
		t.Fatal(err)
	}
	px, err := damper.NewProxy(d, damper.ProxyConfig{Upstream: up.URL})
	if err != nil {
		t.Fatal(err)
	}
	r := &proxyRig{proxy: httptest.NewServer(px)}
	t.Cleanup(r.proxy.Close)
	srv.Script("down", dampertest.Status(500))
	srv.Script("up", dampertest.OK())

	refused := func(retryAfter, retryAfterMs string, header ...string) {
		t.Helper()
		res, b := r.post(t, "up", plainBody, header...)
		if typ, _ := apiError(t, b); res.StatusCode != 529 || typ != "overloaded_error" {
			t.Fatalf("%d %s, want 529 overloaded_error", res.StatusCode, b)
		}
		wantHeader(t, res, damper.HeaderOutcome, "circuit_open")
		wantHeader(t, res, "Retry-After", retryAfter)
		wantHeader(t, res, "Retry-After-Ms", retryAfterMs)
	}
	// probe opens the breaker, lets its open period pass, and holds a
	// probe with header in flight; the returned func releases it and
	// checks its answer.
	probe := func(header ...string) (release func()) {
		t.Helper()
		for range 2 {
			r.post(t, "down", plainBody)
		}
		refused("2", "2000")
		clk.Advance(2 * time.Second)
		arrived, rel := gate.hold()
		req, err := http.NewRequest(http.MethodPost, r.proxy.URL+"/v1/messages", strings.NewReader(plainBody))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Api-Key", testKey)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(dampertest.ScenarioHeader, "up")
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		done := make(chan error, 1)
		go func() {
			res, err := r.proxy.Client().Do(req)
			if err == nil {
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
				if res.StatusCode != 200 {
					err = fmt.Errorf("status %d, want 200", res.StatusCode)
				}
			}
			done <- err
		}()
		<-arrived
		return func() {
			t.Helper()
			rel()
			if err := <-done; err != nil {
				t.Fatalf("the probe: %v", err)
			}
		}
	}

	release := probe()
	refused("2", "2000")
	clk.Advance(57500 * time.Millisecond) // the probe is due in 2.5 s
	refused("2", "2000")
	clk.Advance(1300 * time.Millisecond) // in 1.2 s
	refused("2", "1200")
	release()

	// A probe whose caller gave it 0.75 s.
	release = probe(damper.HeaderTimeout, "0.75")
	refused("1", "750")
	clk.Advance(500 * time.Millisecond)
	refused("1", "250")
	release()
	if n := gate.count(); n != 6 {
		t.Errorf("the provider got %d requests, want 6: 4 failures and 2 probes", n)
	}
}
