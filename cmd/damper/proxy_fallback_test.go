package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// cloudEnv points the AWS and Google default chains at nothing of the
// user's and no metadata server: AWS credentials, when wanted, come from
// the environment, as the fake Bedrock accepts them.
func cloudEnv(t *testing.T, awsKeys bool) {
	t.Helper()
	dir := t.TempDir()
	for _, k := range []string{"AWS_BEARER_TOKEN_BEDROCK", "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN",
		"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE",
		"AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_REGION", "AWS_DEFAULT_REGION"} {
		t.Setenv(k, "") // restored after the test
		os.Unsetenv(k)
	}
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(dir, "aws-config"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(dir, "aws-credentials"))
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", filepath.Join(dir, "no-such-gcp.json"))
	if awsKeys {
		t.Setenv("AWS_ACCESS_KEY_ID", dampertest.BedrockAccessKeyID)
		t.Setenv("AWS_SECRET_ACCESS_KEY", dampertest.BedrockSecretKey)
	}
}

// switchable is a fake first-party API that answers status to every
// call while down, and then "from the primary".
type switchable struct {
	*dampertest.Server
	down atomic.Bool
}

func newSwitchable(t *testing.T, status int) *switchable {
	s := &switchable{}
	s.down.Store(true)
	s.Server = dampertest.NewServer(dampertest.WithStepFunc(func(r dampertest.Request) dampertest.Step {
		switch {
		case s.down.Load():
			return dampertest.Status(status)
		case r.Stream:
			return dampertest.OK().WithStream(dampertest.Stream{Text: "from the primary"})
		}
		return dampertest.OK().WithText("from the primary")
	}))
	t.Cleanup(s.Close)
	return s
}

// fakeBedrock is a fake Amazon Bedrock that answers every call "from
// bedrock".
func fakeBedrock(t *testing.T) *dampertest.Server {
	s := dampertest.NewServer(dampertest.Bedrock("us-east-1"), dampertest.WithStepFunc(func(r dampertest.Request) dampertest.Step {
		if r.Stream {
			return dampertest.OK().WithStream(dampertest.Stream{Text: "from bedrock"})
		}
		return dampertest.OK().WithText("from bedrock")
	}))
	t.Cleanup(s.Close)
	return s
}

// bedrockBackend is the file's entry of a Bedrock backend at srv.
func bedrockBackend(srv *dampertest.Server) backendFile {
	return backendFile{Name: "bedrock", Provider: "bedrock", Region: "us-east-1", BaseURL: srv.URL(),
		Models: map[string]string{"claude-sonnet-4-6": "us.anthropic.claude-sonnet-4-6"}}
}

// checkBedrockRequests checks that every request Bedrock got passed its
// checks (signed, well formed) and carried none of the client's
// credentials.
func checkBedrockRequests(t *testing.T, bedrock *dampertest.Server) {
	t.Helper()
	for _, r := range bedrock.Requests() {
		if r.AuthError != "" {
			t.Errorf("Bedrock refused request %d: %s", r.N, r.AuthError)
		}
		// The log redacts credentials: the one authorization there is
		// must be the signature the fake checked.
		if _, key := r.Header["X-Api-Key"]; key || len(r.Header.Values("Authorization")) != 1 {
			t.Errorf("request %d to Bedrock: x-api-key %q, authorization %q: want the SigV4 signature alone", r.N, r.Header.Get("X-Api-Key"), r.Header.Get("Authorization"))
		}
		if r.Model != "us.anthropic.claude-sonnet-4-6" || r.Signature == "" {
			t.Errorf("request %d to Bedrock: model %q, signature %q", r.N, r.Model, r.Signature)
		}
	}
}

// tsResult is what fallback.mjs printed for one call.
type tsResult struct {
	Call     string `json:"call"`
	OK       bool   `json:"ok"`
	Text     string `json:"text"`
	Stop     bool   `json:"stop"`
	Attempts string `json:"attempts"`
	Outcome  string `json:"outcome"`
	Made     int    `json:"made"`
	Error    string `json:"error"`
	Status   int    `json:"status"`
	Message  string `json:"message"`
}

// runFallbackClient runs fallback.mjs against the proxy at url, with
// testKey, the key of the tests' tenant.
func runFallbackClient(t *testing.T, url string, calls ...string) []tsResult {
	t.Helper()
	return runFallbackClientKey(t, url, testKey, calls...)
}

