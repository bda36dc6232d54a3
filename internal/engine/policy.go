package engine

import (
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/damper-ai/damper-go/internal/conf"
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
type Policy struct {
	// MaxAttempts is the number of provider attempts per logical request,
	// the first one included. Default 3; 1 turns retries off; at most 100.
	MaxAttempts int `key:"max_attempts" default:"3" min:"1" max:"100"`

	// PerAttemptTimeout bounds one attempt: for a plain call, the whole
	// response; for a stream, the time to its first content. Default 60 s;
	// at most 24 h, as every duration of a Policy.
	PerAttemptTimeout time.Duration `key:"per_attempt_timeout" default:"60s" min:">0" max:"24h"`

	// MaxRetryCostUSD is a ceiling on the summed estimated cost of the retries
	// of one logical request, from an estimate of its input tokens (one per
	// four bytes of the body, and 1,600 for each base64 image or document).
	// Zero means no ceiling; at most 1,000,000.
	MaxRetryCostUSD float64 `key:"max_retry_cost_usd" min:"0" max:"1e6" unit:"dollars" zero:"no ceiling"`

	// RetryBudgetRatio is the number of budget units that each successful
	// first attempt adds to the current window. Default 0.1; [None] for 0,
	// a budget that never grows beyond RetryBudgetMinTokens; at most 1000.
	RetryBudgetRatio float64 `key:"retry_budget_ratio" default:"0.1" none:"means 0" min:"0" max:"1000"`

	// RetryBudgetWindow is the length of the budget's fixed window; units
	// left at its end do not carry over. Default 60 s; at most 24 h.
	RetryBudgetWindow time.Duration `key:"retry_budget_window" default:"60s" min:">0" max:"24h"`

	// RetryBudgetMinTokens is the number of units every window starts with.
	// Default 10; [None] for 0, a window that starts empty and allows only
	// the retries its successful first attempts earn. With RetryBudgetRatio
	// also None the budget refuses every retry. At most 1,000,000.
	RetryBudgetMinTokens int `key:"retry_budget_min_tokens" default:"10" none:"means 0" min:"0" max:"1000000"`

	// BackoffBase and BackoffMax shape the full-jitter backoff used when the
	// provider gives no delay: retry n waits a uniform random time in
	// [0, min(BackoffMax, BackoffBase·2^(n-1))]. Defaults 1 s and 30 s;
	// each at most 24 h.
	// BackoffBase takes [None] for 0: a retry waits only for a provider
	// delay, and that with no spread added (BackoffBase also caps the
	// spread), so clients told the same delay come back together.
	BackoffBase time.Duration `key:"backoff_base" default:"1s" none:"means 0" min:"0" max:"24h"`
	BackoffMax  time.Duration `key:"backoff_max" default:"30s" min:">0" max:"24h"`

	// IgnoreRetryAfter makes Damper disregard retry-after and retry-after-ms.
	// By default a provider delay is honoured, up to MaxRetryAfter.
	IgnoreRetryAfter bool `key:"ignore_retry_after"`

	// MaxRetryAfter is the longest provider delay Damper waits. A longer one
	// fails the call at once with [ErrRetryAfterTooLong], and the error
	// carries the delay so that a queue can reschedule. Default 60 s;
	// [None] for 0: Damper waits for no provider delay, and every call
	// given one fails at once, for a queue to reschedule. At most 24 h.
	MaxRetryAfter time.Duration `key:"max_retry_after" default:"60s" none:"means 0" min:"0" max:"24h"`

	// OnBudgetExhausted says what a caller gets when the retry budget refuses
	// a retry. The zero value, the default ("raise"), returns an [*Error]
	// that matches ErrRetryBudgetExhausted and wraps the last provider
	// error; PassthroughBudgetExhausted returns that error as it is.
	OnBudgetExhausted BudgetExhaustedAction `key:"on_budget_exhausted" enum:"raise:unset,passthrough:PassthroughBudgetExhausted"`

	// PriceTable prices models for the cost ceiling and the report. Nil
	// means [DefaultPriceTable]; a table given here replaces it entirely.
	PriceTable *PriceTable `key:"-"` // code: a price table file may come later

	// Classifier, when set, sees every failed attempt with Damper's own
	// classification and returns the one to act on.
	Classifier Classifier `key:"-"` // code

	// MaxHoldBack is the most bytes of a stream Damper holds back before
	// its first content (see Streams in the package documentation); a
	// stream that sends more fails with [ErrHoldBackExceeded], not retried.
	// Default 1 MiB, far above the few hundred bytes the API sends; at most
	// 64 MiB.
	MaxHoldBack int `key:"max_hold_back" default:"1048576" min:">0" max:"67108864" unit:"bytes"`

	// MaxEventBytes bounds one SSE event of a stream: its lines and the
	// empty line that ends it. Whoever reads a stream holds an event whole
	// (the SDK's decoder; the proxy, which passes on whole events only),
	// so one event must not cost unbounded memory. A stream that sends a
	// larger event fails with [ErrEventTooLarge]: before its first
	// content, not retried (it is the provider's answer, likely the same
	// again); after it, as [ErrAmbiguous], and a proxy client gets an SSE
	// error event. Default 16 MiB: far above the API's events (a delta of
	// text or of a tool's input is a few KiB), and half the 32 MiB line
	// the SDK's decoder accepts at most. At most that 32 MiB: a larger
	// event could not reach a Go caller, and a proxy holding one costs
	// several times its size.
	MaxEventBytes int `key:"max_event_bytes" default:"16777216" min:">0" max:"33554432" unit:"bytes"`

	// StreamIdleTimeout, when set, fails a stream after its first content
	// whose body sends nothing for this long while the caller waits for the
	// next event: a stall becomes an [ErrAmbiguous] error instead of a
	// hang. Zero means no limit (the caller's context still bounds the
	// stream). Pings count as data: choose a limit well above the longest
	// pause you expect between events, such as a minute. At most 24 h.
	StreamIdleTimeout time.Duration `key:"stream_idle_timeout" min:">0" max:"24h" zero:"no idle limit"`

	// Breaker, when set, stops sending to a provider that fails most
	// attempts on its health (see [BreakerPolicy]). Nil: no breaker.
	Breaker *BreakerPolicy `key:"breaker"`

	// Throttle, when set, stops retries once failures outweigh successes
	// (see [ThrottlePolicy]); a retry then needs both the throttle and the
	// retry budget. Nil: no throttle.
	Throttle *ThrottlePolicy `key:"throttle"`
	// RateLimit, when set, keeps the Damper's attempts under the API's rate
	// limits, learned from its headers or configured (see
	// [RateLimitPolicy]). Nil: no rate limiter.
	RateLimit *RateLimitPolicy `key:"rate_limit"`
	// Concurrency, when set, limits the attempts in flight on each
	// backend, fixed or following the provider's latency (see
	// [ConcurrencyPolicy]). Nil: no limit.
	Concurrency *ConcurrencyPolicy `key:"concurrency"`
	// Hedge, when set, sends one more attempt beside one that is slow to
	// start answering; the first to answer wins (see [HedgePolicy]). Nil:
	// no hedging.
	Hedge *HedgePolicy `key:"hedge"`
	// Fallback says when a call moves to another backend (see
	// [WithBackends]) or a sibling model (see [FallbackPolicy]). Nil: on
	// the provider's health and rate limits only, to the backends alone.
	Fallback *FallbackPolicy `key:"fallback"`
}

// None, in a [Policy] field whose zero value means its default, means
// explicitly zero, where zero would mean the default. The fields that take
// it say so: RetryBudgetRatio, RetryBudgetMinTokens, BackoffBase and
// MaxRetryAfter. [New] turns it into a real 0 in its filled-in copy of the
// Policy (see [Damper.Policy]). Any other negative value is an error, and
// so is None in a field that does not take it. It is an untyped constant,
// so that it fits an int, a float64 and a [time.Duration] field alike (as
// a Duration it is -1ns).
const None = -1

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
func RecommendedPolicy() Policy {
	return Policy{
		Breaker:  &BreakerPolicy{OpenFor: 2 * time.Second, MaxOpenFor: 10 * time.Second},
		Throttle: &ThrottlePolicy{},
	}
}

// BudgetExhaustedAction is what a call returns when the retry budget
// refuses a retry.
type BudgetExhaustedAction int

const (
	// RaiseBudgetExhausted returns an [*Error] that matches
	// [ErrRetryBudgetExhausted] and wraps the last provider error.
	RaiseBudgetExhausted BudgetExhaustedAction = iota
	// PassthroughBudgetExhausted returns the last provider error exactly as
	// the SDK would have returned it without Damper.
	PassthroughBudgetExhausted
)

func (a BudgetExhaustedAction) String() string {
	switch a {
	case RaiseBudgetExhausted:
		return "raise"
	case PassthroughBudgetExhausted:
		return "passthrough"
	}
	return strconv.Itoa(int(a)) // an unknown action is its number
}

func init() {
	conf.Register((*Policy).check)
	conf.Register((*HedgePolicy).check)
	conf.Register((*FallbackPolicy).check)
}

// maxFallbackSiblings bounds the siblings of one model in
// Fallback.Models: each is a route on every backend.
const maxFallbackSiblings = 16

// policyDefaults returns the zero Policy, with every part, filled in: each
// field's default as its tag declares it.
var policyDefaults = sync.OnceValue(func() Policy {
	p, err := Policy{Breaker: &BreakerPolicy{}, Throttle: &ThrottlePolicy{}, RateLimit: &RateLimitPolicy{},
		Hedge: &HedgePolicy{}, Fallback: &FallbackPolicy{}}.withDefaults()
	if err != nil {
		panic(err) // a default outside its bounds: TestPolicyTags fails too
	}
	return p
})

// withDefaults returns p with every zero field set to its default (the
// default tag of its declaration) and every None set to 0, or an error
// naming the first field whose value cannot be used. It runs once, in New:
// no call reads a tag.
func (p Policy) withDefaults() (Policy, error) {
	if err := conf.Fill(&p); err != nil {
		return Policy{}, policyError(err, "")
	}
	return p, nil
}

// check is what the tags of Policy cannot say: how its fields bound each
// other, and the default price table.
func (p *Policy) check(Policy) error {
	if p.BackoffBase > p.BackoffMax {
		return fieldError("BackoffBase", p.BackoffBase, fmt.Sprintf("must not exceed BackoffMax (%v)", p.BackoffMax))
	}
	if p.PriceTable == nil {
		p.PriceTable = DefaultPriceTable()
	}
	return nil
}

// filledPart returns a part of a Policy, the field of its name, filled in
// as New fills it in, for a store given the part alone.
func filledPart[T any](p T, name string) (*T, error) {
	if err := conf.Fill(&p); err != nil {
		return nil, policyError(err, name+".")
	}
	return &p, nil
}

// fieldError is the error of a check: field, of the struct checked, holds
// value, which cannot be used. A value already written for a message
// (a count, a quoted key) is a [conf.Text].
func fieldError(field string, value any, why string) error {
	return &conf.FieldError{Field: field, Value: value, Why: why}
}

// policyError is err, a [*conf.FieldError] of a Policy's field below
// prefix, as New returns it: "damper: Policy.Breaker.OpenFor = -1s: ...".
func policyError(err error, prefix string) error {
	var fe *conf.FieldError
	if errors.As(err, &fe) {
		return fmt.Errorf("damper: Policy.%s%w", prefix, fe)
	}
	return fmt.Errorf("damper: Policy: %w", err)
}
