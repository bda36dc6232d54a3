package damper_test

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
)

// budgetsByTenant is a store that keeps its budgets in memory and each
// budget it made by the tenant it was made for ("" for the backend's own).
type budgetsByTenant struct {
	mu      sync.Mutex
	budgets map[string]fleet.Budget
}

func (s *budgetsByTenant) Budget(set fleet.BudgetSettings) (fleet.Budget, error) {
	b, err := fleet.MemoryStore{}.Budget(set)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.budgets[set.Tenant]; ok {
		return nil, nil // one budget per tenant: the test has one backend
	}
	s.budgets[set.Tenant] = b
	return b, nil
}

// available is the balance of the budget made for tenant.
func (s *budgetsByTenant) available(t *testing.T, tenant string, now time.Time) float64 {
	t.Helper()
	s.mu.Lock()
	b := s.budgets[tenant]
	s.mu.Unlock()
	if b == nil {
		t.Fatalf("no budget was made for tenant %q", tenant)
	}
	n, err := b.Available(context.Background(), now)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// tenantPost sends a Messages call whose message is text to px with
// tenant's key, and returns its status and the Damper-Attempts and
// Damper-Outcome headers.
func tenantPost(t *testing.T, px http.Handler, key, text string) (status int, attempts, outcome string) {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, "/v1/messages", strings.NewReader(strings.Replace(plainBody, `"hi"`, `"`+text+`"`, 1)))
	req.Header.Set("X-Api-Key", key)
	req.Header.Set("Anthropic-Version", "2023-06-01")
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	px.ServeHTTP(rec, req)
	return rec.Code, rec.Header().Get(damper.HeaderAttempts), rec.Header().Get(damper.HeaderOutcome)
}

// TestProxyTenantRetryBudgets: tenant b's calls meet an outage (529 at
// every attempt) and retry until b's budget is spent; tenant a's budget
// is whole afterwards, and a's call that fails once still gets its retry.
// The budget of calls without a tenant is untouched. Budgets start with
// 10 units and earn nothing here (no first attempt of the storm answers).
func TestProxyTenantRetryBudgets(t *testing.T) {
	clock := dampertest.NewClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	var flaky sync.Once
	srv := dampertest.NewServer(dampertest.InMemory(), dampertest.WithClock(clock),
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
	defer srv.Close()
	store := &budgetsByTenant{budgets: map[string]fleet.Budget{}}
	d, err := damper.New(damper.Policy{MaxAttempts: 5, BackoffBase: damper.None},
		damper.WithClock(clock), damper.WithStore(store))
	if err != nil {
		t.Fatal(err)
	}
	px, err := damper.NewProxy(d, damper.ProxyConfig{
		Upstream: dampertest.MemoryURL, Transport: dampertest.Transport(srv.Handler()), UpstreamAPIKey: authOperator,
		Tenants: []damper.Tenant{
			{Name: "a", KeySHA256: []string{damper.ClientKeyHash("dk-a")}},
			{Name: "b", KeySHA256: []string{damper.ClientKeyHash("dk-b")}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	// b's storm: 4 retries, 4 retries, then 2 and the budget is spent.
	for i, want := range []struct{ attempts, outcome string }{
		{"5", string(damper.OutcomeAttemptsExhausted)},
		{"5", string(damper.OutcomeAttemptsExhausted)},
		{"3", string(damper.OutcomeBudgetExhausted)},
		{"1", string(damper.OutcomeBudgetExhausted)},
	} {
		status, attempts, outcome := tenantPost(t, px, "dk-b", "outage")
		if status != 529 || attempts != want.attempts || outcome != want.outcome {
			t.Errorf("b's call %d: %d after %s attempts, outcome %s; want 529 after %s, %s", i+1, status, attempts, outcome, want.attempts, want.outcome)
		}
	}
	now := clock.Now()
	for tenant, want := range map[string]float64{"a": 10, "b": 0, "": 10} {
		if got := store.available(t, tenant, now); got != want {
			t.Errorf("after b's storm, the budget of tenant %q has %v units, want %v", tenant, got, want)
		}
	}
	status, attempts, outcome := tenantPost(t, px, "dk-a", "flaky")
	if status != 200 || attempts != "2" || outcome != string(damper.OutcomeSuccess) {
		t.Errorf("a's call: %d after %s attempts, outcome %s; want 200 at its retry", status, attempts, outcome)
	}
	for tenant, want := range map[string]float64{"a": 9, "b": 0, "": 10} {
		if got := store.available(t, tenant, now); got != want {
			t.Errorf("after a's call, the budget of tenant %q has %v units, want %v", tenant, got, want)
		}
	}
	if n := srv.Count(""); n != 5+5+3+1+2 {
		t.Errorf("the API got %d requests, want 16", n)
	}
}
