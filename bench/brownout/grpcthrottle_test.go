package brownout

import "testing"

func TestRetryThrottler(t *testing.T) {
	rt := newRetryThrottler(10, 0.1)
	// 10 → 9, 8, 7, 6: retries allowed; 5 is at max/2: throttled.
	for i, want := range []bool{false, false, false, false, true, true} {
		if got := rt.throttle(); got != want {
			t.Fatalf("failure %d: throttle() = %v, want %v", i+1, got, want)
		}
	}
	if rt.tokens != 4 {
		t.Fatalf("tokens = %v, want 4", rt.tokens)
	}
	for range 11 {
		rt.successfulRPC()
	}
	// 4 + 1.1 = 5.1 > 5, so the next failure (to 4.1) is throttled again.
	if got := rt.throttle(); !got {
		t.Errorf("throttle() after 11 successes = false, want true (tokens %.1f)", rt.tokens)
	}
	for range 200 {
		rt.successfulRPC()
	}
	if rt.tokens != 10 {
		t.Errorf("tokens = %v, want capped at 10", rt.tokens)
	}
	var none *retryThrottler
	if none.throttle() {
		t.Error("a nil throttler throttled")
	}
	none.successfulRPC()
}
