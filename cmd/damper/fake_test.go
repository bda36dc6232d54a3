package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go/internal/syncbuf"
)

// TestFakeSettings: every wrong flag or file value is refused with an
// error naming the flag or the key and the value; good ones are read as
// written, flags over the file.
func TestFakeSettings(t *testing.T) {
	file := func(name, body string) string { return writeFile(t, name, body) }
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-fault", "meltdown"}, `-fault "meltdown": want ok, overloaded, server_error, rate_limited, slow, stream_cut, overloaded_event`},
		{[]string{"-for", "1s"}, "-for 1s: sets -fault's phase: give -fault too"},
		{[]string{"-fault", "overloaded", "-every", "0"}, "-every 0: want 1 to 1000"},
		{[]string{"-fault", "overloaded", "-for", "-1s"}, "-for -1s: want 0 (no time limit) to 720h0m0s"},
		{[]string{"-fault", "overloaded", "-requests", "-2"}, "-requests -2: want 0 (no limit) to 1000000000"},
		{[]string{"-retry-after", "1500ms"}, "-retry-after 1.5s: want whole seconds, 1s to 1h0m0s"},
		{[]string{"-retry-after", "0s"}, "-retry-after 0s: want whole seconds"},
		{[]string{"-slow-first-byte", "11m"}, "-slow-first-byte 11m0s: want above 0, at most 10m0s"},
		{[]string{"-keep", "0"}, "-keep 0: want 1 to 10000"},
		{[]string{"-keep", "10001"}, "-keep 10001: want 1 to 10000"},
		{[]string{"-rpm", "-1"}, "-rpm -1: want 0 (none) to 1000000000"},
		{[]string{"-text", strings.Repeat("x", 4097)}, "-text \"xxxx"},
		{[]string{"-listen", "nowhere"}, `-listen "nowhere": want host:port`},
		{[]string{"extra"}, "fake takes no arguments"},
		{[]string{"-config", file("a.yaml", "phases: [{fault: meltdown}]\n")}, `a.yaml: phases[0].fault: "meltdown": want ok, overloaded`},
		{[]string{"-config", file("b.yaml", "phases: [{for: 1s}]\n")}, "b.yaml: phases[0].fault: nothing: want ok"},
		{[]string{"-config", file("c.yaml", "phases: [{fault: slow, every: 0}]\n")}, "c.yaml: phases[0].every: 0"},
		{[]string{"-config", file("d.yaml", "phasez: []\n")}, `d.yaml: phasez: unknown key`},
		{[]string{"-config", file("e.yaml", "retry_after: 2.5s\n")}, `e.yaml: retry_after: "2.5s": want whole seconds`},
		{[]string{"-config", file("f.yaml", "rate_limits: {requests_per_minute: -5}\n")}, "f.yaml: rate_limits.requests_per_minute: -5"},
		{[]string{"-config", file("g.yaml", "keep: 20000\n")}, "g.yaml: keep: 20000"},
		{[]string{"-config", file("h.json", `{"phases": [{"fault": "overloaded", "for": "forever"}]}`)}, `h.json: phases[0].for: "forever"`},
		{[]string{"-config", file("i.yaml", "slow_first_byte: 1h\n")}, "i.yaml: slow_first_byte: \"1h0m0s\""},
		{[]string{"-config", filepath.Join(t.TempDir(), "missing.yaml")}, "missing.yaml: no such file"},
	} {
		_, err := parseFake(tc.args, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("damper fake %q: %v; want an error holding %q", tc.args, err, tc.want)
		}
	}

	f, err := parseFake([]string{"-config", file("ok.yaml", `
listen: 127.0.0.1:0
keep: 5
retry_after: 3s
rate_limits: {requests_per_minute: 50}
phases:
  - {fault: overloaded, for: 30s}
  - {fault: rate_limited, requests: 4, every: 2}
`), "-retry-after", "7s"}, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := []fakePhase{{Fault: "overloaded", For: 30 * time.Second, Every: 1}, {Fault: "rate_limited", Requests: 4, Every: 2}}
	if f.Keep != 5 || f.RetryAfter != 7*time.Second || f.RateLimits.RequestsPerMinute != 50 || f.SlowFirstByte != 5*time.Second ||
		len(f.Phases) != 2 || f.Phases[0] != want[0] || f.Phases[1] != want[1] {
		t.Errorf("read %+v, phases %+v", f, f.Phases)
	}
	// -fault replaces the file's phases.
	f, err = parseFake([]string{"-config", file("ok2.yaml", "phases: [{fault: slow}]\n"), "-fault", "server_error", "-requests", "3"}, io.Discard, io.Discard)
	if err != nil || len(f.Phases) != 1 || f.Phases[0] != (fakePhase{Fault: "server_error", Requests: 3, Every: 1}) {
		t.Errorf("-fault over the file: %+v, %v", f.Phases, err)
	}
	if f.Listen != "127.0.0.1:8788" || f.Keep != 100 || f.RetryAfter != time.Second {
		t.Errorf("defaults: %+v", f)
	}
}

