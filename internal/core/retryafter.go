package core

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// maxHint is the longest provider delay that parses as a hint. Anything
// longer is still a hint (and refused by MaxRetryAfter), but is clamped here
// so that no arithmetic on it overflows.
const maxHint = 1000 * 24 * time.Hour

// ParseRetryAfter reads the provider's delay from the response headers:
// retry-after-ms (milliseconds), else retry-after (seconds, or an HTTP date
// in any of the three formats net/http accepts, relative to now). A value
// that is negative, NaN, infinite or unparseable, or a date in the past, is
// no hint: ok is false. A huge value is clamped, never overflowed.
func ParseRetryAfter(h http.Header, now time.Time) (d time.Duration, ok bool) {
	if v := strings.TrimSpace(h.Get("retry-after-ms")); v != "" {
		if d, ok := parseHintNumber(v, float64(time.Millisecond)); ok {
			return d, true
		}
	}
	v := strings.TrimSpace(h.Get("retry-after"))
	if v == "" {
		return 0, false
	}
	if d, ok := parseHintNumber(v, float64(time.Second)); ok {
		return d, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	d = t.Sub(now)
	if d < 0 {
		return 0, false
	}
	return min(d, maxHint), true
}

func parseHintNumber(v string, unit float64) (time.Duration, bool) {
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
		return 0, false
	}
	ns := f * unit
	if ns >= float64(maxHint) {
		return maxHint, true
	}
	return time.Duration(ns), true
}
