package damper_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/damper-ai/damper-go"
)

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name    string
		headers map[string]string
		want    time.Duration
		ok      bool
	}{
		{"seconds", map[string]string{"retry-after": "2"}, 2 * time.Second, true},
		{"fractional seconds", map[string]string{"retry-after": "1.5"}, 1500 * time.Millisecond, true},
		{"milliseconds win", map[string]string{"retry-after-ms": "300", "retry-after": "2"}, 300 * time.Millisecond, true},
		{"bad ms falls back", map[string]string{"retry-after-ms": "soon", "retry-after": "2"}, 2 * time.Second, true},
		{"zero", map[string]string{"retry-after": "0"}, 0, true},
		{"RFC 1123 date", map[string]string{"retry-after": "Sun, 30 Nov 2026 12:00:30 GMT"}, 30 * time.Second, true},
		{"RFC 850 date", map[string]string{"retry-after": "Sunday, 30-Nov-26 12:01:00 GMT"}, time.Minute, true},
		{"ANSI C date", map[string]string{"retry-after": "Sun Nov 30 12:00:05 2026"}, 5 * time.Second, true},
		{"date in the past", map[string]string{"retry-after": "Sun, 30 Nov 2026 11:00:00 GMT"}, 0, false},
		{"negative", map[string]string{"retry-after": "-1"}, 0, false},
		{"NaN", map[string]string{"retry-after": "NaN"}, 0, false},
		{"Inf", map[string]string{"retry-after": "Inf"}, 0, false},
		{"huge is clamped", map[string]string{"retry-after": "1e308"}, 1000 * 24 * time.Hour, true},
		{"huge ms is clamped", map[string]string{"retry-after-ms": "1000000000000000000"}, 1000 * 24 * time.Hour, true},
		{"empty", map[string]string{"retry-after": ""}, 0, false},
		{"garbage", map[string]string{"retry-after": "tomorrow"}, 0, false},
		{"none", nil, 0, false},
	}
	for _, tt := range tests {
		h := http.Header{}
		for k, v := range tt.headers {
			h.Set(k, v)
		}
		got, ok := damper.ParseRetryAfter(h, now)
		if got != tt.want || ok != tt.ok {
			t.Errorf("%s: got (%v, %v), want (%v, %v)", tt.name, got, ok, tt.want, tt.ok)
		}
	}
}

// FuzzParseRetryAfter: no header value gives a negative delay, and any
// hint is bounded.
func FuzzParseRetryAfter(f *testing.F) {
	for _, s := range []string{"2", "0.3", "-1", "NaN", "Inf", "1e308", "", "Sun, 30 Nov 2026 12:00:30 GMT", "9223372036854775807"} {
		f.Add(s, s)
	}
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, ms, s string) {
		h := http.Header{}
		h.Set("retry-after-ms", ms)
		h.Set("retry-after", s)
		d, ok := damper.ParseRetryAfter(h, now)
		if d < 0 || d > 1000*24*time.Hour || (!ok && d != 0) {
			t.Fatalf("ParseRetryAfter(%q, %q) = (%v, %v)", ms, s, d, ok)
		}
	})
}
