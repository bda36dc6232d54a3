package dampertest

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
)

func TestStatusErrors(t *testing.T) {
	srv := NewServer()
	defer srv.Close()
	client := newClient(srv)

	tests := []struct {
		name     string
		step     Step
		status   int
		wantType string
		wantCode string
		wantMsg  string
	}{
		{"400", Status(400), 400, "invalid_request_error", "", "Invalid request."},
		{"401", Status(401), 401, "authentication_error", "", "invalid x-api-key"},
		{"402", Status(402), 402, "billing_error", "", ""},
		{"403", Status(403), 403, "permission_error", "", ""},
		{"404", Status(404), 404, "not_found_error", "", ""},
		{"409", Status(409), 409, "invalid_request_error", "", ""},
		{"413", Status(413), 413, "request_too_large", "", ""},
		{"429", Status(429), 429, "rate_limit_error", "", ""},
		{"500", Status(500), 500, "api_error", "", "Internal server error"},
		{"502", Status(502), 502, "api_error", "", ""},
		{"503", Status(503), 503, "api_error", "", ""},
		{"504", Status(504), 504, "api_error", "", ""},
		{"529", Status(529), 529, "overloaded_error", "", "Overloaded"},
		{"spend limit", SpendLimit(), 429, "rate_limit_error", "enforced_spend_limit_reached", ""},
		{"ramp limit", Status(429).WithError("", "ramp_limit_exceeded"), 429, "rate_limit_error", "ramp_limit_exceeded", ""},
		{"custom", Status(400).WithError("weird_error", "some_code").WithMessage("scripted"), 400, "weird_error", "some_code", "scripted"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv.Script(tt.name, tt.step)
			_, err := client.Messages.New(context.Background(), params(), Scenario(tt.name))
			var apiErr *anthropic.Error
			if !errors.As(err, &apiErr) {
				t.Fatalf("err = %v, want *anthropic.Error", err)
			}
			if apiErr.StatusCode != tt.status {
				t.Errorf("StatusCode = %d, want %d", apiErr.StatusCode, tt.status)
			}
			if got := string(apiErr.Type()); got != tt.wantType {
				t.Errorf("Type() = %q, want %q", got, tt.wantType)
			}
			if got := string(apiErr.ErrorCode()); got != tt.wantCode {
				t.Errorf("ErrorCode() = %q, want %q", got, tt.wantCode)
			}
			if tt.wantMsg != "" && apiErr.Message != tt.wantMsg {
				t.Errorf("Message = %q, want %q", apiErr.Message, tt.wantMsg)
			}
			wantID := "req_dampertest_" + tt.name + "_1"
			if apiErr.RequestID != wantID {
				t.Errorf("RequestID = %q, want %q", apiErr.RequestID, wantID)
			}

			// The exact body shape: details only with a code, request_id repeated.
			var body map[string]any
			if err := json.Unmarshal([]byte(apiErr.RawJSON()), &body); err != nil {
				t.Fatalf("body %q: %v", apiErr.RawJSON(), err)
			}
			if body["type"] != "error" || body["request_id"] != wantID {
				t.Errorf("body = %s", apiErr.RawJSON())
			}
			_, hasDetails := body["error"].(map[string]any)["details"]
			if hasDetails != (tt.wantCode != "") {
				t.Errorf("details present = %v, want %v: %s", hasDetails, tt.wantCode != "", apiErr.RawJSON())
			}
		})
	}
}

