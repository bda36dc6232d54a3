package damper_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
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
	r := &proxyRig{
		clock:   dampertest.NewClock(time.Now().Truncate(time.Minute).Add(time.Minute)),
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

func TestProxyRequestLimits(t *testing.T) {
	r := newProxyRig(t, damper.Policy{})
	px, err := damper.NewProxy(r.d, damper.ProxyConfig{Upstream: r.up.URL, MaxRequestBytes: 1000})
	if err != nil {
		t.Fatal(err)
	}
	small := httptest.NewServer(px)
	defer small.Close()
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
	raw := func(request string) string {
		conn, err := net.Dial("tcp", strings.TrimPrefix(r.proxy.URL, "http://"))
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
		{damper.ProxyConfig{Upstream: "https://api.anthropic.com", MaxRequestBytes: -1}, "ProxyConfig.MaxRequestBytes"},
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
