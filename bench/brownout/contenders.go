package brownout

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/failsafe-go/failsafe-go/budget"
	"github.com/failsafe-go/failsafe-go/failsafehttp"

	"github.com/damper-ai/damper-go"
)

// Contender is one way a Go service calls the Messages API with retries,
// configured as its users would by default.
type Contender struct {
	Name string
	// Path says, for the docs, which code runs for real and what is a
	// re-implementation.
	Path string
	// newReplica builds the client of one replica (one process with its
	// own retry state) over the simulated transport.
	newReplica func(env replicaEnv) (call, error)
}

// call makes one logical request and returns its error.
type call func(ctx context.Context) error

// replicaEnv is what a replica runs on.
type replicaEnv struct {
	transport http.RoundTripper
	clock     simClock
	rng       *rand.Rand
	// circuit records the changes of the replica's circuit breaker.
	circuit func(damper.CircuitChange)
	// params is the request of every logical request, but with
	// Scenario.Cached.
	params anthropic.MessageNewParams
	// request, with Scenario.Cached, returns the request of the logical
	// request running now: params, or one with a cached prefix.
	request func() anthropic.MessageNewParams
	// secondary reaches the scenario's secondary provider; nil without one.
	secondary http.RoundTripper
	// moved records why the running request first moved to another
	// backend, as Damper's report says.
	moved func(reason string)
	// meter, when set, is the MeterProvider of the replica's Damper,
	// through which the run reads its gauges.
	meter *gaugeReader
}

// newSDKClient returns a real SDK client over the simulated transport.
func newSDKClient(rt http.RoundTripper, opts ...option.RequestOption) anthropic.Client {
	base := []option.RequestOption{
		option.WithBaseURL("http://provider.sim/"),
		option.WithAPIKey("sim-key"),
		option.WithHTTPClient(&http.Client{Transport: rt}),
	}
	return anthropic.NewClient(append(base, opts...)...)
}

// messageParams is the request of the scenarios without a prompt of their
// own.
var messageParams = paramsFor("")

// paramsFor returns the request with prompt as its user message; "" means
// "hello".
func paramsFor(prompt string) anthropic.MessageNewParams {
	if prompt == "" {
		prompt = "hello"
	}
	return anthropic.MessageNewParams{
		Model:     "claude-sonnet-4-5",
		MaxTokens: 64,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(prompt))},
	}
}

// Contenders returns the contenders, in table order: the no-retry
// control, the retry loops and libraries, Damper with its default policy,
// then Damper with its opt-in throttle and with the recommended policy.
func Contenders() []Contender {
	return []Contender{NoRetry(), SDKDefault(), Naive(), Failsafe(), GRPCThrottle(), Damper(), DamperThrottle(), DamperRecommended()}
}

// NoRetry is the control: one attempt per logical request, no retries, so
// that the tables show what the provider does with none at all.
func NoRetry() Contender {
	return Contender{
		Name: "no-retry",
		Path: "the control: SDK v2 client with WithMaxRetries(0), one attempt per logical request and no retries",
		newReplica: func(env replicaEnv) (call, error) {
			client := newSDKClient(env.transport, option.WithMaxRetries(0))
			return func(ctx context.Context) error {
				_, err := client.Messages.New(ctx, env.params)
				return err
			}, nil
		},
	}
}

// Damper is the real Damper engine with its default policy, one Damper
// (and so one retry budget) per replica, on the simulation's clock.
func Damper() Contender {
	return damperContender("damper",
		"real code: SDK v2 client + damper.New(damper.Policy{}) middleware (budget, classification, backoff, deadline gate) on the virtual clock",
		func() damper.Policy { return damper.Policy{} })
}

// DamperThrottle is Damper's default policy plus its retry throttle with
// the throttle's defaults.
func DamperThrottle() Contender {
	return DamperThrottleWith("damper+throttle", damper.ThrottlePolicy{})
}

// DamperThrottleWith is Damper's default policy plus a retry throttle of
// the given settings (zero fields take their defaults), under name: the
// published damper+throttle contender, or one point of a sweep of the
// throttle's settings.
func DamperThrottleWith(name string, t damper.ThrottlePolicy) Contender {
	path := fmt.Sprintf("real code: SDK v2 client + damper.New(damper.Policy{Throttle: &damper.ThrottlePolicy{}}) middleware, the default policy plus the retry throttle (%d tokens, ratio %g), on the virtual clock",
		defaults.Throttle.MaxTokens, defaults.Throttle.TokenRatio)
	if t != (damper.ThrottlePolicy{}) {
		path = fmt.Sprintf("real code: SDK v2 client + damper.New(damper.Policy{Throttle: &damper.ThrottlePolicy{MaxTokens: %d, TokenRatio: %g}}) middleware on the virtual clock", t.MaxTokens, t.TokenRatio)
	}
	return damperContender(name, path, func() damper.Policy {
		t := t // a copy for each replica's Damper
		return damper.Policy{Throttle: &t}
	})
}