func TestHeadersDelivered(t *testing.T) {
	srv := NewServer()
	defer srv.Close()
	client := newClient(srv)

	step := Status(429).RetryAfter("120").RetryAfterMs("300").ShouldRetry(false).
		WithHeader("anthropic-ratelimit-requests-remaining", "0")
	srv.Script("h", step, OK().RetryAfter("Wed, 21 Oct 2015 07:28:00 GMT").WithHeader("request-id", "req_custom"))

	_, err := client.Messages.New(context.Background(), params(), Scenario("h"))
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) {
		t.Fatalf("err = %v", err)
	}
	for k, want := range map[string]string{
		"retry-after":                            "120",
		"retry-after-ms":                         "300",
		"x-should-retry":                         "false",
		"anthropic-ratelimit-requests-remaining": "0",
		"request-id":                             "req_dampertest_h_1",
		"content-type":                           "application/json",
	} {
		if got := apiErr.Response.Header.Get(k); got != want {
			t.Errorf("header %s = %q, want %q", k, got, want)
		}
	}

	// A step's own request-id replaces the generated one, on success too.
	var resp *http.Response
	if _, err := client.Messages.New(context.Background(), params(), Scenario("h"), option.WithResponseInto(&resp)); err != nil {
		t.Fatal(err)
	}
	if got := resp.Header.Get("request-id"); got != "req_custom" {
		t.Errorf("request-id = %q", got)
	}
	if got := resp.Header.Get("retry-after"); got != "Wed, 21 Oct 2015 07:28:00 GMT" {
		t.Errorf("retry-after = %q", got)
	}
}

func TestScriptsPerScenario(t *testing.T) {
	srv := NewServer()
	defer srv.Close()
	client := newClient(srv)

	srv.Script("flaky", Status(529), Status(500), OK().WithText("third"))
	srv.Script("fine", OK().WithText("fine"))

	call := func(scenario string) string {
		t.Helper()
		msg, err := client.Messages.New(context.Background(), params(), Scenario(scenario))
		var apiErr *anthropic.Error
		switch {
		case errors.As(err, &apiErr):
			return strconv.Itoa(apiErr.StatusCode)
		case err != nil:
			t.Fatal(err)
		}
		return msg.Content[0].Text
	}
	got := []string{call("flaky"), call("fine"), call("flaky"), call("flaky"), call("flaky"), call(""), call("fine")}
	want := []string{"529", "fine", "500", "third", "third", "ok", "fine"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("answers = %q, want %q", got, want)
	}
	if n := srv.Count("flaky"); n != 4 {
		t.Errorf("Count(flaky) = %d, want 4", n)
	}
	if n := srv.Count(""); n != 1 {
		t.Errorf("Count(\"\") = %d, want 1", n)
	}

	// Scripting again starts the new script over; N keeps counting.
	srv.Script("flaky", Status(503), OK())
	if got := call("flaky"); got != "503" {
		t.Errorf("after re-Script: %q", got)
	}
	if got := call("flaky"); got != "ok" {
		t.Errorf("after re-Script: %q", got)
	}
	reqs := srv.Requests()
	last := reqs[len(reqs)-1]
	if last.Scenario != "flaky" || last.N != 6 {
		t.Errorf("last request = %s #%d, want flaky #6", last.Scenario, last.N)
	}

	// No steps: back to the default answer.
	srv.Script("flaky")
	if got := call("flaky"); got != "ok" {
		t.Errorf("after clearing: %q", got)
	}
}

func TestScriptCopiesSteps(t *testing.T) {
	srv := NewServer()
	defer srv.Close()
	step := Status(429).RetryAfter("1")
	srv.Script("x", step)
	step.Header.Set("Retry-After", "999") // must not reach the script

	_, err := newClientPtr(srv).Messages.New(context.Background(), params(), Scenario("x"))
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.Response.Header.Get("retry-after") != "1" {
		t.Fatalf("err = %v", err)
	}
}

