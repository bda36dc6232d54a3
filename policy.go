package damper

// The policy a Damper runs by and its parts, as the package names them:
// each an alias of the engine's, or its value re-declared, so that == and
// errors.Is hold across both names.

import (
	"context"
	"github.com/damper-ai/damper-go/internal/engine"
)

// Policy says when Damper retries a Messages call. It is a plain value: the
// zero value of every field means the default written beside it, and [New]
// validates it and copies it, so changing a Policy after New has no effect.
// A field whose zero would otherwise be hidden by its default takes [None]
// for an explicit zero; its documentation says so.
//
// Each field is declared once: its tags give its key in a JSON or YAML
// file, its default and its bounds, from which New fills it in and checks
// it, and [ParsePolicyYAML], [ParsePolicyJSON] and [LoadPolicyFile] read a
// file (see ParsePolicyJSON for the format) and [Policy.MarshalJSON]
// writes one. Fields a file cannot hold, which are code, are tagged out.
//
// Its fields are documented on [github.com/damper-ai/damper-go/internal/engine.Policy].
type Policy = engine.Policy

// None, in a [Policy] field whose zero value means its default, means
// explicitly zero, where zero would mean the default. The fields that take
// it say so: RetryBudgetRatio, RetryBudgetMinTokens, BackoffBase and
// MaxRetryAfter. [New] turns it into a real 0 in its filled-in copy of the
// Policy (see [Damper.Policy]). Any other negative value is an error, and
// so is None in a field that does not take it. It is an untyped constant,
// so that it fits an int, a float64 and a [time.Duration] field alike (as
// a Duration it is -1ns).
const None = engine.None

// RecommendedPolicy is the policy to start a production service with: the
// defaults, a retry throttle with its defaults, and a circuit breaker with
// its defaults but for shorter open periods: 2 s, doubling after each
// failed probe up to 10 s. In a full outage the provider then sees about
// one attempt per request until the breaker opens, and one probe per open
// period after; with one attempt in ten failing, neither ever acts. The
// short open periods cost a provider that is down a probe every few
// seconds from each Damper, and spare the callers of one that has come
// back most of the calls a long open period would still refuse. The zero
// Policy, by contrast, keeps the retry budget alone.
func RecommendedPolicy() Policy { return engine.RecommendedPolicy() }

// BudgetExhaustedAction is what a call returns when the retry budget
// refuses a retry. The zero value, the default ("raise" in a file),
// returns an [*Error] that matches [ErrRetryBudgetExhausted] and wraps the
// last provider error.
type BudgetExhaustedAction = engine.BudgetExhaustedAction

// PassthroughBudgetExhausted returns the last provider error exactly as
// the SDK would have returned it without Damper.
const PassthroughBudgetExhausted = engine.PassthroughBudgetExhausted

// ConfigError is a configuration that cannot be loaded: a document that
// is not JSON or YAML, or a key or value of a Policy file that is wrong.
type ConfigError = engine.ConfigError

// ParsePolicyJSON returns the Policy of a JSON document, with the zero
// value in every field whose key is absent, as [New] expects. null is the
// zero Policy. It checks the values as New does; its error is a
// [*ConfigError].
//
// A Policy file, JSON or YAML, holds the fields of a [Policy] under the
// snake_case keys their declarations name (each field's `key` tag), and
// its parts under theirs:
//
//	max_attempts: 3
//	per_attempt_timeout: 45s
//	retry_budget_ratio: 0      # explicitly zero: the budget never grows
//	retry_budget_min_tokens: 20
//	on_budget_exhausted: passthrough
//	breaker:
//	  failure_ratio: 0.5
//	  open_for: 2s
//	  max_open_for: 10s
//	throttle: {}               # a throttle with its defaults
//	rate_limit:
//	  max_wait: 10s
//	  priority: batch
//	  limits:
//	    claude-sonnet-4: {requests_per_minute: 4000}
//
// A key that is absent means the default, as a zero field of Policy does;
// an absent breaker, throttle, rate_limit, hedge or fallback means none,
// and {} one with its defaults. A value written 0 means zero: in the
// fields that take [None] (retry_budget_ratio, retry_budget_min_tokens,
// backoff_base, max_retry_after, rate_limit.max_wait) it becomes None, in
// the fields where 0 already means something (max_retry_cost_usd and
// stream_idle_timeout: off; the limits: learned; hedge.delay: a quantile)
// it is 0, and in the others, where zero cannot be used, it is an error.
// Durations are strings that [time.ParseDuration] reads ("30s", "1m30s";
// the number 0 is zero too); on_budget_exhausted is "raise" or
// "passthrough", priority "interactive" or "batch". null is not a value:
// leave the key out.
//
// A file cannot hold the Classifier, the PriceTable or the breaker's
// OnStateChange, which are code: set them on the Policy that the file
// gives.
//
// Reading is strict: an unknown or repeated key, a value of the wrong type,
// a bad duration or name, and a value the Policy cannot use are each a
// [*ConfigError] naming the key's path, such as "breaker.open_for", and
// the value.
func ParsePolicyJSON(data []byte) (Policy, error) { return engine.ParsePolicyJSON(data) }

