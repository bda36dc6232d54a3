package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/conf"
	"github.com/damper-ai/damper-go/dampertest"
	_ "github.com/damper-ai/damper-go/dampertest/vertexclient"
)

// recorder is a fake backend's front: it records the headers of each
// request, then hands it to the fake.
type recorder struct {
	mu      sync.Mutex
	headers []http.Header
	srv     *httptest.Server
}

func newRecorder(t *testing.T, next http.Handler) *recorder {
	rec := &recorder{}
	rec.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.mu.Lock()
		rec.headers = append(rec.headers, r.Header.Clone())
		rec.mu.Unlock()
		next.ServeHTTP(w, r)
	}))
	t.Cleanup(rec.srv.Close)
	return rec
}

func (rec *recorder) count() int {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return len(rec.headers)
}

// fromBackend answers every call "from the backend".
func fromBackend(r dampertest.Request) dampertest.Step {
	if r.Stream {
		return dampertest.OK().WithStream(dampertest.Stream{Text: "from the backend"})
	}
	return dampertest.OK().WithText("from the backend")
}

// clientCall is a Messages call (or, with path, another request) with
// the headers h, and its answer.
func clientCall(t *testing.T, url, path string, h http.Header) (*http.Response, string) {
	t.Helper()
	method, body := http.MethodPost, `{"model":"claude-sonnet-4-6","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`
	if path != "/v1/messages" {
		method, body = http.MethodGet, ""
	}
	req, _ := http.NewRequest(method, url+path, strings.NewReader(body))
	for k, v := range h {
		req.Header[k] = v
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	return res, string(b)
}

// TestProxyKeyModeEachBackendKind: for each kind of fallback backend
// (anthropic with api_key_env, bedrock, vertex), with the upstream up and
// down, a client without a key or with a wrong one gets 401 and neither
// the upstream nor the backend gets a request; a client with its
// tenant's key is served, by the backend when the upstream is down, and
// the backend never sees the client's key, its cookie, a header not
// allowed, or the operator's upstream key.
func TestProxyKeyModeEachBackendKind(t *testing.T) {
	for _, kind := range []string{"anthropic", "bedrock", "vertex"} {
		t.Run(kind, func(t *testing.T) {
			cloudEnv(t, true)
			t.Setenv("DAMPER_TEST_SECOND_ORG_KEY", secondOrgKey)
			gcp := fakeGoogle(t, true)
			t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", gcp.credentials)
			var fake *dampertest.Server
			models := map[string]string{"claude-sonnet-4-6": "claude-sonnet-4-6"}
			switch kind {
			case "anthropic":
				fake = dampertest.NewServer(dampertest.WithStepFunc(fromBackend))
			case "bedrock":
				fake = dampertest.NewServer(dampertest.Bedrock("us-east-1"), dampertest.WithStepFunc(fromBackend))
				models["claude-sonnet-4-6"] = "us.anthropic.claude-sonnet-4-6"
			case "vertex":
				fake = dampertest.NewServer(dampertest.Vertex("us-east5", "my-project"), dampertest.WithStepFunc(fromBackend))
			}
			t.Cleanup(fake.Close)
			rec := newRecorder(t, fake.Handler())
			b := backendFile{Name: "fallback", Provider: kind, BaseURL: rec.srv.URL, Models: models}
			switch kind {
			case "anthropic":
				b.APIKeyEnv = "DAMPER_TEST_SECOND_ORG_KEY"
			case "bedrock":
				b.Region = "us-east-1"
			case "vertex":
				b.Region, b.Project = "us-east5", "my-project"
			}
			primary := newSwitchable(t, 529)
			up := newRecorder(t, primary.Handler())
			p := startProxy(t, up.srv.URL, func(s *proxySettings) {
				s.policy = damper.Policy{MaxAttempts: 1}
				s.Backends = []backendFile{b}
				keyMode(s)
			})
			client := http.Header{
				"Anthropic-Version": {"2023-06-01"}, "Content-Type": {"application/json"},
				"Cookie": {"session=client-cookie"}, "X-Custom": {"client-custom"},
			}
			for _, down := range []bool{true, false} {
				primary.down.Store(down)
				for _, key := range []string{"", "dk-names-no-tenant"} {
					h := client.Clone()
					if key != "" {
						h.Set("X-Api-Key", key)
					}
					for _, path := range []string{"/v1/messages", "/v1/models"} {
						if res, body := clientCall(t, p.url, path, h); res.StatusCode != 401 || !strings.Contains(body, `"authentication_error"`) {
							t.Errorf("upstream down %v, key %q, %s: %d %s, want 401 authentication_error", down, key, path, res.StatusCode, body)
						}
					}
				}
				if n, m := primary.Count(""), rec.count(); n != 0 || m != 0 {
					t.Fatalf("upstream down %v: without the tenant's key, the upstream got %d requests, the backend %d; want none", down, n, m)
				}
			}
			h := client.Clone()
			h.Set("X-Api-Key", testKey)
			primary.down.Store(true)
			res, body := clientCall(t, p.url, "/v1/messages", h)
			if res.StatusCode != 200 || !strings.Contains(body, "from the backend") || res.Header.Get("Damper-Backend") != "fallback" {
				t.Fatalf("upstream down: %d %s, want the backend's answer", res.StatusCode, body)
			}
			primary.down.Store(false)
			if res, body := clientCall(t, p.url, "/v1/messages", h); res.StatusCode != 200 || !strings.Contains(body, "from the primary") {
				t.Fatalf("upstream up: %d %s, want the upstream's answer", res.StatusCode, body)
			}
			if n, m := primary.Count(""), rec.count(); n != 2 || m != 1 {
				t.Fatalf("the upstream got %d requests, the backend %d; want 2 and 1", n, m)
			}
			for _, got := range rec.headers {
				for k, v := range got {
					joined := strings.Join(v, ",")
					if strings.Contains(joined, testKey) || strings.Contains(joined, upstreamKey) || strings.Contains(joined, "client-") {
						t.Errorf("the backend got %s: %q", k, joined)
					}
				}
			}
			for _, r := range fake.Requests() {
				if r.AuthError != "" {
					t.Errorf("the backend refused the proxy's request: %s", r.AuthError)
				}
			}
			for _, r := range up.headers {
				if r.Get("X-Api-Key") != upstreamKey || r.Get("Cookie") != "" || r.Get("X-Custom") != "" {
					t.Errorf("the upstream got x-api-key %q, cookie %q, x-custom %q; want the operator's key alone", r.Get("X-Api-Key"), r.Get("Cookie"), r.Get("X-Custom"))
				}
			}
			if !strings.Contains(p.logs.String(), `"tenant":"svc"`) {
				t.Errorf("no log line names the tenant:\n%s", p.logs)
			}
		})
	}
}

// TestProxyKeyModeMetrics: in key mode /metrics on the API's listener
// needs a tenant's key; /healthz and /readyz do not.
func TestProxyKeyModeMetrics(t *testing.T) {
	api := fakeAPI(t)
	p := startProxy(t, api.URL(), keyMode)
	for _, tc := range []struct {
		path, key string
		want      int
	}{
		{"/metrics", "", 401}, {"/metrics", "dk-wrong", 401}, {"/metrics", testKey, 200},
		{"/healthz", "", 200}, {"/readyz", "", 200},
	} {
		h := http.Header{}
		if tc.key != "" {
			h.Set("X-Api-Key", tc.key)
		}
		if res, body := clientCall(t, p.url, tc.path, h); res.StatusCode != tc.want {
			t.Errorf("%s with key %q: %d %s, want %d", tc.path, tc.key, res.StatusCode, body, tc.want)
		}
	}
	if n := api.Count(""); n != 0 {
		t.Errorf("the upstream got %d requests, want none", n)
	}
}

// TestProxyTenantsFileErrors: a file whose backends spend the operator's
// credentials with no tenants does not start, and neither does one whose
// tenants the proxy cannot use (their keys, or their settings out of
// bounds); each error names the key and its value, and none shows a key.
func TestProxyTenantsFileErrors(t *testing.T) {
	cloudEnv(t, false)
	t.Setenv("DAMPER_TEST_BACKEND_KEY", backendSecret)
	t.Setenv(upstreamKeyEnv, upstreamKey)
	t.Setenv("DAMPER_TEST_TENANT_KEY", testKey)
	t.Setenv("DAMPER_TEST_LONG_KEY", strings.Repeat("k", 257))
	t.Setenv("DAMPER_TEST_EMPTY", "")
	hash := damper.ClientKeyHash(testKey)
	const secondOrg = "backends:\n  - {name: second-org, provider: anthropic, api_key_env: DAMPER_TEST_BACKEND_KEY}\n"
	const up = "upstream_api_key_env: " + upstreamKeyEnv + "\n"
	for _, tc := range []struct{ doc, want string }{
		{secondOrg, `backends[0] ("second-org"): spends the operator's credentials; name the clients that may use it under tenants`},
		{"backends:\n  - {name: bedrock, provider: bedrock, region: us-east-1}\n", `backends[0] ("bedrock"): spends the operator's credentials`},
		{up, `upstream_api_key_env: "DAMPER_TEST_UPSTREAM_KEY": the operator's key is spent only for clients that present a key: name them under tenants`},
		{"tenants: [{name: a, key_sha256: ['" + hash + "']}]\n", `upstream_api_key_env: nothing: required with tenants`},
		{"upstream_api_key_env: DAMPER_TEST_UNSET\ntenants: [{name: a, key_sha256: ['" + hash + "']}]\n", `upstream_api_key_env: "DAMPER_TEST_UNSET": the environment variable is unset or empty`},
		{"upstream_api_key_env: " + upstreamKey + "\ntenants: [{name: a, key_sha256: ['" + hash + "']}]\n", `upstream_api_key_env: (not shown): want the name of the environment variable`},
		{up + "tenants: [{name: a}]\n", `tenants[0].key_env: nothing, and no key_sha256: a tenant needs a key`},
		{up + "tenants: [{name: 'a b', key_sha256: ['" + hash + "']}]\n", `tenants[0].name: "a b": want 1 to 64 ASCII letters`},
		{up + "tenants: [{key_sha256: ['" + hash + "']}]\n", `tenants[0].name: "": want 1 to 64`},
		{up + "tenants: [{name: a, key_sha256: ['" + testKey + "']}]\n", `tenants[0].key_sha256: "sk-ant-api03-cmdproxysecret": entry 0: want the key's SHA-256`},
		{up + "tenants: [{name: a, key_env: [" + testKey + "]}]\n", `tenants[0].key_env: (not shown): entry 0: want the name of the environment variable`},
		{up + "tenants: [{name: a, key_env: [DAMPER_TEST_EMPTY]}]\n", `tenants[0].key_env: "DAMPER_TEST_EMPTY": entry 0: the environment variable is unset or empty`},
		{up + "tenants: [{name: a, key_env: [DAMPER_TEST_LONG_KEY]}]\n", `tenants[0].key_env: "DAMPER_TEST_LONG_KEY": entry 0: the variable holds 257 bytes: a client key has at most 256`},
		{up + "tenants: [{name: a, key_sha256: ['" + hash + "']}, {name: a, key_sha256: ['" + damper.ClientKeyHash("x") + "']}]\n", `tenants[1].name: "a": tenants[0] has this name already`},
		{up + "tenants: [{name: a, key_sha256: ['" + hash + "']}, {name: b, key_env: [DAMPER_TEST_TENANT_KEY]}]\n", `tenants[1]: key 0: tenants[0] ("a") has this key already`},
		{up + "tenants: [{name: a, key_sha256: ['" + hash + "'], key: x}]\n", `tenants[0].key: unknown key (known: name, key_sha256, priority, weight, retry_budget, daily_cost_usd, key_env)`},
		{up + "tenants: [{name: a, key_sha256: ['" + hash + "'], weight: 0}]\n", `tenants[0].weight: 0: must be at least 1`},
		{up + "tenants: [{name: a, key_sha256: ['" + hash + "'], weight: 1001}]\n", `tenants[0].weight: 1001: must be at most 1000`},
		{up + "tenants: [{name: a, key_sha256: ['" + hash + "'], retry_budget: {ratio: -1}}]\n", `tenants[0].retry_budget.ratio: -1: must be a finite number, at least 0`},
		{up + "tenants: [{name: a, key_sha256: ['" + hash + "'], retry_budget: {min_tokens: -1}}]\n", `tenants[0].retry_budget.min_tokens: -1: must be at least 0`},
		{up + "tenants: [{name: a, key_sha256: ['" + hash + "'], daily_cost_usd: -1}]\n", `tenants[0].daily_cost_usd: -1: must be a finite number of dollars, at least 0`},
		{up + "tenants: [{name: a, key_sha256: ['" + hash + "'], priority: urgent}]\n", `tenants[0].priority: "urgent": want "policy", "interactive" or "batch"`},
	} {
		_, err := parseProxyFile(t, "listen: 127.0.0.1:0\n"+tc.doc)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %s", strings.TrimSpace(tc.doc), err, tc.want)
		}
		if err != nil && (strings.Contains(err.Error(), backendSecret) || strings.Contains(err.Error(), upstreamKey) || strings.Contains(err.Error(), "cmdproxysecret") && !strings.Contains(tc.want, "cmdproxysecret")) {
			t.Errorf("a secret is in the error: %v", err)
		}
	}
}