func TestOKMessage(t *testing.T) {
	srv := NewServer()
	defer srv.Close()
	p := params()
	p.Model = "claude-sonnet-5-5"
	msg, err := newClientPtr(srv).Messages.New(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if msg.ID != messageID || msg.Model != "claude-sonnet-5-5" || msg.Role != "assistant" ||
		msg.StopReason != anthropic.StopReasonEndTurn || len(msg.Content) != 1 ||
		msg.Content[0].Type != "text" || msg.Content[0].Text != "ok" ||
		msg.Usage.InputTokens != defaultInputTokens || msg.Usage.OutputTokens != 1 {
		t.Errorf("message = %s", msg.RawJSON())
	}
}

func TestDrops(t *testing.T) {
	srv := NewServer()
	defer srv.Close()
	client := newClient(srv)

	tests := []struct {
		name string
		step Step
		want error
	}{
		{"before headers", OK().WithDrop(DropBeforeHeaders), io.EOF},
		{"error before headers", Status(529).WithDrop(DropBeforeHeaders), io.EOF},
		{"mid body", OK().WithDrop(DropMidBody), io.ErrUnexpectedEOF},
		{"error mid body", Status(500).WithDrop(DropMidBody), io.ErrUnexpectedEOF},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv.Script(tt.name, tt.step)
			_, err := client.Messages.New(context.Background(), params(), Scenario(tt.name))
			var apiErr *anthropic.Error
			if errors.As(err, &apiErr) {
				t.Fatalf("err = %v, want a transport error", err)
			}
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			if n := srv.Count(tt.name); n != 1 {
				t.Errorf("Count = %d, want 1 (no hidden retry)", n)
			}
		})
	}
}

func TestRawBody(t *testing.T) {
	srv := NewServer()
	defer srv.Close()
	srv.Script("html", Status(502).WithBody([]byte("<html>bad gateway</html>")).WithHeader("Content-Type", "text/html"))

	_, err := newClientPtr(srv).Messages.New(context.Background(), params(), Scenario("html"))
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) {
		t.Fatalf("err = %v", err)
	}
	if apiErr.StatusCode != 502 || apiErr.RawJSON() != "<html>bad gateway</html>" || apiErr.Type() != "" {
		t.Errorf("status %d, type %q, body %q", apiErr.StatusCode, apiErr.Type(), apiErr.RawJSON())
	}
	if ct := apiErr.Response.Header.Get("content-type"); ct != "text/html" {
		t.Errorf("content-type = %q", ct)
	}
}

