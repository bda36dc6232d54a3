package hedge

import (
	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/conf"
)

// defaults is the zero Policy, with every part, filled in: each field's
// default as its declaration's tag gives it.
var defaults = conf.Defaults(damper.Policy{Breaker: &damper.BreakerPolicy{}, Throttle: &damper.ThrottlePolicy{},
	RateLimit: &damper.RateLimitPolicy{}, Hedge: &damper.HedgePolicy{}})
