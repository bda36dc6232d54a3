package damper_test

import (
	"math/rand/v2"
	"net/http"
	"runtime"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// soakProfiles are the Dampers of the in-memory soak: defaults with limits
// on stalls; many cheap retries under a cost ceiling and a small, fast
// budget window; two attempts, a small hold-back and no idle limit.
func soakProfiles() []soakProfile {
	deadlines := []time.Duration{20 * time.Second, 45 * time.Second, 2 * time.Minute, 5 * time.Minute, 9 * time.Minute}
	return []soakProfile{
		{"defaults", damper.Policy{PerAttemptTimeout: 10 * time.Second, StreamIdleTimeout: 20 * time.Second},
			dampertest.DefaultModel, deadlines, time.Minute},
		{"ceiling", damper.Policy{
			MaxAttempts: 5, PerAttemptTimeout: 5 * time.Second, StreamIdleTimeout: 5 * time.Second,
			BackoffBase: 200 * time.Millisecond, BackoffMax: 5 * time.Second, MaxRetryAfter: 3 * time.Second,
			MaxRetryCostUSD: 0.005, RetryBudgetWindow: 10 * time.Second, RetryBudgetMinTokens: 2, RetryBudgetRatio: 0.2,
			OnBudgetExhausted: damper.PassthroughBudgetExhausted,
		}, "claude-sonnet-4-5", deadlines, time.Minute},
		{"small", damper.Policy{MaxAttempts: 2, PerAttemptTimeout: 30 * time.Second, MaxHoldBack: 4 << 10, RetryBudgetWindow: time.Hour},
			dampertest.DefaultModel, deadlines, time.Minute},
	}
}

// TestSoakInMemory is the chaos soak on dampertest.Transport in a synctest
// bubble: see the comment at the top of soak_test.go.
func TestSoakInMemory(t *testing.T) {
	requests, workers := 3000, 16
	if testing.Short() {
		requests = 600
	}
	if soakIsLong() {
		requests = 100_000
	}
	seed := soakSeedFor(t)
	rng := rand.New(rand.NewPCG(seed, 0x50a4))
	profiles := soakProfiles()
	plans := make([]reqPlan, requests)
	for i := range plans {
		plans[i] = drawPlan(rng, i, 500, profiles)
	}
	tel := newSoakTelemetry(t)
	before := heapAfterGC()

	var st soakStats
	ck := &checker{}
	synctest.Test(t, func(t *testing.T) {
		// Made in the bubble, the server waits on the bubble's clock, and a
		// stalled handler waits, durably blocked, for its request's context.
		srv := dampertest.NewServer(dampertest.InMemory(), dampertest.WithStepFunc(stepFor(plans)))
		defer srv.Close()
		// In memory an attempt reaches the server before the next one
		// starts, so the last to arrive is the latest.
		received := func(i int) served {
			n := srv.Count(strconv.Itoa(i))
			return served{n, n}
		}
		clients := soakClients(t, profiles, tel, rand.NewPCG(seed, 0x7a11),
			option.WithBaseURL(srv.URL()), option.WithHTTPClient(&http.Client{Transport: dampertest.Transport(srv.Handler())}))
		results, ends := runSoak(ck, tel, workers, plans, profiles, clients, received, false)
		// On the bubble's clock a call returns at its limit's very instant.
		checkDeadlines(ck, plans, results, func(int) time.Duration { return 0 })
		synctest.Wait() // calls ended on a goroutine of their own, by their context
		tel.flush(ck)
		tel.checkOutcomes(ck, results)

		st.requests, st.outcomes = len(plans), map[damper.Outcome]int{}
		extra := 0 // attempts beyond a plan: more than MaxAttempts
		for i, r := range results {
			p := plans[i]
			st.count(p, r)
			st.ends[ends[i]]++
			if r.elapsed == p.limit() {
				st.stopped++
			}
			n := received(i).n
			st.lost += r.report.Attempts - n
			st.served += int64(n)
			for k := range n {
				st.faults[p.attempts[min(k, len(p.attempts)-1)].kind]++
			}
			extra += max(n-len(p.attempts), 0)
		}
		if extra > 0 {
			ck.failf("the server received %d attempts beyond MaxAttempts", extra)
		}
		if st.attempts != st.served+int64(st.lost) {
			ck.failf("reports add up to %d attempts; the server received %d and %d were cut before it", st.attempts, st.served, st.lost)
		}
		for i, pr := range profiles {
			var mine []soakResult
			for k, r := range results {
				if plans[k].damper == i {
					mine = append(mine, r)
				}
			}
			checkBudget(ck, &st, pr.name, pr.policy, mine)
		}
	})
	ck.report(t)
	after := heapAfterGC()
	runtime.KeepAlive(plans) // measured in both, so not part of the difference
	t.Logf("seed %d: %s\nheap %d KiB before, %d KiB after", seed, &st, before>>10, after>>10)
	if !testing.Short() {
		checkSoakCoverage(t, &st) // 600 requests may miss a rare outcome
	}
	if grown := int64(after) - int64(before); grown > 64<<20 {
		t.Errorf("the heap grew by %d MiB over the soak, want at most 64", grown>>20)
	}
}