// runFallbackClientKey runs fallback.mjs against the proxy at url with
// key as the SDK's apiKey.
func runFallbackClientKey(t *testing.T, url, key string, calls ...string) []tsResult {
	t.Helper()
	node := needNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, append([]string{"fallback.mjs", url}, calls...)...)
	cmd.Dir = filepath.Join("testdata", "tsclient")
	cmd.Env = append(os.Environ(), "ANTHROPIC_API_KEY="+key)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, stderr.String())
	}
	if strings.Contains(stderr.String(), testKey) || bytes.Contains(out, []byte(testKey)) {
		t.Error("the key is in what the client printed")
	}
	var results []tsResult
	for sc := bufio.NewScanner(bytes.NewReader(out)); sc.Scan(); {
		var r tsResult
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("%v: %s", err, sc.Bytes())
		}
		results = append(results, r)
	}
	if len(results) != len(calls) {
		t.Fatalf("%d results from node, want %d:\n%s\n%s", len(results), len(calls), out, stderr.String())
	}
	return results
}

// TestTypeScriptSDKFallsBackToBedrock: with the upstream down, the official
// TypeScript SDK's calls through the proxy, plain and streaming, are
// answered by a Bedrock backend, every attempt there signed from the AWS
// default chain and none carrying the client's key; the breaker opens on
// the upstream, and once the upstream recovers, its probe brings the calls
// back to it.
func TestTypeScriptSDKFallsBackToBedrock(t *testing.T) {
	cloudEnv(t, true)
	primary := newSwitchable(t, 529)
	bedrock := fakeBedrock(t)
	p := startProxy(t, primary.URL(), func(s *proxySettings) {
		s.policy = damper.Policy{MaxAttempts: 1, Breaker: &damper.BreakerPolicy{MinAttempts: 2, OpenFor: 200 * time.Millisecond}}
		s.Backends = []backendFile{bedrockBackend(bedrock)}
		keyMode(s)
	})

	// A key that names no tenant: 401, which the SDK raises as an
	// AuthenticationError, and nothing sent.
	for _, r := range runFallbackClientKey(t, p.url, "dk-names-no-tenant", "plain", "stream") {
		if r.OK || r.Status != 401 || r.Error != "AuthenticationError" {
			t.Errorf("%s with a wrong key: %+v, want AuthenticationError 401", r.Call, r)
		}
	}
	if n, m := primary.Count(""), bedrock.Count(""); n != 0 || m != 0 {
		t.Fatalf("with a wrong key, the upstream got %d requests, Bedrock %d; want none", n, m)
	}

	// The tenant's key as the SDK's apiKey: two calls fail on the upstream
	// and move to Bedrock (2 attempts each); the breaker then opens, and
	// the next two go to Bedrock alone.
	got := runFallbackClient(t, p.url, "plain", "stream", "plain", "stream")
	for i, want := range []string{"2", "2", "1", "1"} {
		r := got[i]
		if !r.OK || r.Text != "from bedrock" || r.Attempts != want {
			t.Errorf("call %d (%s): %+v, want the text from bedrock after %s attempts", i+1, r.Call, r, want)
		}
		if r.Call == "stream" && !r.Stop {
			t.Errorf("call %d: the stream had no message_stop: %+v", i+1, r)
		}
		if r.Call == "plain" && r.Outcome != string(damper.OutcomeSuccess) {
			t.Errorf("call %d: Damper-Outcome %q, want success", i+1, r.Outcome)
		}
	}
	if n, m := primary.Count(""), bedrock.Count(""); n != 2 || m != 4 {
		t.Errorf("the upstream got %d requests, Bedrock %d; want 2 and 4: nothing to the upstream while its breaker is open", n, m)
	}

	// The upstream recovers: calls go to Bedrock until the breaker's probe,
	// the first call after open_for, is answered by the upstream.
	primary.down.Store(false)
	back := runFallbackClient(t, p.url, "until:from the primary:500", "stream")
	if r := back[0]; !r.OK || r.Text != "from the primary" || r.Attempts != "1" {
		t.Fatalf("no call came back to the upstream in %d calls: %+v", r.Made, r)
	}
	if r := back[1]; !r.OK || r.Text != "from the primary" || !r.Stop {
		t.Errorf("the stream after the probe: %+v", r)
	}
	made := back[0].Made
	if n, m := primary.Count(""), bedrock.Count(""); n != 2+1+1 || m != 4+made-1 {
		t.Errorf("the upstream got %d requests, Bedrock %d; want %d and %d: the probe alone reached the upstream before it closed", n, m, 4, 4+made-1)
	}
	checkBedrockRequests(t, bedrock)
	if bedrock.Count("") == 0 {
		t.Fatal("Bedrock got nothing")
	}
}

