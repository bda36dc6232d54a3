package damper_test

import (
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// A share run: two tenants of one proxy in key mode, alpha of weight 3
// and beta of weight 1, calling in turn, one call every 200 ms in all
// (150 a minute each, 2.5 times the limit), against a fake API that
// enforces 60 requests a minute, on a virtual clock; the limiter never
// waits. The first minute warms up (the limit is learned, the buckets
// drain); the second is counted.
const (
	shareRPM  = 60
	shareTick = 200 * time.Millisecond
	shareBody = `{"model":"claude-sonnet-4-6","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`
)

// shareCounts is what one run admitted in its counted minute, by tenant,
// and the API's own 429s over the whole run.
type shareCounts struct {
	alpha, beta int
	api429      int
}

// newShareProxy returns a proxy in key mode for alpha (weight 3) and beta
// (weight 1) on a fake API that enforces the limit of rl, and its clock;
// the limiter never waits.
func newShareProxy(t *testing.T, rl damper.RateLimitPolicy) (*damper.Proxy, *dampertest.Clock, *dampertest.Server) {
	t.Helper()
	clock := dampertest.NewClock(time.Now().UTC().Truncate(time.Second))
	api := dampertest.NewServer(dampertest.InMemory(), dampertest.WithClock(clock),
		dampertest.WithRateLimits(dampertest.RateLimits{RequestsPerMinute: shareRPM, OutputTokensPerMinute: 100_000}))
	t.Cleanup(api.Close)
	rl.MaxWait = damper.None
	d, err := damper.New(damper.Policy{MaxAttempts: 1, RateLimit: &rl}, damper.WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	px, err := damper.NewProxy(d, damper.ProxyConfig{
		Upstream: dampertest.MemoryURL, Transport: dampertest.Transport(api.Handler()), UpstreamAPIKey: "test-key",
		Tenants: []damper.Tenant{
			{Name: "alpha", Weight: 3, KeySHA256: []string{damper.ClientKeyHash("dk-alpha")}},
			{Name: "beta", Weight: 1, KeySHA256: []string{damper.ClientKeyHash("dk-beta")}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return px, clock, api
}

// shareCall makes one call through px with key and returns the answer.
func shareCall(px *damper.Proxy, key string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/v1/messages", strings.NewReader(shareBody))
	req.Header.Set("X-Api-Key", key)
	req.Header.Set("Anthropic-Version", "2023-06-01")
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	px.ServeHTTP(rec, req)
	return rec
}

// runShares runs the proxy with tenants of the given weights; betaCalls
// says whether beta calls at all.
func runShares(t *testing.T, betaCalls bool) shareCounts {
	t.Helper()
	px, clock, api := newShareProxy(t, damper.RateLimitPolicy{})
	var c shareCounts
	start := clock.Now()
	for n := 0; clock.Now().Sub(start) < 2*time.Minute; n++ {
		key, count := "dk-alpha", &c.alpha
		if n%2 == 1 {
			key, count = "dk-beta", &c.beta
		}
		if key == "dk-beta" && !betaCalls {
			clock.Advance(shareTick)
			continue
		}
		rec := shareCall(px, key)
		switch {
		case rec.Code == http.StatusOK:
			if clock.Now().Sub(start) >= time.Minute {
				*count++
			}
		case rec.Code == http.StatusTooManyRequests && strings.Contains(rec.Body.String(), "rate limit"):
		default:
			t.Fatalf("call %d (%s): status %d: %s", n, key, rec.Code, rec.Body)
		}
		clock.Advance(shareTick)
	}
	c.api429 = api.RateLimitStats().Limited
	return c
}

// TestTenantSharesOneProcess: two tenants of weights 3 and 1, each
// offering 2.5 times the limit in turn, get 3:1 of the learned limit, not
// the 1:1 of arrival order; with beta idle, alpha gets the whole limit.
func TestTenantSharesOneProcess(t *testing.T) {
	both := runShares(t, true)
	t.Logf("both calling: alpha %d, beta %d a minute (limit %d); %d 429s from the API", both.alpha, both.beta, shareRPM, both.api429)
	if ratio := float64(both.alpha) / float64(max(both.beta, 1)); math.Abs(ratio-3) > 0.3 {
		t.Errorf("alpha %d, beta %d: ratio %.2f, want 3 ± 10 %%", both.alpha, both.beta, ratio)
	}
	if both.alpha != 45 || both.beta != 15 || both.api429 != 0 {
		t.Errorf("alpha %d, beta %d, %d 429s from the API; want 45, 15 and 0", both.alpha, both.beta, both.api429)
	}
	alone := runShares(t, false)
	t.Logf("beta idle: alpha %d a minute (limit %d)", alone.alpha, shareRPM)
	if float64(alone.alpha) < 0.95*shareRPM || alone.api429 != 0 {
		t.Errorf("beta idle: alpha got %d, want at least 95 %% of %d; %d 429s from the API", alone.alpha, shareRPM, alone.api429)
	}
}

// TestTenantShareRefusal: under a configured limit of 60 a minute, with
// alpha active, beta's share is a quarter of a minute: 15 calls, and one
// more into debt; the next is refused as rate_limited with the wait its
// share needs (4 s), though the group's buckets hold 43 more. A call its
// share admits and the group's buckets refuse gives its share back:
// twenty of them cost alpha nothing.
func TestTenantShareRefusal(t *testing.T) {
	px, clock, api := newShareProxy(t, damper.RateLimitPolicy{Limits: map[string]damper.RateLimits{
		"claude-sonnet-4": {RequestsPerMinute: shareRPM}}})
	want := func(key string, n, status int, retryAfterMs string) {
		t.Helper()
		for i := range n {
			rec := shareCall(px, key)
			if rec.Code != status || rec.Header().Get("Retry-After-Ms") != retryAfterMs {
				t.Fatalf("%s, call %d of %d: status %d, retry-after-ms %q; want %d, %q: %s",
					key, i+1, n, rec.Code, rec.Header().Get("Retry-After-Ms"), status, retryAfterMs, rec.Body)
			}
		}
	}
	want("dk-alpha", 1, http.StatusOK, "")
	want("dk-beta", 16, http.StatusOK, "")
	want("dk-beta", 1, http.StatusTooManyRequests, "4000") // its share: 1/60 below 0
	// alpha's share, 3/4 now, holds 45 and one more; the group's buckets
	// hold 43.
	want("dk-alpha", 43, http.StatusOK, "")
	if got := api.RateLimitStats().Admitted; got != shareRPM {
		t.Fatalf("the API admitted %d, want %d", got, shareRPM)
	}
	// Its share takes, the group's buckets refuse for a second, and the
	// share goes back: else the fourth would wait 4/3 s for the share.
	want("dk-alpha", 20, http.StatusTooManyRequests, "1000")
	clock.Advance(time.Second)
	want("dk-alpha", 1, http.StatusOK, "")
	clock.Advance(3 * time.Second)
	want("dk-beta", 1, http.StatusOK, "")
}
