package redisstore_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/redistest"
	"github.com/damper-ai/damper-go/redisstore"
)

// TestFleetTenantRetryBudgets: three proxies in key mode, three Dampers
// of one Name on one Redis and one virtual clock, serve tenants a and b.
// b's calls, spread over the three, meet an outage (529 at every attempt)
// and retry until b's budget, one for the fleet, is spent: 10 units, as
// many as one process would allow. a's budget in Redis is untouched, and
// a's call that fails once still gets its retry; the budget of calls
// without a tenant is untouched too.
func TestFleetTenantRetryBudgets(t *testing.T) {
	const name = "tenant-fleet"
	srv := redistest.Start(t)
	clock := dampertest.NewClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	var flaky sync.Once
	api := dampertest.NewServer(dampertest.InMemory(), dampertest.WithClock(clock),
		dampertest.WithStepFunc(func(r dampertest.Request) dampertest.Step {
			switch {
			case bytes.Contains(r.Body, []byte(`"outage"`)):
				return dampertest.Status(529)
			case bytes.Contains(r.Body, []byte(`"flaky"`)):
				fail := false
				flaky.Do(func() { fail = true })
				if fail {
					return dampertest.Status(529)
				}
			}
			return dampertest.OK()
		}))
	t.Cleanup(api.Close)
	const upstreamKey = "sk-ant-api03-operator"
	tenants := []damper.Tenant{
		{Name: "a", KeySHA256: []string{damper.ClientKeyHash("dk-a")}},
		{Name: "b", KeySHA256: []string{damper.ClientKeyHash("dk-b")}},
	}
	var (
		stores  []*redisstore.Store
		proxies []*damper.Proxy
	)
	for range 3 {
		store := newStore(t, newClient1(t, srv.Addr), name)
		d, err := damper.New(damper.Policy{MaxAttempts: 5, BackoffBase: damper.None},
			damper.WithClock(clock), damper.WithStore(store), damper.WithName(name))
		if err != nil {
			t.Fatal(err)
		}
		px, err := damper.NewProxy(d, damper.ProxyConfig{Upstream: dampertest.MemoryURL,
			Transport: dampertest.Transport(api.Handler()), UpstreamAPIKey: upstreamKey, Tenants: tenants})
		if err != nil {
			t.Fatal(err)
		}
		stores, proxies = append(stores, store), append(proxies, px)
	}
	post := func(px *damper.Proxy, key, text string) (status int, attempts, outcome string) {
		req := httptest.NewRequest(http.MethodPost, "/v1/messages", strings.NewReader(
			`{"model":"claude-sonnet-4-6","max_tokens":64,"messages":[{"role":"user","content":"`+text+`"}]}`))
		req.Header.Set("X-Api-Key", key)
		req.Header.Set("Anthropic-Version", "2023-06-01")
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		px.ServeHTTP(rec, req)
		return rec.Code, rec.Header().Get("Damper-Attempts"), rec.Header().Get("Damper-Outcome")
	}
	ctx := context.Background()
	flush := func() {
		for _, s := range stores {
			if err := s.Flush(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	rdb := newClient1(t, srv.Addr)
	// available is the balance of tenant's budget in Redis, as a process
	// that has spent none of it reads it.
	reader := newStore(t, rdb, name)
	available := func(tenant string) float64 {
		t.Helper()
		b, err := reader.Budget(fleet.BudgetSettings{Ratio: 0.1, Window: time.Minute, MinTokens: 10, Tenant: tenant})
		if err != nil {
			t.Fatal(err)
		}
		n, err := b.Available(ctx, clock.Now())
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	exists := func(tenant string) bool {
		t.Helper()
		n, err := rdb.Exists(ctx, redisstore.TenantKey(name, tenant)).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n == 1
	}

	// b's storm, one proxy after the other: 4 retries, 4, then 2 and the
	// fleet's budget for b is spent.
	for i, want := range []struct{ attempts, outcome string }{
		{"5", string(damper.OutcomeAttemptsExhausted)},
		{"5", string(damper.OutcomeAttemptsExhausted)},
		{"3", string(damper.OutcomeBudgetExhausted)},
		{"1", string(damper.OutcomeBudgetExhausted)},
	} {
		status, attempts, outcome := post(proxies[i%3], "dk-b", "outage")
		if status != 529 || attempts != want.attempts || outcome != want.outcome {
			t.Errorf("b's call %d, through proxy %d: %d after %s attempts, outcome %s; want 529 after %s, %s",
				i+1, i%3, status, attempts, outcome, want.attempts, want.outcome)
		}
	}
	flush()
	if !exists("b") || exists("a") || exists("") {
		t.Errorf("after b's storm, keys in Redis: b's %v, a's %v, the untenanted budget's %v; want b's alone",
			exists("b"), exists("a"), exists(""))
	}
	for tenant, want := range map[string]float64{"a": 10, "b": 0, "": 10} {
		if got := available(tenant); got != want {
			t.Errorf("after b's storm, the fleet's budget of tenant %q has %v units, want %v", tenant, got, want)
		}
	}
	status, attempts, outcome := post(proxies[1], "dk-a", "flaky")
	if status != 200 || attempts != "2" || outcome != string(damper.OutcomeSuccess) {
		t.Errorf("a's call: %d after %s attempts, outcome %s; want 200 at its retry", status, attempts, outcome)
	}
	flush()
	for tenant, want := range map[string]float64{"a": 9, "b": 0, "": 10} {
		if got := available(tenant); got != want {
			t.Errorf("after a's call, the fleet's budget of tenant %q has %v units, want %v", tenant, got, want)
		}
	}
	if n := api.Count(""); n != 5+5+3+1+2 {
		t.Errorf("the API got %d requests, want 16", n)
	}
}
