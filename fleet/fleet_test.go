package fleet_test

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/damper-ai/damper-go/fleet"
)

func breakerSettings() fleet.BreakerSettings {
	return fleet.BreakerSettings{FailureRatio: 0.5, MinAttempts: 20, Window: 30 * time.Second, OpenFor: 30 * time.Second, MaxOpenFor: 300 * time.Second}
}

// MemoryStore takes settings as a Damper gives them, every value set: a
// value it cannot use is an error naming the field and the value, never
// a default.
func TestMemoryStoreRefusesBadSettings(t *testing.T) {
	var m fleet.MemoryStore
	breaker := func(f func(*fleet.BreakerSettings)) error {
		s := breakerSettings()
		f(&s)
		_, err := m.Breaker(s)
		return err
	}
	limits := func(s fleet.LimitSettings) error {
		_, err := m.LimitBuckets(s)
		return err
	}
	throttle := func(max int) error {
		_, err := m.Throttle(fleet.ThrottleSettings{MaxTokens: max, TokenRatio: 0.2})
		return err
	}
	budget := func(ratio float64, window time.Duration, minTokens int) error {
		_, err := m.Budget(fleet.BudgetSettings{Ratio: ratio, Window: window, MinTokens: minTokens})
		return err
	}
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"throttle of no tokens", throttle(0), "ThrottleSettings.MaxTokens = 0"},
		{"throttle of 1001 tokens", throttle(1001), "ThrottleSettings.MaxTokens = 1001"},
		{"breaker ratio 0", breaker(func(s *fleet.BreakerSettings) { s.FailureRatio = 0 }), "BreakerSettings.FailureRatio = 0"},
		{"breaker ratio NaN", breaker(func(s *fleet.BreakerSettings) { s.FailureRatio = math.NaN() }), "BreakerSettings.FailureRatio = NaN"},
		{"breaker ratio over 1", breaker(func(s *fleet.BreakerSettings) { s.FailureRatio = 1.5 }), "BreakerSettings.FailureRatio = 1.5"},
		{"breaker of no attempts", breaker(func(s *fleet.BreakerSettings) { s.MinAttempts = 0 }), "BreakerSettings.MinAttempts = 0"},
		{"breaker window too short", breaker(func(s *fleet.BreakerSettings) { s.Window = 29 }), "BreakerSettings.Window = 29ns"},
		{"breaker never open", breaker(func(s *fleet.BreakerSettings) { s.OpenFor = 0 }), "BreakerSettings.OpenFor = 0s"},
		{"breaker max under open", breaker(func(s *fleet.BreakerSettings) { s.MaxOpenFor = time.Second }), "BreakerSettings.MaxOpenFor = 1s"},
		{"no batch share", limits(fleet.LimitSettings{Group: "g"}), "LimitSettings.BatchShare = 0"},
		{"batch share over 1", limits(fleet.LimitSettings{Group: "g", BatchShare: 1.1}), "LimitSettings.BatchShare = 1.1"},
		{"negative limit", limits(fleet.LimitSettings{Group: "g", BatchShare: 0.8, Limits: fleet.RateLimits{InputTokensPerMinute: -1}}), "LimitSettings.Limits.InputTokensPerMinute = -1"},
		{"negative budget ratio", budget(-1, time.Minute, 10), "ratio = -1"},
		{"budget of no window", budget(0.1, 0, 10), "window = 0s"},
	}
	for _, tt := range tests {
		if tt.err == nil || !strings.Contains(tt.err.Error(), tt.want) {
			t.Errorf("%s: error %v, want one naming %q", tt.name, tt.err, tt.want)
		}
	}
	for _, err := range []error{breaker(func(*fleet.BreakerSettings) {}), limits(fleet.LimitSettings{BatchShare: 1}), throttle(1000), budget(0, time.Nanosecond, 0)} {
		if err != nil {
			t.Errorf("good settings refused: %v", err)
		}
	}
}

// The parts MemoryStore makes are in memory; one wrapped is not.
func TestInMemory(t *testing.T) {
	var m fleet.MemoryStore
	b, _ := m.Budget(fleet.BudgetSettings{Ratio: 0.1, Window: time.Minute, MinTokens: 10})
	th, _ := m.Throttle(fleet.ThrottleSettings{MaxTokens: 10, TokenRatio: 0.2})
	br, _ := m.Breaker(breakerSettings())
	l, _ := m.LimitBuckets(fleet.LimitSettings{Group: "g", BatchShare: 0.8})
	for _, part := range []any{b, th, br, l} {
		if !fleet.InMemory(part) {
			t.Errorf("%T: not in memory", part)
		}
	}
	if fleet.InMemory(wrapped{th}) || fleet.InMemory(nil) {
		t.Error("a part of another store is in memory")
	}
}

type wrapped struct{ fleet.Throttle }

// The throttle in memory keeps its count within [0, MaxTokens×1000],
// starting full.
func TestMemoryThrottleBounds(t *testing.T) {
	ctx := context.Background()
	th, err := fleet.MemoryStore{}.Throttle(fleet.ThrottleSettings{MaxTokens: 2, TokenRatio: 0.2})
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct{ add, want int64 }{{0, 2000}, {500, 2000}, {-1500, 500}, {-1000, 0}, {200, 200}} {
		if err := th.Add(ctx, step.add); err != nil {
			t.Fatal(err)
		}
		if n, _ := th.Tokens(ctx); n != step.want {
			t.Fatalf("after adding %d: %d tokens, want %d", step.add, n, step.want)
		}
	}
}
