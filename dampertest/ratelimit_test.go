package dampertest

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
)

// rlRig is a server with rate limits on a fake clock, and a client without
// retries.
type rlRig struct {
	clock  *Clock
	srv    *Server
	client anthropic.Client
}

func newRLRig(t *testing.T, l RateLimits, opts ...ServerOption) *rlRig {
	t.Helper()
	if err := l.Validate(); err != nil {
		t.Fatal(err)
	}
	clock := NewClock(t0)
	srv := NewServer(append([]ServerOption{WithClock(clock), WithRateLimits(l)}, opts...)...)
	t.Cleanup(srv.Close)
	return &rlRig{clock: clock, srv: srv, client: newClient(srv)}
}

// answer is what the caller got from one request.
type answer struct {
	status int
	header http.Header
	msg    *anthropic.Message
	apiErr *anthropic.Error
}

// send makes one plain request with p and fails t on anything but an
// answer from the server.
func (r *rlRig) send(t *testing.T, scenario string, p anthropic.MessageNewParams) answer {
	t.Helper()
	var resp *http.Response
	msg, err := r.client.Messages.New(context.Background(), p, Scenario(scenario), option.WithResponseInto(&resp))
	var apiErr *anthropic.Error
	switch {
	case errors.As(err, &apiErr):
		return answer{status: apiErr.StatusCode, header: apiErr.Response.Header, apiErr: apiErr}
	case err != nil:
		t.Fatalf("request: %v", err)
	}
	return answer{status: resp.StatusCode, header: resp.Header, msg: msg}
}

// lastInput is the input tokens the last logged request cost.
func (r *rlRig) lastInput() int {
	reqs := r.srv.Requests()
	return inputTokensOf(reqs[len(reqs)-1].Body)
}

// withMax returns params() with max_tokens n.
func withMax(n int64) anthropic.MessageNewParams {
	p := params()
	p.MaxTokens = n
	return p
}

// wantHeaders fails t unless h has each of want (a value "" means absent).
func wantHeaders(t *testing.T, what string, h http.Header, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got := h.Get(k); got != v || (v == "" && len(h.Values(k)) > 0) {
			t.Errorf("%s: %s = %q, want %q", what, k, got, v)
		}
	}
}

// at formats t0+d as the reset headers do.
func at(d time.Duration) string { return t0.Add(d).Format(time.RFC3339) }

// atUp is at of d rounded up to the second.
func atUp(d time.Duration) string { return at((d + time.Second - 1).Truncate(time.Second)) }

func itoa(n int) string { return strconv.Itoa(n) }

