package brownout

import "sync"

// retryThrottler is gRPC's client-side retry throttling (gRFC A6, as in
// grpc-go's clientconn.go): a token count that starts full, loses one token
// per failed attempt and gains ratio per success, never leaving
// [0, max]. Retries are refused while the count is at or below max/2. A nil
// throttler (not configured) never throttles.
type retryThrottler struct {
	max    float64
	thresh float64
	ratio  float64

	mu     sync.Mutex
	tokens float64 // requires mu held
}

func newRetryThrottler(maxTokens, ratio float64) *retryThrottler {
	return &retryThrottler{max: maxTokens, thresh: maxTokens / 2, ratio: ratio, tokens: maxTokens}
}

// throttle records a failed attempt and reports whether a retry of it must
// be refused. The failure is counted even when the retry would not have
// happened anyway, as gRPC does.
func (rt *retryThrottler) throttle() bool {
	if rt == nil {
		return false
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.tokens = max(rt.tokens-1, 0)
	return rt.tokens <= rt.thresh
}

// successfulRPC records a successful attempt.
func (rt *retryThrottler) successfulRPC() {
	if rt == nil {
		return
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.tokens = min(rt.tokens+rt.ratio, rt.max)
}
