package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"github.com/damper-ai/damper-go"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/damper-ai/damper-go/dampertest"
	"github.com/damper-ai/damper-go/internal/redistest"
	"github.com/damper-ai/damper-go/internal/syncbuf"
)

// reloadWait bounds the wait for a reload's log line: a failure, never a
// pace.
const reloadWait = 10 * time.Second

// reloadLines hands on each log line about a reload as it is written.
type reloadLines struct {
	logs  *syncbuf.Buffer
	lines chan string
}

func (w *reloadLines) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte(`"msg":"damper proxy: reload`)) {
		w.lines <- string(p)
	}
	return w.logs.Write(p)
}

// reloadingProxy is serveProxy, as runProxy runs it, on its file: a
// reload (reload) writes the file and sends what SIGHUP sends.
type reloadingProxy struct {
	*runningProxy
	path   string
	hup    chan os.Signal
	lines  chan string
	listen string // the listener's address
}

// startReloading serves the configuration file config (YAML), whose
// upstream is given, as `damper proxy -config file` would.
func startReloading(t *testing.T, config string) *reloadingProxy {
	t.Helper()
	path := writeFile(t, "proxy.yaml", config)
	args := []string{"-config", path}
	s, err := parseProxy(args, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	hup := make(chan os.Signal) // a send returns once the reload begins
	s.reloads = hup
	s.reread = func() (proxySettings, error) { return parseProxy(args, io.Discard, io.Discard) }
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &reloadingProxy{path: path, hup: hup, lines: make(chan string, 16), listen: ln.Addr().String(),
		runningProxy: &runningProxy{url: "http://" + ln.Addr().String(), logs: &syncbuf.Buffer{}, done: make(chan error, 1)}}
	ctx, cancel := context.WithCancel(context.Background())
	p.stop = cancel
	logger := newLogger(&reloadLines{logs: p.logs, lines: p.lines}, slog.LevelDebug)
	if s.fleet, err = openProxyStore(ctx, s.store, logger); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- serveProxy(ctx, s, ln, logger) }()
	t.Cleanup(func() {
		cancel()
		if err := <-p.done; err != nil {
			t.Errorf("serveProxy: %v", err)
		}
		if err := s.fleet.Close(); err != nil {
			t.Errorf("the store's Close: %v", err)
		}
		for _, secret := range []string{testKey, upstreamKey, newTenantKey} {
			if strings.Contains(p.logs.String(), secret) {
				t.Errorf("a key is in the proxy's logs:\n%s", p.logs)
			}
		}
		if t.Failed() {
			t.Logf("logs:\n%s", p.logs)
		}
	})
	return p
}

// reloadLine is a reload's log line, read.
type reloadLine struct {
	Level    string   `json:"level"`
	Msg      string   `json:"msg"`
	Error    string   `json:"error"`
	Changed  []string `json:"changed"`
	Restart  []string `json:"restart_needed"`
	Config   string   `json:"config"`
	rawInput string
}

// reload writes config to the proxy's file, signals a reload and returns
// its log line.
func (p *reloadingProxy) reload(t *testing.T, config string) reloadLine {
	t.Helper()
	if err := os.WriteFile(p.path, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	p.hup <- syscall.SIGHUP
	select {
	case line := <-p.lines:
		var l reloadLine
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatalf("the reload's log line %q: %v", line, err)
		}
		l.rawInput = line
		return l
	case <-time.After(reloadWait):
		t.Fatalf("no reload logged within %v", reloadWait)
		return reloadLine{}
	}
}

// newTenantKey is a key a reload adds.
const newTenantKey = "dk-reload-added-tenant-key"

// proxyYAML is a file in front of upstream, in pass-through mode, with
// policy under policy:.
func proxyYAML(upstream, policy string) string {
	return "listen: 127.0.0.1:0\nupstream: " + upstream + "\npolicy:\n  backoff_base: 0\n" + policy
}

// keyYAML is proxyYAML in key mode, with testKey's tenant. A client's
// scenario header does not reach the upstream then.
func keyYAML(upstream, policy string) string {
	return "listen: 127.0.0.1:0\nupstream: " + upstream + "\n" + tenantsYAML + "policy:\n  backoff_base: 0\n" + policy
}