// TestRateLimitHeaders: exact headers on every kind of response, after a
// few requests at one instant.
func TestRateLimitHeaders(t *testing.T) {
	r := newRLRig(t, RateLimits{RequestsPerMinute: 10, InputTokensPerMinute: 1000, OutputTokensPerMinute: 600})
	r.srv.Script("s", OK(), Status(529), OK().WithHeader("anthropic-ratelimit-requests-remaining", "42"))

	a := r.send(t, "s", params()) // max_tokens 64, answer "ok": 1 output token
	in := r.lastInput()
	if a.status != 200 || a.msg.Usage.InputTokens != int64(in) || in != (len(r.srv.Requests()[0].Body)+3)/4 {
		t.Fatalf("first: status %d, usage %d input tokens, body costs %d", a.status, a.msg.Usage.InputTokens, in)
	}
	// Output shows the reservation of max_tokens: the headers are those of
	// the admission. Output reset: 64 tokens at 600/min = 6.4 s, up to 7 s.
	wantHeaders(t, "first", a.header, map[string]string{
		"anthropic-ratelimit-requests-limit":          "10",
		"anthropic-ratelimit-requests-remaining":      "9",
		"anthropic-ratelimit-requests-reset":          at(6 * time.Second),
		"anthropic-ratelimit-input-tokens-limit":      "1000",
		"anthropic-ratelimit-input-tokens-remaining":  itoa(1000 - in),
		"anthropic-ratelimit-input-tokens-reset":      atUp(time.Duration(in) * time.Minute / 1000),
		"anthropic-ratelimit-output-tokens-limit":     "600",
		"anthropic-ratelimit-output-tokens-remaining": "536",
		"anthropic-ratelimit-output-tokens-reset":     at(7 * time.Second),
		"anthropic-ratelimit-tokens-limit":            "600", // output has less left
		"anthropic-ratelimit-tokens-remaining":        "536",
		"anthropic-ratelimit-tokens-reset":            at(7 * time.Second),
		"retry-after":                                 "",
	})

	// A scripted error carries them too, and gives its reservation back.
	a = r.send(t, "s", params())
	if a.status != 529 {
		t.Fatalf("second: status %d", a.status)
	}
	wantHeaders(t, "529", a.header, map[string]string{
		"anthropic-ratelimit-requests-remaining":      "8",
		"anthropic-ratelimit-input-tokens-remaining":  itoa(1000 - 2*in),
		"anthropic-ratelimit-output-tokens-remaining": itoa(600 - 1 - 64),
	})

	// A step's own header wins over the limits'.
	a = r.send(t, "s", params())
	wantHeaders(t, "override", a.header, map[string]string{
		"anthropic-ratelimit-requests-limit":          "10",
		"anthropic-ratelimit-requests-remaining":      "42",
		"anthropic-ratelimit-output-tokens-remaining": itoa(600 - 1 - 64),
	})

	// A stream has them from its first byte.
	var resp *http.Response
	stream := r.client.Messages.NewStreaming(context.Background(), params(), Scenario("stream"), option.WithResponseInto(&resp))
	if !stream.Next() {
		t.Fatalf("stream: %v", stream.Err())
	}
	start := stream.Current()
	for stream.Next() {
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	stream.Close()
	streamIn := r.lastInput() // the body says "stream":true
	if start.Message.Usage.InputTokens != int64(streamIn) || streamIn <= in {
		t.Errorf("message_start reports %d input tokens, want %d", start.Message.Usage.InputTokens, streamIn)
	}
	// 3 settled plain answers (1 output token each; the 529 none), this one reserved.
	used := 3*in + streamIn
	wantHeaders(t, "stream", resp.Header, map[string]string{
		"content-type":                                "text/event-stream; charset=utf-8",
		"anthropic-ratelimit-requests-remaining":      "6",
		"anthropic-ratelimit-input-tokens-remaining":  itoa(1000 - used),
		"anthropic-ratelimit-output-tokens-remaining": itoa(600 - 2 - 64),
	})

	if got, want := r.srv.RateLimitStats(), (RateLimitStats{Admitted: 4, InputTokens: used, OutputTokens: 3}); got != want {
		t.Errorf("stats %+v, want %+v", got, want)
	}
}

// TestRateLimitHeadersOnlyEnforced: a limit of 0 sends no headers, and the
// combined tokens headers need both token limits.
func TestRateLimitHeadersOnlyEnforced(t *testing.T) {
	r := newRLRig(t, RateLimits{OutputTokensPerMinute: 1000})
	a := r.send(t, "", params())
	wantHeaders(t, "output only", a.header, map[string]string{
		"anthropic-ratelimit-output-tokens-remaining": "936",
		"anthropic-ratelimit-requests-limit":          "",
		"anthropic-ratelimit-input-tokens-limit":      "",
		"anthropic-ratelimit-tokens-limit":            "",
	})

	plain := NewServer()
	defer plain.Close()
	var resp *http.Response
	if _, err := newClientPtr(plain).Messages.New(context.Background(), params(), option.WithResponseInto(&resp)); err != nil {
		t.Fatal(err)
	}
	for k := range resp.Header {
		if strings.HasPrefix(strings.ToLower(k), "anthropic-ratelimit") {
			t.Errorf("server without limits sent %s", k)
		}
	}
}

// TestRateLimitTokenRounding: remaining token counts are rounded down;
// limits and requests are exact.
func TestRateLimitTokenRounding(t *testing.T) {
	r := newRLRig(t, RateLimits{RequestsPerMinute: 7, InputTokensPerMinute: 10000, OutputTokensPerMinute: 5000, TokenRounding: 1000})
	a := r.send(t, "", params())
	wantHeaders(t, "rounded", a.header, map[string]string{
		"anthropic-ratelimit-requests-remaining":      "6",
		"anthropic-ratelimit-input-tokens-limit":      "10000",
		"anthropic-ratelimit-input-tokens-remaining":  "9000",
		"anthropic-ratelimit-output-tokens-remaining": "4000", // 4936
		"anthropic-ratelimit-tokens-remaining":        "4000",
	})
}

// TestRateLimitRefill: buckets refill continuously on the server's clock,
// up to their limit.
func TestRateLimitRefill(t *testing.T) {
	r := newRLRig(t, RateLimits{RequestsPerMinute: 60}) // one a second
	for i := range 60 {
		if a := r.send(t, "", params()); a.status != 200 {
			t.Fatalf("request %d: status %d", i+1, a.status)
		}
	}
	a := r.send(t, "", params())
	wantHeaders(t, "empty", a.header, map[string]string{
		"anthropic-ratelimit-requests-remaining": "0",
		"anthropic-ratelimit-requests-reset":     at(time.Minute),
		"retry-after":                            "1",
	})

	r.clock.Advance(500 * time.Millisecond) // half a request: not enough
	if a := r.send(t, "", params()); a.status != 429 || a.header.Get("retry-after") != "1" {
		t.Fatalf("after 0.5s: status %d, retry-after %q", a.status, a.header.Get("retry-after"))
	}
	r.clock.Advance(10*time.Second - 500*time.Millisecond)
	a = r.send(t, "", params())
	wantHeaders(t, "after 10s", a.header, map[string]string{
		"anthropic-ratelimit-requests-remaining": "9", // 10 refilled, 1 taken
		"anthropic-ratelimit-requests-reset":     at(10*time.Second + 51*time.Second),
	})

	r.clock.Advance(time.Hour) // capped at the limit: no more than 60 banked
	for i := range 60 {
		if a := r.send(t, "", params()); a.status != 200 {
			t.Fatalf("after an hour, request %d: status %d", i+1, a.status)
		}
	}
	if a := r.send(t, "", params()); a.status != 429 {
		t.Fatalf("61st request after an hour: status %d, want 429", a.status)
	}
}

// TestRateLimitBurst: a burst over RPM gets the API's 429, takes no step,
// and is admitted once the caller waits retry-after.
func TestRateLimitBurst(t *testing.T) {
	r := newRLRig(t, RateLimits{RequestsPerMinute: 3})
	r.srv.Script("s", OK().WithText("one"), OK().WithText("two"), Status(500), OK().WithText("four"), OK().WithText("five"))
	for i, want := range []int{200, 200, 500} {
		if a := r.send(t, "s", params()); a.status != want {
			t.Fatalf("request %d: status %d, want %d", i+1, a.status, want)
		}
	}
	a := r.send(t, "s", params())
	if a.status != 429 || a.apiErr.Type() != "rate_limit_error" || a.apiErr.RequestID != "req_dampertest_s_4" {
		t.Fatalf("burst: status %d, type %q, request id %q", a.status, a.apiErr.Type(), a.apiErr.RequestID)
	}
	if !strings.HasPrefix(a.apiErr.Message, "This request would exceed the rate limit for your organization of 3 requests per minute.") {
		t.Errorf("message %q", a.apiErr.Message)
	}
	wantHeaders(t, "429", a.header, map[string]string{
		"retry-after":                            "20", // one request at 3/min
		"anthropic-ratelimit-requests-limit":     "3",
		"anthropic-ratelimit-requests-remaining": "0",
		"anthropic-ratelimit-requests-reset":     at(time.Minute),
		"content-type":                           "application/json",
	})

	r.clock.Advance(19 * time.Second)
	if a := r.send(t, "s", params()); a.status != 429 || a.header.Get("retry-after") != "1" {
		t.Fatalf("after 19s: status %d, retry-after %q", a.status, a.header.Get("retry-after"))
	}
	r.clock.Advance(time.Second)
	a = r.send(t, "s", params())
	if a.status != 200 || a.msg.Content[0].Text != "four" {
		t.Fatalf("after retry-after: status %d, msg %v; want the script's fourth step", a.status, a.msg)
	}

	reqs := r.srv.Requests()
	var limited []int
	for _, q := range reqs {
		if q.RateLimited {
			limited = append(limited, q.N)
		}
	}
	if len(reqs) != 6 || r.srv.Count("s") != 6 || len(limited) != 2 || limited[0] != 4 || limited[1] != 5 {
		t.Errorf("%d logged, Count %d, limited %v; want 6, 6, [4 5]", len(reqs), r.srv.Count("s"), limited)
	}
	if got := r.srv.RateLimitStats(); got.Admitted != 4 || got.Limited != 2 {
		t.Errorf("stats %+v, want 4 admitted, 2 limited", got)
	}
}

// TestRateLimitStepFuncNotAsked: a refused request does not reach
// WithStepFunc's function.
func TestRateLimitStepFuncNotAsked(t *testing.T) {
	var mu sync.Mutex
	var asked []int
	r := newRLRig(t, RateLimits{RequestsPerMinute: 1}, WithStepFunc(func(q Request) Step {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, q.N)
		return OK()
	}))
	r.send(t, "", params())
	if a := r.send(t, "", params()); a.status != 429 {
		t.Fatalf("status %d", a.status)
	}
	r.clock.Advance(time.Minute)
	r.send(t, "", params())
	if len(asked) != 2 || asked[0] != 1 || asked[1] != 3 {
		t.Errorf("f asked for %v, want [1 3]", asked)
	}
}

