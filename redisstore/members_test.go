package redisstore_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/redistest"
	"github.com/damper-ai/damper-go/redisstore"
	"github.com/redis/go-redis/v9"
)

// opsHook records the script operations of each round trip, unfiltered.
type opsHook struct {
	mu    sync.Mutex
	trips [][]string
}

func (h *opsHook) add(cmds ...redis.Cmder) {
	var ops []string
	for _, cmd := range cmds {
		if cmd.Name() == "evalsha" || cmd.Name() == "eval" {
			o, _ := redisstore.ScriptOps(cmd.Args())
			ops = append(ops, o...)
		}
	}
	if len(ops) > 0 {
		h.mu.Lock()
		h.trips = append(h.trips, ops)
		h.mu.Unlock()
	}
}

func (h *opsHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *opsHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.add(cmd)
		return next(ctx, cmd)
	}
}
func (h *opsHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.add(cmds...)
		return next(ctx, cmds)
	}
}

func (h *opsHook) take() [][]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	t := h.trips
	h.trips = nil
	return t
}

// TestMembers: each store counts itself among the members of its Name
// with its first record, in the same batch; the count is Redis's,
// members not refreshed within MemberFor are trimmed, and the last count
// heard holds while Redis cannot be reached.
func TestMembers(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	admin := newClient1(t, srv.Addr)
	hook := &opsHook{}
	stores := make([]*redisstore.Store, 3)
	budgets := make([]fleet.Budget, 3)
	for i := range stores {
		var hooks []redis.Hook
		if i == 0 {
			hooks = append(hooks, hook)
		}
		s, err := redisstore.New(newClientWith(t, &redis.Options{Addr: srv.Addr, MaxRetries: -1}, hooks...),
			redisstore.Options{Name: "members", Timeout: conformanceTimeout})
		mustNil(t, err)
		stores[i] = s
		if n := stores[i].Members(); n != 1 {
			t.Fatalf("store %d: Members before any round trip = %d, want 1", i, n)
		}
		b, err := stores[i].Budget(fleet.BudgetSettings{Ratio: 0.1, Window: time.Minute, MinTokens: 10})
		mustNil(t, err)
		budgets[i] = b
		observe(t, stores[i], b)
		if n := stores[i].Members(); n != i+1 {
			t.Errorf("store %d: Members after its first record = %d, want %d", i, n, i+1)
		}
	}
	if got, want := hook.take(), [][]string{{"store:members", "budget:observe"}}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("round trips of the first record = %v, want %v: the refresh rides with it", got, want)
	}
	// A decision goes alone, and a record within the refresh's interval
	// carries none.
	if _, err := budgets[0].Acquire(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	observe(t, stores[0], budgets[0])
	for _, trip := range hook.take() {
		if !slices.Equal(trip, []string{"budget:acquire"}) && !slices.Equal(trip, []string{"budget:observe"}) {
			t.Errorf("a round trip of a decision and a record ran %v, want [budget:acquire] or [budget:observe]", trip)
		}
	}

	// A member refreshed MemberFor ago, and a millisecond more, is gone;
	// one refreshed just now counts.
	tm, err := admin.Time(ctx).Result()
	mustNil(t, err)
	key := redisstore.MembersKey("members")
	mustNil(t, admin.ZAdd(ctx, key,
		redis.Z{Score: float64(tm.Add(-redisstore.MemberFor - time.Millisecond).UnixMilli()), Member: "gone"},
		redis.Z{Score: float64(tm.UnixMilli()), Member: "peer"}).Err())
	redisstore.JoinNow(stores[0])
	observe(t, stores[0], budgets[0])
	if n := stores[0].Members(); n != 4 {
		t.Errorf("Members after a refresh with a stale member and a new one = %d, want 4", n)
	}
	if _, err := admin.ZScore(ctx, key, "gone").Result(); err != redis.Nil {
		t.Errorf("the stale member: ZSCORE error %v, want redis.Nil (trimmed)", err)
	}
	if ttl, _ := admin.PTTL(ctx, key).Result(); ttl <= 0 || ttl > redisstore.MemberFor {
		t.Errorf("the members' key expires in %v, want (0, %v]", ttl, redisstore.MemberFor)
	}

	// Redis cannot be reached: the last count holds.
	srv.Pause()
	defer srv.Resume()
	redisstore.JoinNow(stores[0])
	stores[0].Probe(ctx) // falls back
	_ = budgets[0].Observe(ctx, time.Now(), success)
	if st, n := stores[0].State(), stores[0].Members(); st != redisstore.StateFallback || n != 4 {
		t.Errorf("in a fault: State %v, Members %d; want fallback, 4 (the last heard)", st, n)
	}
}

