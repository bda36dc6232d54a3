package damper_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
	"github.com/damper-ai/damper-go/internal/syncbuf"
)

// ceilingPrices prices "ceiling-model" at $3 per million input tokens and
// $15 per million output tokens: cache writes $3.75, cache reads $0.30.
func ceilingPrices(t *testing.T) *damper.PriceTable {
	t.Helper()
	pt, err := damper.NewPriceTable("test", map[string]damper.Price{"ceiling-model": {InputPerMTok: 3, OutputPerMTok: 15}})
	if err != nil {
		t.Fatal(err)
	}
	return pt
}

// usageAPI is a fake API whose answers report the usage a request's
// message names ("in=100000 cw=40000 cr=200000 out=20000"), plain or
// streamed (input and cache in message_start, output in message_delta).
type usageAPI struct{ requests atomic.Int64 }

var usageField = regexp.MustCompile(`\b(in|cw|cr|out)=(\d+)`)

func (u *usageAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.requests.Add(1)
	body, _ := io.ReadAll(r.Body)
	var req struct {
		Stream bool `json:"stream"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	n := map[string]string{"in": "0", "cw": "0", "cr": "0", "out": "0"}
	for _, m := range usageField.FindAllStringSubmatch(string(body), -1) {
		n[m[1]] = m[2]
	}
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"msg_1","type":"message","role":"assistant","model":"ceiling-model","content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn",`+
			`"usage":{"input_tokens":`+n["in"]+`,"cache_creation_input_tokens":`+n["cw"]+`,"cache_read_input_tokens":`+n["cr"]+`,"output_tokens":`+n["out"]+`}}`)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	io.WriteString(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"ceiling-model\",\"content\":[],"+
		"\"usage\":{\"input_tokens\":"+n["in"]+",\"cache_creation_input_tokens\":"+n["cw"]+",\"cache_read_input_tokens\":"+n["cr"]+",\"output_tokens\":1}}}\n\n"+
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"+
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"ok\"}}\n\n"+
		"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n"+
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":"+n["out"]+"}}\n\n"+
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
}

// ceilingCall sends a Messages call with key to the proxy at url, its
// message usage (see usageAPI), and returns the answer and its body.
func ceilingCall(t *testing.T, url, key, usage string, stream bool) (*http.Response, string) {
	t.Helper()
	s := ""
	if stream {
		s = `"stream":true,`
	}
	req, err := http.NewRequest(http.MethodPost, url+"/v1/messages",
		strings.NewReader(`{"model":"ceiling-model","max_tokens":64,`+s+`"messages":[{"role":"user","content":"`+usage+`"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Api-Key", key)
	req.Header.Set("Anthropic-Version", "2023-06-01")
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, string(b)
}

// ceilingTenants are tenant "a", whose daily cost ceiling is $1, and "b",
// whose ceiling is $100.
func ceilingTenants() []damper.Tenant {
	return []damper.Tenant{
		{Name: "a", KeySHA256: []string{damper.ClientKeyHash("dk-a")}, DailyCostUSD: 1},
		{Name: "b", KeySHA256: []string{damper.ClientKeyHash("dk-b")}, DailyCostUSD: 100},
	}
}

// wantCeilingRefusal checks that res, body is tenant a's refusal at
// $spent, an hour before the day's end.
func wantCeilingRefusal(t *testing.T, res *http.Response, body, spent string) {
	t.Helper()
	if res.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429: %s", res.StatusCode, body)
	}
	want := `{"type":"error","error":{"type":"rate_limit_error","message":"damper proxy: tenant \"a\" reached its daily cost ceiling of $1.00 ($` + spent +
		` spent today, UTC): it resets at 2026-12-08T00:00:00Z"}}`
	if body != want {
		t.Errorf("body\n%s\nwant\n%s", body, want)
	}
	if got := [2]string{res.Header.Get("Retry-After"), res.Header.Get("Retry-After-Ms")}; got != [2]string{"3600", "3600000"} {
		t.Errorf("retry-after, retry-after-ms = %q, want 3600 s to the reset", got)
	}
	if res.Header.Get("X-Should-Retry") != "false" {
		t.Errorf("x-should-retry %q, want false", res.Header.Get("X-Should-Retry"))
	}
}

// TestProxyTenantDailyCostCeiling: tenant a's calls, plain and streamed,
// are priced from their answers' usage; once a has spent its ceiling it
// gets 429 rate_limit_error saying which ceiling and when it resets, and
// nothing is sent upstream; b is served all along; at 00:00 UTC on the
// Damper's clock a is served again.
func TestProxyTenantDailyCostCeiling(t *testing.T) {
	clock := dampertest.NewClock(time.Date(2026, 12, 7, 23, 0, 0, 0, time.UTC))
	api := &usageAPI{}
	up := httptest.NewServer(api)
	t.Cleanup(up.Close)
	d, err := damper.New(damper.Policy{MaxAttempts: 1, BackoffBase: damper.None, PriceTable: ceilingPrices(t)}, damper.WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncbuf.Buffer{}
	px, err := damper.NewProxy(d, damper.ProxyConfig{Upstream: up.URL, UpstreamAPIKey: authOperator, Tenants: ceilingTenants(),
		Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(px)
	t.Cleanup(srv.Close)

	// $0.30 input + $0.15 cache writes + $0.06 cache reads + $0.30 output.
	if res, body := ceilingCall(t, srv.URL, "dk-a", "in=100000 cw=40000 cr=200000 out=20000", false); res.StatusCode != 200 {
		t.Fatalf("a's first call: %d %s", res.StatusCode, body)
	}
	// $0.81 of $1: a's stream is served, $0.15 input + $0.15 output.
	res, body := ceilingCall(t, srv.URL, "dk-a", "in=50000 out=10000", true)
	if res.StatusCode != 200 || !strings.Contains(body, "message_stop") {
		t.Fatalf("a's stream: %d %s", res.StatusCode, body)
	}
	if n := api.requests.Load(); n != 2 {
		t.Fatalf("upstream got %d requests, want 2", n)
	}

	// $1.11 of $1: refused, on every path, with nothing sent.
	res, body = ceilingCall(t, srv.URL, "dk-a", "in=1", false)
	wantCeilingRefusal(t, res, body, "1.11")
	res, body = ceilingCall(t, srv.URL, "dk-a", "in=1", true)
	wantCeilingRefusal(t, res, body, "1.11")
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/messages/count_tokens", strings.NewReader(`{}`))
	req.Header.Set("X-Api-Key", "dk-a")
	pres, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	pres.Body.Close()
	if pres.StatusCode != http.StatusTooManyRequests {
		t.Errorf("a's count_tokens: status %d, want 429", pres.StatusCode)
	}
	if n := api.requests.Load(); n != 2 {
		t.Fatalf("upstream got %d requests, want 2: a's refused calls reached it", n)
	}
	logged := 0
	for line := range strings.Lines(logs.String()) {
		if strings.Contains(line, `"status":429,`) && strings.Contains(line, `"tenant":"a"`) {
			logged++
		}
	}
	if logged != 3 {
		t.Errorf("%d log lines of a's 429, want 3:\n%s", logged, logs.String())
	}

	// b has a ceiling of its own, and is served.
	for i := range 3 {
		if res, body := ceilingCall(t, srv.URL, "dk-b", "in=1000000 out=100000", i == 1); res.StatusCode != 200 {
			t.Fatalf("b's call %d: %d %s", i, res.StatusCode, body)
		}
	}

	// A minute before the day's end a is still refused; at its end, served.
	clock.Advance(59 * time.Minute)
	if res, body := ceilingCall(t, srv.URL, "dk-a", "in=1", false); res.StatusCode != 429 || res.Header.Get("Retry-After") != "60" {
		t.Fatalf("a a minute before the reset: %d, retry-after %q: %s", res.StatusCode, res.Header.Get("Retry-After"), body)
	}
	clock.Advance(time.Minute)
	if res, body := ceilingCall(t, srv.URL, "dk-a", "in=1", false); res.StatusCode != 200 {
		t.Fatalf("a after the reset: %d %s", res.StatusCode, body)
	}
	if n := api.requests.Load(); n != 6 {
		t.Errorf("upstream got %d requests, want 6", n)
	}
}

// TestReportUsage: a call's report carries its answer's usage, plain and
// streamed, when the caller reads the report, with no rate limiter and no
// metrics.
func TestReportUsage(t *testing.T) {
	d := newDamper(t, damper.Policy{MaxAttempts: 1})
	client := memClient(d, &usageAPI{})
	p := anthropic.MessageNewParams{Model: "ceiling-model", MaxTokens: 64,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("in=7 cw=11 cr=13 out=17"))}}
	var rep damper.Report
	if _, err := client.Messages.New(context.Background(), p, damper.ReportInto(&rep)); err != nil {
		t.Fatal(err)
	}
	want := damper.Usage{InputTokens: 7, CacheCreationInputTokens: 11, CacheReadInputTokens: 13, OutputTokens: 17, Known: true}
	if rep.Usage != want {
		t.Errorf("plain: Usage %+v, want %+v", rep.Usage, want)
	}
	var srep damper.Report
	stream := client.Messages.NewStreaming(context.Background(), p, damper.ReportInto(&srep))
	for stream.Next() {
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	stream.Close()
	if srep.Usage != want || srep.Outcome != damper.OutcomeSuccess {
		t.Errorf("stream: Usage %+v, outcome %q, want %+v, success", srep.Usage, srep.Outcome, want)
	}
}
