package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/redistest"
	"github.com/damper-ai/damper-go/redisstore"
	"github.com/redis/go-redis/v9"
)

// thrStore returns a store on client.
func thrStore(tb testing.TB, client redis.UniversalClient, o redisstore.Options) *redisstore.Store {
	tb.Helper()
	s, err := redisstore.New(client, o)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// thrThrottle returns the store's throttle for p.
func thrThrottle(tb testing.TB, s *redisstore.Store, p fleet.ThrottleSettings) fleet.Throttle {
	tb.Helper()
	th, err := s.Throttle(p)
	if err != nil {
		tb.Fatal(err)
	}
	if th == nil {
		tb.Fatal("Throttle returned nil: kept in memory")
	}
	return th
}

func thrMemory(tb testing.TB, p fleet.ThrottleSettings) fleet.Throttle {
	tb.Helper()
	th, err := fleet.MemoryStore{}.Throttle(p)
	if err != nil {
		tb.Fatal(err)
	}
	return th
}

// TestThrottleMatchesMemory runs the same random Adds on a Redis throttle
// and on MemoryStore's: every count must be the same, bounds included.
func TestThrottleMatchesMemory(t *testing.T) {
	srv := redistest.Start(t)
	client := newClient1(t, srv.Addr)
	ctx := context.Background()
	for i, p := range []fleet.ThrottleSettings{{MaxTokens: 10, TokenRatio: 0.2}, {MaxTokens: 1, TokenRatio: 0.2}, {MaxTokens: 3, TokenRatio: 0.35}, {MaxTokens: 1000, TokenRatio: 1}} {
		t.Run(fmt.Sprintf("max=%d", p.MaxTokens), func(t *testing.T) {
			s := thrStore(t, client, redisstore.Options{Name: fmt.Sprintf("thr-arith-%d", i), Timeout: 5 * time.Second})
			rt, mt := thrThrottle(t, s, p), thrMemory(t, p)
			full := int64(p.MaxTokens) * 1000
			if got, err := rt.Tokens(ctx); got != full || err != nil {
				t.Fatalf("Tokens of a new throttle = %d, %v; want %d, full", got, err, full)
			}
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			var floors, ceilings int
			for step := range 300 {
				var delta int64
				switch r := rng.IntN(10); {
				case r < 4:
					delta = -1000
				case r < 8:
					delta = int64(1 + rng.IntN(1000))
				case r < 9:
					delta = -rng.Int64N(3 * full)
				default:
					delta = rng.Int64N(3 * full)
				}
				mustNil(t, rt.Add(ctx, delta))
				mustNil(t, mt.Add(ctx, delta))
				got, err := rt.Tokens(ctx)
				mustNil(t, err)
				want, _ := mt.Tokens(ctx)
				if got != want {
					t.Fatalf("step %d: after Add(%d), Tokens = %d, memory says %d", step, delta, got, want)
				}
				switch got {
				case 0:
					floors++
				case full:
					ceilings++
				}
			}
			if floors == 0 || ceilings == 0 {
				t.Fatalf("the sequence never reached the bounds (%d at 0, %d full)", floors, ceilings)
			}
		})
	}
	if _, err := thrStore(t, client, redisstore.Options{Name: "thr-bad"}).Throttle(fleet.ThrottleSettings{MaxTokens: 1001, TokenRatio: 0.2}); err == nil || !strings.Contains(err.Error(), "MaxTokens") {
		t.Fatalf("Throttle(MaxTokens: 1001): error %v, want one naming MaxTokens", err)
	}
}

// TestThrottleShared: two stores on two clients with one Name draw on one
// count; another Name has its own. The key is the documented one, with a
// time to live of an hour refreshed on each Add.
func TestThrottleShared(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	p := fleet.ThrottleSettings{MaxTokens: 4, TokenRatio: 0.2}
	stores := []*redisstore.Store{
		thrStore(t, newClient1(t, srv.Addr), redisstore.Options{Name: "thr-shared"}),
		thrStore(t, newClient1(t, srv.Addr), redisstore.Options{Name: "thr-shared"}),
		thrStore(t, newClient1(t, srv.Addr), redisstore.Options{Name: "thr-other"}),
	}
	a, b, other := thrThrottle(t, stores[0], p), thrThrottle(t, stores[1], p), thrThrottle(t, stores[2], p)
	mustNil(t, a.Add(ctx, -1000))
	mustNil(t, b.Add(ctx, -1500))
	mustNil(t, other.Add(ctx, -200))
	for _, s := range stores { // each process's records reach Redis
		mustNil(t, s.Flush(ctx))
	}
	for _, c := range []struct {
		name string
		th   fleet.Throttle
		want int64
	}{{"a", a, 1500}, {"b", b, 1500}, {"other", other, 3800}} {
		if got, err := c.th.Tokens(ctx); got != c.want || err != nil {
			t.Fatalf("Tokens of %s = %d, %v; want %d", c.name, got, err, c.want)
		}
	}

	client := newClient1(t, srv.Addr)
	if got := client.Get(ctx, "damper:{thr-shared}:throttle").Val(); got != "1500" || redisstore.ThrottleKey("thr-shared") != "damper:{thr-shared}:throttle" {
		t.Fatalf("the key holds %q, want 1500", got)
	}
	ttl := client.PTTL(ctx, redisstore.ThrottleKey("thr-shared")).Val()
	if ttl <= time.Hour-time.Minute || ttl > time.Hour {
		t.Fatalf("time to live %v, want about %v", ttl, redisstore.ThrottleTTL)
	}
	// Tokens reads only: it neither makes the key nor refreshes it.
	mustNil(t, client.PExpire(ctx, redisstore.ThrottleKey("thr-shared"), time.Minute).Err())
	if _, err := a.Tokens(ctx); err != nil {
		t.Fatal(err)
	}
	if ttl := client.PTTL(ctx, redisstore.ThrottleKey("thr-shared")).Val(); ttl > time.Minute {
		t.Fatalf("Tokens refreshed the time to live to %v", ttl)
	}
	fresh := thrThrottle(t, thrStore(t, client, redisstore.Options{Name: "thr-fresh"}), p)
	if got, err := fresh.Tokens(ctx); got != 4000 || err != nil {
		t.Fatalf("Tokens of a missing key = %d, %v; want 4000, full", got, err)
	}
	if n := client.Exists(ctx, redisstore.ThrottleKey("thr-fresh")).Val(); n != 0 {
		t.Fatal("Tokens made the key")
	}
	// A key that expires starts full again.
	mustNil(t, client.Del(ctx, redisstore.ThrottleKey("thr-shared")).Err())
	if got, err := b.Tokens(ctx); got != 4000 || err != nil {
		t.Fatalf("Tokens after the key expired = %d, %v; want 4000", got, err)
	}
}

// TestThrottleOutage kills Redis: every call returns within the timeout;
// by default the local count, which heard every Add, decides; with
// FailClosed, Tokens is 0; both return the error, and both are shared
// again once Redis is back.
func TestThrottleOutage(t *testing.T) {
	for _, failClosed := range []bool{false, true} {
		t.Run(fmt.Sprintf("FailClosed=%v", failClosed), func(t *testing.T) {
			eachClientKind(t, func(t *testing.T, ctxTimeout bool) {
				srv := redistest.Start(t)
				ctx := context.Background()
				p := fleet.ThrottleSettings{MaxTokens: 10, TokenRatio: 0.2}
				o := redisstore.Options{Name: "thr-outage", Timeout: outageTimeout, FailClosed: failClosed}
				s := thrStore(t, newClientWith(t, &redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: ctxTimeout}), o)
				th := thrThrottle(t, s, p)
				peerStore := thrStore(t, newClient1(t, srv.Addr), o)
				peer := thrThrottle(t, peerStore, p)
				local := thrMemory(t, p) // what this process has heard
				add := func(d int64) error {
					_ = local.Add(ctx, d)
					return th.Add(ctx, d)
				}
				mustNil(t, add(-3000))
				mustNil(t, peer.Add(ctx, -4000)) // the fleet: 3000 left
				mustNil(t, peerStore.Flush(ctx))
				if got, err := th.Tokens(ctx); got != 3000 || err != nil {
					t.Fatalf("shared Tokens = %d, %v; want 3000", got, err)
				}

				srv.Kill()
				bound := outageTimeout + slack
				unasked := 0
				for i := range 12 {
					var err error
					timed(t, "Add with Redis down", bound, func() { err = add(int64(700 - 300*(i%3))) })
					// The first is queued before the failure is known: the
					// batch that carries it, with Tokens, fails.
					if (err == nil) != (i == 0) {
						t.Fatalf("Add %d with Redis down returned %v", i, err)
					}
					var got int64
					timed(t, "Tokens with Redis down", bound, func() { got, err = th.Tokens(ctx) })
					want, _ := local.Tokens(ctx)
					if failClosed {
						want = 0
					}
					if got != want || err == nil {
						t.Fatalf("Tokens with Redis down = %d, %v; want %d and an error", got, err, want)
					}
					if errors.Is(err, redisstore.ErrUnavailable) {
						unasked++
					}
					time.Sleep(5 * time.Millisecond)
				}
				if s.State() != redisstore.StateFallback {
					t.Fatalf("state %v with Redis down", s.State())
				}

				srv.Restart()
				back := time.Now()
				for {
					n, err := th.Tokens(ctx)
					if err == nil {
						// A restarted Redis without persistence: full.
						if n != 10000 {
							t.Fatalf("Tokens after the restart = %d, want 10000", n)
						}
						break
					}
					if failClosed && n != 0 {
						t.Fatalf("Tokens failing closed = %d", n)
					}
					if time.Since(back) > time.Second {
						t.Fatalf("not shared again %v after the restart: %v", time.Since(back), err)
					}
					time.Sleep(time.Millisecond)
				}
				t.Logf("shared again %v after Redis answered PING", time.Since(back))
				mustNil(t, peer.Add(ctx, -2000))
				mustNil(t, peerStore.Flush(ctx))
				if got, err := th.Tokens(ctx); got != 8000 || err != nil {
					t.Fatalf("Tokens after the peer's Add = %d, %v; want 8000", got, err)
				}
				if unasked == 0 {
					t.Fatal("no call during the outage was decided without asking Redis (ErrUnavailable)")
				}
			})
		})
	}
}
