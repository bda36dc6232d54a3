package redisstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/redistest"
	"github.com/damper-ai/damper-go/redisstore"
)

// TestBreakerFailuresReachRedisAtOnce: three processes share a closed
// breaker, each in turn admitting an attempt that fails. A failure's Done
// reaches Redis before it returns, so the next process's Allow counts it:
// the fleet admits before the breaker opens exactly what one breaker
// admits on the same sequence, never up to N − 1 more. Ten rounds, each on
// a Name of its own, so that a Done left to a batch sent later loses the
// race at least once.
func TestBreakerFailuresReachRedisAtOnce(t *testing.T) {
	const n = 3
	srv := redistest.Start(t)
	ctx := context.Background()
	settings := fleet.BreakerSettings{FailureRatio: 0.5, MinAttempts: 3, Window: 10 * time.Second,
		OpenFor: 10 * time.Second, MaxOpenFor: 10 * time.Second, ProbeLimit: time.Second}
	// run counts the attempts bs admit on 2 s of steps of 100 ms, each
	// breaker asked once a step and every attempt failing.
	run := func(bs []fleet.Breaker) int {
		admitted := 0
		for at := 100 * time.Millisecond; at <= 2*time.Second; at += 100 * time.Millisecond {
			now := base.Add(at)
			for _, b := range bs {
				a, _ := b.Allow(ctx, now)
				if a.OK {
					admitted++
					_ = b.Done(ctx, a.Ticket, now, fleet.CircuitFailure)
				}
			}
		}
		return admitted
	}
	one, err := fleet.MemoryStore{}.Breaker(settings)
	mustNil(t, err)
	want := run([]fleet.Breaker{one})
	if want != 3 {
		t.Fatalf("one breaker admitted %d, want 3 (MinAttempts)", want)
	}
	for round := range 10 {
		f := newFaultFleet(t, srv, fmt.Sprintf("lag-%d", round), n, redisstore.Options{})
		bs := make([]fleet.Breaker, n)
		for i, s := range f.stores {
			bs[i], err = s.Breaker(settings)
			mustNil(t, err)
		}
		if got := run(bs); got != want {
			t.Fatalf("round %d: the fleet admitted %d before its shared breaker opened, want %d as one breaker", round, got, want)
		}
		for i, s := range f.stores {
			if st := s.State(); st != redisstore.StateShared {
				t.Fatalf("round %d: store %d in %v, want shared", round, i, st)
			}
		}
	}
}
