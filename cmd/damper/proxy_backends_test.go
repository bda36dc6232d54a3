package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
	"github.com/damper-ai/damper-go/fleet"
)

// backendSecret is the value of the env var an anthropic backend names:
// no error may show it.
const backendSecret = "sk-ant-api03-backendsecretvalue"

// writeConfig writes a proxy configuration file whose backends list is
// backends (YAML), and returns its path.
func writeConfig(t *testing.T, backends string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "proxy.yaml")
	setUpstreamKey(t)
	if err := os.WriteFile(path, []byte("listen: 127.0.0.1:0\n"+tenantsYAML+"backends:\n"+backends), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestBackendsFileErrors: every backend the file cannot use is an error
// naming the file, the key's path and the value, and no secret.
func TestBackendsFileErrors(t *testing.T) {
	cloudEnv(t, false)
	t.Setenv("DAMPER_TEST_BACKEND_KEY", backendSecret)
	t.Setenv("DAMPER_TEST_EMPTY", "")
	const ok = "  - {name: a, provider: anthropic, api_key_env: DAMPER_TEST_BACKEND_KEY}\n"
	nine := strings.Repeat("  - {name: x, provider: bedrock, region: us-east-1}\n", 9)
	var many strings.Builder
	many.WriteString("  - name: big\n    provider: bedrock\n    region: us-east-1\n    models:\n")
	for i := range 1001 {
		fmt.Fprintf(&many, "      m%d: id%d\n", i, i)
	}
	for _, tc := range []struct{ backends, want string }{
		{"  - {provider: bedrock, region: us-east-1}\n", `backends[0].name: nothing: a name is required`},
		{ok + "  - {name: a, provider: bedrock, region: us-east-1}\n", `backends[1].name: "a": backends[0] has this name already`},
		{"  - {name: primary, provider: bedrock, region: us-east-1}\n", `backends[0].name: "primary": is the upstream's own name`},
		{"  - {name: a b, provider: bedrock, region: us-east-1}\n", `backends[0].name: "a b": want 1 to 32 letters, digits, '-' or '_'`},
		{"  - {name: " + strings.Repeat("n", 33) + ", provider: bedrock, region: us-east-1}\n", `backends[0].name: "` + strings.Repeat("n", 33) + `": want 1 to 32`},
		{"  - {name: a, provider: openai}\n", `backends[0].provider: "openai": want anthropic, bedrock or vertex`},
		{"  - {name: a}\n", `backends[0].provider: "": want anthropic, bedrock or vertex`},
		{"  - {name: a, provider: bedrock, region: us-east-1, api_key_env: DAMPER_TEST_BACKEND_KEY}\n", `backends[0].api_key_env: "DAMPER_TEST_BACKEND_KEY": provider bedrock takes no api_key_env`},
		{"  - {name: a, provider: anthropic, api_key_env: DAMPER_TEST_BACKEND_KEY, project: p}\n", `backends[0].project: "p": provider anthropic takes no project`},
		{"  - {name: a, provider: anthropic, api_key_env: DAMPER_TEST_BACKEND_KEY, region: us-east-1}\n", `backends[0].region: "us-east-1": provider anthropic takes no region`},
		{"  - {name: a, provider: vertex, region: us-east5, project: p, api_key_env: DAMPER_TEST_BACKEND_KEY}\n", `backends[0].api_key_env: "DAMPER_TEST_BACKEND_KEY": provider vertex takes no api_key_env`},
		{"  - {name: a, provider: anthropic}\n", `backends[0].api_key_env: nothing: required for provider anthropic`},
		{"  - {name: a, provider: bedrock}\n", `backends[0].region: nothing: required for provider bedrock`},
		{"  - {name: a, provider: vertex, region: us-east5}\n", `backends[0].project: nothing: required for provider vertex`},
		{"  - {name: a, provider: vertex, project: p}\n", `backends[0].region: nothing: required for provider vertex`},
		{ok + "  - {name: b, provider: bedrock, region: us-east-1, base_url: 'ftp://x'}\n", `backends[1].base_url: "ftp://x": want an http or https URL`},
		{"  - {name: b, provider: bedrock, region: us-east-1, base_url: 'https://'}\n", `backends[0].base_url: "https://": the URL has no host`},
		{"  - {name: b, provider: bedrock, region: us-east-1, base_url: 'https://user:" + backendSecret + "@h'}\n", `backends[0].base_url: "https://xxxxx@h": a base URL holds no credentials`},
		{"  - {name: b, provider: bedrock, region: us-east-1, base_url: 'https://h/?q=1'}\n", `backends[0].base_url: "https://h/?q=xxxxx": a base URL has no query`},
		{"  - {name: b, provider: vertex, region: us-east5, project: p, base_url: 'https://h/vertex'}\n", `backends[0].base_url: "https://h/vertex": a vertex base URL has no path`},
		{"  - {name: a, provider: anthropic, api_key_env: 1KEY}\n", `backends[0].api_key_env: (not shown): want the name of the environment variable that holds the key`},
		{"  - {name: a, provider: anthropic, api_key_env: " + backendSecret + "}\n", `backends[0].api_key_env: (not shown): want the name of the environment variable`},
		{"  - {name: a, provider: anthropic, api_key_env: DAMPER_TEST_UNSET_VAR}\n", `backends[0].api_key_env: "DAMPER_TEST_UNSET_VAR": the environment variable is unset or empty`},
		{"  - {name: a, provider: anthropic, api_key_env: DAMPER_TEST_EMPTY}\n", `backends[0].api_key_env: "DAMPER_TEST_EMPTY": the environment variable is unset or empty`},
		{"  - {name: a, provider: bedrock, region: US East}\n", `backends[0].region: "US East": want a region such as us-east-1`},
		{"  - {name: a, provider: vertex, region: us-east5, project: my project}\n", `backends[0].project: "my project": want a project ID`},
		{"  - {name: a, provider: bedrock, region: us-east-1, models: {claude-sonnet-4-6: ''}}\n", `backends[0].models: "claude-sonnet-4-6": "": a model and its ID are each 1 to 256`},
		{"  - {name: a, provider: bedrock, region: us-east-1, models: {'': x}}\n", `backends[0].models: "": "x": a model and its ID`},
		{"  - {name: a, provider: bedrock, region: us-east-1, models: {m: " + strings.Repeat("x", 257) + "}}\n", `backends[0].models: "m": "` + strings.Repeat("x", 64) + `"...: a model and its ID are each 1 to 256`},
		{"  - {name: a, provider: bedrock, region: us-east-1, api_key: " + backendSecret + "}\n", `backends[0].api_key: unknown key (known: name, provider, base_url, api_key_env, region, project, models, weight)`},
		{"  - {name: a, provider: bedrock, region: us-east-1, weight: 1001}\n", `backends[0].weight: 1001: must be at most 1000`},
		{"  - {name: a, provider: bedrock, region: us-east-1, weight: 0}\n", `backends[0].weight: 0:`},
		{"  - {name: a, provider: bedrock, region: us-east-1, weight: heavy}\n", `backends[0].weight: "heavy"`},
		{nine, `backends: 9 backends: must be at most 8`},
		{many.String(), `backends[0].models: 1001 models: must be at most 1000`},
	} {
		path := writeConfig(t, tc.backends)
		_, err := parseProxy([]string{"-config", path}, io.Discard, io.Discard)
		if err == nil || !strings.HasPrefix(err.Error(), path+": ") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %s", strings.TrimSpace(tc.backends[:min(len(tc.backends), 120)]), err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), backendSecret) {
			t.Errorf("the secret is in the error: %v", err)
		}
	}
}

