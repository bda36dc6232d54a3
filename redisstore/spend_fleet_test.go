package redisstore_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
	"github.com/damper-ai/damper-go/internal/redistest"
	"github.com/damper-ai/damper-go/redisstore"
)

// spendAPI is a fake API whose answers report 100,000 input and 20,000
// output tokens, plain or streamed (output in message_delta): $0.60 at
// the test's prices.
type spendAPI struct{ requests atomic.Int64 }

func (u *spendAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.requests.Add(1)
	body, _ := io.ReadAll(r.Body)
	if !strings.Contains(string(body), `"stream":true`) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"msg_1","type":"message","role":"assistant","model":"ceiling-model","content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","usage":{"input_tokens":100000,"output_tokens":20000}}`)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	io.WriteString(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"ceiling-model\",\"content\":[],\"usage\":{\"input_tokens\":100000,\"output_tokens\":1}}}\n\n"+
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"+
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"ok\"}}\n\n"+
		"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n"+
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":20000}}\n\n"+
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
}

// TestSpendCeilingFleet: three proxies on one Redis and one virtual
// clock. Tenant a's spend through the first two, a plain call and a
// stream of $0.60 each, past its $1 ceiling, refuses a at all three until
// 00:00 UTC, with nothing sent; b is served everywhere.
func TestSpendCeilingFleet(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	clock := dampertest.NewClock(time.Date(2026, 12, 7, 23, 30, 0, 0, time.UTC))
	prices, err := damper.NewPriceTable("test", map[string]damper.Price{"ceiling-model": {InputPerMTok: 3, OutputPerMTok: 15}})
	if err != nil {
		t.Fatal(err)
	}
	api := &spendAPI{}
	up := httptest.NewServer(api)
	t.Cleanup(up.Close)
	var urls []string
	var stores []*redisstore.Store
	for range 3 {
		store := thrStore(t, newClient1(t, srv.Addr), redisstore.Options{Name: "ceiling-fleet", Timeout: 5 * time.Second})
		stores = append(stores, store)
		d, err := damper.New(damper.Policy{MaxAttempts: 1, BackoffBase: damper.None, PriceTable: prices},
			damper.WithClock(clock), damper.WithStore(store), damper.WithName("ceiling-fleet"))
		if err != nil {
			t.Fatal(err)
		}
		px, err := damper.NewProxy(d, damper.ProxyConfig{Upstream: up.URL, UpstreamAPIKey: "sk-ant-operator", Tenants: []damper.Tenant{
			{Name: "a", KeySHA256: []string{damper.ClientKeyHash("dk-a")}, DailyCostUSD: 1},
			{Name: "b", KeySHA256: []string{damper.ClientKeyHash("dk-b")}, DailyCostUSD: 1000},
		}})
		if err != nil {
			t.Fatal(err)
		}
		s := httptest.NewServer(px)
		t.Cleanup(s.Close)
		urls = append(urls, s.URL)
	}
	call := func(i int, key string, stream bool) (*http.Response, string) {
		t.Helper()
		body := `{"model":"ceiling-model","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`
		if stream {
			body = strings.Replace(body, `"max_tokens":64,`, `"max_tokens":64,"stream":true,`, 1)
		}
		req, _ := http.NewRequest(http.MethodPost, urls[i]+"/v1/messages", strings.NewReader(body))
		req.Header.Set("X-Api-Key", key)
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		mustNil(t, stores[i].Flush(ctx)) // the spend reaches Redis before another proxy asks
		return res, string(b)
	}

	if res, body := call(0, "dk-a", false); res.StatusCode != 200 {
		t.Fatalf("a at proxy 0: %d %s", res.StatusCode, body)
	}
	if res, body := call(1, "dk-a", true); res.StatusCode != 200 || !strings.Contains(body, "message_stop") {
		t.Fatalf("a's stream at proxy 1: %d %s", res.StatusCode, body)
	}
	want := `{"type":"error","error":{"type":"rate_limit_error","message":"damper proxy: tenant \"a\" reached its daily cost ceiling of $1.00 ($1.20 spent today, UTC): it resets at 2026-12-08T00:00:00Z"}}`
	for i := range 3 {
		res, body := call(i, "dk-a", false)
		if res.StatusCode != 429 || body != want || res.Header.Get("Retry-After") != "1800" || res.Header.Get("Retry-After-Ms") != "1800000" {
			t.Errorf("a at proxy %d: %d, retry-after %q/%q, %s; want 429 for 1800 s, %s", i, res.StatusCode,
				res.Header.Get("Retry-After"), res.Header.Get("Retry-After-Ms"), body, want)
		}
	}
	if n := api.requests.Load(); n != 2 {
		t.Fatalf("upstream got %d requests, want 2: a's refused calls reached it", n)
	}
	for i := range 3 {
		if res, body := call(i, "dk-b", i == 2); res.StatusCode != 200 {
			t.Errorf("b at proxy %d: %d %s", i, res.StatusCode, body)
		}
	}
	if v, err := newClient1(t, srv.Addr).Get(ctx, "damper:{ceiling-fleet}:spend:b:2026-12-07").Result(); err != nil || v != "1800000000" {
		t.Errorf("b's count in Redis = %q, %v; want 1800000000 nanodollars", v, err)
	}

	// 00:00 UTC: a new day, for every proxy, and a spends it again.
	clock.Advance(30 * time.Minute)
	for _, i := range []int{2, 0} {
		if res, body := call(i, "dk-a", false); res.StatusCode != 200 {
			t.Errorf("a at proxy %d after the reset: %d %s", i, res.StatusCode, body)
		}
	}
	res, body := call(1, "dk-a", false)
	if res.StatusCode != 429 || !strings.Contains(body, "($1.20 spent today, UTC): it resets at 2026-12-09T00:00:00Z") {
		t.Errorf("a at proxy 1 past the new day's ceiling: %d %s", res.StatusCode, body)
	}
	if n := api.requests.Load(); n != 7 {
		t.Errorf("upstream got %d requests, want 7", n)
	}
}
