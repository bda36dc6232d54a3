package redisstore_test

import (
	"context"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
	"github.com/damper-ai/damper-go/internal/redistest"
	"github.com/damper-ai/damper-go/redisstore"
)

// A share fleet: three proxies in key mode on one Redis and one virtual
// clock, each with the tenants alpha (weight 3) and beta (weight 1), in
// front of one fake API that enforces 60 requests a minute. The tenants
// call in turn, one call every 200 ms in all (150 a minute each, 2.5
// times the limit), each through the proxies its route lists, in turn;
// the limiters never wait. The first minute warms up; the second is
// counted.
const (
	shareFleetRPM  = 60
	shareFleetTick = 200 * time.Millisecond
	shareFleetBody = `{"model":"claude-sonnet-4-6","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`
)

// shareFleet is what one run admitted in its counted minute, by tenant,
// and the API's own 429s over the whole run.
type shareFleet struct {
	alpha, beta, api429 int
}

// runShareFleet runs the fleet on the Redis at addr under the key name
// name; alpha and beta list the proxies each tenant calls (none: it stays
// idle).
func runShareFleet(t *testing.T, addr, name string, alpha, beta []int) shareFleet {
	t.Helper()
	clock := dampertest.NewClock(rlFleetStart)
	api := dampertest.NewServer(dampertest.InMemory(), dampertest.WithClock(clock),
		dampertest.WithRateLimits(dampertest.RateLimits{RequestsPerMinute: shareFleetRPM, OutputTokensPerMinute: 100_000}))
	t.Cleanup(api.Close)
	proxies := make([]*damper.Proxy, 3)
	stores := make([]*redisstore.Store, len(proxies))
	for i := range proxies {
		stores[i] = newStore(t, newClient1(t, addr), name)
		d, err := damper.New(damper.Policy{MaxAttempts: 1, RateLimit: &damper.RateLimitPolicy{MaxWait: damper.None}},
			damper.WithClock(clock), damper.WithStore(stores[i]))
		if err != nil {
			t.Fatal(err)
		}
		if proxies[i], err = damper.NewProxy(d, damper.ProxyConfig{
			Upstream: dampertest.MemoryURL, Transport: dampertest.Transport(api.Handler()), UpstreamAPIKey: "test-key",
			Tenants: []damper.Tenant{
				{Name: "alpha", Weight: 3, KeySHA256: []string{damper.ClientKeyHash("dk-alpha")}},
				{Name: "beta", Weight: 1, KeySHA256: []string{damper.ClientKeyHash("dk-beta")}},
			},
		}); err != nil {
			t.Fatal(err)
		}
	}
	var r shareFleet
	start := clock.Now()
	sent := [2]int{}
	for n := 0; clock.Now().Sub(start) < 2*time.Minute; n++ {
		who := n % 2
		key, route, count := "dk-alpha", alpha, &r.alpha
		if who == 1 {
			key, route, count = "dk-beta", beta, &r.beta
		}
		if len(route) == 0 {
			clock.Advance(shareFleetTick)
			continue
		}
		px := proxies[route[sent[who]%len(route)]]
		sent[who]++
		req := httptest.NewRequest(http.MethodPost, "/v1/messages", strings.NewReader(shareFleetBody))
		req.Header.Set("X-Api-Key", key)
		req.Header.Set("Anthropic-Version", "2023-06-01")
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		px.ServeHTTP(rec, req)
		// The call's records (the share's and the limiter's settles) reach
		// Redis before the next call, as the tick between calls lets them
		// in real time; the virtual clock leaves them none, and one a batch
		// late changes what the next call, on another proxy, is admitted.
		for _, s := range stores {
			if err := s.Flush(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		switch {
		case rec.Code == http.StatusOK:
			if clock.Now().Sub(start) >= time.Minute {
				*count++
			}
		case rec.Code == http.StatusTooManyRequests && strings.Contains(rec.Body.String(), "rate limit"):
		default:
			t.Fatalf("call %d (%s): status %d: %s", n, key, rec.Code, rec.Body)
		}
		clock.Advance(shareFleetTick)
	}
	r.api429 = api.RateLimitStats().Limited
	return r
}

// TestFleetTenantShares: three proxies on one Redis give tenants of
// weights 3 and 1, each offering 2.5 times the limit, 3:1 of the learned
// limit, whichever proxies each calls: every one in turn, or alpha only
// the first and beta only the two others; with beta idle, alpha gets the
// whole limit.
func TestFleetTenantShares(t *testing.T) {
	addr := redistest.Start(t).Addr
	for _, c := range []struct {
		name        string
		alpha, beta []int
		want        shareFleet
	}{
		{"all proxies", []int{0, 1, 2}, []int{0, 1, 2}, shareFleet{alpha: 45, beta: 15}},
		{"apart", []int{0}, []int{1, 2}, shareFleet{alpha: 45, beta: 15}},
		{"beta idle", []int{0, 1, 2}, nil, shareFleet{alpha: 60}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := runShareFleet(t, addr, strings.ReplaceAll(c.name, " ", "-"), c.alpha, c.beta)
			t.Logf("alpha %d, beta %d a minute (limit %d); %d 429s from the API", got.alpha, got.beta, shareFleetRPM, got.api429)
			if c.beta != nil {
				if ratio := float64(got.alpha) / float64(max(got.beta, 1)); math.Abs(ratio-3) > 0.3 {
					t.Errorf("alpha %d, beta %d: ratio %.2f, want 3 ± 10 %%", got.alpha, got.beta, ratio)
				}
			} else if float64(got.alpha) < 0.95*shareFleetRPM {
				t.Errorf("beta idle: alpha got %d, want at least 95 %% of %d", got.alpha, shareFleetRPM)
			}
			if got != c.want {
				t.Errorf("got %+v, want %+v", got, c.want)
			}
		})
	}
}