// ParsePolicyYAML returns the Policy of a YAML document, as
// [ParsePolicyJSON] does; it reads JSON too, except JSON indented with
// tabs, which YAML does not allow. An empty document is the zero Policy.
// YAML 1.1 reads an unquoted yes, no, on or off as a boolean.
func ParsePolicyYAML(data []byte) (Policy, error) { return engine.ParsePolicyYAML(data) }

// LoadPolicyFile returns the Policy of the file name: JSON when its name
// ends in .json, YAML otherwise. An error in the file is a [*ConfigError]
// whose File is name.
func LoadPolicyFile(name string) (Policy, error) { return engine.LoadPolicyFile(name) }

// OutcomeCircuitOpen: the circuit breaker refused the attempt.
const OutcomeCircuitOpen = engine.OutcomeCircuitOpen

// ErrCircuitOpen: the circuit breaker is open, or half-open with its
// probe in flight, so nothing was sent. [Error.NextProbe] holds when to
// try again, and [Error.RetryAfter] the time until then: open, until the
// open period ends; with a probe in flight, until the probe is due to
// answer (its PerAttemptTimeout, or its caller's deadline if sooner), or
// [fleet.CircuitOverdueWait] once that has passed. It is never longer
// than the current open period, however long PerAttemptTimeout.
var ErrCircuitOpen = engine.ErrCircuitOpen

// BreakerPolicy configures the circuit breaker: when most attempts fail on
// the provider's health (5xx, 529, transport failures, attempt timeouts),
// Damper stops sending to the provider for a while, and then sends one
// probe at a time until one succeeds. Rate limits, spend limits, other 4xx
// and the caller's own cancellations never count.
//
// The zero value is a working breaker with the defaults written beside
// each field; a nil *BreakerPolicy in a Policy means no breaker.
//
// Its fields are documented on [github.com/damper-ai/damper-go/internal/gates/breaker.Policy].
type BreakerPolicy = engine.BreakerPolicy

// CircuitState is the state of a circuit breaker: closed, open or
// half-open, the constants fleet.CircuitClosed, fleet.CircuitOpen (every
// attempt is refused with [ErrCircuitOpen]) and fleet.CircuitHalfOpen of
// package [github.com/damper-ai/damper-go/fleet]. The zero value means
// that no breaker is configured.
type CircuitState = engine.CircuitState

// CircuitChange is one change of a breaker's state, as
// [BreakerPolicy.OnStateChange] hears it; its Backend is the backend
// whose breaker it is: "primary" for the client's own (see
// [WithBackends]).
type CircuitChange = engine.CircuitChange

// OutcomeBudgetExhausted: the retry budget had no unit left.
const OutcomeBudgetExhausted = engine.OutcomeBudgetExhausted

// ErrRetryBudgetExhausted: the shared retry budget had no unit left.
var ErrRetryBudgetExhausted = engine.ErrRetryBudgetExhausted

// OutcomeConcurrencyLimited: no slot of the concurrency limit came in time.
const OutcomeConcurrencyLimited = engine.OutcomeConcurrencyLimited

