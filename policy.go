package damper

import (
	"fmt"
	"math"
	"time"
)

// Policy says when Damper retries a Messages call. It is a plain value: the
// zero value of every field means the default written beside it, and [New]
// validates it and copies it, so changing a Policy after New has no effect.
// A field whose zero would otherwise be hidden by its default takes [None]
// for an explicit zero; its documentation says so. [PolicyConfig] loads a
// Policy from a JSON or YAML file.
type Policy struct {
	// MaxAttempts is the number of provider attempts per logical request,
	// the first one included. Default 3; 1 turns retries off; at most 100.
	MaxAttempts int

	// PerAttemptTimeout bounds one attempt: for a plain call, the whole
	// response; for a stream, the time to its first content. Default 60 s;
	// at most 24 h, as every duration of a Policy.
	PerAttemptTimeout time.Duration

	// MaxRetryCostUSD is a ceiling on the summed estimated cost of the retries
	// of one logical request (see [EstimateInputTokens] for the estimate).
	// Zero means no ceiling; at most 1,000,000.
	MaxRetryCostUSD float64

	// RetryBudgetRatio is the number of budget units that each successful
	// first attempt adds to the current window. Default 0.1; [None] for 0,
	// a budget that never grows beyond RetryBudgetMinTokens; at most 1000.
	RetryBudgetRatio float64

	// RetryBudgetWindow is the length of the budget's fixed window; units
	// left at its end do not carry over. Default 60 s; at most 24 h.
	RetryBudgetWindow time.Duration

	// RetryBudgetMinTokens is the number of units every window starts with.
	// Default 10; [None] for 0, a window that starts empty and allows only
	// the retries its successful first attempts earn. With RetryBudgetRatio
	// also None the budget refuses every retry. At most 1,000,000.
	RetryBudgetMinTokens int

	// BackoffBase and BackoffMax shape the full-jitter backoff used when the
	// provider gives no delay: retry n waits a uniform random time in
	// [0, min(BackoffMax, BackoffBase·2^(n-1))]. Defaults 1 s and 30 s;
	// each at most 24 h.
	// BackoffBase takes [None] for 0: a retry waits only for a provider
	// delay, and that with no spread added (BackoffBase also caps the
	// spread), so clients told the same delay come back together.
	BackoffBase time.Duration
	BackoffMax  time.Duration

	// IgnoreRetryAfter makes Damper disregard retry-after and retry-after-ms.
	// By default a provider delay is honoured, up to MaxRetryAfter.
	IgnoreRetryAfter bool

	// MaxRetryAfter is the longest provider delay Damper waits. A longer one
	// fails the call at once with [ErrRetryAfterTooLong], and the error
	// carries the delay so that a queue can reschedule. Default 60 s;
	// [None] for 0: Damper waits for no provider delay, and every call
	// given one fails at once, for a queue to reschedule. At most 24 h.
	MaxRetryAfter time.Duration

	// OnBudgetExhausted says what a caller gets when the retry budget refuses
	// a retry. Default [RaiseBudgetExhausted].
	OnBudgetExhausted BudgetExhaustedAction

	// PriceTable prices models for the cost ceiling and the report. Nil
	// means [DefaultPriceTable]; a table given here replaces it entirely.
	PriceTable *PriceTable

	// Classifier, when set, sees every failed attempt with Damper's own
	// classification and returns the one to act on.
	Classifier Classifier

	// MaxHoldBack is the most bytes of a stream Damper holds back before
	// its first content (see Streams in the package documentation); a
	// stream that sends more fails with [ErrHoldBackExceeded], not retried.
	// Default 1 MiB, far above the few hundred bytes the API sends; at most
	// 64 MiB.
	MaxHoldBack int

	// MaxEventBytes bounds one SSE event of a stream: its lines and the
	// empty line that ends it. Whoever reads a stream holds an event whole
	// (the SDK's decoder; the proxy, which passes on whole events only),
	// so one event must not cost unbounded memory. A stream that sends a
	// larger event fails with [ErrEventTooLarge]: before its first
	// content, not retried (it is the provider's answer, likely the same
	// again); after it, as [ErrAmbiguous], and a proxy client gets an SSE
	// error event. Default 16 MiB: far above the API's events, and half
	// the 32 MiB line the SDK's decoder accepts at most.
	MaxEventBytes int

	// StreamIdleTimeout, when set, fails a stream after its first content
	// whose body sends nothing for this long while the caller waits for the
	// next event: a stall becomes an [ErrAmbiguous] error instead of a
	// hang. Zero means no limit (the caller's context still bounds the
	// stream). Pings count as data: choose a limit well above the longest
	// pause you expect between events, such as a minute. At most 24 h.
	StreamIdleTimeout time.Duration

	// Breaker, when set, stops sending to a provider that fails most
	// attempts on its health (see [BreakerPolicy]). Nil: no breaker.
	Breaker *BreakerPolicy

	// Throttle, when set, stops retries once failures outweigh successes
	// (see [ThrottlePolicy]); a retry then needs both the throttle and the
	// retry budget. Nil: no throttle.
	Throttle *ThrottlePolicy
	// RateLimit, when set, keeps the Damper's attempts under the API's rate
	// limits, learned from its headers or configured (see
	// [RateLimitPolicy]). Nil: no rate limiter.
	RateLimit *RateLimitPolicy
	// Hedge, when set, sends one more attempt beside one that is slow to
	// start answering; the first to answer wins (see [HedgePolicy]). Nil:
	// no hedging.
	Hedge *HedgePolicy
	// Fallback says when a call moves to another backend (see
	// [WithBackends]) or a sibling model (see [FallbackPolicy]). Nil: on
	// the provider's health and rate limits only, to the backends alone.
	Fallback *FallbackPolicy
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
		Breaker:  &BreakerPolicy{OpenFor: RecommendedBreakerOpenFor, MaxOpenFor: RecommendedBreakerMaxOpenFor},
		Throttle: &ThrottlePolicy{},
	}
}

