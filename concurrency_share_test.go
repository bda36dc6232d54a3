package damper_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// shareTenant is a tenant of a share run: its weight and how many callers
// call for it without pause.
type shareTenant struct {
	name    string
	weight  int
	callers int
}

// shareRun runs, in a synctest bubble, a proxy in key mode with a
// concurrency limit of 4 slots in front of a fake API whose every answer
// takes 1 s, and tenants' callers, each sending its next call as its last
// one ends, for one minute; the callers of each tenant start after the
// previous tenant's have taken what they could. It returns, by tenant,
// the attempts the API got within the minute.
func shareRun(t *testing.T, tenants ...shareTenant) map[string]int {
	t.Helper()
	got := map[string]int{}
	synctest.Test(t, func(t *testing.T) {
		srv := dampertest.NewServer(dampertest.InMemory(), dampertest.WithStepFunc(func(dampertest.Request) dampertest.Step {
			return dampertest.Step{Delay: time.Second}
		}))
		defer srv.Close()
		d, err := damper.New(damper.Policy{MaxAttempts: 1, BackoffBase: damper.None,
			Concurrency: &damper.ConcurrencyPolicy{Max: 4, MaxWait: time.Minute}})
		if err != nil {
			t.Fatal(err)
		}
		cfg := damper.ProxyConfig{Upstream: dampertest.MemoryURL, Transport: dampertest.Transport(srv.Handler()), UpstreamAPIKey: authOperator}
		for _, ten := range tenants {
			cfg.Tenants = append(cfg.Tenants, damper.Tenant{Name: ten.name, Weight: ten.weight,
				KeySHA256: []string{damper.ClientKeyHash("dk-" + ten.name)}})
		}
		px, err := damper.NewProxy(d, cfg)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		var wg sync.WaitGroup
		for _, ten := range tenants {
			// The message names the tenant, for the API's log.
			body := strings.Replace(plainBody, `"hi"`, `"from `+ten.name+`"`, 1)
			for range ten.callers {
				wg.Go(func() {
					for time.Since(start) < time.Minute {
						req := httptest.NewRequest(http.MethodPost, "/v1/messages", strings.NewReader(body))
						req.Header.Set("X-Api-Key", "dk-"+ten.name)
						req.Header.Set("Anthropic-Version", "2023-06-01")
						req.Header.Set("Content-Type", "application/json")
						rec := httptest.NewRecorder()
						px.ServeHTTP(rec, req)
						if rec.Code != http.StatusOK {
							t.Errorf("tenant %s: status %d: %s", ten.name, rec.Code, rec.Body)
							return
						}
					}
				})
			}
			synctest.Wait()
		}
		wg.Wait()
		for _, r := range srv.Requests() {
			if !r.At.Before(start.Add(time.Minute)) {
				continue
			}
			for _, ten := range tenants {
				if bytes.Contains(r.Body, []byte(`"from `+ten.name+`"`)) {
					got[ten.name]++
				}
			}
		}
	})
	return got
}

// TestConcurrencyShareByWeight: two tenants of weights 3 and 1, each with
// more callers than the limit has slots, get the slots 3:1, though they
// have as many callers (first come, first served would give them 1:1).
// Tenant a's callers come first and take all 4 slots for the first
// second; from then on a holds 3 and b 1.
func TestConcurrencyShareByWeight(t *testing.T) {
	got := shareRun(t, shareTenant{"a", 3, 6}, shareTenant{"b", 1, 6})
	if got["a"] != 4+3*59 || got["b"] != 59 {
		t.Errorf("attempts admitted in a minute: %v, want a 181 (4 in the first second, then 3 a second) and b 59 (1 a second)", got)
	}
	if ratio := float64(got["a"]) / float64(got["b"]); ratio < 2.7 || ratio > 3.3 {
		t.Errorf("a:b = %.3f, want 3 ± 10%%", ratio)
	}
}

// TestConcurrencyShareLent: a tenant alone, however small its weight, gets
// every slot: the share of a tenant with no calls is lent.
func TestConcurrencyShareLent(t *testing.T) {
	got := shareRun(t, shareTenant{"a", 3, 0}, shareTenant{"b", 1, 6})
	if got["a"] != 0 || got["b"] != 4*60 {
		t.Errorf("attempts admitted in a minute: %v, want b all 4 slots each second: 240", got)
	}
}

// TestConcurrencyShareLeavesCallersOut: a tenant's share does not grow
// with its callers: 4 callers of a weight of 1 get as many slots as 12
// (first come, first served would give them a quarter).
func TestConcurrencyShareLeavesCallersOut(t *testing.T) {
	got := shareRun(t, shareTenant{"a", 1, 12}, shareTenant{"b", 1, 4})
	if got["a"] != 4+2*59 || got["b"] != 2*59 {
		t.Errorf("attempts admitted in a minute: %v, want a 122 and b 118 (2 slots each a second, after a's first 4)", got)
	}
}