// TestBackendsFileBuilds: a good file's backends are built in order, each
// reaching its platform's endpoint (base_url, else the platform's own),
// with the key of its env var, its models, and the store the seam gives.
func TestBackendsFileBuilds(t *testing.T) {
	cloudEnv(t, true)
	t.Setenv("DAMPER_TEST_BACKEND_KEY", backendSecret)
	gcp := fakeGoogle(t, true)
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", gcp.credentials)
	path := writeConfig(t, `  - name: second-org
    provider: anthropic
    api_key_env: DAMPER_TEST_BACKEND_KEY
  - name: bedrock
    provider: bedrock
    region: us-east-1
    models: {claude-sonnet-4-6: us.anthropic.claude-sonnet-4-6}
  - name: bedrock-eu
    provider: bedrock
    region: eu-west-1
    base_url: http://127.0.0.1:9
  - name: vertex
    provider: vertex
    region: us-east5
    project: my-project
`)
	s, err := parseProxy([]string{"-config", path}, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var asked []string
	stores := map[string]fleet.Store{}
	built, err := buildBackends(context.Background(), s.Backends, func(name string) (fleet.Store, error) {
		asked = append(asked, name)
		stores[name] = namedStore{name: name}
		return stores[name], nil
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct{ name, provider, endpoint string }{
		{"second-org", damper.ProviderAnthropic, "https://api.anthropic.com"},
		{"bedrock", damper.ProviderBedrock, "https://bedrock-runtime.us-east-1.amazonaws.com"},
		{"bedrock-eu", damper.ProviderBedrock, "http://127.0.0.1:9"},
		{"vertex", damper.ProviderVertex, "https://us-east5-aiplatform.googleapis.com"},
	}
	if len(built) != len(want) || !slices.Equal(asked, []string{"second-org", "bedrock", "bedrock-eu", "vertex"}) {
		t.Fatalf("built %d backends, stores asked for %q", len(built), asked)
	}
	for i, w := range want {
		b := built[i]
		if b.backend.Name != w.name || b.backend.Provider != w.provider || b.endpoint.String() != w.endpoint || b.backend.Store != stores[w.name] || len(b.backend.Options) == 0 {
			t.Errorf("backend %d: %q %q at %s, store %v, want %+v", i, b.backend.Name, b.backend.Provider, b.endpoint, b.backend.Store != nil, w)
		}
	}
	if built[1].backend.Models["claude-sonnet-4-6"] != "us.anthropic.claude-sonnet-4-6" {
		t.Errorf("models %v", built[1].backend.Models)
	}
	// Damper takes them as they are.
	if _, err := damper.New(damper.Policy{}, damper.WithBackends(damperBackends(built)...)); err != nil {
		t.Fatal(err)
	}
	// The seam's error names the backend.
	_, err = buildBackends(context.Background(), s.Backends, func(name string) (fleet.Store, error) {
		if name == "bedrock" {
			return nil, errors.New("no store here")
		}
		return nil, nil
	}, nil)
	if err == nil || err.Error() != `backends[1] ("bedrock"): its store: no store here` {
		t.Errorf("the seam's error: %v", err)
	}
}

// namedStore is a store in memory that says whose it is.
type namedStore struct {
	fleet.MemoryStore
	name string
}

// fakeGoogleServer is a service account's Application Default Credentials
// whose token endpoint is a loopback server.
type fakeGoogleServer struct {
	credentials string // the credentials file
	tokens      int    // tokens asked for
	mu          sync.Mutex
}

// fakeGoogle writes a service account's credentials whose token endpoint
// grants a token, or, when !grant, refuses with 401.
func fakeGoogle(t *testing.T, grant bool) *fakeGoogleServer {
	t.Helper()
	f := &fakeGoogleServer{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.tokens++
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if !grant {
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprint(w, `{"error":"invalid_grant","error_description":"account disabled"}`)
			return
		}
		fmt.Fprint(w, `{"access_token":"`+dampertest.VertexToken+`","token_type":"Bearer","expires_in":3600}`)
	}))
	t.Cleanup(srv.Close)
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKCS8PrivateKey(key)
	doc, _ := json.Marshal(map[string]string{
		"type": "service_account", "project_id": "my-project", "private_key_id": "k1",
		"private_key":  string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})),
		"client_email": "damper@my-project.iam.gserviceaccount.com", "client_id": "1",
		"token_uri": srv.URL + "/token",
	})
	f.credentials = filepath.Join(t.TempDir(), "gcp.json")
	if err := os.WriteFile(f.credentials, doc, 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// listening is a loopback listener that accepts and closes connections,
// and a closed port's address.
func listening(t *testing.T) (open, closed string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	gone, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed = gone.Addr().String()
	gone.Close()
	return ln.Addr().String(), closed
}

// testChecks are the checks at start on loopback: the real dialer, no
// HTTP proxy.
func testChecks() startChecks {
	c := defaultStartChecks()
	c.proxy = nil
	c.timeout = 10 * time.Second // loopback answers at once: the bound is never met
	return c
}

// TestStartChecks: a backend whose credentials cannot be had, or whose
// endpoint (or the upstream) cannot be reached, is an error naming it,
// and no secret.
func TestStartChecks(t *testing.T) {
	cloudEnv(t, false)
	t.Setenv("DAMPER_TEST_BACKEND_KEY", backendSecret)
	open, closed := listening(t)
	anthropicAt := func(addr string) backendFile {
		return backendFile{Name: "second-org", Provider: "anthropic", APIKeyEnv: "DAMPER_TEST_BACKEND_KEY", BaseURL: "http://" + addr}
	}
	bedrockAt := func(addr string) backendFile {
		return backendFile{Name: "bedrock", Provider: "bedrock", Region: "us-east-1", BaseURL: "http://" + addr}
	}
	check := func(upstream string, files ...backendFile) error {
		t.Helper()
		s := defaultProxySettings()
		s.Upstream, s.Backends = upstream, files
		_, err := startBackends(context.Background(), s, testChecks(), nil)
		if err != nil && strings.Contains(err.Error(), backendSecret) {
			t.Errorf("the secret is in the error: %v", err)
		}
		return err
	}

	if err := check("http://"+open, anthropicAt(open)); err != nil {
		t.Errorf("all reachable: %v", err)
	}
	err := check("http://"+closed, anthropicAt(open), anthropicAt(closed))
	for _, want := range []string{
		"upstream: cannot reach " + closed + ": ",
		`backends[1] ("second-org"): cannot reach ` + closed + ": ",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("unreachable: %v, want %s", err, want)
		}
	}
	if err != nil && strings.Contains(err.Error(), `backends[0]`) {
		t.Errorf("a reachable backend is in the error: %v", err)
	}

	// Bedrock: no credentials in the default chain; then the environment's.
	err = check("http://"+open, bedrockAt(open))
	if err == nil || !strings.HasPrefix(err.Error(), `backends[0] ("bedrock"): no AWS credentials: `) {
		t.Errorf("bedrock without credentials: %v", err)
	}
	t.Setenv("AWS_BEARER_TOKEN_BEDROCK", backendSecret)
	if err := check("http://"+open, bedrockAt(open)); err != nil {
		t.Errorf("bedrock with a bearer token: %v", err)
	}
	os.Unsetenv("AWS_BEARER_TOKEN_BEDROCK")
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIADAMPERTEST000000")
	t.Setenv("AWS_SECRET_ACCESS_KEY", backendSecret)
	if err := check("http://"+open, bedrockAt(open)); err != nil {
		t.Errorf("bedrock with keys in the environment: %v", err)
	}

	// Vertex: no Application Default Credentials; a token refused; one granted.
	vertexAt := backendFile{Name: "vertex", Provider: "vertex", Region: "us-east5", Project: "my-project", BaseURL: "http://" + open}
	err = check("http://"+open, vertexAt)
	if err == nil || !strings.HasPrefix(err.Error(), `backends[0] ("vertex"): no Google credentials (Application Default Credentials): `) {
		t.Errorf("vertex without credentials: %v", err)
	}
	refused := fakeGoogle(t, false)
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", refused.credentials)
	err = check("http://"+open, vertexAt)
	if err == nil || !strings.HasPrefix(err.Error(), `backends[0] ("vertex"): no Google credentials: `) || refused.tokens != 1 {
		t.Errorf("vertex with a token refused: %v (%d asked)", err, refused.tokens)
	}
	granted := fakeGoogle(t, true)
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", granted.credentials)
	if err := check("http://"+open, vertexAt); err != nil || granted.tokens != 1 {
		t.Errorf("vertex with a token granted: %v (%d asked)", err, granted.tokens)
	}
}

