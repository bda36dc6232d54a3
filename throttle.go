package damper

import (
	"context"
	"errors"
	"math"
	"time"

	"github.com/damper-ai/damper-go/fleet"
)

// The retry throttle's gate: Policy.Throttle, over a [fleet.Throttle] count from
// the backend's store. Before a retry or a hedge it checks the count,
// taking nothing; it hears every attempt's end.

// OutcomeRetryThrottled: the retry throttle refused the retry.
const OutcomeRetryThrottled Outcome = "retry_throttled"

// ErrRetryThrottled: the retry throttle had half of its tokens or
// fewer left (see [ThrottlePolicy]).
var ErrRetryThrottled = errors.New("damper: retry throttled")

// partThrottle is the throttle's part of a store.
var partThrottle = newStorePart("throttle", "damper: retry throttle store error")

// gateThrottle moves a call on: another backend has a count of its own.
var gateThrottle = &gate{outcome: OutcomeRetryThrottled, reason: ErrRetryThrottled, moves: true, part: newThrottleGate}

// newThrottleGate makes backend b's throttle from its store, or nil
// without Policy.Throttle.
func newThrottleGate(d *Damper, b *backend) (hooks, error) {
	p := d.policy.Throttle
	if p == nil {
		return hooks{}, nil
	}
	t, err := fromStore("Throttle", b.store, fleet.ThrottleStore.Throttle, fleet.MemoryStore.Throttle, fleet.ThrottleSettings{MaxTokens: p.MaxTokens, TokenRatio: p.TokenRatio})
	if err != nil {
		return hooks{}, err
	}
	rt := newRetryThrottle(p, t, d.tel)
	return hooks{retry: rt, hedge: rt, observe: rt}, nil
}

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
type ThrottlePolicy struct {
	// MaxTokens is the number of tokens, and where the count starts.
	// Default 10; at least 1, at most 1000.
	MaxTokens int `key:"max_tokens" default:"10" in:"[1,1000]"`
	// TokenRatio is what each answered attempt earns, at least 0.001 and
	// at most 1. Default 0.2: the count holds while fewer than one attempt
	// in six fails.
	TokenRatio float64 `key:"token_ratio" default:"0.2" in:"(0,1]"`
}

// check is what the tags of ThrottlePolicy cannot say: the count keeps
// thousandths of a token.
func (p *ThrottlePolicy) check(ThrottlePolicy) error {
	if math.Round(p.TokenRatio*1000) < 1 {
		return fieldError("TokenRatio", p.TokenRatio, "must be at least 0.001")
	}
	return nil
}

// retryThrottle is the throttle's rule over its count of tokens, kept in
// thousandths of a token by a [fleet.Throttle].
type retryThrottle struct {
	half, ratio int64
	t           fleet.Throttle
	tel         *telemetry
}

func newRetryThrottle(p *ThrottlePolicy, t fleet.Throttle, tel *telemetry) *retryThrottle {
	return &retryThrottle{half: int64(p.MaxTokens) * 500, ratio: int64(math.Round(p.TokenRatio * 1000)), t: t, tel: tel}
}

// observeAttempt takes a token for a failed attempt that could be retried
// and gives back a share of one for an answered attempt.
func (t *retryThrottle) observeAttempt(ctx context.Context, _ time.Time, e attemptEvent) {
	var delta int64
	switch {
	case e.outcome.Success:
		delta = t.ratio
	case e.class == Retryable:
		delta = -1000
	default:
		return
	}
	if err := t.t.Add(keepGoing(ctx, t.t), delta); err != nil {
		t.tel.logStoreError(ctx, partThrottle, "add", err)
	}
}

// allows reports whether c may make a retry, or a hedge, now.
func (t *retryThrottle) allows(c *call) bool {
	n, err := t.t.Tokens(c.ctx)
	c.storeError(partThrottle, "tokens", err)
	return n > t.half
}

func (t *retryThrottle) refusesRetry(c *call, _ *retryAsk) *denial {
	if !t.allows(c) {
		return &denial{gate: gateThrottle}
	}
	return nil
}

func (t *retryThrottle) refusesHedge(c *call, _ time.Time) *denial {
	if !t.allows(c) {
		return &denial{gate: gateThrottle}
	}
	return nil
}