// TestDamperKeyRoundTrip: damper key prints a key and its key_sha256
// line; a file with that line serves a client with that key, and a key
// from key_env alike, and refuses another.
func TestDamperKeyRoundTrip(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"key"}, &out, &errOut); code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	m := regexp.MustCompile(`^key: (dk-[A-Za-z0-9_-]{43})\nkey_sha256: \["([0-9a-f]{64})"\]\n$`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("damper key printed %q", out.String())
	}
	key, line := m[1], "key_sha256: [\""+m[2]+"\"]"
	var again bytes.Buffer
	run([]string{"key"}, &again, io.Discard)
	if strings.Contains(again.String(), key) {
		t.Error("two runs printed the same key")
	}
	api := fakeAPI(t)
	t.Setenv(upstreamKeyEnv, upstreamKey)
	t.Setenv("DAMPER_TEST_TENANT_KEY", "dk-from-the-environment")
	s, err := parseProxyFile(t, "upstream: "+api.URL()+"\nupstream_api_key_env: "+upstreamKeyEnv+"\ntenants:\n  - name: made\n    "+line+"\n  - name: env\n    key_env: [DAMPER_TEST_TENANT_KEY]\n")
	if err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, s.Upstream, func(ps *proxySettings) { ps.tenants, ps.upstreamKey = s.tenants, s.upstreamKey })
	for _, tc := range []struct {
		key    string
		status int
	}{{key, 200}, {"dk-from-the-environment", 200}, {key[:len(key)-1], 401}} {
		res, body := clientCall(t, p.url, "/v1/messages", http.Header{"Authorization": {"Bearer " + tc.key}})
		if res.StatusCode != tc.status {
			t.Errorf("key %q: %d %s, want %d", tc.key, res.StatusCode, body, tc.status)
		}
	}
	for _, want := range []string{`"tenant":"made"`, `"tenant":"env"`} {
		if !strings.Contains(p.logs.String(), want) {
			t.Errorf("no log line with %s:\n%s", want, p.logs)
		}
	}
	if strings.Contains(p.logs.String(), key) || strings.Contains(p.logs.String(), "dk-from-the-environment") {
		t.Errorf("a key is in the log:\n%s", p.logs)
	}
}

