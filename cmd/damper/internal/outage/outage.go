// Package outage simulates a provider outage against three retry
// strategies, a naive per-request retry loop, Damper, and Damper with its
// circuit breaker and retry throttle, through the real SDK request
// path: an anthropic.Client whose HTTP transport serves a fake Messages API
// in memory, and a virtual clock that every backoff sleeps on. Nothing goes
// to the network and nothing waits on real time, so a run of thousands of
// requests takes well under a second and, at concurrency 1, gives the same
// numbers every time.
//
// It is what `damper demo` and examples/02_outage_demo run.
package outage

import (
	"fmt"
	"time"

	"github.com/damper-ai/damper-go"
)

// Config describes one simulated outage. Start from [DefaultConfig]: unlike
// a damper.Policy, zero is a meaningful value for Failures, so the fields
// have no zero-value defaults.
type Config struct {
	// Requests is the number of logical requests, at least 1.
	Requests int
	// Failures is how many attempts of every logical request fail with 529
	// overloaded_error before one succeeds; 0 means no outage at all.
	Failures int
	// Concurrency is the number of logical requests in flight at once, at
	// least 1. At 1 the requests run one after another and the result is
	// exact; above 1 the order in which they draw on the shared retry
	// budget depends on scheduling, so the split of budget units across
	// requests (and with it the attempt count) can change from run to run.
	Concurrency int
	// Policy is Damper's policy. Its MaxAttempts, BackoffBase and
	// BackoffMax (defaults filled in) also drive the naive loop, so the
	// strategies differ only in what Damper adds: the retry budget and the
	// other admission gates. The third run adds a breaker and a throttle
	// to it (see [Protected]).
	Policy damper.Policy
	// Seed seeds the jitter of both strategies.
	Seed uint64
}

// DefaultConfig is the demo of the project's README: 1,000 requests, each
// failing twice before it succeeds, one at a time, Damper's default policy.
func DefaultConfig() Config {
	return Config{Requests: 1000, Failures: 2, Concurrency: 1, Seed: 1}
}

// Validate returns an error naming the first field whose value cannot be
// used, including any field of Policy that damper.New refuses.
func (c Config) Validate() error {
	switch {
	case c.Requests < 1:
		return fmt.Errorf("outage: Config.Requests = %d: must be at least 1", c.Requests)
	case c.Failures < 0:
		return fmt.Errorf("outage: Config.Failures = %d: must be at least 0", c.Failures)
	case c.Concurrency < 1:
		return fmt.Errorf("outage: Config.Concurrency = %d: must be at least 1", c.Concurrency)
	}
	_, err := damper.New(c.Policy)
	return err
}

// Run is what one strategy did during the outage. Times are virtual.
type Run struct {
	// Name is "naive", "damper" or "damper+breaker".
	Name string `json:"name"`
	// Requests is the number of logical requests made.
	Requests int `json:"logical_requests"`
	// Attempts is the number of provider attempts the fake API received.
	Attempts int `json:"provider_attempts"`
	// Amplification is Attempts / Requests.
	Amplification float64 `json:"amplification"`
	// Succeeded is the number of logical requests that got an answer.
	Succeeded int `json:"succeeded"`
	// BudgetExhausted is the number of logical requests that ended because
	// the retry budget refused a retry (always 0 for the naive loop).
	BudgetExhausted int `json:"budget_exhausted_events"`
	// Throttled and CircuitOpen are the logical requests that the retry
	// throttle, or the circuit breaker, ended (0 without them).
	Throttled   int `json:"retry_throttled_events"`
	CircuitOpen int `json:"circuit_open_events"`
	// Outcomes counts the logical requests by how they ended, as Damper's
	// report names it; the naive loop reports only success and
	// attempts_exhausted.
	Outcomes map[damper.Outcome]int `json:"outcomes"`
	// Elapsed is the virtual time from the first attempt to the last.
	Elapsed time.Duration `json:"-"`
	// ElapsedSeconds is Elapsed in seconds, for JSON.
	ElapsedSeconds float64 `json:"virtual_seconds"`
	// AttemptTimes holds the virtual time, since the start of the run, at
	// which each provider attempt arrived, in arrival order.
	AttemptTimes []time.Duration `json:"-"`
}

// Result is a simulation of both strategies under the same outage.
type Result struct {
	Requests    int    `json:"requests"`
	Failures    int    `json:"failures_before_success"`
	Concurrency int    `json:"concurrency"`
	Seed        uint64 `json:"seed"`
	// Policy is Damper's policy with every default filled in.
	Policy damper.Policy `json:"-"`
	Naive  Run           `json:"naive"`
	Damper Run           `json:"damper"`
	// Protected is the policy of the third run, defaults filled in.
	Protected damper.Policy `json:"-"`
	// Breaker is Damper with the policy [Protected] makes of Policy.
	Breaker Run `json:"damper_breaker"`
}

// Protected returns p with a circuit breaker and a retry throttle, each
// with its defaults where p has none: the policy of the demo's third run.
func Protected(p damper.Policy) damper.Policy {
	if p.Breaker == nil {
		p.Breaker = &damper.BreakerPolicy{}
	}
	if p.Throttle == nil {
		p.Throttle = &damper.ThrottlePolicy{}
	}
	return p
}

// finish fills in the fields derived from the counts.
func (r *Run) finish() {
	if r.Requests > 0 {
		r.Amplification = float64(r.Attempts) / float64(r.Requests)
	}
	r.ElapsedSeconds = r.Elapsed.Seconds()
	r.BudgetExhausted = r.Outcomes[damper.OutcomeBudgetExhausted]
	r.Throttled = r.Outcomes[damper.OutcomeRetryThrottled]
	r.CircuitOpen = r.Outcomes[damper.OutcomeCircuitOpen]
	r.Succeeded = r.Outcomes[damper.OutcomeSuccess]
}