// callKey makes a plain Messages call of scenario with key through the
// proxy at url, and returns its status and the Damper-Outcome header.
func callKey(t *testing.T, url, key, scenario string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/messages", strings.NewReader(`{"model":"claude-sonnet-4-6","max_tokens":64,"messages":[]}`))
	req.Header.Set("X-Api-Key", key)
	req.Header.Set(dampertest.ScenarioHeader, scenario)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode, res.Header.Get("Damper-Outcome")
}

// TestProxyReloadKeepsStreamsInFlight: streams begun before a reload all
// finish whole after it, on the configuration they began on, while a call
// after it runs on the new one.
func TestProxyReloadKeepsStreamsInFlight(t *testing.T) {
	setUpstreamKey(t)
	release := make(chan struct{})
	api := dampertest.NewServer()
	t.Cleanup(api.Close)
	api.Script("overloaded", dampertest.Status(529))
	st := dampertest.Stream{Text: "a stream that outlives its configuration"}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(dampertest.ScenarioHeader) != "held" {
			api.Handler().ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for i, e := range st.Events() {
			if i == st.ContentIndex()+1 {
				select {
				case <-release:
				case <-r.Context().Done():
					return
				}
			}
			io.WriteString(w, e.String())
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(up.Close)
	p := startReloading(t, proxyYAML(up.URL, "  max_attempts: 1\n"))

	const streams = 4
	type result struct {
		text string
		err  error
	}
	results := make(chan result, streams)
	var begun sync.WaitGroup
	for range streams {
		begun.Add(1)
		go func() {
			req, _ := http.NewRequest(http.MethodPost, p.url+"/v1/messages",
				strings.NewReader(`{"model":"claude-sonnet-4-6","max_tokens":64,"stream":true,"messages":[]}`))
			req.Header.Set("X-Api-Key", testKey)
			req.Header.Set(dampertest.ScenarioHeader, "held")
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				begun.Done()
				results <- result{err: err}
				return
			}
			defer res.Body.Close()
			br := bufio.NewReader(res.Body)
			var text strings.Builder
			first := true
			for {
				line, err := br.ReadString('\n')
				if err == io.EOF {
					results <- result{text: text.String()}
					return
				}
				if err != nil {
					results <- result{err: err}
					return
				}
				if data, ok := strings.CutPrefix(line, "data: "); ok {
					var ev struct {
						Type  string `json:"type"`
						Delta struct {
							Text string `json:"text"`
						} `json:"delta"`
					}
					_ = json.Unmarshal([]byte(data), &ev)
					text.WriteString(ev.Delta.Text)
					if ev.Type == "content_block_delta" && first {
						first = false
						begun.Done() // its first content is here: it is in flight
					}
					if ev.Type == "message_stop" {
						text.WriteString("|stop")
					}
				}
			}
		}()
	}
	begun.Wait()
	if l := p.reload(t, proxyYAML(up.URL, "  max_attempts: 3\n")); l.Msg != "damper proxy: reloaded" || strings.Join(l.Changed, ",") != "policy" {
		t.Fatalf("reload: %s", l.rawInput)
	}
	// The new policy decides a call made now, while the streams are held.
	if status, _ := callKey(t, p.url, testKey, "overloaded"); status != 529 || api.Count("overloaded") != 3 {
		t.Errorf("a call after the reload: %d after %d attempts, want 529 after 3 (max_attempts 3)", status, api.Count("overloaded"))
	}
	close(release)
	for range streams {
		r := <-results
		if want := st.Text + "|stop"; r.err != nil || r.text != want {
			t.Errorf("a stream in flight through the reload got %q (%v), want %q whole", r.text, r.err, want)
		}
	}
}

// TestProxyReloadRefusesABrokenFile: a file that does not parse, holds a
// bad value or names an unset variable is refused whole, with the key it
// got wrong, and the policy in use goes on deciding.
func TestProxyReloadRefusesABrokenFile(t *testing.T) {
	setUpstreamKey(t)
	os.Unsetenv("DAMPER_TEST_RELOAD_UNSET")
	api := fakeAPI(t)
	api.Script("", dampertest.Status(529)) // every call: in key mode the scenario is not sent
	// A budget that outlasts the test's retries: it is kept across reloads.
	good := keyYAML(api.URL(), "  max_attempts: 2\n  retry_budget_min_tokens: 1000\n")
	p := startReloading(t, good)
	attempts := func() int {
		t.Helper()
		before := api.Count("")
		if status, _ := callKey(t, p.url, testKey, "overloaded"); status != 529 {
			t.Fatalf("status %d, want 529", status)
		}
		return api.Count("") - before
	}
	if n := attempts(); n != 2 {
		t.Fatalf("%d attempts at start, want 2", n)
	}
	for _, tt := range []struct {
		name, file, want string
	}{
		{"a bad value", keyYAML(api.URL(), "  max_attempts: 0\n  retry_budget_min_tokens: 1000\n"), "policy.max_attempts"},
		{"not YAML", good + "policy: [\n", "proxy.yaml"},
		{"an unknown key", keyYAML(api.URL(), "  max_attempts: 5\n  max_atempts: 5\n"), "max_atempts"},
		{"an unset variable", strings.Replace(keyYAML(api.URL(), "  max_attempts: 5\n  retry_budget_min_tokens: 1000\n"), "key_sha256:", "key_env: [DAMPER_TEST_RELOAD_UNSET], key_sha256:", 1), "tenants[0].key_env"},
		{"a backend's unset key", keyYAML(api.URL(), "  max_attempts: 5\n  retry_budget_min_tokens: 1000\n") + "backends:\n  - {name: other, provider: anthropic, api_key_env: DAMPER_TEST_RELOAD_UNSET}\n", "backends[0].api_key_env"},
		{"a bad upstream", strings.Replace(keyYAML(api.URL(), "  max_attempts: 5\n  retry_budget_min_tokens: 1000\n"), "upstream: http://", "upstream: ftp://", 1), "upstream"},
	} {
		l := p.reload(t, tt.file)
		if l.Level != "ERROR" || l.Msg != "damper proxy: reload refused: the configuration in use goes on serving" || !strings.Contains(l.Error, tt.want) {
			t.Errorf("%s: logged %s, want a refusal naming %s", tt.name, l.rawInput, tt.want)
		}
		if n := attempts(); n != 2 {
			t.Errorf("%s: %d attempts after the refused reload, want 2: the old policy decides", tt.name, n)
		}
	}
	// Fixed, the file is taken.
	if l := p.reload(t, keyYAML(api.URL(), "  max_attempts: 5\n  retry_budget_min_tokens: 1000\n")); l.Level != "INFO" || strings.Join(l.Changed, ",") != "policy" {
		t.Errorf("the fixed file: %s", l.rawInput)
	}
	if n := attempts(); n != 5 {
		t.Errorf("%d attempts after the reload, want 5", n)
	}
}

// TestProxyReloadAppliesThePolicy: a reload's new max_attempts decides
// the very next call, and a reload of the same file changes nothing.
func TestProxyReloadAppliesThePolicy(t *testing.T) {
	setUpstreamKey(t)
	api := fakeAPI(t)
	api.Script("overloaded", dampertest.Status(529))
	p := startReloading(t, proxyYAML(api.URL(), "  max_attempts: 1\n"))
	if status, _ := callKey(t, p.url, testKey, "overloaded"); status != 529 || api.Count("overloaded") != 1 {
		t.Fatalf("before the reload: %d after %d attempts, want 529 after 1", status, api.Count("overloaded"))
	}
	l := p.reload(t, proxyYAML(api.URL(), "  max_attempts: 3\n"))
	if l.Level != "INFO" || l.Msg != "damper proxy: reloaded" || strings.Join(l.Changed, ",") != "policy" || l.Config != p.path || len(l.Restart) != 0 {
		t.Errorf("reload: %s, want changed [policy]", l.rawInput)
	}
	if status, _ := callKey(t, p.url, testKey, "overloaded"); status != 529 || api.Count("overloaded") != 4 {
		t.Errorf("after the reload: %d after %d attempts in all, want 529 after 1+3", status, api.Count("overloaded"))
	}
	if l := p.reload(t, proxyYAML(api.URL(), "  max_attempts: 3\n")); l.Msg != "damper proxy: reloaded" || len(l.Changed) != 0 {
		t.Errorf("the same file again: %s, want nothing changed", l.rawInput)
	}
}

// TestProxyReloadKeepsLearnedState: with no store, a reload keeps the
// Damper's state: a breaker opened before it is still open after it (no
// attempt reaches the upstream), and a rate limit learned before it is
// still known.
func TestProxyReloadKeepsLearnedState(t *testing.T) {
	setUpstreamKey(t)
	api := fakeAPI(t)
	api.Script("overloaded", dampertest.Status(529))
	api.Script("limits", dampertest.OK().WithHeader("anthropic-ratelimit-requests-limit", "50").
		WithHeader("anthropic-ratelimit-requests-remaining", "49").
		WithHeader("anthropic-ratelimit-requests-reset", time.Now().Add(time.Minute).UTC().Format(time.RFC3339)))
	policy := func(maxCost string) string {
		return "  max_attempts: 1\n  max_retry_cost_usd: " + maxCost + "\n  breaker: {min_attempts: 3, failure_ratio: 0.6, open_for: 1h, max_open_for: 1h}\n  rate_limit: {}\n"
	}
	p := startReloading(t, proxyYAML(api.URL(), policy("1")))
	if status, _ := callKey(t, p.url, testKey, "limits"); status != 200 {
		t.Fatalf("limits: %d", status)
	}
	for range 2 {
		callKey(t, p.url, testKey, "overloaded")
	}
	if status, outcome := callKey(t, p.url, testKey, "overloaded"); outcome != "circuit_open" || api.Count("overloaded") != 2 {
		t.Fatalf("the breaker did not open: %d %s, %d attempts", status, outcome, api.Count("overloaded"))
	}
	if l := p.reload(t, proxyYAML(api.URL(), policy("2"))); l.Msg != "damper proxy: reloaded" || strings.Join(l.Changed, ",") != "policy" {
		t.Fatalf("reload: %s", l.rawInput)
	}
	if status, outcome := callKey(t, p.url, testKey, "overloaded"); status != 529 || outcome != "circuit_open" || api.Count("overloaded") != 2 {
		t.Errorf("after the reload: %d %s, %d attempts at the upstream; want the breaker still open, no attempt", status, outcome, api.Count("overloaded"))
	}
	// That call's group, which the limiter admitted it in before the
	// breaker refused it, has the limit learned before the reload.
	req, _ := http.NewRequest(http.MethodGet, p.url+"/metrics", nil)
	req.Header.Set("X-Api-Key", testKey)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	var limits []string
	for line := range strings.Lines(string(body)) {
		if strings.HasPrefix(line, "damper_ratelimit_limit") && strings.Contains(line, `damper_ratelimit_bucket="requests"`) {
			limits = append(limits, strings.TrimSpace(line))
		}
	}
	if len(limits) != 1 || !strings.Contains(limits[0], `damper_ratelimit_learned="true"`) || !strings.HasSuffix(limits[0], " 50") {
		t.Errorf("the requests bucket's limit after the reload: %q, want the one learned before it, 50, alone", limits)
	}
}

// TestProxyReloadTenants: a key a reload adds is let in at once; one it
// removes gets 401; the upstream key a reload changes is the one sent.
func TestProxyReloadTenants(t *testing.T) {
	setUpstreamKey(t)
	t.Setenv("DAMPER_TEST_RELOAD_NEW_KEY", newTenantKey)
	t.Setenv("DAMPER_TEST_RELOAD_UPSTREAM", "sk-ant-api03-the-rotated-operator-key")
	api := fakeAPI(t)
	rec := newRecorder(t, api.Handler())
	p := startReloading(t, keyYAML(rec.srv.URL, ""))
	if status, _ := callKey(t, p.url, newTenantKey, "plain"); status != 401 {
		t.Fatalf("a key of no tenant: %d, want 401", status)
	}
	if status, _ := callKey(t, p.url, testKey, "plain"); status != 200 {
		t.Fatalf("the tenant's key: %d, want 200", status)
	}
	swapped := "listen: 127.0.0.1:0\nupstream: " + rec.srv.URL + "\nupstream_api_key_env: DAMPER_TEST_RELOAD_UPSTREAM\n" +
		"tenants:\n  - {name: svc, key_env: [DAMPER_TEST_RELOAD_NEW_KEY]}\npolicy:\n  backoff_base: 0\n"
	if l := p.reload(t, swapped); l.Msg != "damper proxy: reloaded" || strings.Join(l.Changed, ",") != "tenants,upstream_api_key_env" {
		t.Fatalf("reload: %s", l.rawInput)
	}
	if status, _ := callKey(t, p.url, newTenantKey, "plain"); status != 200 {
		t.Errorf("the key the reload added: %d, want 200", status)
	}
	if status, _ := callKey(t, p.url, testKey, "plain"); status != 401 {
		t.Errorf("the key the reload removed: %d, want 401", status)
	}
	rec.mu.Lock()
	got := rec.headers[len(rec.headers)-1].Get("X-Api-Key")
	rec.mu.Unlock()
	if got != "sk-ant-api03-the-rotated-operator-key" {
		t.Errorf("the upstream got x-api-key %q after the reload, want the new operator key", got)
	}
}

// TestProxyReloadFixedSettings: a reload that changes what a running
// proxy cannot change (listen and the server's limits) warns, naming each
// key, leaves them as they were, and applies the rest.
func TestProxyReloadFixedSettings(t *testing.T) {
	setUpstreamKey(t)
	api := fakeAPI(t)
	api.Script("overloaded", dampertest.Status(529))
	p := startReloading(t, proxyYAML(api.URL(), "  max_attempts: 1\n"))
	_, other := listening(t)
	changed := strings.Replace(proxyYAML(api.URL(), "  max_attempts: 2\n"), "listen: 127.0.0.1:0", "listen: "+other+"\nmax_connections: 7\nidle_timeout: 5m\nname: renamed", 1)
	l := p.reload(t, changed)
	if l.Level != "WARN" || strings.Join(l.Restart, ",") != "listen,name,max_connections,idle_timeout" || strings.Join(l.Changed, ",") != "policy" {
		t.Errorf("reload: %s, want a warning naming listen, name, max_connections and idle_timeout, and policy applied", l.rawInput)
	}
	if strings.Count(p.logs.String(), "damper proxy: serving") != 1 {
		t.Errorf("the proxy served again:\n%s", p.logs)
	}
	// Still on the same listener, with the new policy.
	if status, _ := callKey(t, p.url, testKey, "overloaded"); status != 529 || api.Count("overloaded") != 2 {
		t.Errorf("after the reload: %d after %d attempts, want 529 after 2", status, api.Count("overloaded"))
	}
	if c, err := net.Dial("tcp", other); err == nil {
		c.Close()
		t.Errorf("something listens on %s, the address the reload asked for", other)
	}
}

// TestProxyProcessReloadsOnSIGHUP: the command itself reloads on SIGHUP,
// with the command line's flags still over the file.
func TestProxyProcessReloadsOnSIGHUP(t *testing.T) {
	api := fakeAPI(t)
	api.Script("overloaded", dampertest.Status(529))
	file := func(maxAttempts string) string {
		return "upstream: " + api.URL() + "\npolicy:\n  backoff_base: 0\n  max_attempts: " + maxAttempts + "\n"
	}
	path := writeFile(t, "proxy.yaml", file("1"))
	p := startProxyArgs(t, "sighup", []string{"-config", path, "-listen", "127.0.0.1:0"})
	if res, _ := callThrough(t, p.url, "overloaded"); res.StatusCode != 529 || api.Count("overloaded") != 1 {
		t.Fatalf("before: %d after %d attempts, want 529 after 1", res.StatusCode, api.Count("overloaded"))
	}
	if err := os.WriteFile(path, []byte(file("3")+"listen: 127.0.0.1:1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(processWait)
	for !strings.Contains(p.logs.String(), "damper proxy: reloaded") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	var line reloadLine
	for _, l := range p.logs.Lines() {
		if strings.Contains(l, "damper proxy: reloaded") {
			_ = json.Unmarshal([]byte(l), &line)
		}
	}
	// --listen is over the file's listen, as at start: nothing to warn of.
	if line.Level != "INFO" || strings.Join(line.Changed, ",") != "policy" || len(line.Restart) != 0 {
		t.Fatalf("reload line %+v, want policy changed and nothing needing a restart", line)
	}
	if res, _ := callThrough(t, p.url, "overloaded"); res.StatusCode != 529 || api.Count("overloaded") != 4 {
		t.Errorf("after SIGHUP: %d after %d attempts in all, want 529 after 1+3", res.StatusCode, api.Count("overloaded"))
	}
}

// TestProxyReloadWithRedis: with a store, a reload keeps it, and its
// client, even when the file names another: the breaker opened in Redis
// before the reload is the one after it.
func TestProxyReloadWithRedis(t *testing.T) {
	needRedis(t)
	rds := redistest.Start(t)
	api := fakeAPI(t)
	api.Script("overloaded", dampertest.Status(529))
	file := func(storeName, maxCost string) string {
		return proxyYAML(api.URL(), "  max_attempts: 1\n  max_retry_cost_usd: "+maxCost+"\n  breaker: {min_attempts: 2, failure_ratio: 0.5, open_for: 1h, max_open_for: 1h}\n") +
			"store: {address: '" + rds.Addr + "', name: " + storeName + "}\n"
	}
	p := startReloading(t, file("before", "1"))
	for range 2 {
		callKey(t, p.url, testKey, "overloaded")
	}
	if _, outcome := callKey(t, p.url, testKey, "overloaded"); outcome != "circuit_open" || api.Count("overloaded") != 2 {
		t.Fatalf("the breaker did not open: %s, %d attempts", outcome, api.Count("overloaded"))
	}
	l := p.reload(t, file("after", "2"))
	if l.Level != "WARN" || strings.Join(l.Restart, ",") != "store" || strings.Join(l.Changed, ",") != "policy" {
		t.Errorf("reload: %s, want policy applied and store named as needing a restart", l.rawInput)
	}
	if _, outcome := callKey(t, p.url, testKey, "overloaded"); outcome != "circuit_open" || api.Count("overloaded") != 2 {
		t.Errorf("after the reload: %s, %d attempts at the upstream; want the breaker in Redis, under the first name, still open", outcome, api.Count("overloaded"))
	}
}

// TestProxyReloadKeepsTenantSpend: without Redis, what a tenant spent
// today outlives a reload: a tenant past its daily cost ceiling is still
// refused after one, and nothing is sent for it.
func TestProxyReloadKeepsTenantSpend(t *testing.T) {
	setUpstreamKey(t)
	api := fakeAPI(t)
	capped := func(maxAttempts string) string {
		return "listen: 127.0.0.1:0\nupstream: " + api.URL() + "\nupstream_api_key_env: " + upstreamKeyEnv +
			"\ntenants:\n  - {name: svc, daily_cost_usd: 0.000001, key_sha256: ['" + damper.ClientKeyHash(testKey) + "']}\n" +
			"policy:\n  backoff_base: 0\n  max_attempts: " + maxAttempts + "\n"
	}
	p := startReloading(t, capped("2"))
	if status, _ := callKey(t, p.url, testKey, "plain"); status != 200 {
		t.Fatalf("the first call: %d, want 200", status)
	}
	if status, _ := callKey(t, p.url, testKey, "plain"); status != 429 {
		t.Fatalf("a call past the ceiling: %d, want 429", status)
	}
	if l := p.reload(t, capped("3")); l.Msg != "damper proxy: reloaded" {
		t.Fatalf("reload: %s", l.rawInput)
	}
	if status, _ := callKey(t, p.url, testKey, "plain"); status != 429 {
		t.Errorf("a call past the ceiling after the reload: %d, want 429: the reload forgot what the tenant spent", status)
	}
	if n := len(api.Requests()); n != 1 {
		t.Errorf("the upstream got %d calls, want 1", n)
	}
}
