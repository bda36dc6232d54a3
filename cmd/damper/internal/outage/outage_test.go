package outage

import (
	"context"
	"fmt"
	"maps"
	"math"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/damper-ai/damper-go"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// The README's demo: 1,000 requests through a full outage, 3,000 attempts
// for the SDK alone and 1,010 through Damper, exactly.
func TestDefaultDemo(t *testing.T) {
	res, err := Simulate(context.Background(), DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	checkRun(t, res.Naive, Run{Requests: 1000, Attempts: 3000, Succeeded: 1000, BudgetExhausted: 0}, "3.00")
	checkRun(t, res.Damper, Run{Requests: 1000, Attempts: 1010, Succeeded: 5, BudgetExhausted: 995}, "1.01")
	if got := res.Damper.Outcomes; len(got) != 2 {
		t.Errorf("Damper outcomes = %v, want only success and budget_exhausted", got)
	}
	if res.Policy.MaxAttempts != 3 || res.Policy.RetryBudgetMinTokens != 10 {
		t.Errorf("Result.Policy = %+v, want the defaults filled in", res.Policy)
	}
	// The third run: the throttle stops retries at the third request, the
	// breaker opens at the 20th attempt (18 of them failed), and nothing
	// is sent after it.
	want := Run{Requests: 1000, Attempts: 20, Succeeded: 2, Throttled: 12, CircuitOpen: 986}
	checkRun(t, res.Breaker, want, "0.02")
	if res.Breaker.Throttled != 12 || res.Breaker.CircuitOpen != 986 || len(res.Breaker.Outcomes) != 3 {
		t.Errorf("breaker run outcomes = %v, want 2 success, 12 retry_throttled, 986 circuit_open", res.Breaker.Outcomes)
	}
}

// expectProtected is what the breaker's and the throttle's rules predict
// for requests one at a time, each failing its first failures attempts,
// when the run stays inside one budget window and one breaker window:
// the model is written from the rules, not from the engine.
func expectProtected(requests, failures int, p damper.Policy) Run {
	b, th := p.Breaker, p.Throttle
	tokens, maxTokens := th.MaxTokens*1000, th.MaxTokens*1000 // thousandths
	ratio := int(math.Round(th.TokenRatio * 1000))
	units := p.RetryBudgetMinTokens // no first attempt succeeds when failures >= 1
	total, failed, open := 0, 0, false
	run := Run{Requests: requests, Outcomes: map[damper.Outcome]int{}}
	for range requests {
		outcome := damper.OutcomeCircuitOpen
		for n := 1; !open; n++ {
			run.Attempts++
			total++
			if n > failures {
				tokens = min(tokens+ratio, maxTokens)
				outcome = damper.OutcomeSuccess
				break
			}
			failed++
			tokens = max(tokens-1000, 0)
			open = total >= b.MinAttempts && float64(failed) >= b.FailureRatio*float64(total)
			if n >= p.MaxAttempts {
				outcome = damper.OutcomeAttemptsExhausted
				break
			}
			if open {
				break // the retry is refused: circuit_open
			}
			if tokens <= maxTokens/2 {
				outcome = damper.OutcomeRetryThrottled
				break
			}
			if units == 0 {
				outcome = damper.OutcomeBudgetExhausted
				break
			}
			units--
		}
		run.Outcomes[outcome]++
	}
	run.finish()
	return run
}

func TestProtectedRule(t *testing.T) {
	tests := []struct {
		name     string
		requests int
		failures int
		policy   damper.Policy
	}{
		{"the demo", 1000, 2, damper.Policy{}},
		{"one failure each", 1000, 1, damper.Policy{}},
		{"failures outlast the attempts", 300, 4, damper.Policy{}},
		{"a larger throttle", 500, 1, damper.Policy{Throttle: &damper.ThrottlePolicy{MaxTokens: 30, TokenRatio: 0.5}}},
		{"a patient breaker", 500, 2, damper.Policy{Breaker: &damper.BreakerPolicy{MinAttempts: 200, FailureRatio: 0.9}}},
		{"no outage", 300, 0, damper.Policy{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := Config{Requests: tt.requests, Failures: tt.failures, Concurrency: 1, Policy: tt.policy, Seed: 3}
			d, err := damper.New(Protected(tt.policy))
			if err != nil {
				t.Fatal(err)
			}
			want := expectProtected(tt.requests, tt.failures, d.Policy())
			got, err := SimulateBreaker(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			checkRun(t, got, want, formatAmp(want.Amplification))
			if !maps.Equal(got.Outcomes, want.Outcomes) {
				t.Errorf("outcomes = %v, want %v", got.Outcomes, want.Outcomes)
			}
			if got.Elapsed >= d.Policy().Breaker.Window {
				t.Errorf("the run took %v of virtual time: past one breaker window, the model does not hold", got.Elapsed)
			}
		})
	}
}

func checkRun(t *testing.T, got, want Run, amp string) {
	t.Helper()
	if got.Requests != want.Requests || got.Attempts != want.Attempts ||
		got.Succeeded != want.Succeeded || got.BudgetExhausted != want.BudgetExhausted ||
		got.Throttled != want.Throttled || got.CircuitOpen != want.CircuitOpen {
		t.Errorf("%s: requests/attempts/succeeded/exhausted/throttled/circuit open = %d/%d/%d/%d/%d/%d, want %d/%d/%d/%d/%d/%d", got.Name,
			got.Requests, got.Attempts, got.Succeeded, got.BudgetExhausted, got.Throttled, got.CircuitOpen,
			want.Requests, want.Attempts, want.Succeeded, want.BudgetExhausted, want.Throttled, want.CircuitOpen)
	}
	if s := formatAmp(got.Amplification); s != amp {
		t.Errorf("%s: amplification = %s, want %s", got.Name, s, amp)
	}
	if len(got.AttemptTimes) != got.Attempts {
		t.Errorf("%s: %d attempt times for %d attempts", got.Name, len(got.AttemptTimes), got.Attempts)
	}
}

// expect is what the budget rule (at most minTokens + ratio × first-attempt
// successes retries a window) predicts for a run that stays
// inside one budget window, with requests one at a time and every first
// attempt failing (failures >= 1): the window holds minTokens units and
// never grows; each request needs r = min(failures, maxAttempts-1) retries
// and takes them while units last; the request that finds none left (or
// too few) ends budget-exhausted, and so does every one after it.
func expect(requests, failures, maxAttempts, minTokens int) (naive, dmp Run) {
	r := min(failures, maxAttempts-1)
	succeedsIfServed := failures <= maxAttempts-1
	naive = Run{Requests: requests, Attempts: requests * (r + 1)}
	if succeedsIfServed {
		naive.Succeeded = requests
	}
	retries := min(minTokens, requests*r)
	served := min(requests, minTokens/r) // requests granted all r retries
	dmp = Run{Requests: requests, Attempts: requests + retries, BudgetExhausted: requests - served}
	if succeedsIfServed {
		dmp.Succeeded = served
	}
	return naive, dmp
}

func TestBudgetRule(t *testing.T) {
	tests := []struct {
		name     string
		requests int
		failures int
		policy   damper.Policy
	}{
		{"10k requests, one failure each", 10000, 1, damper.Policy{}},
		{"larger starting budget", 1000, 2, damper.Policy{RetryBudgetMinTokens: 50, RetryBudgetWindow: time.Hour}},
		{"odd budget: one request gets a single retry", 200, 2, damper.Policy{RetryBudgetMinTokens: 7}},
		{"failures outlast the attempts", 300, 4, damper.Policy{}},
		{"five attempts", 400, 4, damper.Policy{MaxAttempts: 5, RetryBudgetMinTokens: 12, RetryBudgetWindow: time.Hour}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel() // each run has its own fake API and clock
			cfg := Config{Requests: tt.requests, Failures: tt.failures, Concurrency: 1, Policy: tt.policy, Seed: 7}
			d, err := damper.New(tt.policy)
			if err != nil {
				t.Fatal(err)
			}
			p := d.Policy()
			naive, dmp := expect(tt.requests, tt.failures, p.MaxAttempts, p.RetryBudgetMinTokens)
			got, err := SimulateDamper(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			checkRun(t, got, dmp, formatAmp(float64(dmp.Attempts)/float64(dmp.Requests)))
			// The naive loop needs no budget rule and is slow under -race
			// at 10,000 requests; check it on the smaller runs.
			if tt.requests <= 1000 {
				got, err := SimulateNaive(context.Background(), cfg)
				if err != nil {
					t.Fatal(err)
				}
				checkRun(t, got, naive, formatAmp(float64(naive.Attempts)/float64(naive.Requests)))
			}
		})
	}
}

func TestNoOutage(t *testing.T) {
	res, err := Simulate(context.Background(), Config{Requests: 250, Failures: 0, Concurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	checkRun(t, res.Naive, Run{Requests: 250, Attempts: 250, Succeeded: 250}, "1.00")
	checkRun(t, res.Damper, Run{Requests: 250, Attempts: 250, Succeeded: 250}, "1.00")
	checkRun(t, res.Breaker, Run{Requests: 250, Attempts: 250, Succeeded: 250}, "1.00")
	if res.Naive.Elapsed != 0 || res.Damper.Elapsed != 0 || res.Breaker.Elapsed != 0 {
		t.Errorf("virtual time = %v / %v, want 0: nothing waits without failures", res.Naive.Elapsed, res.Damper.Elapsed)
	}
}

func TestDeterministic(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Requests = 200
	a, err := Simulate(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Simulate(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, pair := range [][2]Run{{a.Naive, b.Naive}, {a.Damper, b.Damper}, {a.Breaker, b.Breaker}} {
		if pair[0].Elapsed != pair[1].Elapsed || !equalTimes(pair[0].AttemptTimes, pair[1].AttemptTimes) {
			t.Errorf("%s: two runs with one seed differ: %v vs %v", pair[0].Name, pair[0].Elapsed, pair[1].Elapsed)
		}
	}
	if a.Naive.Elapsed == 0 {
		t.Error("naive run took no virtual time: its backoff did not sleep on the clock")
	}
}

func equalTimes(a, b []time.Duration) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// With requests in flight together, all 10 units are still spent in the one
// window, but how they are split across requests depends on scheduling, so
// the count of budget-exhausted requests lies between 995 (five requests
// take two retries each) and 1,000 (ten requests take one each and are
// refused their second).
func TestConcurrency(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Concurrency = 8
	res, err := SimulateDamper(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.Attempts != 1010 {
		t.Errorf("attempts = %d, want 1010", res.Attempts)
	}
	if res.BudgetExhausted < 995 || res.BudgetExhausted > 1000 || res.BudgetExhausted+res.Succeeded != 1000 {
		t.Errorf("exhausted/succeeded = %d/%d, want 995..1000 exhausted and the rest succeeded",
			res.BudgetExhausted, res.Succeeded)
	}
}

func TestCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, conc := range []int{1, 4} {
		cfg := DefaultConfig()
		cfg.Concurrency = conc
		if _, err := Simulate(ctx, cfg); err != context.Canceled {
			t.Errorf("concurrency %d: err = %v, want context.Canceled", conc, err)
		}
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		mutate func(*Config)
		want   string
	}{
		{func(c *Config) { c.Requests = 0 }, "Config.Requests = 0"},
		{func(c *Config) { c.Failures = -1 }, "Config.Failures = -1"},
		{func(c *Config) { c.Concurrency = 0 }, "Config.Concurrency = 0"},
		{func(c *Config) { c.Policy.RetryBudgetRatio = -0.5 }, "RetryBudgetRatio = -0.5"},
	}
	for _, tt := range tests {
		cfg := DefaultConfig()
		tt.mutate(&cfg)
		_, err := Simulate(context.Background(), cfg)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("err = %v, want one naming %q", err, tt.want)
		}
	}
}

func formatAmp(f float64) string { return fmt.Sprintf("%.2f", f) }