// TestRateLimitInputTokens: ITPM is charged the body's input tokens.
func TestRateLimitInputTokens(t *testing.T) {
	r := newRLRig(t, RateLimits{InputTokensPerMinute: 1000})
	a := r.send(t, "", params())
	in := r.lastInput()
	if a.status != 200 || a.msg.Usage.InputTokens != int64(in) {
		t.Fatalf("status %d, usage %d, want %d", a.status, a.msg.Usage.InputTokens, in)
	}

	// A prompt of 3,800 characters costs about 980 tokens: within the
	// limit, not within what the first request left.
	big := params()
	big.Messages = []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(strings.Repeat("x", 3800)))}
	a = r.send(t, "", big)
	bigIn := r.lastInput()
	if bigIn <= 1000-in || bigIn > 1000 {
		t.Fatalf("the big prompt costs %d tokens, want %d to 1000", bigIn, 1000-in+1)
	}
	if a.status != 429 || !strings.Contains(a.apiErr.Message, "of 1,000 input tokens per minute") {
		t.Fatalf("big prompt: status %d, err %v", a.status, a.apiErr)
	}
	// It lacks bigIn-(1000-in) tokens, refilled at 1000/min.
	wait := time.Duration(bigIn-(1000-in)) * time.Minute / 1000
	wantHeaders(t, "big", a.header, map[string]string{
		"retry-after": itoa(int((wait + time.Second - 1) / time.Second)),
		"anthropic-ratelimit-input-tokens-remaining": itoa(1000 - in),
	})
	r.clock.Advance(wait)
	if a := r.send(t, "", big); a.status != 200 {
		t.Fatalf("after %v: status %d", wait, a.status)
	}

	// A prompt above the limit itself is refused every time; its
	// retry-after is the time until the bucket is full.
	huge := params()
	huge.Messages = []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(strings.Repeat("x", 4000)))}
	r.clock.Advance(time.Hour)
	for range 2 {
		if a := r.send(t, "", huge); a.status != 429 || a.header.Get("retry-after") != "1" {
			t.Fatalf("huge prompt: status %d, retry-after %q", a.status, a.header.Get("retry-after"))
		}
	}
	if got := r.srv.RateLimitStats(); got.InputTokens != in+bigIn || got.Admitted != 2 || got.Limited != 3 {
		t.Errorf("stats %+v", got)
	}
}