// TestFakeSchedule: each Messages request takes the fault of the phase it
// arrives in: a phase ends after its time or its requests, whichever
// first, the next starting where it ended; every hits one request in n.
func TestFakeSchedule(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := &fakeSchedule{start: t0, phases: []fakePhase{
		{Fault: "overloaded", For: 10 * time.Second, Every: 1},
		{Fault: "rate_limited", Requests: 2, Every: 1},
		{Fault: "slow", Requests: 5, Every: 2},
		{Fault: "server_error", For: 5 * time.Second, Requests: 100, Every: 1},
	}}
	for i, tc := range []struct {
		at   time.Duration
		want string
	}{
		{0, "overloaded"}, {9 * time.Second, "overloaded"},
		{10 * time.Second, "rate_limited"}, {11 * time.Second, "rate_limited"},
		{12 * time.Second, "slow"}, {12 * time.Second, "ok"}, {12 * time.Second, "slow"}, {12 * time.Second, "ok"}, {12 * time.Second, "slow"},
		{13 * time.Second, "server_error"}, {17 * time.Second, "server_error"},
		{18 * time.Second, "ok"}, {time.Hour, "ok"},
	} {
		if got := s.next(t0.Add(tc.at)); got != tc.want {
			t.Errorf("request %d at %v: %s, want %s", i+1, tc.at, got, tc.want)
		}
	}
	// A time phase nobody asked during is skipped whole.
	s = &fakeSchedule{start: t0, phases: []fakePhase{{Fault: "overloaded", For: time.Second, Every: 1}, {Fault: "slow", For: time.Second, Every: 1}}}
	if got := s.next(t0.Add(1500 * time.Millisecond)); got != "slow" {
		t.Errorf("in the second phase: %s", got)
	}
	if got := s.next(t0.Add(2 * time.Second)); got != "ok" {
		t.Errorf("after both: %s", got)
	}
}

// startFake serves damper fake, as f says, on a loopback port.
func startFake(t *testing.T, args ...string) string {
	t.Helper()
	f, err := parseFake(append([]string{"-listen", "127.0.0.1:0"}, args...), io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", f.Listen)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	logs := &syncbuf.Buffer{}
	go func() { done <- serveFake(ctx, f, ln, newLogger(logs, slog.LevelInfo)) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serveFake: %v", err)
		}
		if strings.Contains(logs.String(), testKey) {
			t.Errorf("the key is in the fake's logs")
		}
	})
	return "http://" + ln.Addr().String()
}

const fakeCall = `{"model":"claude-sonnet-4-6","max_tokens":64,"messages":[{"role":"user","content":"Hi"}]}`
const fakeStreamCall = `{"model":"claude-sonnet-4-6","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"Hi"}]}`

