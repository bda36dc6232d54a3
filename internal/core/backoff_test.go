package core

import (
	"math"
	"testing"
	"time"
)

func TestBackoffFullJitter(t *testing.T) {
	const s = time.Second
	tests := []struct {
		retry int
		rnd   float64
		want  time.Duration
	}{
		{1, 0.5, s / 2}, {2, 0.5, s}, {3, 0.5, 2 * s}, {6, 0.5, 15 * s}, {7, 0.5, 15 * s},
		{1, 0, 0}, {100, 0.5, 15 * s}, {1, math.NaN(), 0}, {1, 7, s - 1},
	}
	for _, tt := range tests {
		if got := Backoff(tt.retry, s, 30*s, 0, false, time.Minute, tt.rnd); got != tt.want {
			t.Errorf("Backoff(retry %d, rnd %v) = %v, want %v", tt.retry, tt.rnd, got, tt.want)
		}
	}
	// A hint is a floor; the spread is at most a tenth of it, within the cap.
	if got := Backoff(1, s, 30*s, 2*s, true, time.Minute, 0.999); got < 2*s || got > 2200*time.Millisecond {
		t.Errorf("hinted wait = %v, want in [2s, 2.2s]", got)
	}
	if got := Backoff(1, s, 30*s, time.Minute, true, time.Minute, 0.999); got != time.Minute {
		t.Errorf("hinted wait at the cap = %v, want 1m0s", got)
	}
}