// The open periods of the breaker of [RecommendedPolicy].
const (
	RecommendedBreakerOpenFor    = 2 * time.Second
	RecommendedBreakerMaxOpenFor = 10 * time.Second
)

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
	return fmt.Sprintf("BudgetExhaustedAction(%d)", int(a))
}

// Defaults of the Policy fields.
const (
	DefaultMaxAttempts          = 3
	DefaultPerAttemptTimeout    = 60 * time.Second
	DefaultRetryBudgetRatio     = 0.1
	DefaultRetryBudgetWindow    = 60 * time.Second
	DefaultRetryBudgetMinTokens = 10
	DefaultBackoffBase          = time.Second
	DefaultBackoffMax           = 30 * time.Second
	DefaultMaxRetryAfter        = 60 * time.Second
	DefaultMaxHoldBack          = 1 << 20
	DefaultMaxEventBytes        = 16 << 20
)

// The largest values of the Policy fields, and of its parts' fields. Each
// is far beyond any use, and keeps every sum, doubling and allocation made
// from the field in range: no value that New accepts can overflow a time
// or a size.
const (
	maxPolicyDuration   = 24 * time.Hour // every duration
	maxAttempts         = 100
	maxRetryCostUSD     = 1e6
	maxRetryBudgetRatio = 1000
	maxCount            = 1_000_000 // RetryBudgetMinTokens, Breaker.MinAttempts
	maxHoldBack         = 64 << 20
	maxHedgeWindow      = 10_000
	maxPerMinute        = 1_000_000_000 // each of RateLimits
	maxFallbackSiblings = 16
	maxFallbackModels   = 1_000 // keys of Fallback.Models
	maxConfiguredGroups = 256   // keys of RateLimit.Limits
)