// DamperRecommended is Damper with damper.RecommendedPolicy(): the default
// policy plus the retry throttle and the circuit breaker, the breaker with
// shorter open periods than its defaults.
func DamperRecommended() Contender {
	return damperContender("damper+breaker",
		"real code: SDK v2 client + damper.New(damper.RecommendedPolicy()) middleware, the default policy plus the retry throttle with its defaults and the circuit breaker with its defaults but for open periods of 2 s up to 10 s, on the virtual clock (the breaker's OnStateChange records its changes for the figures)",
		damper.RecommendedPolicy)
}

// damperContender runs Damper with the policy that policy returns, one
// Damper per replica. A breaker's changes are recorded for the figures.
func damperContender(name, path string, policy func() damper.Policy) Contender {
	return Contender{
		Name: name,
		Path: path,
		newReplica: func(env replicaEnv) (call, error) {
			return newDamperReplica(env, policy())
		},
	}
}

// newDamperReplica is one replica's client through a Damper of policy p.
func newDamperReplica(env replicaEnv, p damper.Policy) (call, error) {
	d, err := newDamper(env, p)
	if err != nil {
		return nil, err
	}
	client := newSDKClient(env.transport, d.Option())
	return func(ctx context.Context) error {
		_, err := client.Messages.New(ctx, env.params)
		return err
	}, nil
}

// newDamper is one replica's Damper of policy p and settings, on the
// simulation's clock. The breakers' changes are recorded for the figures.
func newDamper(env replicaEnv, p damper.Policy, settings ...damper.Setting) (*damper.Damper, error) {
	if p.Breaker != nil {
		b := *p.Breaker
		b.OnStateChange = env.circuit
		p.Breaker = &b
	}
	base := []damper.Setting{damper.WithClock(env.clock), damper.WithRand(env.rng.Float64)}
	if env.meter != nil {
		base = append(base, damper.WithMeterProvider(env.meter))
	}
	return damper.New(p, append(base, settings...)...)
}

// SDKDefault is the SDK's own retry loop: 2 retries, 0.5 s·2^n capped at
// 8 s less up to 25 % jitter, retry-after honoured. The SDK sleeps on the
// wall clock, so its loop is re-implemented here on the virtual clock; each
// attempt is a real SDK call with its own retries off.
func SDKDefault() Contender {
	return Contender{
		Name: "sdk-default",
		Path: "SDK v2 client for each attempt (WithMaxRetries(0)); its retry loop (shouldRetry, retryDelay, 2 retries) re-implemented on the virtual clock",
		newReplica: func(env replicaEnv) (call, error) {
			client := newSDKClient(env.transport, option.WithMaxRetries(0))
			return func(ctx context.Context) error {
				for retry := 0; ; retry++ {
					_, err := client.Messages.New(ctx, env.params)
					if err == nil || ctx.Err() != nil {
						return err
					}
					res := responseOf(err)
					if retry >= 2 || !sdkShouldRetry(err, res) {
						return err
					}
					if err := env.clock.Sleep(ctx, sdkRetryDelay(res, retry, env.rng, env.clock.Now())); err != nil {
						return err
					}
				}
			}, nil
		},
	}
}

// Naive is a hand-written loop of 3 attempts around the SDK (its retries
// off), retrying 429, 5xx and transport errors, with full-jitter backoff of
// the same shape as Damper's (1 s base, 30 s cap) and no budget.
func Naive() Contender {
	return Contender{
		Name: "naive-3x",
		Path: "SDK v2 client for each attempt (WithMaxRetries(0)) in a 3-attempt loop with full jitter (1 s base, 30 s cap)",
		newReplica: func(env replicaEnv) (call, error) {
			client := newSDKClient(env.transport, option.WithMaxRetries(0))
			return func(ctx context.Context) error {
				return jitterLoop(ctx, env, client, nil)
			}, nil
		},
	}
}

// GRPCThrottle is the naive loop with gRPC's retry throttling in front of
// every retry (max tokens 10, ratio 0.1, one throttler per replica).
func GRPCThrottle() Contender {
	return Contender{
		Name: "grpc-throttle",
		Path: "SDK v2 client for each attempt (WithMaxRetries(0)) in the naive loop, gated by a gRPC retry throttler (gRFC A6, written here: max tokens 10, ratio 0.1)",
		newReplica: func(env replicaEnv) (call, error) {
			client := newSDKClient(env.transport, option.WithMaxRetries(0))
			rt := newRetryThrottler(10, 0.1)
			return func(ctx context.Context) error {
				return jitterLoop(ctx, env, client, rt)
			}, nil
		},
	}
}