// TestStartChecksDialWhere: each check dials the backend's own endpoint,
// the platform's by default, or the HTTP proxy its requests would take;
// all at once, and within the time limit.
func TestStartChecksDialWhere(t *testing.T) {
	cloudEnv(t, true)
	t.Setenv("DAMPER_TEST_BACKEND_KEY", backendSecret)
	built, err := buildBackends(context.Background(), []backendFile{
		{Name: "second-org", Provider: "anthropic", APIKeyEnv: "DAMPER_TEST_BACKEND_KEY"},
		{Name: "bedrock", Provider: "bedrock", Region: "us-east-1"},
	}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var dialed []string
	c := startChecks{timeout: time.Minute, dial: func(_ context.Context, network, addr string) (net.Conn, error) {
		mu.Lock()
		dialed = append(dialed, addr)
		mu.Unlock()
		a, b := net.Pipe()
		b.Close()
		return a, nil
	}}
	if err := c.run(context.Background(), "https://api.anthropic.com", built); err != nil {
		t.Fatal(err)
	}
	slices.Sort(dialed)
	if want := []string{"api.anthropic.com:443", "api.anthropic.com:443", "bedrock-runtime.us-east-1.amazonaws.com:443"}; !slices.Equal(dialed, want) {
		t.Errorf("dialed %q, want %q", dialed, want)
	}

	// Through an HTTP proxy that is down.
	_, closed := listening(t)
	c = testChecks()
	c.proxy = func(*http.Request) (*url.URL, error) { return url.Parse("http://" + closed) }
	err = c.run(context.Background(), "https://api.anthropic.com", built[:1])
	for _, want := range []string{
		"upstream: cannot reach the HTTP proxy " + closed + " (for api.anthropic.com:443): ",
		`backends[0] ("second-org"): cannot reach the HTTP proxy ` + closed + " (for api.anthropic.com:443): ",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("through a proxy: %v, want %s", err, want)
		}
	}

	// Endpoints that never answer: every check ends at the one time limit,
	// together.
	release := make(chan struct{})
	defer close(release)
	c = startChecks{timeout: 50 * time.Millisecond, dial: func(context.Context, string, string) (net.Conn, error) {
		<-release // ignores its context, as a check may
		return nil, errors.New("released")
	}}
	start := time.Now()
	err = c.run(context.Background(), "https://api.anthropic.com", built)
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the checks took %v, bound 50ms", took)
	}
	for _, label := range []string{"upstream: ", `backends[0] ("second-org"): `, `backends[1] ("bedrock"): `} {
		if err == nil || !strings.Contains(err.Error(), label+"no answer within 50ms") {
			t.Errorf("never answered: %v, want %sno answer within 50ms", err, label)
		}
	}
}