// TestRateLimitOutputSettles: OTPM is reserved by max_tokens at admission
// and settled by the answer's real output, plain and streamed.
func TestRateLimitOutputSettles(t *testing.T) {
	r := newRLRig(t, RateLimits{OutputTokensPerMinute: 1000}, InMemory())
	text := strings.Repeat("word", 40) // 40 output tokens
	r.srv.Script("", OK().WithText(text), OK().WithStream(Stream{Text: text, ChunkSize: 4}))

	a := r.send(t, "", withMax(600))
	if a.status != 200 || a.msg.Usage.OutputTokens != 40 {
		t.Fatalf("plain: status %d, %v", a.status, a.msg)
	}
	wantHeaders(t, "plain", a.header, map[string]string{"anthropic-ratelimit-output-tokens-remaining": "400"})
	if got := r.srv.RateLimitStats(); got.OutputTokens != 40 || got.OutputReserved != 0 {
		t.Errorf("after the plain answer: %+v, want 40 settled, none reserved", got)
	}

	// Mid-stream, its reservation is held; when it ends, only its output.
	var resp *http.Response
	stream := r.client.Messages.NewStreaming(context.Background(), withMax(500), option.WithResponseInto(&resp))
	if !stream.Next() {
		t.Fatal(stream.Err())
	}
	wantHeaders(t, "stream", resp.Header, map[string]string{
		"anthropic-ratelimit-output-tokens-remaining": "460", // 1000-40-500
	})
	if got := r.srv.RateLimitStats(); got.OutputReserved != 500 {
		t.Errorf("mid-stream: %+v, want 500 reserved", got)
	}
	if a := r.send(t, "other", withMax(500)); a.status != 429 || !strings.Contains(a.apiErr.Message, "output tokens") {
		t.Errorf("while the stream holds 500: status %d, want 429 for output tokens", a.status)
	}
	for stream.Next() {
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	stream.Close()
	if got := r.srv.RateLimitStats(); got.OutputTokens != 80 || got.OutputReserved != 0 {
		t.Errorf("after the stream: %+v, want 80 settled, none reserved", got)
	}
	a = r.send(t, "other", withMax(500))
	wantHeaders(t, "after", a.header, map[string]string{"anthropic-ratelimit-output-tokens-remaining": "420"}) // 1000-80-500
}

// TestRateLimitRefunds: an answer that is not a finished message gives its
// whole output reservation back; requests and input stay taken.
func TestRateLimitRefunds(t *testing.T) {
	errorEvent := Stream{Text: "abcdef", ChunkSize: 2, Fault: FaultErrorEvent}
	errorEvent.At = errorEvent.ContentIndex() + 1
	truncated := Stream{Text: "abcdefgh", Fault: FaultTruncate}
	truncated.At = len(truncated.Events()) - 1 // after message_delta: settled
	tests := []struct {
		name    string
		step    Step
		stream  bool
		settled int // output tokens charged
	}{
		{"529", Status(529), false, 0},
		{"500 stream", Status(500), true, 0},
		{"drop before headers", OK().WithDrop(DropBeforeHeaders), false, 0},
		{"drop mid body", OK().WithText(strings.Repeat("x", 100)).WithDrop(DropMidBody), false, 0},
		{"error event", OK().WithStream(errorEvent), true, 0},
		{"truncated after message_delta", OK().WithStream(truncated), true, 2},
		{"raw body", OK().WithBody([]byte(`{"type":"message","usage":{"output_tokens":7}}`)), false, 7},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRLRig(t, RateLimits{RequestsPerMinute: 10, InputTokensPerMinute: 10000, OutputTokensPerMinute: 1000})
			r.srv.Script("s", tt.step)
			if tt.stream {
				res := readStream(t, &r.client, context.Background(), "s", nil)
				_ = res // the outcome is the fake's business here; the limits are ours
			} else {
				_, _ = r.client.Messages.New(context.Background(), withMax(500), Scenario("s"))
			}
			in := r.lastInput()
			if got, want := r.srv.RateLimitStats(), (RateLimitStats{Admitted: 1, InputTokens: in, OutputTokens: tt.settled}); got != want {
				t.Errorf("stats %+v, want %+v", got, want)
			}
			a := r.send(t, "next", withMax(100))
			wantHeaders(t, "next", a.header, map[string]string{
				"anthropic-ratelimit-requests-remaining":      "8",
				"anthropic-ratelimit-input-tokens-remaining":  itoa(10000 - in - r.lastInput()),
				"anthropic-ratelimit-output-tokens-remaining": itoa(1000 - tt.settled - 100),
			})
		})
	}
}

