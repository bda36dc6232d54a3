package core

import "time"

// Backoff returns the wait before retry number retry (1 for the first
// retry). rnd is a uniform random number in [0, 1).
//
// Without a provider hint it is full jitter: uniform in
// [0, min(max, base·2^(retry-1))]. With a hint it is the hint plus a spread
// of up to a tenth of it (at most base), so that many clients told the same
// delay do not return together; the spread never takes the wait past
// capAfter, the longest provider delay that is honoured.
func Backoff(retry int, base, maxWait time.Duration, hint time.Duration, hasHint bool, capAfter time.Duration, rnd float64) time.Duration {
	rnd = clamp01(rnd)
	if hasHint {
		spread := time.Duration(rnd * float64(min(hint/10, base)))
		return max(hint, min(hint+spread, capAfter))
	}
	ceiling := maxWait
	if retry < 1 {
		retry = 1
	}
	// base·2^(retry-1), without overflowing for a large retry number.
	if shift := retry - 1; shift < 62 && base <= maxWait>>shift {
		ceiling = base << shift
	}
	return time.Duration(rnd * float64(ceiling))
}

func clamp01(f float64) float64 {
	if !(f >= 0) { // also NaN
		return 0
	}
	if f >= 1 {
		return 0.9999999999
	}
	return f
}