// jitterLoop makes up to 3 attempts with full jitter; a non-nil throttler
// is told of every attempt and may refuse a retry, as gRPC's is.
func jitterLoop(ctx context.Context, env replicaEnv, client anthropic.Client, rt *retryThrottler) error {
	const attempts = 3
	for n := 1; ; n++ {
		_, err := client.Messages.New(ctx, env.params)
		if err == nil {
			rt.successfulRPC()
			return nil
		}
		if ctx.Err() != nil || !retryableStatus(err) {
			return err
		}
		// gRPC counts the failure before it checks the attempts left.
		if rt.throttle() || n >= attempts {
			return err
		}
		ceiling := min(30*time.Second, time.Second<<(n-1))
		if err := env.clock.Sleep(ctx, time.Duration(env.rng.Float64()*float64(ceiling))); err != nil {
			return err
		}
	}
}

// Failsafe is failsafe-go's HTTP retry policy with its retry budget, both
// with their defaults (2 retries, no delay unless Retry-After; budget max
// rate 0.2, min concurrency 3), as a RoundTripper under the SDK (its own
// retries off), one budget per replica. Its circuit breaker, rate limiter,
// adaptive throttler and adaptive limiter read the wall clock, so this is
// the most of failsafe-go that runs in virtual time (see the docs).
func Failsafe() Contender {
	return Contender{
		Name: "failsafe-go",
		Path: "real code: failsafe-go v0.9.8 failsafehttp.NewRoundTripper with failsafehttp.NewRetryPolicyBuilder().WithBudget(budget.New()).Build() (3 attempts, no delay without Retry-After; the budget bounds concurrent retries: max rate 0.2 of executions in flight, min concurrency 3) under the SDK v2 client (WithMaxRetries(0)); its strongest configuration that runs in virtual time",
		newReplica: func(env replicaEnv) (call, error) {
			policy := failsafehttp.NewRetryPolicyBuilder().WithBudget(budget.New()).Build()
			rt := failsafehttp.NewRoundTripper(env.transport, policy)
			client := newSDKClient(rt, option.WithMaxRetries(0))
			return func(ctx context.Context) error {
				_, err := client.Messages.New(ctx, env.params)
				return err
			}, nil
		},
	}
}

// responseOf returns the HTTP response behind an SDK error, if any.
func responseOf(err error) *http.Response {
	var apiErr *anthropic.Error
	if errors.As(err, &apiErr) {
		return apiErr.Response
	}
	return nil
}

// retryableStatus is what a hand-written loop retries: 429, 5xx, and
// failures with no response at all.
func retryableStatus(err error) bool {
	var apiErr *anthropic.Error
	if errors.As(err, &apiErr) {
		return apiErr.StatusCode == http.StatusTooManyRequests || apiErr.StatusCode >= 500
	}
	return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

// sdkShouldRetry is the SDK's shouldRetry: no response (a connection
// error), x-should-retry, else 408, 409, 429 and 5xx.
func sdkShouldRetry(err error, res *http.Response) bool {
	if res == nil {
		var apiErr *anthropic.Error
		return !errors.As(err, &apiErr)
	}
	switch res.Header.Get("x-should-retry") {
	case "true":
		return true
	case "false":
		return false
	}
	c := res.StatusCode
	return c == http.StatusRequestTimeout || c == http.StatusConflict || c == http.StatusTooManyRequests || c >= 500
}

// sdkRetryDelay is the SDK's retryDelay: the provider's retry-after-ms or
// retry-after if present, else 0.5 s·2^retry capped at 8 s, less a uniform
// jitter of up to a quarter.
func sdkRetryDelay(res *http.Response, retry int, rng *rand.Rand, now time.Time) time.Duration {
	if res != nil {
		if v := res.Header.Get("Retry-After-Ms"); v != "" {
			if f, err := strconv.ParseFloat(v, 64); err == nil {
				return max(0, time.Duration(f*float64(time.Millisecond)))
			}
		}
		if v := res.Header.Get("Retry-After"); v != "" {
			if f, err := strconv.ParseFloat(v, 64); err == nil {
				return max(0, time.Duration(f*float64(time.Second)))
			}
			if t, err := time.Parse(time.RFC1123, v); err == nil {
				return max(0, t.Sub(now))
			}
		}
	}
	delay := min(time.Duration(0.5*float64(time.Second)*math.Pow(2, float64(retry))), 8*time.Second)
	return delay - time.Duration(rng.Int64N(int64(delay/4)))
}
