package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/conf"
	"github.com/damper-ai/damper-go/dampertest"
	"github.com/damper-ai/damper-go/internal/syncbuf"
)

// testKey is the clients' credential: nothing the proxy writes may hold it.
const testKey = "sk-ant-api03-cmdproxysecret"

// runningProxy is serveProxy on a loopback port in front of upstream.
type runningProxy struct {
	url  string
	logs *syncbuf.Buffer
	stop context.CancelFunc
	done chan error
}

func startProxy(t *testing.T, upstream string, edit func(*proxySettings)) *runningProxy {
	t.Helper()
	s := defaultProxySettings()
	s.Upstream = upstream
	s.policy = damper.Policy{BackoffBase: damper.None} // retries at once: no real sleeping
	if edit != nil {
		edit(&s)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &runningProxy{url: "http://" + ln.Addr().String(), logs: &syncbuf.Buffer{}, done: make(chan error, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	p.stop = cancel
	logger := newLogger(p.logs, slog.LevelDebug)
	go func() { p.done <- serveProxy(ctx, s, ln, logger) }()
	t.Cleanup(func() {
		cancel()
		if err := <-p.done; err != nil {
			t.Errorf("serveProxy: %v", err)
		}
		if strings.Contains(p.logs.String(), testKey) {
			t.Errorf("the key is in the proxy's logs:\n%s", p.logs)
		}
	})
	return p
}

// callThrough makes a plain Messages call with the client's key through
// the proxy at url, as the fake API's scenario, and returns its response
// and its body, read whole.
func callThrough(t *testing.T, url, scenario string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/messages", strings.NewReader(`{"model":"claude-sonnet-4-6","max_tokens":64,"messages":[]}`))
	req.Header.Set("X-Api-Key", testKey)
	req.Header.Set(dampertest.ScenarioHeader, scenario)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	return res, body
}

// fakeAPI is the fake Messages API on loopback with the cases every client
// of the proxy is tried on.
func fakeAPI(t *testing.T) *dampertest.Server {
	t.Helper()
	srv := dampertest.NewServer()
	t.Cleanup(srv.Close)
	st := dampertest.Stream{Text: "a streamed answer, in chunks"}
	cut := st
	cut.Fault, cut.At = dampertest.FaultTruncate, st.ContentIndex()+1
	srv.Script("plain", dampertest.OK().WithText("hello from the fake API"))
	srv.Script("overloaded", dampertest.Status(529), dampertest.OK().WithText("answered on the second attempt"))
	srv.Script("spend", dampertest.SpendLimit())
	srv.Script("stream-clean", dampertest.OK().WithStream(st))
	srv.Script("stream-overloaded", dampertest.Status(529), dampertest.OK().WithStream(st))
	srv.Script("stream-cut", dampertest.OK().WithStream(cut))
	return srv
}

var clientCases = []string{"plain", "overloaded", "spend", "stream-clean", "stream-overloaded", "stream-cut"}

// clientResult is what a client got for one case, in the terms every
// client can report.
type clientResult struct {
	Case     string `json:"case"`
	OK       bool   `json:"ok"`
	Text     string `json:"text"`
	Stop     bool   `json:"stop"`
	Status   int    `json:"status"`
	Type     string `json:"type"`
	Code     string `json:"code"`
	Attempts int    `json:"-"` // the requests the fake API got
}

// goLibraryResults runs every case through the Go SDK with Damper's
// Option, as a Go service would, against a fake API of its own.
func goLibraryResults(t *testing.T) map[string]clientResult {
	t.Helper()
	srv := fakeAPI(t)
	d, err := damper.New(damper.Policy{BackoffBase: damper.None})
	if err != nil {
		t.Fatal(err)
	}
	client := anthropic.NewClient(append([]option.RequestOption{d.Option()}, srv.Options()...)...)
	params := anthropic.MessageNewParams{
		Model: "claude-sonnet-4-6", MaxTokens: 64,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Explain retry storms"))},
	}
	out := map[string]clientResult{}
	for _, name := range clientCases {
		r := clientResult{Case: name}
		var err error
		if strings.HasPrefix(name, "stream-") {
			s := client.Messages.NewStreaming(context.Background(), params, dampertest.Scenario(name))
			for s.Next() {
				switch ev := s.Current().AsAny().(type) {
				case anthropic.ContentBlockDeltaEvent:
					r.Text += ev.Delta.Text
				case anthropic.MessageStopEvent:
					r.Stop = true
				}
			}
			err = s.Err()
			s.Close()
		} else {
			var msg *anthropic.Message
			if msg, err = client.Messages.New(context.Background(), params, dampertest.Scenario(name)); err == nil {
				r.Text = msg.Content[0].Text
			}
		}
		r.OK = err == nil
		if apiErr := (*anthropic.Error)(nil); errors.As(err, &apiErr) {
			r.Status = apiErr.StatusCode
			var body struct {
				Error struct {
					Type    string `json:"type"`
					Details struct {
						ErrorCode string `json:"error_code"`
					} `json:"details"`
				} `json:"error"`
			}
			_ = json.Unmarshal([]byte(apiErr.RawJSON()), &body)
			r.Type, r.Code = body.Error.Type, body.Error.Details.ErrorCode
		}
		r.Attempts = srv.Count(name)
		out[name] = r
	}
	return out
}

// compare checks a client's results through the proxy against the Go
// library's.
func compare(t *testing.T, client string, got, want clientResult) {
	t.Helper()
	if got.OK != want.OK || got.Text != want.Text || got.Stop != want.Stop || got.Status != want.Status || got.Attempts != want.Attempts {
		t.Errorf("%s, %s: got %+v through the proxy, the Go library got %+v", client, got.Case, got, want)
	}
	// The Go library has no error type for a stream cut after content;
	// through the proxy it is an api_error event.
	if want.Type != "" && (got.Type != want.Type || got.Code != want.Code) {
		t.Errorf("%s, %s: error %s/%s through the proxy, %s/%s from the Go library", client, got.Case, got.Type, got.Code, want.Type, want.Code)
	}
}

// checkGoResults pins what the Go library itself gets, so that the
// comparisons compare with the right thing.
func checkGoResults(t *testing.T, want map[string]clientResult) {
	t.Helper()
	for name, r := range map[string]clientResult{
		"plain":             {OK: true, Text: "hello from the fake API", Attempts: 1},
		"overloaded":        {OK: true, Text: "answered on the second attempt", Attempts: 2},
		"spend":             {Status: 429, Type: "rate_limit_error", Code: "enforced_spend_limit_reached", Attempts: 1},
		"stream-clean":      {OK: true, Text: "a streamed answer, in chunks", Stop: true, Attempts: 1},
		"stream-overloaded": {OK: true, Text: "a streamed answer, in chunks", Stop: true, Attempts: 2},
		"stream-cut":        {Text: "a streamed answe", Attempts: 1},
	} {
		r.Case = name
		if got := want[name]; got != r {
			t.Errorf("the Go library got %+v, want %+v", got, r)
		}
	}
}

// TestTypeScriptSDKThroughProxy runs the official TypeScript SDK, with Node,
// against the proxy: it gets what the Go library gets from the same fake
// API, with the same number of provider attempts, its own retries left on.
func TestTypeScriptSDKThroughProxy(t *testing.T) {
	dir := filepath.Join("testdata", "tsclient")
	node := needNode(t)
	want := goLibraryResults(t)
	checkGoResults(t, want)

	srv := fakeAPI(t)
	p := startProxy(t, srv.URL(), nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, append([]string{"client.mjs", p.url}, clientCases...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "ANTHROPIC_API_KEY="+testKey)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, stderr.String())
	}
	seen := 0
	for sc := bufio.NewScanner(bytes.NewReader(out)); sc.Scan(); seen++ {
		var got clientResult
		if err := json.Unmarshal(sc.Bytes(), &got); err != nil {
			t.Fatalf("%v: %s", err, sc.Bytes())
		}
		got.Attempts = srv.Count(got.Case)
		compare(t, "TypeScript SDK", got, want[got.Case])
	}
	if seen != len(clientCases) {
		t.Errorf("%d results from node, want %d:\n%s\n%s", seen, len(clientCases), out, stderr.String())
	}
	if strings.Contains(stderr.String(), testKey) || bytes.Contains(out, []byte(testKey)) {
		t.Error("the key is in what the client printed")
	}

	// A refusal the proxy makes itself reaches the SDK as the API's own
	// error, which it does not retry: the breaker opens after two 500s, and
	// the third call gets 529 overloaded_error, with nothing sent.
	down := dampertest.NewServer()
	defer down.Close()
	down.Script("down", dampertest.Status(500))
	pb := startProxy(t, down.URL(), func(s *proxySettings) {
		s.policy = damper.Policy{MaxAttempts: 1, Breaker: &damper.BreakerPolicy{MinAttempts: 2, OpenFor: time.Minute}}
	})
	cmd = exec.CommandContext(ctx, node, "client.mjs", pb.url, "down", "down", "down")
	cmd.Dir, cmd.Env, cmd.Stderr = dir, append(os.Environ(), "ANTHROPIC_API_KEY="+testKey), &stderr
	if out, err = cmd.Output(); err != nil {
		t.Fatalf("node: %v\n%s", err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var last struct {
		clientResult
		Error   string `json:"error"`
		Outcome string `json:"outcome"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil || len(lines) != 3 {
		t.Fatalf("%v: %s", err, out)
	}
	if last.OK || last.Status != 529 || last.Type != "overloaded_error" || last.Outcome != "circuit_open" || last.Error != "OverloadedError" {
		t.Errorf("the breaker's refusal reached the TypeScript SDK as %s", lines[2])
	}
	if n := down.Count("down"); n != 2 {
		t.Errorf("the fake API got %d requests, want 2: the SDK retried nothing, the breaker sent nothing", n)
	}
}

// TestCurlThroughProxy makes the same calls with curl, as a shell script
// would, and reads the status, the Damper-* headers and the events.
func TestCurlThroughProxy(t *testing.T) {
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Skip("curl is not installed")
	}
	srv := fakeAPI(t)
	p := startProxy(t, srv.URL(), nil)
	call := func(scenario string, stream bool) (status int, header http.Header, body string) {
		t.Helper()
		req := `{"model":"claude-sonnet-4-6","max_tokens":64,"messages":[{"role":"user","content":"hi"}]`
		if stream {
			req += `,"stream":true`
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, curl, "-sS", "-N", "-i", "--raw", p.url+"/v1/messages",
			"-H", "x-api-key: "+testKey, "-H", "anthropic-version: 2023-06-01", "-H", "content-type: application/json",
			"-H", dampertest.ScenarioHeader+": "+scenario, "-d", req+"}")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("curl %s: %v", scenario, err)
		}
		res, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(out)), nil)
		if err != nil {
			t.Fatalf("curl %s: %v\n%s", scenario, err, out)
		}
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, res.Header, string(b)
	}
	check := func(cond bool, scenario string, status int, h http.Header, body string) {
		t.Helper()
		if !cond {
			t.Errorf("%s: %d %v\n%s", scenario, status, h, body)
		}
	}
	status, h, body := call("plain", false)
	check(status == 200 && h.Get("Damper-Attempts") == "1" && h.Get("Damper-Outcome") == "success" &&
		strings.Contains(body, "hello from the fake API"), "plain", status, h, body)
	status, h, body = call("overloaded", false)
	check(status == 200 && h.Get("Damper-Attempts") == "2" && srv.Count("overloaded") == 2, "overloaded", status, h, body)
	status, h, body = call("spend", false)
	check(status == 429 && h.Get("X-Should-Retry") == "false" && strings.Contains(body, "enforced_spend_limit_reached") &&
		srv.Count("spend") == 1, "spend", status, h, body)
	status, h, body = call("stream-overloaded", true)
	check(status == 200 && h.Get("Damper-Attempts") == "2" && strings.HasSuffix(body, "data: {\"type\":\"message_stop\"}\n\n"),
		"stream-overloaded", status, h, body)
	status, h, body = call("stream-cut", true)
	check(status == 200 && strings.HasSuffix(body, "}\n\n") && strings.Contains(body, "\n\nevent: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\""),
		"stream-cut", status, h, body)
}

func TestProxyHealthAndMetrics(t *testing.T) {
	srv := fakeAPI(t)
	p := startProxy(t, srv.URL(), func(s *proxySettings) { s.Name = "proxy-test" })
	get := func(path string) (int, string) {
		t.Helper()
		res, err := http.Get(p.url + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	if code, body := get("/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("/healthz: %d %q", code, body)
	}
	if code, body := get("/readyz"); code != 200 || body != "ready\n" {
		t.Errorf("/readyz: %d %q", code, body)
	}
	callThrough(t, p.url, "overloaded")
	code, body := get("/metrics")
	for _, want := range []string{
		`damper_attempts_total{damper_attempt_error_class="overloaded",damper_name="proxy-test",damper_provider="anthropic"`,
		`damper_request_duration_seconds_count{damper_name="proxy-test",damper_outcome="success"`,
		"go_goroutines",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics has no %s:\n%s", want, body)
		}
	}
	if code != 200 || strings.Contains(body, testKey) {
		t.Errorf("/metrics: %d, or it holds the key", code)
	}
	// A client's wrong idea of the admin paths goes upstream.
	if code, _ := get("/v1/models"); code != 404 {
		t.Errorf("/v1/models: %d, want the fake API's 404", code)
	}
}

// TestProxyDrains: on shutdown the proxy stops accepting, lets a stream in
// flight finish, and returns once it has; a stream that outlasts the drain
// timeout is cut at it.
func TestProxyDrains(t *testing.T) {
	release := make(chan struct{})
	events := func(w http.ResponseWriter, r *http.Request, wait <-chan struct{}) {
		w.Header().Set("Content-Type", "text/event-stream")
		st := dampertest.Stream{Text: "drained"}
		evs := st.Events()
		for i, e := range evs {
			if i == st.ContentIndex()+1 {
				select {
				case <-wait:
				case <-r.Context().Done():
					return
				}
			}
			io.WriteString(w, e.String())
			w.(http.Flusher).Flush()
		}
	}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(dampertest.ScenarioHeader) == "stall" {
			events(w, r, nil)
			return
		}
		events(w, r, release)
	}))
	defer up.Close()

	stream := func(p *runningProxy, scenario string) (*http.Response, *bufio.Reader) {
		req, _ := http.NewRequest(http.MethodPost, p.url+"/v1/messages",
			strings.NewReader(`{"model":"claude-sonnet-4-6","max_tokens":64,"stream":true,"messages":[]}`))
		req.Header.Set(dampertest.ScenarioHeader, scenario)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(res.Body)
		for { // up to the first content
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(line, "content_block_delta") {
				return res, br
			}
		}
	}

	t.Run("finished within the bound", func(t *testing.T) {
		p := startProxy(t, up.URL, nil)
		res, br := stream(p, "")
		defer res.Body.Close()
		p.stop()
		// Shutdown closes the listener before it waits: new calls are refused.
		deadline := time.Now().Add(10 * time.Second)
		for {
			conn, err := net.Dial("tcp", strings.TrimPrefix(p.url, "http://"))
			if err != nil {
				break
			}
			conn.Close()
			if time.Now().After(deadline) {
				t.Fatal("the proxy still accepts connections while it drains")
			}
			time.Sleep(10 * time.Millisecond)
		}
		select {
		case err := <-p.done:
			t.Fatalf("serveProxy returned (%v) with a stream in flight", err)
		default:
		}
		close(release)
		rest, err := io.ReadAll(br)
		if err != nil || !strings.HasSuffix(string(rest), "data: {\"type\":\"message_stop\"}\n\n") {
			t.Errorf("the drained stream ended with %v: %q", err, rest)
		}
		if res.Trailer.Get("Damper-Outcome") != "success" {
			t.Errorf("outcome %q, want success", res.Trailer.Get("Damper-Outcome"))
		}
		err = <-p.done
		p.done <- err // for the cleanup
	})
	t.Run("unready before the drain", func(t *testing.T) {
		p := startProxy(t, up.URL, func(s *proxySettings) { s.ShutdownDelay = 3 * time.Second })
		ready := func() int {
			res, err := http.Get(p.url + "/readyz")
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			return res.StatusCode
		}
		if code := ready(); code != 200 {
			t.Fatalf("/readyz %d before the signal", code)
		}
		p.stop()
		deadline := time.Now().Add(10 * time.Second)
		for ready() != http.StatusServiceUnavailable {
			if time.Now().After(deadline) {
				t.Fatal("/readyz still ready after the signal")
			}
			time.Sleep(5 * time.Millisecond)
		}
		// Still serving calls while unready (release is closed already).
		res, br := stream(p, "")
		rest, err := io.ReadAll(br)
		res.Body.Close()
		if err != nil || !strings.HasSuffix(string(rest), "data: {\"type\":\"message_stop\"}\n\n") {
			t.Errorf("a stream during the delay ended with %v: %q", err, rest)
		}
		select {
		case err := <-p.done:
			t.Fatalf("serveProxy returned (%v) within its shutdown delay", err)
		default:
		}
	})
	t.Run("cut at the bound", func(t *testing.T) {
		p := startProxy(t, up.URL, func(s *proxySettings) { s.DrainTimeout = 50 * time.Millisecond })
		res, br := stream(p, "stall")
		defer res.Body.Close()
		p.stop()
		err := <-p.done
		p.done <- err
		if _, rerr := io.ReadAll(br); rerr == nil {
			t.Error("a stream cut at the drain timeout read as whole")
		}
		if !strings.Contains(p.logs.String(), "cut") {
			t.Errorf("no log line says the stream was cut:\n%s", p.logs)
		}
	})
}

// TestProxyFileTags: every key of the proxy's file, its backends', its
// store's and its policy's, is declared by tags that parse, with defaults
// inside their bounds, and every number, duration and list has a max.
func TestProxyFileTags(t *testing.T) {
	if err := conf.Check(reflect.TypeFor[proxyFile]()); err != nil {
		t.Error(err)
	}
}

func TestProxySettings(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	good := write("good.yaml", `
listen: 127.0.0.1:9000
upstream: http://127.0.0.1:9001
drain_timeout: 5s
shutdown_delay: 0
read_timeout: 2m
write_timeout: 5s
log_level: warn
name: edge
policy:
  max_attempts: 2
  breaker: {}
`)
	s, err := parseProxy([]string{"-config", good, "-listen", "127.0.0.1:9100"}, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if s.Listen != "127.0.0.1:9100" || s.Upstream != "http://127.0.0.1:9001" || s.DrainTimeout != 5*time.Second || s.ReadTimeout != 2*time.Minute || s.WriteTimeout != 5*time.Second ||
		s.level != slog.LevelWarn || s.Name != "edge" || s.policy.MaxAttempts != 2 || s.policy.Breaker == nil || s.listenIsNonLocal {
		t.Errorf("settings %+v", s)
	}
	if s, err := parseProxy([]string{"-listen", "0.0.0.0:8787"}, io.Discard, io.Discard); err != nil || !s.listenIsNonLocal {
		t.Errorf("0.0.0.0: %v, non-local %v", err, s.listenIsNonLocal)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-config", write("a.yaml", "listn: x\n")}, `listn: unknown key`},
		{[]string{"-config", write("b.yaml", "drain_timeout: soon\n")}, `"soon"`},
		{[]string{"-config", write("c.yaml", "drain_timeout: 0\n")}, `drain_timeout: "0s": must be positive`},
		{[]string{"-config", write("d.yaml", "policy:\n  breaker:\n    open_for: 1y\n")}, "policy.breaker.open_for"},
		{[]string{"-config", write("e.json", `{"max_request_bytes": "big"}`)}, `max_request_bytes: "big": want a whole number`},
		{[]string{"-config", write("f.yaml", "log_level: loud\n")}, `log_level: "loud"`},
		{[]string{"-log-level", "loud"}, `--log-level "loud"`},
		{[]string{"-drain-timeout", "0s"}, "--drain-timeout 0s"},
		{[]string{"-max-request-bytes", "0"}, "--max-request-bytes 0"},
		{[]string{"-shutdown-delay", "-1s"}, "--shutdown-delay -1s"},
		{[]string{"-drain-timeout", "25h"}, "--drain-timeout 25h0m0s: must be at most 24h0m0s"},
		{[]string{"-shutdown-delay", "25h"}, "--shutdown-delay 25h0m0s: must be at most 24h0m0s"},
		{[]string{"-max-request-bytes", "9223372036854775807"}, "--max-request-bytes 9223372036854775807: must be at most 536870912"},
		{[]string{"-config", write("i.yaml", "idle_timeout: 100h\n")}, `idle_timeout: "100h0m0s": must be at most 24h0m0s`},
		{[]string{"-config", write("j.yaml", "max_request_bytes: 9223372036854775807\n")}, `max_request_bytes: 9223372036854775807: must be at most 536870912`},
		{[]string{"-config", write("k.yaml", "policy: {max_event_bytes: 9223372036854775807}\n")}, `policy.max_event_bytes: 9223372036854775807: must be at most 33554432`},
		{[]string{"-config", write("g.yaml", "shutdown_delay: -1s\n")}, `shutdown_delay: "-1s": must be at least 0`},
		{[]string{"-config", write("h.yaml", "write_timeout: 0s\n")}, `write_timeout: "0s": must be positive`},
		{[]string{"-listen", "nowhere"}, `listen address "nowhere"`},
		{[]string{"extra"}, "no arguments"},
	} {
		_, err := parseProxy(tc.args, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %s", tc.args, err, tc.want)
		}
	}
	var errb bytes.Buffer
	if code := run([]string{"proxy", "-upstream", "ftp://x", "-listen", "127.0.0.1:0"}, io.Discard, &errb); code != exitUsage ||
		!strings.Contains(errb.String(), `damper proxy: --upstream "ftp://x": want an http or https URL`) {
		t.Errorf("a bad upstream: exit %d, %s", code, errb.String())
	}
}

// TestProxyLogsReadableDurations: the proxy's log lines write durations as
// Go writes them ("1.5ms"), not as bare nanoseconds.
func TestProxyLogsReadableDurations(t *testing.T) {
	srv := fakeAPI(t)
	p := startProxy(t, srv.URL(), nil)
	req, _ := http.NewRequest(http.MethodPost, p.url+"/v1/messages", strings.NewReader(`{"model":"claude-sonnet-4-6","max_tokens":64,"messages":[]}`))
	req.Header.Set(dampertest.ScenarioHeader, "overloaded")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	seen := map[string]bool{}
	for line := range strings.Lines(p.logs.String()) {
		var attrs map[string]any
		if err := json.Unmarshal([]byte(line), &attrs); err != nil {
			t.Fatalf("%v: %s", err, line)
		}
		for _, key := range []string{"duration", "attempt_duration", "backoff"} {
			v, ok := attrs[key]
			if !ok {
				continue
			}
			seen[key] = true
			if s, isString := v.(string); !isString {
				t.Errorf("%s is %v, want a duration such as 1.5ms: %s", key, v, line)
			} else if _, err := time.ParseDuration(s); err != nil {
				t.Errorf("%s: %v", key, err)
			}
		}
	}
	if !seen["duration"] || !seen["backoff"] {
		t.Errorf("no duration or backoff logged:\n%s", p.logs)
	}
}