// fakePost sends body to url's /v1/messages with testKey and returns the
// status, the headers, what came of the body and the read's error.
func fakePost(t *testing.T, url, body string) (int, http.Header, string, error) {
	t.Helper()
	req, _ := http.NewRequest("POST", url+"/v1/messages", strings.NewReader(body))
	req.Header.Set("x-api-key", testKey)
	req.Header.Set("content-type", "application/json")
	res, err := fakeClient.Do(req)
	if err != nil {
		return 0, nil, "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res.StatusCode, res.Header, string(b), err
}

// TestFakeFaultsOverHTTP: each fault as an HTTP client sees it.
func TestFakeFaultsOverHTTP(t *testing.T) {
	url := startFake(t, "-fault", "ok")
	status, h, body, err := fakePost(t, url, fakeCall)
	if err != nil || status != 200 || !strings.Contains(body, `"text":"Hello from damper fake."`) || h.Get("Request-Id") == "" {
		t.Errorf("ok: %d %v %q", status, err, body)
	}
	status, _, body, err = fakePost(t, url, fakeStreamCall)
	if err != nil || status != 200 || !strings.HasSuffix(body, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n") {
		t.Errorf("ok stream: %d %v %q", status, err, body)
	}

	for _, tc := range []struct {
		fault, want string
		status      int
	}{
		{"overloaded", `"type":"overloaded_error"`, 529},
		{"server_error", `"type":"api_error"`, 500},
		{"rate_limited", `"type":"rate_limit_error"`, 429},
	} {
		url := startFake(t, "-fault", tc.fault, "-requests", "1", "-retry-after", "7s")
		status, h, body, err := fakePost(t, url, fakeCall)
		if err != nil || status != tc.status || !strings.Contains(body, tc.want) {
			t.Errorf("%s: %d %v %q", tc.fault, status, err, body)
		}
		if ra := h.Get("Retry-After"); (tc.fault == "rate_limited") != (ra == "7") {
			t.Errorf("%s: retry-after %q", tc.fault, ra)
		}
		// One request: then healthy.
		if status, _, _, _ := fakePost(t, url, fakeCall); status != 200 {
			t.Errorf("%s: after the phase, %d", tc.fault, status)
		}
	}

	// Rate-limit headers for the limit given, then the API's own 429.
	url = startFake(t, "-rpm", "2")
	for i, want := range []string{"1", "0", "0"} {
		status, h, _, _ := fakePost(t, url, fakeCall)
		if h.Get("Anthropic-Ratelimit-Requests-Limit") != "2" || h.Get("Anthropic-Ratelimit-Requests-Remaining") != want ||
			(i < 2) != (status == 200) || (i == 2) != (status == 429 && h.Get("Retry-After") != "") {
			t.Errorf("-rpm 2, request %d: %d, headers %v", i+1, status, h)
		}
	}

	// A stream cut after its first content; a plain answer cut halfway.
	url = startFake(t, "-fault", "stream_cut")
	status, _, body, err = fakePost(t, url, fakeStreamCall)
	if status != 200 || err == nil || !strings.Contains(body, `"text":"Hello from dampe"`) || strings.Contains(body, "message_stop") {
		t.Errorf("stream_cut: %d, read error %v, %q: want a body cut after its first content", status, err, body)
	}
	status, _, _, err = fakePost(t, url, fakeCall)
	if status != 200 || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("stream_cut, plain: %d, %v: want the body cut", status, err)
	}

	// overloaded_event: an error event in place of the first content.
	url = startFake(t, "-fault", "overloaded_event")
	status, _, body, err = fakePost(t, url, fakeStreamCall)
	if err != nil || status != 200 || !strings.Contains(body, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"") ||
		strings.Contains(body, "content_block_delta") {
		t.Errorf("overloaded_event: %d %v %q", status, err, body)
	}
	if status, _, body, _ := fakePost(t, url, fakeCall); status != 200 || !strings.Contains(body, "Hello") {
		t.Errorf("overloaded_event, plain: %d %q: want a healthy answer", status, body)
	}

	// slow: the first byte comes after slow_first_byte, on the fake's
	// real clock.
	url = startFake(t, "-fault", "slow", "-slow-first-byte", "150ms")
	start := time.Now()
	status, _, _, err = fakePost(t, url, fakeCall)
	if took := time.Since(start); err != nil || status != 200 || took < 150*time.Millisecond {
		t.Errorf("slow: %d %v after %v; want 200 after 150ms or more", status, err, took)
	}

	// Bounds: a body above 32 MiB is refused whole.
	url = startFake(t)
	status, _, body, _ = fakePost(t, url, `{"model":"m","pad":"`+strings.Repeat("x", fakeMaxBody)+`"}`)
	if status != 413 || !strings.Contains(body, "request_too_large") {
		t.Errorf("a body above 32 MiB: %d %q", status, body)
	}
	status, _, body, _ = fakePost(t, url, `{"model":"`+strings.Repeat("m", 257)+`"}`)
	if status != 400 || !strings.Contains(body, "model: 257 bytes: want at most 256") {
		t.Errorf("a model of 257 bytes: %d %q", status, body)
	}
}