func TestNotFound(t *testing.T) {
	srv := NewServer()
	defer srv.Close()
	client := newClient(srv)

	// The SDK's own call to another endpoint gets an Anthropic 404.
	_, err := client.Models.Get(context.Background(), "claude-x", anthropic.ModelGetParams{}, Scenario("m"))
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Type() != "not_found_error" {
		t.Fatalf("err = %v", err)
	}

	for _, tc := range []struct{ method, path string }{
		{http.MethodGet, "/v1/messages"},
		{http.MethodPost, "/v1/complete"},
	} {
		req, _ := http.NewRequest(tc.method, srv.URL()+tc.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 404 {
			t.Errorf("%s %s: status %d", tc.method, tc.path, resp.StatusCode)
		}
	}

	// ?beta=true is the same endpoint.
	resp, err := http.Post(srv.URL()+"/v1/messages?beta=true", "application/json", strings.NewReader(`{"model":"m"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("beta: status %d", resp.StatusCode)
	}

	// Logged, but not counted and not numbered.
	reqs := srv.Requests()
	if len(reqs) != 4 || reqs[0].N != 0 || reqs[0].Path != "/v1/models/claude-x" || reqs[3].N != 1 {
		t.Errorf("log = %+v", reqs)
	}
	if srv.Count("m") != 0 || srv.Count("") != 1 {
		t.Errorf("counts m=%d \"\"=%d", srv.Count("m"), srv.Count(""))
	}
}

func TestRequestLog(t *testing.T) {
	clock := NewClock(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC))
	srv := NewServer(WithClock(clock))
	defer srv.Close()
	// WithAPIKey sends "Authorization: Bearer test-key"; add an x-api-key too.
	client := newClient(srv, option.WithHeader("X-Api-Key", "secret-key"))

	if _, err := client.Messages.New(context.Background(), params(), Scenario("log")); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Minute)
	stream := client.Messages.NewStreaming(context.Background(), params(), Scenario("log"))
	for stream.Next() {
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	stream.Close()

	reqs := srv.Requests()
	if len(reqs) != 2 {
		t.Fatalf("%d requests", len(reqs))
	}
	for i, r := range reqs {
		if r.Scenario != "log" || r.N != i+1 || r.Method != "POST" || r.Path != "/v1/messages" {
			t.Errorf("request %d = %s %s %s #%d", i, r.Method, r.Path, r.Scenario, r.N)
		}
		if r.Stream != (i == 1) {
			t.Errorf("request %d: Stream = %v", i, r.Stream)
		}
		if r.Platform != "anthropic" || r.Model != DefaultModel || r.AuthError != "" || !r.SignedAt.IsZero() || r.Signature != "" {
			t.Errorf("request %d: platform %q, model %q, refused %q, signed %v %q", i, r.Platform, r.Model, r.AuthError, r.SignedAt, r.Signature)
		}
		if !strings.Contains(string(r.Body), DefaultModel) {
			t.Errorf("request %d: body %s", i, r.Body)
		}
		if got := r.Header.Get("X-Api-Key"); got != Redacted {
			t.Errorf("request %d: x-api-key = %q", i, got)
		}
		if got := r.Header.Get("Authorization"); got != Redacted {
			t.Errorf("request %d: authorization = %q", i, got)
		}
		for k, vs := range r.Header {
			for _, v := range vs {
				if strings.Contains(v, "test-key") || strings.Contains(v, "secret-key") {
					t.Errorf("request %d: header %s leaks %q", i, k, v)
				}
			}
		}
	}
	if want := clock.Now().Add(-time.Minute); !reqs[0].At.Equal(want) || !reqs[1].At.Equal(clock.Now()) {
		t.Errorf("At = %v, %v", reqs[0].At, reqs[1].At)
	}

	// The log is a copy.
	reqs[0].Header.Set("X-Api-Key", "changed")
	if srv.Requests()[0].Header.Get("X-Api-Key") != Redacted {
		t.Error("Requests shares its headers with the log")
	}
}

func TestOptions(t *testing.T) {
	srv := NewServer()
	defer srv.Close()
	if n := len(srv.Options()); n != 2 {
		t.Errorf("len(Options()) = %d, want 2", n)
	}
	if !strings.HasPrefix(srv.URL(), "http://127.0.0.1:") {
		t.Errorf("URL = %q", srv.URL())
	}
	srv.Close() // twice is fine
}

func TestStepFunc(t *testing.T) {
	var mu sync.Mutex
	var asked []string
	var srv *Server
	srv = NewServer(WithStepFunc(func(r Request) Step {
		mu.Lock()
		asked = append(asked, r.Scenario+"#"+strconv.Itoa(r.N))
		mu.Unlock()
		if r.N == 1 {
			return Status(529)
		}
		// f may call the server: it runs outside the server's lock.
		return OK().WithText(r.Scenario + " " + strconv.Itoa(srv.Count(r.Scenario)))
	}))
	defer srv.Close()
	srv.Script("scripted", OK().WithText("from the script"))
	client := newClient(srv)
	ctx := context.Background()

	_, err := client.Messages.New(ctx, params(), Scenario("a"))
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 529 || apiErr.RequestID != "req_dampertest_a_1" {
		t.Fatalf("first request: err = %v, want the 529 f chose", err)
	}
	msg, err := client.Messages.New(ctx, params(), Scenario("a"))
	if err != nil || msg.Content[0].Text != "a 2" {
		t.Fatalf("second request: msg %v, err %v", msg, err)
	}
	res := readStream(t, &client, ctx, "a", nil)
	if res.err != nil || res.msg.Content[0].Text != "a 3" {
		t.Errorf("stream: text %q, err %v", res.msg.Content[0].Text, res.err)
	}
	// A script takes precedence; f is not asked.
	msg, err = client.Messages.New(ctx, params(), Scenario("scripted"))
	if err != nil || msg.Content[0].Text != "from the script" {
		t.Errorf("scripted: msg %v, err %v", msg, err)
	}
	// Other endpoints take no step.
	if _, err := client.Models.Get(ctx, "claude-x", anthropic.ModelGetParams{}, Scenario("m")); err == nil {
		t.Error("GET /v1/models answered without error")
	}
	if want := []string{"a#1", "a#2", "a#3"}; !slices.Equal(asked, want) {
		t.Errorf("f asked for %v, want %v", asked, want)
	}
}

func TestStepFuncConcurrent(t *testing.T) {
	var calls atomic.Int32
	srv := NewServer(InMemory(), WithStepFunc(func(r Request) Step {
		calls.Add(1)
		return OK().WithText(r.Scenario)
	}))
	defer srv.Close()
	client := newClient(srv)
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			name := strconv.Itoa(i % 4)
			msg, err := client.Messages.New(context.Background(), params(), Scenario(name))
			if err != nil || msg.Content[0].Text != name {
				t.Errorf("scenario %s: msg %v, err %v", name, msg, err)
			}
		})
	}
	wg.Wait()
	if calls.Load() != 20 || srv.Count("0") != 5 {
		t.Errorf("f called %d times, Count(0) = %d", calls.Load(), srv.Count("0"))
	}
}

func TestMessageID(t *testing.T) {
	srv := NewServer()
	defer srv.Close()
	client := newClient(srv)
	base := OK()
	srv.Script("id", base.WithMessageID("msg_first").WithText("one"), OK().WithMessageID("msg_second").WithStream(Stream{Text: "two"}), base)
	if base.MessageID != "" {
		t.Fatal("WithMessageID changed its receiver")
	}

	msg, err := client.Messages.New(context.Background(), params(), Scenario("id"))
	if err != nil || msg.ID != "msg_first" || msg.Content[0].Text != "one" {
		t.Fatalf("plain: msg %v, err %v", msg, err)
	}
	res := readStream(t, &client, context.Background(), "id", nil)
	if res.err != nil || res.msg.ID != "msg_second" || res.msg.Content[0].Text != "two" {
		t.Fatalf("stream: id %q text %q, err %v", res.msg.ID, res.msg.Content[0].Text, res.err)
	}
	if msg, err := client.Messages.New(context.Background(), params(), Scenario("id")); err != nil || msg.ID != messageID {
		t.Fatalf("default: msg %v, err %v", msg, err)
	}
}

// TestStallMidBody is a body that stops halfway and never ends: the caller
// gets nothing until its context ends, over loopback and in memory.
func TestStallMidBody(t *testing.T) {
	if got := StallMidBody.String(); got != "StallMidBody" {
		t.Errorf("String() = %q", got)
	}
	for _, where := range []string{"loopback", "in memory"} {
		var opts []ServerOption
		if where == "in memory" {
			opts = append(opts, InMemory())
		}
		srv := NewServer(opts...)
		client := newClient(srv)
		srv.Script("plain", OK().WithText(strings.Repeat("x", 200)).WithDrop(StallMidBody))
		srv.Script("error", Status(503).WithDrop(StallMidBody))
		srv.Script("stream", OK().WithStream(Stream{Text: strings.Repeat("y", 200)}).WithDrop(StallMidBody))
		for _, scenario := range []string{"plain", "error", "stream"} {
			t.Run(where+" "+scenario, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				defer cancel()
				var err error
				var types []string
				if scenario == "stream" {
					res := readStream(t, &client, ctx, scenario, nil)
					err, types = res.err, res.types
				} else {
					_, err = client.Messages.New(ctx, params(), Scenario(scenario))
				}
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("err = %v, want context.DeadlineExceeded", err)
				}
				if scenario == "stream" && (len(types) == 0 || slices.Contains(types, "message_stop")) {
					t.Errorf("events %v: want the first half's, without message_stop", types)
				}
			})
		}
		srv.Close()
	}
}

func TestStallMidBodyReleasedByClose(t *testing.T) {
	srv := NewServer(InMemory())
	srv.Script("", OK().WithDrop(StallMidBody))
	req, _ := http.NewRequest("POST", MemoryURL+"/v1/messages", strings.NewReader(`{"model":"m"}`))
	resp, err := Transport(srv.Handler()).RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	half := make([]byte, resp.ContentLength/2)
	if _, err := io.ReadFull(resp.Body, half); err != nil || !strings.HasPrefix(string(messageJSON(messageID, "m", "ok", defaultInputTokens)), string(half)) {
		t.Fatalf("first half %q, err %v", half, err)
	}
	srv.Close() // must not leave the stalled handler waiting
	if rest, err := io.ReadAll(resp.Body); len(rest) != 0 || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("after Close: %q, err %v, want io.ErrUnexpectedEOF (connection cut)", rest, err)
	}
}

func TestInMemory(t *testing.T) {
	srv := NewServer(InMemory())
	defer srv.Close()
	if srv.URL() != MemoryURL || len(srv.Options()) != 3 {
		t.Errorf("URL %q, %d options", srv.URL(), len(srv.Options()))
	}
	srv.Script("s", Status(529), OK().WithText("in memory"))
	client := newClient(srv)
	if _, err := client.Messages.New(context.Background(), params(), Scenario("s")); err == nil {
		t.Error("first request: no error, want the 529")
	}
	msg, err := client.Messages.New(context.Background(), params(), Scenario("s"))
	if err != nil || msg.Content[0].Text != "in memory" {
		t.Fatalf("msg %v, err %v", msg, err)
	}
	if reqs := srv.Requests(); len(reqs) != 2 || reqs[1].N != 2 || reqs[1].Header.Get("Authorization") != Redacted {
		t.Errorf("log = %+v", reqs)
	}
	srv.Close() // twice is fine
}

// TestInMemoryInABubble: a server made in a synctest bubble waits on the
// bubble's clock, and its stalls end with the request's context, exactly.
func TestInMemoryInABubble(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := NewServer(InMemory())
		defer srv.Close()
		client := newClient(srv)
		srv.Script("slow", OK().WithDelay(90*time.Second))
		srv.Script("stall", OK().WithDrop(StallMidBody))
		st := Stream{Fault: FaultStall}
		st.At = st.ContentIndex() + 1
		srv.Script("stream", OK().WithStream(st))

		start := time.Now()
		if _, err := client.Messages.New(context.Background(), params(), Scenario("slow")); err != nil {
			t.Fatal(err)
		}
		if got := time.Since(start); got != 90*time.Second {
			t.Errorf("the delay took %v of the bubble's time, want 90s", got)
		}

		for _, scenario := range []string{"stall", "stream"} {
			// Within the SDK's own 10-minute timeout for Messages.New.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			start := time.Now()
			var err error
			if scenario == "stream" {
				err = readStream(t, &client, ctx, scenario, nil).err
			} else {
				_, err = client.Messages.New(ctx, params(), Scenario(scenario))
			}
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) != 5*time.Minute {
				t.Errorf("%s: err %v after %v, want context.DeadlineExceeded after 5m", scenario, err, time.Since(start))
			}
		}
		synctest.Wait() // the handlers have returned: the bubble checks none is left
	})
}

// TestLogLimit: a server made with WithLogLimit keeps the last requests
// alone, each body cut to its bound, while Count and the answers see
// every request whole; the log's backing array stays within twice the
// bound.
func TestLogLimit(t *testing.T) {
	srv := NewServer(InMemory(), WithLogLimit(3, 8))
	defer srv.Close()
	client := newClient(srv)
	for i := range 10 {
		p := params()
		p.Model = anthropic.Model("model-" + strconv.Itoa(i))
		msg, err := client.Messages.New(context.Background(), p)
		if err != nil || string(msg.Model) != "model-"+strconv.Itoa(i) {
			t.Fatalf("call %d: %v, model %q", i, err, msg.Model)
		}
	}
	if n := srv.Count(""); n != 10 {
		t.Errorf("Count = %d, want 10", n)
	}
	log := srv.Requests()
	if len(log) != 3 {
		t.Fatalf("the log holds %d requests, want the last 3", len(log))
	}
	for i, r := range log {
		if r.N != 8+i || r.Model != "model-"+strconv.Itoa(7+i) || len(r.Body) != 8 || string(r.Body) != `{"max_to` {
			t.Errorf("log[%d]: N %d, model %q, body %q; want request %d, its body's first 8 bytes", i, r.N, r.Model, r.Body, 8+i)
		}
	}
	srv.mu.Lock()
	held := cap(srv.log)
	srv.mu.Unlock()
	if held > 8 {
		t.Errorf("the log's array holds %d entries for a bound of 3", held)
	}
}