// observe records a success on b and waits until Redis has it.
func observe(t *testing.T, s *redisstore.Store, b fleet.Budget) {
	t.Helper()
	ctx := context.Background()
	mustNil(t, b.Observe(ctx, time.Now(), success))
	mustNil(t, s.Flush(ctx))
}

// TestProbeKeepsMembership: a store that only probes stays among the
// members: a Probe due for a refresh sends the refresh instead of its
// PING (one round trip either way), so another store's count keeps it
// past MemberFor; a Probe with no refresh due is a PING.
func TestProbeKeepsMembership(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	admin := newClient1(t, srv.Addr)
	hook := &opsHook{}
	busy, err := redisstore.New(newClient1(t, srv.Addr), redisstore.Options{Name: "idle", Timeout: conformanceTimeout})
	mustNil(t, err)
	idle, err := redisstore.New(newClientWith(t, &redis.Options{Addr: srv.Addr, MaxRetries: -1}, hook),
		redisstore.Options{Name: "idle", Timeout: conformanceTimeout})
	mustNil(t, err)
	b, err := busy.Budget(fleet.BudgetSettings{Ratio: 0.1, Window: time.Minute, MinTokens: 10})
	mustNil(t, err)
	observe(t, busy, b)
	mustNil(t, idle.Probe(ctx))
	if n := idle.Members(); n != 2 {
		t.Errorf("the idle store's Members = %d, want 2 (the count its probe heard)", n)
	}
	redisstore.JoinNow(busy)
	observe(t, busy, b)
	if n := busy.Members(); n != 2 {
		t.Fatalf("Members after the idle store's first probe = %d, want 2", n)
	}
	// The script's first run is an EVALSHA that Redis refuses, then EVAL.
	for _, trip := range hook.take() {
		if !slices.Equal(trip, []string{"store:members"}) {
			t.Errorf("the first probe's round trips ran %v, want [store:members] only", trip)
		}
	}
	// Within the refresh's interval a probe is a PING.
	mustNil(t, idle.Probe(ctx))
	if got := hook.take(); len(got) != 0 {
		t.Errorf("a probe with no refresh due ran %v, want none (a PING)", got)
	}

	// The idle store last refreshed MemberFor ago, and a millisecond more:
	// its next probe refreshes it before the busy store's refresh trims.
	key := redisstore.MembersKey("idle")
	for _, probe := range []bool{true, false} {
		tm, err := admin.Time(ctx).Result()
		mustNil(t, err)
		ids, err := admin.ZRange(ctx, key, 0, -1).Result()
		mustNil(t, err)
		for _, id := range ids {
			mustNil(t, admin.ZAdd(ctx, key, redis.Z{Score: float64(tm.Add(-redisstore.MemberFor - time.Millisecond).UnixMilli()), Member: id}).Err())
		}
		redisstore.JoinNow(idle)
		if probe {
			mustNil(t, idle.Probe(ctx))
		}
		redisstore.JoinNow(busy)
		observe(t, busy, b)
		want := 1
		if probe {
			want = 2
		}
		if n := busy.Members(); n != want {
			t.Errorf("probed %v: Members past MemberFor = %d, want %d", probe, n, want)
		}
	}
}