// TestFakeRequests: /_fake/requests counts by fault and by status and
// lists the last requests, never the key; /_fake/reset starts over.
func TestFakeRequests(t *testing.T) {
	url := startFake(t, "-fault", "overloaded", "-requests", "2", "-keep", "3")
	fakePost(t, url, fakeCall)
	fakePost(t, url, fakeStreamCall)
	fakePost(t, url, fakeCall)
	fakePost(t, url, fakeStreamCall)
	if res, err := fakeClient.Get(url + "/v1/models"); err == nil {
		res.Body.Close()
	}
	sum := fakeRequests(t, url)
	if sum.Received != 5 || sum.ByFault["overloaded"] != 2 || sum.ByFault["ok"] != 2 || sum.ByStatus["529"] != 2 || sum.ByStatus["200"] != 2 || sum.ByStatus["404"] != 1 {
		t.Errorf("counts: %+v", sum)
	}
	if len(sum.Requests) != 3 {
		t.Fatalf("%d requests listed, want the last 3: %+v", len(sum.Requests), sum.Requests)
	}
	r := sum.Requests
	if r[0].Fault != "ok" || r[0].Stream || !r[0].APIKey || r[0].Model != "claude-sonnet-4-6" || r[0].Method != "POST" || r[0].Path != "/v1/messages" ||
		r[1].Fault != "ok" || !r[1].Stream || r[2].Path != "/v1/models" || r[2].Fault != "" || r[2].APIKey {
		t.Errorf("listed: %+v", r)
	}
	res, err := fakeClient.Get(url + "/_fake/requests")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if strings.Contains(string(raw), testKey) {
		t.Error("/_fake/requests shows the key")
	}

	// A reset starts the phases and the counts over.
	res, err = fakeClient.Post(url+"/_fake/reset", "", nil)
	if err != nil || res.StatusCode != 204 {
		t.Fatalf("reset: %v %v", res, err)
	}
	res.Body.Close()
	if sum := fakeRequests(t, url); sum.Received != 0 || len(sum.Requests) != 0 {
		t.Errorf("after the reset: %+v", sum)
	}
	if status, _, _, _ := fakePost(t, url, fakeCall); status != 529 {
		t.Errorf("after the reset, %d: want the first phase again", status)
	}
	for _, tc := range []struct{ method, path string }{{"POST", "/_fake/requests"}, {"GET", "/_fake/reset"}, {"GET", "/_fake/other"}} {
		req, _ := http.NewRequest(tc.method, url+tc.path, nil)
		res, err := fakeClient.Do(req)
		if err != nil || res.StatusCode < 400 {
			t.Errorf("%s %s: %v %v", tc.method, tc.path, res.Status, err)
		}
		res.Body.Close()
	}
}

func fakeRequests(t *testing.T, url string) fakeSummary {
	t.Helper()
	res, err := fakeClient.Get(url + "/_fake/requests")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var sum fakeSummary
	if err := json.NewDecoder(res.Body).Decode(&sum); err != nil {
		t.Fatal(err)
	}
	return sum
}