// ErrConcurrencyLimited: the concurrency limit had no slot for the attempt
// within ConcurrencyPolicy.MaxWait and the caller's deadline, so nothing
// was sent.
var ErrConcurrencyLimited = engine.ErrConcurrencyLimited

// ConcurrencyPolicy configures the concurrency limit: at most a limit of
// attempts in flight on each backend, fixed (Max) or adaptive (Adaptive),
// which follows the provider's latency. An attempt that finds no slot
// waits in line, within its priority (see [ContextWithPriority]) and its
// [Tenant]'s weight, for at most MaxWait and not past the caller's
// deadline, then fails with [ErrConcurrencyLimited]. The concurrency
// guide tells the adaptive limit's rule.
//
// The zero value is a fixed limit that needs Max; a nil
// *ConcurrencyPolicy in a Policy means no limit.
//
// Its fields are documented on [github.com/damper-ai/damper-go/internal/gates/concurrency.Policy].
type ConcurrencyPolicy = engine.ConcurrencyPolicy

// OutcomeRateLimited: the rate limiter could not admit the attempt in time.
const OutcomeRateLimited = engine.OutcomeRateLimited

// ErrRateLimited: the rate limiter could not admit the attempt within
// RateLimitPolicy.MaxWait and the caller's deadline, so nothing was
// sent. [Error.AdmitAt] holds when it could have been admitted, and
// [Error.RetryAfter] the time until then.
var ErrRateLimited = engine.ErrRateLimited

// RateLimitPolicy configures the rate limiter: it keeps every goroutine of
// a Damper under the API's rate limits together, so that attempts wait in
// line on the Damper instead of each finding the limit in a 429. The API
// limits requests, input tokens and output tokens per minute for each
// limit group, a model family; the limiter keeps the same three buckets
// per group, configured in Limits or learned from the
// anthropic-ratelimit-* headers. An attempt that finds no room waits in
// line, within its priority (see [ContextWithPriority]), for at most
// MaxWait, else fails at once with [ErrRateLimited].
//
// A model's limit group, which a key of Limits configures: every dated,
// platform and minor version of one family and major version shares a
// group. "claude-sonnet-4-5-20250929" and "claude-sonnet-4-6" are
// "claude-sonnet-4"; "claude-3-5-haiku-20241022" is "claude-3-5-haiku".
// An ID of another shape is its own group, without its date, in lower
// case; but one whose group would be empty, longer than 128 bytes or hold
// bytes other than the letters, digits and . _ : @ / - of model IDs is in
// the group "(other)", so that a group's name is always short and
// printable.
//
// The zero value learns every limit and has the defaults written beside
// each field; a nil *RateLimitPolicy in a Policy means no limiter.
//
// Its fields are documented on [github.com/damper-ai/damper-go/internal/gates/ratelimit.Policy].
type RateLimitPolicy = engine.RateLimitPolicy

// RateLimits are the per-minute limits of one limit group (requests,
// input tokens, output tokens); zero means learned from the API's headers.
// Each is at most 1,000,000,000.
type RateLimits = engine.RateLimits

// OutcomeRetryThrottled: the retry throttle refused the retry.
const OutcomeRetryThrottled = engine.OutcomeRetryThrottled

// ErrRetryThrottled: the retry throttle had half of its tokens or
// fewer left (see [ThrottlePolicy]).
var ErrRetryThrottled = engine.ErrRetryThrottled

// ThrottlePolicy configures the retry throttle, the rule of gRPC's retry
// throttling: a count of tokens that starts full at MaxTokens; each failed
// attempt that could be retried costs one token, each answered attempt
// earns TokenRatio, and no retry is made while half of MaxTokens or fewer
// are left. Unlike the retry budget, failures drain it, so a provider that
// answers nothing gets almost no retries. A retry needs both the throttle
// and the retry budget.
//
// The zero value is a working throttle with the defaults written beside
// each field; a nil *ThrottlePolicy in a Policy means no throttle.
//
// Its fields are documented on [github.com/damper-ai/damper-go/internal/gates/throttle.Policy].
type ThrottlePolicy = engine.ThrottlePolicy