// secondOrgKey is the key of the second organisation's backend.
const secondOrgKey = "sk-ant-api03-secondorgsecret"

// TestSecondOrgBackendGetsItsOwnKey: a first-party backend of another
// organisation gets the key from its api_key_env, never the client's, on
// plain and streaming calls alike.
func TestSecondOrgBackendGetsItsOwnKey(t *testing.T) {
	cloudEnv(t, false)
	t.Setenv("DAMPER_TEST_SECOND_ORG_KEY", secondOrgKey)
	primary := newSwitchable(t, 500)
	second := dampertest.NewServer(dampertest.InMemory(), dampertest.WithStepFunc(func(r dampertest.Request) dampertest.Step {
		if r.Stream {
			return dampertest.OK().WithStream(dampertest.Stream{Text: "from the second org"})
		}
		return dampertest.OK().WithText("from the second org")
	}))
	var keys, auths []string // the credentials the second org got
	var mu sync.Mutex
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		keys, auths = append(keys, r.Header.Get("X-Api-Key")), append(auths, r.Header.Get("Authorization"))
		mu.Unlock()
		second.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	p := startProxy(t, primary.URL(), func(s *proxySettings) {
		s.policy = damper.Policy{MaxAttempts: 1}
		s.Backends = []backendFile{{Name: "second-org", Provider: "anthropic", BaseURL: front.URL, APIKeyEnv: "DAMPER_TEST_SECOND_ORG_KEY"}}
		keyMode(s)
	})
	for _, stream := range []bool{false, true} {
		body := `{"model":"claude-sonnet-4-6","max_tokens":64,"messages":[{"role":"user","content":"hi"}]`
		if stream {
			body += `,"stream":true`
		}
		req, _ := http.NewRequest(http.MethodPost, p.url+"/v1/messages", strings.NewReader(body+"}"))
		req.Header.Set("X-Api-Key", testKey)
		req.Header.Set("Authorization", "Bearer "+testKey)
		req.Header.Set("Anthropic-Version", "2023-06-01")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 200 || !strings.Contains(string(got), "from the second") || res.Header.Get("Damper-Attempts") != "2" {
			t.Errorf("stream %v: %d, Damper-Attempts %q: %s", stream, res.StatusCode, res.Header.Get("Damper-Attempts"), got)
		}
		if b := res.Header.Get("Damper-Backend"); b != "second-org" {
			t.Errorf("stream %v: Damper-Backend %q, want the file's name for the backend, second-org", stream, b)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(keys) != 2 || primary.Count("") != 2 {
		t.Fatalf("the second org got %d requests, the upstream %d; want 2 and 2", len(keys), primary.Count(""))
	}
	for i := range keys {
		// The SDK sends the key of option.WithAPIKey as x-api-key or as a
		// bearer token, by version: either way the backend's own.
		own := keys[i] == secondOrgKey || keys[i] == "" && auths[i] == "Bearer "+secondOrgKey
		if !own || strings.Contains(keys[i]+auths[i], testKey) {
			t.Errorf("request %d to the second org: its own key %v, the client's %v", i+1, own, strings.Contains(keys[i]+auths[i], testKey))
		}
	}
	for _, r := range primary.Requests() {
		if r.Header.Get("X-Api-Key") == "" {
			t.Errorf("the upstream got no x-api-key: the client's is forwarded to it")
		}
	}
}

// TestProxySiblingModelsFromTheFile: the file's policy.fallback.models
// moves a call to a sibling model when its own model's attempts fail, on
// the upstream and on every backend, in the order fallback describes: the
// model on each backend first, then the sibling.
func TestProxySiblingModelsFromTheFile(t *testing.T) {
	cloudEnv(t, true)
	primary := dampertest.NewServer(dampertest.WithStepFunc(func(r dampertest.Request) dampertest.Step {
		if r.Model == "claude-opus-4-5" {
			return dampertest.Status(529)
		}
		return dampertest.OK().WithText("from the primary, model " + r.Model)
	}))
	t.Cleanup(primary.Close)
	bedrock := dampertest.NewServer(dampertest.Bedrock("us-east-1"), dampertest.WithStepFunc(func(r dampertest.Request) dampertest.Step {
		return dampertest.Status(529)
	}))
	t.Cleanup(bedrock.Close)
	setUpstreamKey(t)
	s, err := parseProxyFile(t, `
upstream: `+primary.URL()+`
`+tenantsYAML+`backends:
  - {name: bedrock, provider: bedrock, region: us-east-1, base_url: '`+bedrock.URL()+`'}
policy:
  max_attempts: 1
  fallback:
    models: {claude-opus-4-5: [claude-sonnet-4-5]}
`)
	if err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, s.Upstream, func(ps *proxySettings) {
		ps.policy, ps.Backends, ps.tenants, ps.upstreamKey = s.policy, s.Backends, s.tenants, s.upstreamKey
	})
	req, _ := http.NewRequest(http.MethodPost, p.url+"/v1/messages", strings.NewReader(`{"model":"claude-opus-4-5","max_tokens":64,"messages":[]}`))
	req.Header.Set("X-Api-Key", testKey)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || !strings.Contains(string(body), "from the primary, model claude-sonnet-4-5") || res.Header.Get("Damper-Attempts") != "3" {
		t.Errorf("%d, Damper-Attempts %q: %s; want the sibling's answer from the primary at the third attempt", res.StatusCode, res.Header.Get("Damper-Attempts"), body)
	}
	var models []string
	for _, r := range primary.Requests() {
		models = append(models, r.Model)
	}
	if len(models) != 2 || models[0] != "claude-opus-4-5" || models[1] != "claude-sonnet-4-5" || bedrock.Count("") != 1 {
		t.Errorf("the upstream got %q, Bedrock %d requests; want opus then the sibling sonnet upstream, and opus once on Bedrock between them", models, bedrock.Count(""))
	}
}

// TestProxySpreadFromTheFile: the file's policy.fallback.routing spread,
// primary_weight and backends[i].weight are read: with nothing learned,
// the calls go to the upstream and the second organisation by their
// weights, 1:3, in a smooth order, each answered by the one it started on.
func TestProxySpreadFromTheFile(t *testing.T) {
	cloudEnv(t, false)
	t.Setenv("DAMPER_TEST_SECOND_ORG_KEY", secondOrgKey)
	answer := func(from string) dampertest.ServerOption {
		return dampertest.WithStepFunc(func(dampertest.Request) dampertest.Step { return dampertest.OK().WithText("from " + from) })
	}
	primary := dampertest.NewServer(answer("the upstream"))
	t.Cleanup(primary.Close)
	second := dampertest.NewServer(answer("the second org"))
	t.Cleanup(second.Close)
	setUpstreamKey(t)
	s, err := parseProxyFile(t, `
upstream: `+primary.URL()+`
`+tenantsYAML+`backends:
  - {name: second-org, provider: anthropic, base_url: '`+second.URL()+`', api_key_env: DAMPER_TEST_SECOND_ORG_KEY, weight: 3}
policy:
  fallback: {routing: spread, primary_weight: 1}
`)
	if err != nil {
		t.Fatal(err)
	}
	if s.policy.Fallback == nil || s.policy.Fallback.Routing != "spread" || s.Backends[0].Weight != 3 {
		t.Fatalf("read policy.fallback %+v, backends %+v; want routing spread and weight 3", s.policy.Fallback, s.Backends)
	}
	p := startProxy(t, s.Upstream, func(ps *proxySettings) {
		ps.policy, ps.Backends, ps.tenants, ps.upstreamKey = s.policy, s.Backends, s.tenants, s.upstreamKey
	})
	var got []string
	for range 8 {
		req, _ := http.NewRequest(http.MethodPost, p.url+"/v1/messages", strings.NewReader(`{"model":"claude-sonnet-4-5","max_tokens":64,"messages":[]}`))
		req.Header.Set("X-Api-Key", testKey)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		backend := res.Header.Get("Damper-Backend")
		if res.StatusCode != 200 || res.Header.Get("Damper-Attempts") != "1" || !strings.Contains(string(body), map[string]string{"primary": "from the upstream", "second-org": "from the second org"}[backend]) {
			t.Fatalf("%d from %q, Damper-Attempts %q: %s", res.StatusCode, backend, res.Header.Get("Damper-Attempts"), body)
		}
		got = append(got, backend)
	}
	want := "second-org,primary,second-org,second-org,second-org,primary,second-org,second-org"
	if strings.Join(got, ",") != want {
		t.Fatalf("answered by %s; want %s", strings.Join(got, ","), want)
	}
	if primary.Count("") != 2 || second.Count("") != 6 {
		t.Fatalf("the upstream got %d calls, the second org %d; want 2 and 6", primary.Count(""), second.Count(""))
	}
}
