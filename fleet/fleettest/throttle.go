package fleettest

import (
	"context"
	"strconv"
	"testing"

	"github.com/damper-ai/damper-go/fleet"
)

func (e *env) throttle(t *testing.T) {
	t.Run("Settings", func(t *testing.T) {
		s := e.new(t).(fleet.ThrottleStore)
		for _, n := range []int{0, -1, 1001} {
			_, err := s.Throttle(fleet.ThrottleSettings{MaxTokens: n, TokenRatio: 0.1})
			wantFieldError(t, "Throttle", err, "MaxTokens", strconv.Itoa(n))
		}
	})
	t.Run("Bounds", e.throttleBounds)
	t.Run("Exact", e.throttleExact)
}

func newThrottle(t *testing.T, s fleet.Store, max int) fleet.Throttle {
	t.Helper()
	th, err := s.(fleet.ThrottleStore).Throttle(fleet.ThrottleSettings{MaxTokens: max, TokenRatio: 0.1})
	if err != nil || th == nil {
		t.Fatalf("Throttle(MaxTokens %d) = %v, %v; want a throttle", max, th, err)
	}
	return th
}

// throttleBounds: the count starts full and stays within [0, max].
func (e *env) throttleBounds(t *testing.T) {
	s := e.new(t)
	th := newThrottle(t, s, 10)
	ctx := context.Background()
	for _, step := range []struct{ delta, want int64 }{
		{0, 10000}, {-2500, 7500}, {-100000, 0}, {3000, 3000}, {1_000_000, 10000}, {-1, 9999},
	} {
		must(t, "Add", th.Add(ctx, step.delta))
		flush(t, s)
		if got, err := th.Tokens(ctx); err != nil || got != step.want {
			t.Fatalf("after Add(%d): Tokens = %d, %v; want %d", step.delta, got, err, step.want)
		}
	}
}

// throttleExact: every Add of every goroutine of the fleet counts.
func (e *env) throttleExact(t *testing.T) {
	const goroutines, adds = 8, 20
	stores := e.stores(t, fleetSize)
	ths := make([]fleet.Throttle, len(stores))
	for i, s := range stores {
		ths[i] = newThrottle(t, s, 1000)
	}
	ctx := context.Background()
	parallel(len(stores)*goroutines, func(i int) {
		th := ths[i%len(stores)]
		for j := range adds {
			delta := int64(-7)
			if j%4 == 3 { // never while the count is full
				delta = 3
			}
			if err := th.Add(ctx, delta); err != nil {
				t.Errorf("Add: %v", err)
			}
		}
	})
	flush(t, stores...)
	// Each goroutine: 5 × +3 and 15 × -7, from 1,000,000.
	perGoroutine := int64(5*3 - 15*7)
	want := 1_000_000 + perGoroutine*int64(goroutines*len(stores)/e.groups(len(stores)))
	for i, th := range ths {
		if got, err := th.Tokens(ctx); err != nil || got != want {
			t.Errorf("store %d: Tokens = %d, %v; want %d", i, got, err, want)
		}
	}
}