// TestRateLimitAbandonedRefund: a client that gives up during a delay
// gives its reservation back, once the server sees it go.
func TestRateLimitAbandonedRefund(t *testing.T) {
	r := newRLRig(t, RateLimits{OutputTokensPerMinute: 1000}, InMemory())
	r.srv.Script("slow", OK().WithDelay(time.Minute))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	defer r.clock.AfterFunc(time.Second, cancel)()
	if _, err := r.client.Messages.New(ctx, withMax(500), Scenario("slow")); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for r.srv.RateLimitStats().OutputReserved != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("reservation never given back: %+v", r.srv.RateLimitStats())
		}
		time.Sleep(time.Millisecond)
	}
	if got := r.srv.RateLimitStats(); got.OutputTokens != 0 {
		t.Errorf("stats %+v, want nothing charged", got)
	}
}

// TestRateLimitAllOrNone: a request refused for output tokens takes no
// request and no input tokens; the message names the first bucket short.
func TestRateLimitAllOrNone(t *testing.T) {
	r := newRLRig(t, RateLimits{RequestsPerMinute: 10, InputTokensPerMinute: 10000, OutputTokensPerMinute: 100})
	r.srv.Script("long", OK().WithText(strings.Repeat("x", 360))) // 90 output tokens
	r.send(t, "long", withMax(90))
	in := r.lastInput()

	a := r.send(t, "", withMax(50)) // 10 left
	if a.status != 429 || !strings.Contains(a.apiErr.Message, "of 100 output tokens per minute") {
		t.Fatalf("status %d, err %v", a.status, a.apiErr)
	}
	wantHeaders(t, "429", a.header, map[string]string{
		"retry-after":                                 "24", // 40 tokens at 100/min
		"anthropic-ratelimit-requests-remaining":      "9",
		"anthropic-ratelimit-input-tokens-remaining":  itoa(10000 - in),
		"anthropic-ratelimit-output-tokens-remaining": "10",
		"anthropic-ratelimit-output-tokens-reset":     at(54 * time.Second), // 90 tokens
		"anthropic-ratelimit-tokens-remaining":        "10",
	})
	if got, want := r.srv.RateLimitStats(), (RateLimitStats{Admitted: 1, Limited: 1, InputTokens: in, OutputTokens: 90}); got != want {
		t.Errorf("stats %+v, want %+v", got, want)
	}
	r.clock.Advance(24 * time.Second)
	if a := r.send(t, "", withMax(50)); a.status != 200 {
		t.Fatalf("after retry-after: status %d", a.status)
	}

	// Short of requests (for 30 s) and output tokens (for 60 s) at once:
	// the message names requests, and retry-after covers both.
	r2 := newRLRig(t, RateLimits{RequestsPerMinute: 2, OutputTokensPerMinute: 60})
	r2.srv.Script("30", OK().WithText(strings.Repeat("x", 120))) // 30 output tokens
	r2.send(t, "30", withMax(30))
	r2.send(t, "30", withMax(30))
	refusals := []struct {
		advance    time.Duration
		unit       string
		retryAfter string
	}{
		{0, "of 2 requests per minute", "60"},
		{30 * time.Second, "of 60 output tokens per minute", "30"},
	}
	for _, want := range refusals {
		r2.clock.Advance(want.advance)
		a = r2.send(t, "", withMax(60))
		if a.status != 429 || !strings.Contains(a.apiErr.Message, want.unit) || a.header.Get("retry-after") != want.retryAfter {
			t.Errorf("+%v: status %d, retry-after %q, err %v; want 429 %q, retry-after %s", want.advance, a.status, a.header.Get("retry-after"), a.apiErr, want.unit, want.retryAfter)
		}
	}
	r2.clock.Advance(30 * time.Second)
	if a := r2.send(t, "", withMax(60)); a.status != 200 {
		t.Errorf("after retry-after: status %d", a.status)
	}
}