// withDefaults returns p with every zero field set to its default and every
// None set to 0, or an error naming the first field whose value cannot be
// used.
func (p Policy) withDefaults() (Policy, error) {
	if err := p.checkBounds(); err != nil {
		return p, err
	}
	if p.MaxAttempts < 0 {
		return p, fieldError("MaxAttempts", p.MaxAttempts, "must be at least 1 (0 means the default, 3)")
	}
	if p.PerAttemptTimeout < 0 {
		return p, fieldError("PerAttemptTimeout", p.PerAttemptTimeout, "must be positive (0 means the default, 60s)")
	}
	if math.IsNaN(p.MaxRetryCostUSD) || math.IsInf(p.MaxRetryCostUSD, 0) || p.MaxRetryCostUSD < 0 {
		return p, fieldError("MaxRetryCostUSD", p.MaxRetryCostUSD, "must be a finite number of dollars, at least 0 (0 means no ceiling)")
	}
	if p.RetryBudgetRatio != None && (math.IsNaN(p.RetryBudgetRatio) || math.IsInf(p.RetryBudgetRatio, 0) || p.RetryBudgetRatio < 0) {
		return p, fieldError("RetryBudgetRatio", p.RetryBudgetRatio, "must be a finite number, at least 0 (0 means the default, 0.1; None means 0)")
	}
	if p.RetryBudgetWindow < 0 {
		return p, fieldError("RetryBudgetWindow", p.RetryBudgetWindow, "must be positive (0 means the default, 1m0s)")
	}
	if p.RetryBudgetMinTokens < 0 && p.RetryBudgetMinTokens != None {
		return p, fieldError("RetryBudgetMinTokens", p.RetryBudgetMinTokens, "must be at least 0 (0 means the default, 10; None means 0)")
	}
	if p.BackoffBase < 0 && p.BackoffBase != None {
		return p, fieldError("BackoffBase", p.BackoffBase, "must be at least 0 (0 means the default, 1s; None means 0)")
	}
	if p.BackoffMax < 0 {
		return p, fieldError("BackoffMax", p.BackoffMax, "must be positive (0 means the default, 30s)")
	}
	if p.MaxRetryAfter < 0 && p.MaxRetryAfter != None {
		return p, fieldError("MaxRetryAfter", p.MaxRetryAfter, "must be at least 0 (0 means the default, 1m0s; None means 0)")
	}
	if p.MaxHoldBack < 0 {
		return p, fieldError("MaxHoldBack", p.MaxHoldBack, "must be a positive number of bytes (0 means the default, 1048576)")
	}
	if p.MaxEventBytes < 0 {
		return p, fieldError("MaxEventBytes", p.MaxEventBytes, "must be a positive number of bytes (0 means the default, 16777216)")
	}
	if p.StreamIdleTimeout < 0 {
		return p, fieldError("StreamIdleTimeout", p.StreamIdleTimeout, "must be positive (0 means no idle limit)")
	}
	if p.OnBudgetExhausted != RaiseBudgetExhausted && p.OnBudgetExhausted != PassthroughBudgetExhausted {
		return p, fieldError("OnBudgetExhausted", int(p.OnBudgetExhausted), "must be RaiseBudgetExhausted or PassthroughBudgetExhausted")
	}

	p.MaxAttempts = orDefault(p.MaxAttempts, DefaultMaxAttempts)
	p.PerAttemptTimeout = orDefault(p.PerAttemptTimeout, DefaultPerAttemptTimeout)
	p.RetryBudgetRatio = orDefaultOrNone(p.RetryBudgetRatio, DefaultRetryBudgetRatio)
	p.RetryBudgetWindow = orDefault(p.RetryBudgetWindow, DefaultRetryBudgetWindow)
	p.RetryBudgetMinTokens = orDefaultOrNone(p.RetryBudgetMinTokens, DefaultRetryBudgetMinTokens)
	p.BackoffBase = orDefaultOrNone(p.BackoffBase, DefaultBackoffBase)
	p.BackoffMax = orDefault(p.BackoffMax, DefaultBackoffMax)
	p.MaxRetryAfter = orDefaultOrNone(p.MaxRetryAfter, DefaultMaxRetryAfter)
	p.MaxHoldBack = orDefault(p.MaxHoldBack, DefaultMaxHoldBack)
	p.MaxEventBytes = orDefault(p.MaxEventBytes, DefaultMaxEventBytes)
	if p.PriceTable == nil {
		p.PriceTable = DefaultPriceTable()
	}
	if p.Breaker != nil {
		b, err := p.Breaker.withDefaults()
		if err != nil {
			return p, err
		}
		p.Breaker = b
	}
	if p.Throttle != nil {
		t, err := p.Throttle.withDefaults()
		if err != nil {
			return p, err
		}
		p.Throttle = t
	}

	if p.RateLimit != nil {
		r, err := p.RateLimit.withDefaults()
		if err != nil {
			return p, err
		}
		p.RateLimit = r
	}
	if p.Hedge != nil {
		h, err := p.Hedge.withDefaults()
		if err != nil {
			return p, err
		}
		p.Hedge = h
	}
	if p.Fallback != nil {
		if err := p.Fallback.check(); err != nil {
			return p, err
		}
		p.Fallback = p.Fallback.clone()
	}
	if p.BackoffBase > p.BackoffMax {
		return p, fieldError("BackoffBase", p.BackoffBase, fmt.Sprintf("must not exceed BackoffMax (%v)", p.BackoffMax))
	}
	return p, nil
}