// HedgePolicy configures hedging: when an attempt is slow to start
// answering, Damper sends one more attempt beside it, and the first to
// answer wins. The other is cancelled, its connection closed, and nothing of
// it reaches the caller: a stream races to its first content, and only the
// winner's held-back events are released.
//
// The hedge leaves after a delay from the start of the attempt it hedges:
// Delay when set, else the Quantile of the time recent attempts of the same
// limit group (see [RateLimitPolicy]) took to answer a plain call, or to send a
// stream's first content, over the last Window of them. Until MinSamples
// have been seen there is no hedge. Windows are kept for at most 64 (a
// group's plain calls and its streams are two); one with no sample for 30
// minutes is dropped, and a new one that finds no room takes the place of
// the one least recently sampled.
//
// A hedge is an extra attempt and pays like a retry: it counts toward
// Policy.MaxAttempts and the retry cost ceiling (at its full estimated cost,
// since a cancelled attempt may still be billed for its input), passes the
// retry throttle and takes a retry budget unit, and it must find room in the
// rate limiter at once and a closed breaker: it never waits in line, and an
// attempt that a gate refuses is simply not sent. When the attempt it hedges
// fails while the hedge is in flight, the call waits for the hedge instead
// of retrying on top of it.
//
// The zero value hedges at the 95th percentile of recent attempts; a nil
// *HedgePolicy in a Policy means no hedging.
//
// Its fields are documented on [github.com/damper-ai/damper-go/internal/engine.HedgePolicy].
type HedgePolicy = engine.HedgePolicy

// ContextWithHedging returns ctx marking the Messages calls made with it as
// hedged (on) or not, when the Damper's Policy has a [HedgePolicy]; it
// overrides HedgePolicy.OnlyWhenAsked. Without a HedgePolicy no call is
// hedged.
func ContextWithHedging(ctx context.Context, on bool) context.Context {
	return engine.ContextWithHedging(ctx, on)
}

// The outcomes of the retry rules' refusals.
const (
	// OutcomeAttemptsExhausted: MaxAttempts reached.
	OutcomeAttemptsExhausted = engine.OutcomeAttemptsExhausted
	// OutcomeRetryAfterTooLong: the provider asked for a wait over
	// Policy.MaxRetryAfter.
	OutcomeRetryAfterTooLong = engine.OutcomeRetryAfterTooLong
	// OutcomeDeadline: no retry fits before the caller's deadline.
	OutcomeDeadline = engine.OutcomeDeadline
	// OutcomeCostCeiling: a retry would pass Policy.MaxRetryCostUSD.
	OutcomeCostCeiling = engine.OutcomeCostCeiling
)

// ErrRetryAfterTooLong: the provider asked for a longer delay than
// Policy.MaxRetryAfter. [Error.RetryAfter] holds the delay.
var ErrRetryAfterTooLong = engine.ErrRetryAfterTooLong

// ErrDeadline: the backoff and another attempt cannot finish before the
// caller's deadline, so no retry was started.
var ErrDeadline = engine.ErrDeadline

// ErrRetryCostCeiling: the retry would cross Policy.MaxRetryCostUSD,
// or the model has no price while a ceiling is set.
var ErrRetryCostCeiling = engine.ErrRetryCostCeiling

// Priority is a call's place in the lines of the rate limiter and the
// concurrency limit.
type Priority = engine.Priority

// Interactive calls may use all of every bucket: someone is waiting.
const Interactive = engine.Interactive

// Batch calls leave a share of every bucket to interactive calls (see
// [RateLimitPolicy.BatchShare]), and wait behind interactive calls
// that wait.
const Batch = engine.Batch

// ContextWithPriority returns ctx marking the Messages calls made with it
// as of priority p, for the rate limiter and the concurrency limit; it
// overrides their policies' Priority.
func ContextWithPriority(ctx context.Context, p Priority) context.Context {
	return engine.ContextWithPriority(ctx, p)
}