// TestRateLimitConcurrent: of many requests at one instant, exactly the
// limit's worth are admitted.
func TestRateLimitConcurrent(t *testing.T) {
	const rpm, n = 50, 200
	r := newRLRig(t, RateLimits{RequestsPerMinute: rpm, InputTokensPerMinute: 1_000_000, OutputTokensPerMinute: 1_000_000}, InMemory())
	var mu sync.Mutex
	statuses := map[int]int{}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			a := r.send(t, strconv.Itoa(i%7), params())
			mu.Lock()
			statuses[a.status]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if statuses[200] != rpm || statuses[429] != n-rpm {
		t.Errorf("statuses %v, want %d 200s and %d 429s", statuses, rpm, n-rpm)
	}
	limited := 0
	for _, q := range r.srv.Requests() {
		if q.RateLimited {
			limited++
		}
	}
	got := r.srv.RateLimitStats()
	if got.Admitted != rpm || got.Limited != n-rpm || limited != n-rpm || got.OutputTokens != rpm || got.OutputReserved != 0 {
		t.Errorf("stats %+v, %d marked in the log", got, limited)
	}
}

// TestRateLimitRealTime: without a fake clock the buckets run on real
// time.
func TestRateLimitRealTime(t *testing.T) {
	srv := NewServer(WithRateLimits(RateLimits{RequestsPerMinute: 1}))
	defer srv.Close()
	client := newClient(srv)
	if _, err := client.Messages.New(context.Background(), params()); err != nil {
		t.Fatal(err)
	}
	_, err := client.Messages.New(context.Background(), params())
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 429 || apiErr.Response.Header.Get("retry-after") != "60" {
		t.Fatalf("err = %v, want a 429 with retry-after 60", err)
	}
	reset, err := time.Parse(time.RFC3339, apiErr.Response.Header.Get("anthropic-ratelimit-requests-reset"))
	if d := time.Until(reset); err != nil || d < 58*time.Second || d > 61*time.Second {
		t.Errorf("reset %v (%v from now), err %v", reset, d, err)
	}
}