// TestProxyTenantRetryBudgetFromFile: a tenant's retry_budget in the
// file sets its own budget: "small", with ratio 0.5 and min_tokens 2,
// earns 0.5 of a retry by each of its 2 answered first attempts, and so
// has 3 retries in the outage that follows; "whole", without one, has the
// Policy's 10, of which its call of 5 attempts takes 4.
func TestProxyTenantRetryBudgetFromFile(t *testing.T) {
	api := dampertest.NewServer()
	t.Cleanup(api.Close)
	api.Script("", dampertest.OK(), dampertest.OK(), dampertest.Status(529))
	setUpstreamKey(t)
	s, err := parseProxyFile(t, "upstream: "+api.URL()+"\nupstream_api_key_env: "+upstreamKeyEnv+`
tenants:
  - {name: small, key_sha256: ['`+damper.ClientKeyHash(testKey)+`'], retry_budget: {ratio: 0.5, min_tokens: 2}}
  - {name: whole, key_sha256: ['`+damper.ClientKeyHash("dk-whole")+`']}
policy:
  max_attempts: 5
  backoff_base: 0
`)
	if err != nil {
		t.Fatal(err)
	}
	if rb := s.tenants[0].RetryBudget; rb == nil || *rb != (damper.TenantRetryBudget{Ratio: 0.5, MinTokens: 2}) || s.tenants[1].RetryBudget != nil {
		t.Fatalf("the tenants' retry budgets: %+v and %+v, want {0.5 2} and none", rb, s.tenants[1].RetryBudget)
	}
	p := startProxy(t, s.Upstream, func(ps *proxySettings) {
		ps.policy, ps.tenants, ps.upstreamKey = s.policy, s.tenants, s.upstreamKey
	})
	for i, tc := range []struct {
		key               string
		status            int
		attempts, outcome string
	}{
		{testKey, 200, "1", "success"},
		{testKey, 200, "1", "success"},
		{testKey, 529, "4", "budget_exhausted"}, // 2 + 2 × 0.5 retries
		{testKey, 529, "1", "budget_exhausted"},
		{"dk-whole", 529, "5", "attempts_exhausted"},
	} {
		h := http.Header{}
		h.Set("X-Api-Key", tc.key)
		res, body := clientCall(t, p.url, "/v1/messages", h)
		if res.StatusCode != tc.status || res.Header.Get("Damper-Attempts") != tc.attempts || res.Header.Get("Damper-Outcome") != tc.outcome {
			t.Errorf("call %d: %d after %s attempts, outcome %s: %s; want %d after %s, %s", i+1, res.StatusCode,
				res.Header.Get("Damper-Attempts"), res.Header.Get("Damper-Outcome"), body, tc.status, tc.attempts, tc.outcome)
		}
	}
	if n := api.Count(""); n != 1+1+4+1+5 {
		t.Errorf("the API got %d requests, want 12", n)
	}
}

// TestTenantKeysBoundIsTheLibrarys: the command's bound on a tenant's keys
// is the library's, which refuses one hash past it and takes it.
func TestTenantKeysBoundIsTheLibrarys(t *testing.T) {
	hashes := make([]string, maxTenantKeys+1)
	for i := range hashes {
		hashes[i] = damper.ClientKeyHash(strconv.Itoa(i))
	}
	at := damper.Tenant{Name: "a", KeySHA256: hashes[:maxTenantKeys]}
	if err := conf.Fill(&at); err != nil {
		t.Errorf("%d keys: %v", maxTenantKeys, err)
	}
	past := damper.Tenant{Name: "a", KeySHA256: hashes}
	if err := conf.Fill(&past); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("at most %d", maxTenantKeys)) {
		t.Errorf("%d keys: %v, want at most %d", maxTenantKeys+1, err, maxTenantKeys)
	}
}
