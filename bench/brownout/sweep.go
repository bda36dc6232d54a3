package brownout

import (
	"fmt"
	"time"

	"github.com/damper-ai/damper-go"
)

// ThrottleSettings returns the settings of Damper's retry throttle that
// the sweep compares: the defaults (10 tokens, ratio 0.2), a lower and a
// higher ratio, and half and twice the tokens.
func ThrottleSettings() []damper.ThrottlePolicy {
	return []damper.ThrottlePolicy{
		{MaxTokens: 10, TokenRatio: 0.1},
		{MaxTokens: 10, TokenRatio: 0.2},
		{MaxTokens: 10, TokenRatio: 0.3},
		{MaxTokens: 5, TokenRatio: 0.2},
		{MaxTokens: 20, TokenRatio: 0.2},
	}
}

// Sweep is Damper's default policy plus a retry throttle of each of
// Settings, run as one contender per setting.
type Sweep struct {
	Settings []damper.ThrottlePolicy
	*Suite
}

// SweepThrottle runs the sweep of settings over the scenarios and the
// outage's starts.
func SweepThrottle(scenarios []Scenario, outageStarts []time.Duration, settings []damper.ThrottlePolicy) (*Sweep, error) {
	contenders := make([]Contender, len(settings))
	for i, t := range settings {
		contenders[i] = DamperThrottleWith(throttleName(t), t)
	}
	s, err := RunSuite(scenarios, outageStarts, contenders)
	if err != nil {
		return nil, err
	}
	return &Sweep{Settings: settings, Suite: s}, nil
}

func throttleName(t damper.ThrottlePolicy) string {
	return fmt.Sprintf("%d tokens, ratio %g", t.MaxTokens, t.TokenRatio)
}

// BreakerSettings returns the open periods of the breaker that the breaker
// sweep compares, each with the rest of the recommended policy: the
// breaker's defaults (30 s, doubling up to 5 min), two shorter pairs, the
// recommended one (2 s up to 10 s) among them, and a shorter one still.
func BreakerSettings() []damper.BreakerPolicy {
	return []damper.BreakerPolicy{
		{OpenFor: defaults.Breaker.OpenFor, MaxOpenFor: defaults.Breaker.MaxOpenFor},
		{OpenFor: 5 * time.Second, MaxOpenFor: time.Minute},
		{OpenFor: recommended.Breaker.OpenFor, MaxOpenFor: recommended.Breaker.MaxOpenFor},
		{OpenFor: time.Second, MaxOpenFor: 4 * time.Second},
	}
}

// SweepBreaker runs the recommended policy with each of settings' open
// periods over the scenarios and the outage's starts.
func SweepBreaker(scenarios []Scenario, outageStarts []time.Duration, settings []damper.BreakerPolicy) (*Suite, error) {
	contenders := make([]Contender, len(settings))
	for i, b := range settings {
		name := breakerName(b)
		contenders[i] = damperContender(name, name, func() damper.Policy {
			p := damper.RecommendedPolicy()
			p.Breaker.OpenFor, p.Breaker.MaxOpenFor = b.OpenFor, b.MaxOpenFor
			return p
		})
	}
	return RunSuite(scenarios, outageStarts, contenders)
}

func breakerName(b damper.BreakerPolicy) string {
	return fmt.Sprintf("open %s, up to %s", secs0(b.OpenFor), secs0(b.MaxOpenFor))
}