// checkBounds returns an error naming the first field of p above its
// largest value.
func (p Policy) checkBounds() error {
	for _, f := range []struct {
		name string
		d    time.Duration
	}{
		{"PerAttemptTimeout", p.PerAttemptTimeout},
		{"RetryBudgetWindow", p.RetryBudgetWindow},
		{"BackoffBase", p.BackoffBase},
		{"BackoffMax", p.BackoffMax},
		{"MaxRetryAfter", p.MaxRetryAfter},
		{"StreamIdleTimeout", p.StreamIdleTimeout},
	} {
		if err := atMostDuration(f.name, f.d); err != nil {
			return err
		}
	}
	switch {
	case p.MaxAttempts > maxAttempts:
		return atMost("MaxAttempts", p.MaxAttempts, maxAttempts)
	case p.MaxRetryCostUSD > maxRetryCostUSD:
		return atMost("MaxRetryCostUSD", p.MaxRetryCostUSD, maxRetryCostUSD)
	case p.RetryBudgetRatio > maxRetryBudgetRatio:
		return atMost("RetryBudgetRatio", p.RetryBudgetRatio, maxRetryBudgetRatio)
	case p.RetryBudgetMinTokens > maxCount:
		return atMost("RetryBudgetMinTokens", p.RetryBudgetMinTokens, maxCount)
	case p.MaxHoldBack > maxHoldBack:
		return atMost("MaxHoldBack", p.MaxHoldBack, maxHoldBack)
	}
	return nil
}

// atMost is the error of a field whose value v is above its largest, most.
func atMost[T int | float64 | time.Duration](field string, v, most T) error {
	return fieldError(field, v, fmt.Sprintf("must be at most %v", most))
}

// atMostDuration is the error of a duration field above
// maxPolicyDuration, or nil.
func atMostDuration(field string, d time.Duration) error {
	if d > maxPolicyDuration {
		return atMost(field, d, maxPolicyDuration)
	}
	return nil
}

func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// orDefaultOrNone is orDefault for a field that takes None: None is 0.
func orDefaultOrNone[T int | float64 | time.Duration](v, def T) T {
	switch v {
	case 0:
		return def
	case None:
		return 0
	}
	return v
}

func fieldError(field string, value any, why string) error {
	return &policyFieldError{field: field, value: value, why: why}
}

// policyFieldError is a Policy field whose value cannot be used; the
// configuration loader reads its parts to name the key in the file.
type policyFieldError struct {
	field string // as in Go, below Policy: "Breaker.OpenFor"
	value any
	why   string
}

func (e *policyFieldError) Error() string {
	return fmt.Sprintf("damper: Policy.%s = %v: %s", e.field, e.value, e.why)
}
