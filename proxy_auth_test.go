package damper_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/internal/syncbuf"
)

// authKey is a client key of tenant "svc" in the key-mode tests; otherKey
// names no tenant.
const (
	authKey      = "dk-tenant-svc-key"
	otherKey     = "dk-someone-else"
	authOperator = "sk-ant-api03-operatorupstream"
	authSecond   = "sk-ant-api03-operatorsecond"
)

// gotRequests records the requests a fake backend got.
type gotRequests struct {
	mu      sync.Mutex
	headers []http.Header
	paths   []string
}

func (s *gotRequests) add(r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.headers = append(s.headers, r.Header.Clone())
	s.paths = append(s.paths, r.URL.Path)
}

func (s *gotRequests) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.headers)
}

// authRig is a Proxy in key mode over a primary and a first-party
// fallback "second", each a handler on loopback that records what it got.
type authRig struct {
	url             string
	primary, second gotRequests
	logs            *syncbuf.Buffer
}

func newAuthRig(t *testing.T, primary, second http.HandlerFunc) *authRig {
	t.Helper()
	r := &authRig{logs: &syncbuf.Buffer{}}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.primary.add(req)
		primary(w, req)
	}))
	t.Cleanup(up.Close)
	sec := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.second.add(req)
		second(w, req)
	}))
	t.Cleanup(sec.Close)
	d, err := damper.New(damper.Policy{MaxAttempts: 1, BackoffBase: damper.None}, damper.WithBackends(damper.Backend{
		Name: "second", Provider: damper.ProviderAnthropic,
		Options: []option.RequestOption{option.WithBaseURL(sec.URL), option.WithAPIKey(authSecond)},
	}))
	if err != nil {
		t.Fatal(err)
	}
	px, err := damper.NewProxy(d, damper.ProxyConfig{
		Upstream: up.URL, Logger: slog.New(slog.NewJSONHandler(r.logs, nil)), UpstreamAPIKey: authOperator,
		Tenants: []damper.Tenant{
			{Name: "other", KeySHA256: []string{damper.ClientKeyHash("dk-other-1"), damper.ClientKeyHash("dk-other-2")}},
			{Name: "svc", KeySHA256: []string{strings.ToUpper(damper.ClientKeyHash(authKey))}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(px)
	t.Cleanup(srv.Close)
	r.url = srv.URL
	return r
}

// do sends method path with body and the header h, and returns the
// answer and its body.
func (r *authRig) do(t *testing.T, method, path, body string, h http.Header) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, r.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range h {
		req.Header[k] = v
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

func answerText(text string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-6","content":[{"type":"text","text":"`+text+`"}],"stop_reason":"end_turn","usage":{"input_tokens":1,"output_tokens":1}}`)
	}
}

func overloaded(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(529)
	io.WriteString(w, `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`)
}

// switchable is a backend that answers with up until fail is called, and
// is overloaded from then on.
type switchable struct {
	up   http.HandlerFunc
	down atomic.Bool
}

func (b *switchable) fail() { b.down.Store(true) }

func (b *switchable) serve(w http.ResponseWriter, r *http.Request) {
	if b.down.Load() {
		overloaded(w, r)
		return
	}
	b.up(w, r)
}

// TestProxyKeyModeRefusesUnknownClients: in key mode a request without a
// tenant's key, on every path, with the primary up or down, is answered
// 401 authentication_error in the API's shape, and nothing is sent to
// any backend.
func TestProxyKeyModeRefusesUnknownClients(t *testing.T) {
	for _, primaryDown := range []bool{false, true} {
		primary := answerText("from the primary")
		if primaryDown {
			primary = overloaded
		}
		r := newAuthRig(t, primary, answerText("from the second"))
		for _, tc := range []struct {
			name string
			h    http.Header
		}{
			{"no key", http.Header{}},
			{"wrong key", http.Header{"X-Api-Key": {otherKey}}},
			{"wrong bearer", http.Header{"Authorization": {"Bearer " + otherKey}}},
			{"the hash as the key", http.Header{"X-Api-Key": {damper.ClientKeyHash(authKey)}}},
			{"a longer key", http.Header{"X-Api-Key": {authKey + "x"}}},
			{"a prefix of the key", http.Header{"X-Api-Key": {authKey[:len(authKey)-1]}}},
			{"the key past the bound", http.Header{"X-Api-Key": {authKey + strings.Repeat("k", 256)}}},
			{"empty", http.Header{"X-Api-Key": {""}}},
			{"not bearer", http.Header{"Authorization": {"Basic " + authKey}}},
			{"two keys that differ", http.Header{"X-Api-Key": {authKey}, "Authorization": {"Bearer " + otherKey}}},
			{"repeated", http.Header{"X-Api-Key": {authKey, authKey}}},
		} {
			for _, path := range []string{"/v1/messages", "/v1/models", "/v1/messages/count_tokens"} {
				method := http.MethodPost
				if path == "/v1/models" {
					method = http.MethodGet
				}
				res, body := r.do(t, method, path, plainBody, tc.h)
				var e struct {
					Type  string `json:"type"`
					Error struct{ Type, Message string }
				}
				if res.StatusCode != 401 || json.Unmarshal([]byte(body), &e) != nil || e.Type != "error" || e.Error.Type != "authentication_error" ||
					res.Header.Get("X-Should-Retry") != "false" {
					t.Errorf("primary down %v, %s, %s: %d %s (x-should-retry %q), want 401 authentication_error", primaryDown, tc.name, path, res.StatusCode, body, res.Header.Get("X-Should-Retry"))
				}
				if strings.Contains(body, authKey) || strings.Contains(body, otherKey) {
					t.Errorf("%s: the answer shows a key: %s", tc.name, body)
				}
			}
		}
		if n, m := r.primary.count(), r.second.count(); n != 0 || m != 0 {
			t.Errorf("primary down %v: the primary got %d requests, the second %d; want none", primaryDown, n, m)
		}
		if strings.Contains(r.logs.String(), `"tenant"`) || !strings.Contains(r.logs.String(), `"status":401`) {
			t.Errorf("the log lines of refused requests: %s", r.logs)
		}
	}
}

// TestProxyKeyModeSendsTheOperatorsCredentials: an authenticated client
// (its key as x-api-key or as a bearer token) is served, on the primary
// and, with the primary down, on the fallback, each sent the operator's
// key and the allowed headers alone: never the client's key, cookie or
// any other header. The log line names the tenant.
func TestProxyKeyModeSendsTheOperatorsCredentials(t *testing.T) {
	client := http.Header{
		"Anthropic-Version":         {"2023-06-01"},
		"Anthropic-Beta":            {"prompt-caching-2024-07-31"},
		"Content-Type":              {"application/json"},
		"User-Agent":                {"test-client/1"},
		"X-Stainless-Lang":          {"js"},
		"Cookie":                    {"session=client-cookie"},
		"X-Custom":                  {"client-custom"},
		"X-Forwarded-For":           {"10.0.0.1"},
		"Anthropic-Organization-Id": {"client-org"},
		"Proxy-Authorization":       {"Basic client"},
	}
	for _, tc := range []struct {
		name string
		auth http.Header
	}{
		{"x-api-key", http.Header{"X-Api-Key": {authKey}}},
		{"bearer", http.Header{"Authorization": {"Bearer " + authKey}}},
		{"both, the same key", http.Header{"X-Api-Key": {authKey}, "Authorization": {"bearer " + authKey}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := client.Clone()
			for k, v := range tc.auth {
				h[k] = v
			}
			primary := &switchable{up: answerText("from the primary")}
			r := newAuthRig(t, primary.serve, answerText("from the second"))
			if res, body := r.do(t, http.MethodPost, "/v1/messages", plainBody, h); res.StatusCode != 200 || !strings.Contains(body, "from the primary") {
				t.Fatalf("primary up: %d %s", res.StatusCode, body)
			}
			if res, body := r.do(t, http.MethodGet, "/v1/models", "", h); res.StatusCode != 200 {
				t.Fatalf("pass-through: %d %s", res.StatusCode, body)
			}
			primary.fail()
			res, body := r.do(t, http.MethodPost, "/v1/messages", plainBody, h)
			if res.StatusCode != 200 || !strings.Contains(body, "from the second") || res.Header.Get("Damper-Backend") != "second" {
				t.Fatalf("primary down: %d %s, want the second's answer", res.StatusCode, body)
			}
			check := func(who string, got http.Header, key string) {
				t.Helper()
				if got.Get("X-Api-Key") != key && got.Get("Authorization") != "Bearer "+key {
					t.Errorf("%s: x-api-key %q, authorization %q: want the operator's key", who, got.Get("X-Api-Key"), got.Get("Authorization"))
				}
				for k, v := range got {
					joined := strings.Join(v, ",")
					if strings.Contains(joined, authKey) || strings.Contains(joined, "client-") || strings.Contains(joined, "10.0.0.1") ||
						(key == authSecond && strings.Contains(joined, authOperator)) {
						t.Errorf("%s got %s: %q", who, k, joined)
					}
				}
				if got.Get("Anthropic-Version") != "2023-06-01" || got.Get("Anthropic-Beta") != "prompt-caching-2024-07-31" {
					t.Errorf("%s: anthropic-version %q, anthropic-beta %q: the allowed headers are forwarded", who, got.Get("Anthropic-Version"), got.Get("Anthropic-Beta"))
				}
			}
			if r.primary.count() != 3 || r.second.count() != 1 {
				t.Fatalf("the primary got %d requests, the second %d; want 3 and 1", r.primary.count(), r.second.count())
			}
			for i, got := range r.primary.headers {
				check("the primary's request "+r.primary.paths[i], got, authOperator)
				if got.Get("User-Agent") != "test-client/1" || got.Get("X-Stainless-Lang") != "js" {
					t.Errorf("the primary: user-agent %q, x-stainless-lang %q: the client's, forwarded", got.Get("User-Agent"), got.Get("X-Stainless-Lang"))
				}
			}
			check("the second", r.second.headers[0], authSecond)
			var tenants []string
			for _, l := range r.logs.Lines() {
				var m map[string]any
				if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == "damper proxy: request" {
					tenants = append(tenants, m["tenant"].(string))
				}
			}
			if strings.Join(tenants, ",") != "svc,svc,svc" {
				t.Errorf("the log lines' tenants %q, want svc for each", tenants)
			}
			if strings.Contains(r.logs.String(), authKey) {
				t.Errorf("the key is in the log:\n%s", r.logs)
			}
		})
	}
}

// TestProxyKeyModeShapesBackendErrors: a backend's error in key mode
// reaches the client in the API's shape, with its status, error type,
// request ID and wait, and the proxy's own message: never the backend's
// body or other headers, which here echo what the proxy sent it.
func TestProxyKeyModeShapesBackendErrors(t *testing.T) {
	echo := func(status int, typ string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			var sent []string
			for k, v := range r.Header {
				sent = append(sent, k+": "+strings.Join(v, ","))
			}
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Echo", strings.Join(sent, "; "))
			w.Header().Set("Request-Id", "req_backend1")
			w.Header().Set("Retry-After", "7")
			w.WriteHeader(status)
			b, _ := json.Marshal(map[string]any{"type": "error", "error": map[string]string{"type": typ, "message": "you sent " + strings.Join(sent, "; ")}})
			w.Write(b)
		}
	}
	r := newAuthRig(t, echo(529, "overloaded_error"), echo(429, "rate_limit_error"))
	h := http.Header{"X-Api-Key": {authKey}}
	for _, tc := range []struct {
		method, path, body string
		status             int
		typ, backend       string
	}{
		{http.MethodPost, "/v1/messages", plainBody, 429, "rate_limit_error", "second"},
		{http.MethodPost, "/v1/messages", streamBody, 429, "rate_limit_error", "second"},
		{http.MethodGet, "/v1/models", "", 529, "overloaded_error", "primary"},
	} {
		res, body := r.do(t, tc.method, tc.path, tc.body, h)
		var e struct {
			Type      string `json:"type"`
			Error     struct{ Type, Message string }
			RequestID string `json:"request_id"`
		}
		if err := json.Unmarshal([]byte(body), &e); err != nil || res.StatusCode != tc.status || e.Error.Type != tc.typ || e.RequestID != "req_backend1" {
			t.Errorf("%s %s: %d %s, want %d %s with the request ID", tc.path, tc.body, res.StatusCode, body, tc.status, tc.typ)
		}
		if want := `damper proxy: the backend "` + tc.backend + `" answered`; !strings.HasPrefix(e.Error.Message, want) {
			t.Errorf("%s: message %q, want %s...", tc.path, e.Error.Message, want)
		}
		for k, v := range res.Header {
			if strings.Contains(strings.Join(v, ","), "sk-ant") || k == "X-Echo" {
				t.Errorf("%s: header %s reached the client: %q", tc.path, k, v)
			}
		}
		if strings.Contains(body, "sk-ant") || strings.Contains(body, "you sent") {
			t.Errorf("%s: the backend's body reached the client: %s", tc.path, body)
		}
		if res.Header.Get("Retry-After") != "7" || res.Header.Get("Request-Id") != "req_backend1" || res.Header.Get("X-Should-Retry") != "false" {
			t.Errorf("%s: retry-after %q, request-id %q, x-should-retry %q", tc.path, res.Header.Get("Retry-After"), res.Header.Get("Request-Id"), res.Header.Get("X-Should-Retry"))
		}
	}
}

// TestNewProxyOperatorCredentialsNeedTenants: NewProxy refuses a Damper
// with fallback backends, or an upstream key, without tenants, tenants
// without the operator's upstream key, and tenants it cannot use.
func TestNewProxyOperatorCredentialsNeedTenants(t *testing.T) {
	withBackend, err := damper.New(damper.Policy{}, damper.WithBackends(damper.Backend{Name: "second-org", Provider: damper.ProviderAnthropic}))
	if err != nil {
		t.Fatal(err)
	}
	plain, err := damper.New(damper.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	hash := damper.ClientKeyHash(authKey)
	for _, tc := range []struct {
		d    *damper.Damper
		cfg  damper.ProxyConfig
		want string
	}{
		{withBackend, damper.ProxyConfig{}, `the Damper's backend "second-org" spends the operator's credentials: name the clients that may use it in ProxyConfig.Tenants`},
		{plain, damper.ProxyConfig{UpstreamAPIKey: authOperator}, "ProxyConfig.UpstreamAPIKey is the operator's key: name the clients that may spend it in ProxyConfig.Tenants"},
		{plain, damper.ProxyConfig{Tenants: []damper.Tenant{{Name: "a", KeySHA256: []string{hash}}}}, "ProxyConfig.UpstreamAPIKey: required with Tenants"},
		{plain, damper.ProxyConfig{UpstreamAPIKey: "k", Tenants: []damper.Tenant{{Name: "a"}}}, `Tenants[0] ("a").KeySHA256: empty: a tenant needs a key`},
		{plain, damper.ProxyConfig{UpstreamAPIKey: "k", Tenants: []damper.Tenant{{Name: "a", KeySHA256: []string{authKey}}}}, `Tenants[0] ("a").KeySHA256 = "dk-tenant-svc-key": entry 0: want the key's SHA-256: 64 hexadecimal digits, not 17 characters`},
		{plain, damper.ProxyConfig{UpstreamAPIKey: "k", Tenants: []damper.Tenant{{Name: "a b", KeySHA256: []string{hash}}}}, `Tenants[0] ("a b").Name = "a b": want 1 to 64 ASCII letters, digits`},
		{plain, damper.ProxyConfig{UpstreamAPIKey: "k", Tenants: []damper.Tenant{{Name: "a", KeySHA256: []string{hash}}, {Name: "a", KeySHA256: []string{damper.ClientKeyHash("x")}}}}, `Tenants[1] ("a").Name: Tenants[0] has this name already`},
		{plain, damper.ProxyConfig{UpstreamAPIKey: "k", Tenants: []damper.Tenant{{Name: "a", KeySHA256: []string{hash}}, {Name: "b", KeySHA256: []string{strings.ToUpper(hash)}}}}, `Tenants[1] ("b").KeySHA256: a key of Tenants[0] (a) has this hash already`},
	} {
		tc.cfg.Upstream = "https://api.anthropic.com"
		_, err := damper.NewProxy(tc.d, tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v, want %s", err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), authOperator) {
			t.Errorf("the key is in the error: %v", err)
		}
	}
	if _, err := damper.NewProxy(withBackend, damper.ProxyConfig{Upstream: "https://api.anthropic.com", UpstreamAPIKey: "k",
		Tenants: []damper.Tenant{{Name: "a", KeySHA256: []string{hash}}}}); err != nil {
		t.Errorf("with tenants: %v", err)
	}
}

// TestProxyKeyModeReturnsNoAccountHeaders: in key mode a backend's answer
// reaches the client with what reading it needs and its request id, never
// the headers that describe the operator's account (its organisation, its
// rate limits) or its connection (cookies): on the Messages path, from the
// primary and from a fallback, and on a pass-through path.
func TestProxyKeyModeReturnsNoAccountHeaders(t *testing.T) {
	withAccount := func(text string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			h := w.Header()
			h.Set("Anthropic-Organization-Id", "org-operator-secret")
			h.Set("Anthropic-Ratelimit-Requests-Limit", "4000")
			h.Set("Set-Cookie", "__cf_bm=operator-secret")
			h.Set("Request-Id", "req_"+text)
			answerText(text)(w, r)
		}
	}
	primary := &switchable{up: withAccount("primary")}
	r := newAuthRig(t, primary.serve, withAccount("second"))
	key := http.Header{"X-Api-Key": {authKey}}
	check := func(what string, res *http.Response, body, want string) {
		t.Helper()
		if res.StatusCode != 200 || !strings.Contains(body, want) {
			t.Fatalf("%s: %d %s", what, res.StatusCode, body)
		}
		for k, v := range res.Header {
			if strings.Contains(strings.Join(v, ","), "operator-secret") || strings.HasPrefix(k, "Anthropic-Ratelimit-") {
				t.Errorf("%s: the client got %s: %q", what, k, v)
			}
		}
		if got := res.Header.Get("Request-Id"); got != "req_"+want {
			t.Errorf("%s: request-id %q, want req_%s", what, got, want)
		}
		if got := res.Header.Get("Content-Type"); got != "application/json" {
			t.Errorf("%s: content-type %q", what, got)
		}
	}
	res, body := r.do(t, http.MethodPost, "/v1/messages", plainBody, key)
	check("the primary's answer", res, body, "primary")
	res, body = r.do(t, http.MethodGet, "/v1/models", "", key)
	check("a pass-through answer", res, body, "primary")
	primary.fail()
	res, body = r.do(t, http.MethodPost, "/v1/messages", plainBody, key)
	check("the fallback's answer", res, body, "second")
}