// TestRunProxyChecksBeforeListening: the damper command fails at start,
// before it listens, on a backend it cannot use, naming it.
func TestRunProxyChecksBeforeListening(t *testing.T) {
	cloudEnv(t, false)
	t.Setenv("DAMPER_TEST_BACKEND_KEY", backendSecret)
	open, closed := listening(t)
	path := filepath.Join(t.TempDir(), "proxy.yaml")
	setUpstreamKey(t)
	doc := "listen: 127.0.0.1:0\nupstream: http://" + open + "\n" + tenantsYAML + "backends:\n" +
		"  - {name: second-org, provider: anthropic, api_key_env: DAMPER_TEST_BACKEND_KEY, base_url: 'http://" + closed + "'}\n" +
		"  - {name: bedrock, provider: bedrock, region: us-east-1, base_url: 'http://" + open + "'}\n"
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	if code := run([]string{"proxy", "-config", path}, io.Discard, &stderr); code != exitFail {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	out := stderr.String()
	for _, want := range []string{"damper proxy: cannot start", `backends[0] (\"second-org\"): cannot reach ` + closed, `backends[1] (\"bedrock\"): no AWS credentials`} {
		if !strings.Contains(out, want) {
			t.Errorf("stderr lacks %s:\n%s", want, out)
		}
	}
	if strings.Contains(out, "serving") || strings.Contains(out, backendSecret) {
		t.Errorf("it served, or showed the secret:\n%s", out)
	}
}

// TestRunProxyUpstreamUnreachable: an upstream the proxy cannot reach at
// start, as api.anthropic.com offline, stops it with what to set.
func TestRunProxyUpstreamUnreachable(t *testing.T) {
	_, closed := listening(t)
	var stderr bytes.Buffer
	if code := run([]string{"proxy", "-listen", "127.0.0.1:0", "-upstream", "http://" + closed}, io.Discard, &stderr); code != exitFail {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	want := `"msg":"damper proxy: cannot start","error":"upstream: cannot reach ` + closed + `: dial tcp ` + closed + `: connect: connection refused (every call goes to the upstream, http://` + closed +
		`: set upstream in the file, or --upstream, to an API this host reaches; offline, a fake API on loopback, as in the README's quick start)"}`
	if !strings.Contains(stderr.String(), want) {
		t.Errorf("stderr:\n%s\nwant %s", stderr.String(), want)
	}
}