// TestFakeThroughProxy: each fault as the Go SDK sees it through damper
// proxy, which retries what it may.
func TestFakeThroughProxy(t *testing.T) {
	ctx := context.Background()
	params := anthropic.MessageNewParams{Model: "claude-sonnet-4-6", MaxTokens: 64,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Hi"))}}
	client := func(url string) *anthropic.Client {
		c := anthropic.NewClient(option.WithBaseURL(url), option.WithAPIKey(testKey), option.WithMaxRetries(0), option.WithHTTPClient(fakeClient))
		return &c
	}
	attempts := func(res *http.Response) string { return res.Header.Get("Damper-Attempts") }

	// An outage of two requests: the third attempt succeeds.
	for _, fault := range []string{"overloaded", "server_error"} {
		p := startProxy(t, startFake(t, "-fault", fault, "-requests", "2"), nil)
		var res *http.Response
		msg, err := client(p.url).Messages.New(ctx, params, option.WithResponseInto(&res))
		if err != nil || msg.Content[0].Text != "Hello from damper fake." || attempts(res) != "3" {
			t.Errorf("%s for 2 requests: %v, attempts %s", fault, err, attempts(res))
		}
	}
	// A full outage: the call fails after the policy's 3 attempts.
	p := startProxy(t, startFake(t, "-fault", "overloaded", "-for", "1h"), nil)
	_, err := client(p.url).Messages.New(ctx, params)
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 529 || attempts(apiErr.Response) != "3" {
		t.Errorf("a full outage: %v", err)
	}

	// 429 with retry-after: with one attempt, the SDK sees it.
	one := func(s *proxySettings) { s.policy.MaxAttempts = 1 }
	p = startProxy(t, startFake(t, "-fault", "rate_limited", "-retry-after", "5s"), one)
	_, err = client(p.url).Messages.New(ctx, params)
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 429 || apiErr.Response.Header.Get("Retry-After") != "5" {
		t.Errorf("rate_limited: %v", err)
	}
	// The limit's headers reach the client; the third call is refused.
	p = startProxy(t, startFake(t, "-rpm", "2"), one)
	for i := range 3 {
		var res *http.Response
		_, err := client(p.url).Messages.New(ctx, params, option.WithResponseInto(&res))
		if i < 2 && (err != nil || res.Header.Get("Anthropic-Ratelimit-Requests-Limit") != "2") {
			t.Errorf("-rpm 2, call %d: %v", i+1, err)
		}
		if i == 2 && (!errors.As(err, &apiErr) || apiErr.StatusCode != 429) {
			t.Errorf("-rpm 2, call 3: %v, want 429", err)
		}
	}

	// An overloaded_error event before content: the proxy retries, the
	// stream arrives whole.
	p = startProxy(t, startFake(t, "-fault", "overloaded_event", "-requests", "1"), nil)
	var res *http.Response
	stream := client(p.url).Messages.NewStreaming(ctx, params, option.WithResponseInto(&res))
	var acc anthropic.Message
	for stream.Next() {
		acc.Accumulate(stream.Current())
	}
	if err := stream.Err(); err != nil || acc.Content[0].Text != "Hello from damper fake." || attempts(res) != "2" {
		t.Errorf("overloaded_event: %v, %+v, attempts %s", err, acc.Content, attempts(res))
	}
	stream.Close()

	// A stream cut after content: the client has the content, then an
	// error, as the proxy cannot retry what it passed on.
	p = startProxy(t, startFake(t, "-fault", "stream_cut"), nil)
	stream = client(p.url).Messages.NewStreaming(ctx, params)
	acc = anthropic.Message{}
	for stream.Next() {
		acc.Accumulate(stream.Current())
	}
	if err := stream.Err(); err == nil || len(acc.Content) != 1 || acc.Content[0].Text != "Hello from dampe" {
		t.Errorf("stream_cut: %v, %+v: want the first content, then an error", err, acc.Content)
	}
	stream.Close()

	// slow: the answer after the first byte's wait; with a client
	// deadline shorter than it, the call ends at the deadline.
	p = startProxy(t, startFake(t, "-fault", "slow", "-slow-first-byte", "300ms"), nil)
	start := time.Now()
	if _, err := client(p.url).Messages.New(ctx, params); err != nil || time.Since(start) < 300*time.Millisecond {
		t.Errorf("slow: %v after %v", err, time.Since(start))
	}
	_, err = client(p.url).Messages.New(ctx, params, option.WithHeader("Damper-Timeout", "0.1"))
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusGatewayTimeout {
		t.Errorf("slow with a deadline of 100ms: %v", err)
	}
}

// fakeProcess is damper fake running as a process of its own, the test
// binary run as the command; it returns the fake's base URL.
func fakeProcess(t *testing.T, args ...string) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, append([]string{"fake"}, args...)...)
	cmd.Env = append(os.Environ(), runAsDamperEnv+"=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	logs := &syncbuf.Buffer{}
	listen := make(chan string, 1)
	read := make(chan struct{})
	go func() {
		defer close(read)
		for sc := bufio.NewScanner(stderr); sc.Scan(); {
			logs.Write(append(sc.Bytes(), '\n'))
			var line struct{ Msg, Listen string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "damper fake: serving" {
				listen <- line.Listen
			}
		}
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		<-read
		if err := cmd.Wait(); err != nil {
			t.Errorf("damper fake: %v\n%s", err, logs)
		}
	})
	select {
	case addr := <-listen:
		return "http://" + addr
	case <-read:
		t.Fatalf("damper fake exited at start:\n%s", logs)
	case <-time.After(processWait):
		t.Fatalf("damper fake did not serve within %v:\n%s", processWait, logs)
	}
	return ""
}

