package engine

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/damper-ai/damper-go/dampertest"
)

// 10,000 distinct limit groups leave at most maxLatencyWindows windows,
// each keyed by at most maxLabelBytes; a group in use keeps its window
// through the flood, and windows idle for latencyWindowIdle are dropped.
func TestHedgerWindowsBounded(t *testing.T) {
	clock := dampertest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	p, err := filledPart(HedgePolicy{Window: 20, MinSamples: 2}, "Hedge")
	if err != nil {
		t.Fatal(err)
	}
	h := newHedger(*p, clock)
	busy := latencyKey{group: "claude-sonnet-4"}
	long := strings.Repeat("g", 64<<10)
	for i := range 10_000 {
		h.record(latencyKey{group: fmt.Sprintf("%s-%d", long[:1+i%2*(64<<10-1)], i), stream: i%3 == 0}, time.Second)
		if i%10 == 0 {
			h.record(busy, 2*time.Second) // sampled more often than the flood evicts
		}
		clock.Advance(time.Millisecond)
	}
	if n := len(h.windows); n != maxLatencyWindows {
		t.Errorf("%d windows after 10,000 groups, want %d", n, maxLatencyWindows)
	}
	for k := range h.windows {
		if len(k.group) > maxLabelBytes {
			t.Fatalf("a window keyed by %d bytes", len(k.group))
		}
	}
	if d, ok := h.delay(busy); !ok || d != 2*time.Second {
		t.Errorf("the busy group's delay is %v, %v; want 2s, true: its window was kept", d, ok)
	}

	// An hour on, the flood has stopped and only the busy group is seen.
	clock.Advance(latencyWindowIdle - 10*time.Second)
	h.record(busy, 2*time.Second)
	clock.Advance(latencyWindowIdle / 4)
	h.record(busy, 2*time.Second)
	if n := len(h.windows); n != 1 {
		t.Errorf("%d windows once every other group was idle for %v, want 1", n, latencyWindowIdle)
	}
}
