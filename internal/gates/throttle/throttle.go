// Package throttle is the retry throttle's gate: its Policy, over a
// [fleet.Throttle] count from the backend's store. Before a retry or a
// hedge it checks the count, taking nothing; it hears every attempt's end.
package throttle

import (
	"context"
	"errors"
	"math"
	"time"

	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/conf"
	"github.com/damper-ai/damper-go/internal/core"
)

// OutcomeRetryThrottled: the retry throttle refused the retry.
const OutcomeRetryThrottled core.Outcome = "retry_throttled"

// ErrRetryThrottled: the retry throttle had half of its tokens or
// fewer left (see [Policy]).
var ErrRetryThrottled = errors.New("damper: retry throttled")

// partThrottle is the throttle's part of a store.
var partThrottle = core.NewStorePart("throttle", "damper: retry throttle store error")

// Gate moves a call on: another backend has a count of its own.
var Gate = &core.Gate{Outcome: OutcomeRetryThrottled, Reason: ErrRetryThrottled, Moves: true}

func init() { conf.Register((*Policy).check) }

// Part makes backend b's throttle from its store, or none without p.
func Part(p *Policy, b *core.Backend, env *core.Env) (core.Hooks, error) {
	if p == nil {
		return core.Hooks{}, nil
	}
	t, err := core.FromStore("Throttle", b.Store, fleet.ThrottleStore.Throttle, fleet.MemoryStore.Throttle, fleet.ThrottleSettings{MaxTokens: p.MaxTokens, TokenRatio: p.TokenRatio})
	if err != nil {
		return core.Hooks{}, err
	}
	rt := newRetryThrottle(p, t, env)
	return core.Hooks{Retry: rt, Hedge: rt, Observe: rt}, nil
}

// Policy configures the retry throttle, the rule of gRPC's retry
// throttling: a count of tokens that starts full at MaxTokens; each failed
// attempt that could be retried costs one token, each answered attempt
// earns TokenRatio, and no retry is made while half of MaxTokens or fewer
// are left. Unlike the retry budget, failures drain it, so a provider that
// answers nothing gets almost no retries. A retry needs both the throttle
// and the retry budget.
//
// The zero value is a working throttle with the defaults written beside
// each field; a nil *Policy in a Damper's Policy means no throttle.
type Policy struct {
	// MaxTokens is the number of tokens, and where the count starts.
	// Default 10; at least 1, at most 1000.
	MaxTokens int `key:"max_tokens" default:"10" in:"[1,1000]"`
	// TokenRatio is what each answered attempt earns, at least 0.001 and
	// at most 1. Default 0.2: the count holds while fewer than one attempt
	// in six fails.
	TokenRatio float64 `key:"token_ratio" default:"0.2" in:"(0,1]"`
}

// check is what the tags of Policy cannot say: the count keeps
// thousandths of a token.
func (p *Policy) check(Policy) error {
	if math.Round(p.TokenRatio*1000) < 1 {
		return &conf.FieldError{Field: "TokenRatio", Value: p.TokenRatio, Why: "must be at least 0.001"}
	}
	return nil
}

// retryThrottle is the throttle's rule over its count of tokens, kept in
// thousandths of a token by a [fleet.Throttle].
type retryThrottle struct {
	half, ratio int64
	t           fleet.Throttle
	env         *core.Env
}

func newRetryThrottle(p *Policy, t fleet.Throttle, env *core.Env) *retryThrottle {
	return &retryThrottle{half: int64(p.MaxTokens) * 500, ratio: int64(math.Round(p.TokenRatio * 1000)), t: t, env: env}
}

// Of is the throttle's count among a backend's parts, or nil.
func Of(parts []core.Hooks) fleet.Throttle {
	for _, h := range parts {
		if t, ok := h.Observe.(*retryThrottle); ok {
			return t.t
		}
	}
	return nil
}

// ObserveAttempt takes a token for a failed attempt that could be retried
// and gives back a share of one for an answered attempt.
func (t *retryThrottle) ObserveAttempt(ctx context.Context, _ time.Time, e core.Event) {
	var delta int64
	switch {
	case e.Outcome.Success:
		delta = t.ratio
	case e.Class == core.Retryable:
		delta = -1000
	default:
		return
	}
	if err := t.t.Add(core.KeepGoing(ctx, t.t), delta); err != nil {
		t.env.LogStoreError(ctx, partThrottle, "add", err)
	}
}

// allows reports whether c may make a retry, or a hedge, now.
func (t *retryThrottle) allows(c core.Call) bool {
	n, err := t.t.Tokens(c.Context())
	c.StoreError(partThrottle, "tokens", err)
	return n > t.half
}

func (t *retryThrottle) RefusesRetry(c core.Call, _ *core.RetryAsk) *core.Denial {
	if !t.allows(c) {
		return &core.Denial{Gate: Gate}
	}
	return nil
}

func (t *retryThrottle) RefusesHedge(c core.Call, _ time.Time) *core.Denial {
	if !t.allows(c) {
		return &core.Denial{Gate: Gate}
	}
	return nil
}