// TestTypeScriptServiceThroughOutage: the guide's test, as a TypeScript
// team runs it: damper fake scripted to fail, damper proxy in front, and
// the official TypeScript SDK as the service's client. Through a two-call
// outage the calls succeed on the proxy's retries; through a full outage
// they fail fast, on the proxy's decision, and the fake saw every attempt.
func TestTypeScriptServiceThroughOutage(t *testing.T) {
	needNode(t)
	fake := fakeProcess(t, "-listen", "127.0.0.1:0", "-fault", "overloaded", "-requests", "2")
	p := startProxyArgs(t, "ts-outage", []string{"-listen", "127.0.0.1:0", "-upstream", fake})
	got := runFallbackClient(t, p.url, "plain", "stream")
	if r := got[0]; !r.OK || r.Text != "Hello from damper fake." || r.Attempts != "3" || r.Outcome != "success" {
		t.Errorf("the call through the outage: %+v, want success on the third attempt", r)
	}
	if r := got[1]; !r.OK || r.Text != "Hello from damper fake." || r.Attempts != "1" || !r.Stop {
		t.Errorf("the stream after the outage: %+v", r)
	}
	if sum := fakeRequests(t, fake); sum.Received != 4 || sum.ByFault["overloaded"] != 2 || sum.ByStatus["529"] != 2 || sum.ByStatus["200"] != 2 {
		t.Errorf("the fake received %+v", sum)
	}

	fake = fakeProcess(t, "-listen", "127.0.0.1:0", "-fault", "overloaded", "-for", "1h")
	p = startProxyArgs(t, "ts-down", []string{"-listen", "127.0.0.1:0", "-upstream", fake})
	got = runFallbackClient(t, p.url, "plain")
	if r := got[0]; r.OK || r.Status != 529 {
		t.Errorf("the call in a full outage: %+v, want the 529 after the proxy's attempts", r)
	}
	if n := fakeRequests(t, fake).ByFault["overloaded"]; n != 3 {
		t.Errorf("the fake got %d attempts, want the policy's 3", n)
	}
}

// fakeClient keeps no connection open after a request, so that none is
// left when a test ends.
var fakeClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