// TestRateLimitNotMessages: other endpoints are not limited.
func TestRateLimitNotMessages(t *testing.T) {
	r := newRLRig(t, RateLimits{RequestsPerMinute: 1})
	for range 3 {
		resp, err := http.Post(r.srv.URL()+"/v1/complete", "application/json", strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 404 || resp.Header.Get("anthropic-ratelimit-requests-limit") != "" {
			t.Errorf("status %d, headers %v", resp.StatusCode, resp.Header)
		}
	}
	if a := r.send(t, "", params()); a.status != 200 {
		t.Errorf("Messages after 404s: status %d", a.status)
	}
}

// TestRateLimitsInvalid: bad limits never panic; Validate names the field
// and value, and the server answers every Messages request with it.
func TestRateLimitsInvalid(t *testing.T) {
	tests := []struct {
		l    RateLimits
		want []string
	}{
		{RateLimits{RequestsPerMinute: -5}, []string{"RateLimits.RequestsPerMinute is -5"}},
		{RateLimits{InputTokensPerMinute: -1, OutputTokensPerMinute: maxRateLimit + 1},
			[]string{"RateLimits.InputTokensPerMinute is -1", "RateLimits.OutputTokensPerMinute is 1000000001"}},
		{RateLimits{TokenRounding: -1000}, []string{"RateLimits.TokenRounding is -1000"}},
	}
	for _, tt := range tests {
		err := tt.l.Validate()
		if err == nil {
			t.Errorf("%+v: Validate() = nil", tt.l)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%+v: Validate() = %q, want it to say %q", tt.l, err, w)
			}
		}
	}
	if err := (RateLimits{RequestsPerMinute: maxRateLimit, TokenRounding: 1000}).Validate(); err != nil {
		t.Errorf("valid limits: %v", err)
	}

	srv := NewServer(WithRateLimits(RateLimits{OutputTokensPerMinute: -8000}))
	defer srv.Close()
	srv.Script("s", OK().WithText("first step"))
	_, err := newClientPtr(srv).Messages.New(context.Background(), params(), Scenario("s"))
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 500 || !strings.Contains(apiErr.Message, "RateLimits.OutputTokensPerMinute is -8000") {
		t.Fatalf("err = %v, want a 500 naming the field", err)
	}
	if q := srv.Requests()[0]; q.RateLimited || q.N != 1 {
		t.Errorf("logged %+v", q)
	}
}