// FallbackPolicy says when a call moves to its next route: the next
// backend (see [WithBackends]), then the next sibling model on every
// backend again. A call moves:
//
//   - before an attempt, when the current backend's breaker is open, or
//     its rate limiter cannot admit the attempt in time;
//   - after a failed attempt whose failure speaks of the provider's health
//     (5xx, 529, a transport failure, a timeout, a stream that failed
//     before content) or of a rate limit, once the current backend cannot
//     retry it: its attempts (MaxAttempts per backend), its retry budget,
//     throttle, breaker or limiter, or a provider delay past MaxRetryAfter
//     refuse the retry;
//   - after a spend-limit 429, with OnSpendLimit.
//
// A call never moves on the caller's own errors (a 4xx but 429), after
// content has reached the caller, or when the move's attempt would cross
// the retry cost ceiling (which covers every attempt of the call, on every
// backend, at each one's model's price) or could not finish before the
// caller's deadline. A move waits no backoff: the next backend is another
// pool of capacity. Its attempt is that backend's first for the call, so
// it takes nothing from that backend's retry budget.
//
// Its fields are documented on [github.com/damper-ai/damper-go/internal/engine.FallbackPolicy].
type FallbackPolicy = engine.FallbackPolicy

// The platforms a backend's client reaches, as [Backend].Provider names them.
const (
	// ProviderAnthropic is the first-party API.
	ProviderAnthropic = engine.ProviderAnthropic
	// ProviderBedrock is Amazon Bedrock.
	ProviderBedrock = engine.ProviderBedrock
	// ProviderVertex is Google Vertex AI.
	ProviderVertex = engine.ProviderVertex
)

// PrimaryBackend is the name of the backend a call's own client reaches.
const PrimaryBackend = engine.PrimaryBackend

// Backend is a place a Messages call can fall back to: a platform, reached
// with the SDK's own options, such as
//
//	damper.Backend{
//		Name:     "bedrock",
//		Provider: damper.ProviderBedrock,
//		Options:  []option.RequestOption{bedrock.WithConfig(cfg)},
//	}
//
// Damper builds one client from Options (with the SDK's own retries off:
// Damper owns them) and sends the backend's attempts through it, so that
// the platform's middleware signs each attempt afresh and translates its
// answer (Bedrock's event stream becomes SSE). The caller's headers travel
// with the call, but not its credentials (x-api-key, authorization): each
// backend's come from its Options. Options must not hold Damper's own
// [Damper.Option].
//
// Its fields are documented on [github.com/damper-ai/damper-go/internal/engine.Backend].
type Backend = engine.Backend

// WithBackends adds backends that a Messages call falls back to, in order,
// after the client's own (see [FallbackPolicy] for when a call moves on).
// Each gets its own budget, throttle, breaker and rate limiter, from the
// Damper's Policy and the backend's Store.
func WithBackends(backends ...Backend) Setting { return engine.WithBackends(backends...) }

// Tenant is a client of a [Proxy] in key mode: a name, and the keys its
// clients present, as SHA-256 hashes. A file never holds a key itself:
// the damper command's proxy adds the hashes of the keys held in the
// environment variables its key_env lists. A tenant has at most 16 keys,
// enough to rotate one (the new key added, clients moved, the old one
// removed), and a client key has at most 256 bytes.
//
// Its fields are documented on [github.com/damper-ai/damper-go/internal/engine.Tenant].
type Tenant = engine.Tenant

// TenantRetryBudget is a tenant's retry budget: within the Policy's
// RetryBudgetWindow, the tenant's retries are at most MinTokens + Ratio ×
// its first attempts that succeeded.
//
// Its fields are documented on [github.com/damper-ai/damper-go/internal/engine.TenantRetryBudget].
type TenantRetryBudget = engine.TenantRetryBudget

// TenantPriority is a tenant's priority: its calls' own, or the Policy's.
// The zero value, the default ("policy" in a file), leaves the priority
// the Policy gives.
type TenantPriority = engine.TenantPriority

// TenantInteractive makes the tenant's calls [Interactive].
const TenantInteractive = engine.TenantInteractive

// TenantBatch makes the tenant's calls [Batch].
const TenantBatch = engine.TenantBatch
