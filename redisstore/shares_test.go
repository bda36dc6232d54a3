package redisstore_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/redistest"
	"github.com/damper-ai/damper-go/redisstore"
)

// shareStep is one ask of the shares' arithmetic test, at base+at, or, with
// settle set, the settling of the reservation of step settle-1 by used.
type shareStep struct {
	at      time.Duration
	tenant  string
	weight  int
	f       float64
	wait    time.Duration // latest is now + wait
	settle  int
	used    float64
	taken   bool
	due     time.Duration // when not taken, from base
	comment string
}

// shareSteps: alpha (weight 3) alone has the whole limit, and waits once
// its bucket is below 0; beta (weight 1) joining makes alpha's share 3/4;
// beta idle for more than TenantIdle is dropped, and alpha has it all
// again; beta back starts full; a settling gives back what was not used;
// a weight changed changes the share at once.
var shareSteps = []shareStep{
	{at: 0, tenant: "alpha", weight: 3, f: 0.5, wait: time.Minute, taken: true, comment: "new: full, 1"},
	{at: 0, tenant: "alpha", weight: 3, f: 0.5, wait: time.Minute, taken: true, comment: "0.5 left"},
	{at: 0, tenant: "alpha", weight: 3, f: 0.5, wait: time.Minute, taken: true, comment: "0 left: takes, to -0.5"},
	{at: 0, tenant: "alpha", weight: 3, f: 0.25, wait: time.Minute, due: 30 * time.Second, comment: "-0.5 refills at 1 a minute"},
	{at: 0, tenant: "beta", weight: 1, f: 0.1, wait: time.Minute, taken: true, comment: "new: 1/4, full"},
	{at: time.Second, tenant: "alpha", weight: 3, f: 0.1, wait: time.Minute, due: 40 * time.Second, comment: "-0.4875 at 3/4 a minute"},
	{at: time.Second, tenant: "beta", weight: 1, f: 0.2, taken: true, comment: "0.15 + 1/240"},
	{at: time.Second, tenant: "beta", weight: 1, f: 0.1, due: 12 * time.Second, comment: "refused: after latest, active until now"},
	{at: 40 * time.Second, tenant: "alpha", weight: 3, f: 0.5, taken: true, comment: "beta dropped: alpha's share 1, -0.4875 + 39/60"},
	{at: 40 * time.Second, tenant: "beta", weight: 1, f: 0.25, taken: true, comment: "beta new again: full, to 0"},
	{at: 40 * time.Second, settle: 10, used: 0.05, comment: "0.2 back"},
	{at: 40 * time.Second, tenant: "beta", weight: 1, f: 0.2, taken: true, comment: "0.2, to 0"},
	{at: 40 * time.Second, tenant: "beta", weight: 1, f: 0.1, taken: true, comment: "0, to -0.1"},
	{at: 40 * time.Second, tenant: "beta", weight: 1, f: 0.1, wait: time.Minute, due: 64 * time.Second, comment: "-0.1 at 1/4 a minute"},
	{at: 40 * time.Second, tenant: "alpha", weight: 1, f: 0.1, wait: time.Minute, due: 80*time.Second + 500*time.Millisecond, comment: "weight 1: share 1/2, -0.3375"},
}

// runShareSteps runs shareSteps on s and checks each answer, to the
// microsecond (Redis holds times as seconds in a double).
func runShareSteps(t *testing.T, s fleet.LimitShares) {
	t.Helper()
	ctx := context.Background()
	rs := make([]fleet.ShareReservation, len(shareSteps))
	for i, st := range shareSteps {
		now := base.Add(st.at)
		if st.settle > 0 {
			if err := s.Settle(ctx, now, rs[st.settle-1], st.used); err != nil {
				t.Fatalf("step %d: Settle: %v", i+1, err)
			}
			continue
		}
		r, due, err := s.Take(ctx, now, fleet.ShareAsk{Tenant: st.tenant, Weight: st.weight, Fraction: st.f}, now.Add(st.wait))
		if err != nil {
			t.Fatalf("step %d: Take: %v", i+1, err)
		}
		rs[i] = r
		want := now
		if !st.taken {
			want = base.Add(st.due)
		}
		if r.Taken() != st.taken || due.Sub(want).Abs() > time.Microsecond {
			t.Errorf("step %d (%s): taken %v, due %v; want %v, %v", i+1, st.comment, r.Taken(), due.Sub(base), st.taken, want.Sub(base))
		}
	}
}

// TestSharesArithmetic runs the same asks on the shares in memory and in
// Redis: the same answers, and Redis holds only the tenants active.
func TestSharesArithmetic(t *testing.T) {
	t.Run("memory", func(t *testing.T) {
		s, err := fleet.MemoryStore{}.LimitShares(fleet.ShareSettings{Group: "claude-sonnet-4"})
		if err != nil {
			t.Fatal(err)
		}
		runShareSteps(t, s)
	})
	t.Run("redis", func(t *testing.T) {
		client := newClient1(t, redistest.Start(t).Addr)
		store := newStore(t, client, "shares")
		s, err := store.LimitShares(fleet.ShareSettings{Group: "claude-sonnet-4"})
		if err != nil {
			t.Fatal(err)
		}
		runShareSteps(t, s)
		mustNil(t, store.Flush(context.Background()))
		ctx := context.Background()
		hkey, zkey := redisstore.ShareKey("shares", "claude-sonnet-4"), redisstore.ShareActiveKey("shares", "claude-sonnet-4")
		active, err := client.ZRange(ctx, zkey, 0, -1).Result()
		if err != nil || len(active) != 2 {
			t.Fatalf("active tenants %q, %v; want alpha and beta", active, err)
		}
		if w, _ := client.HGet(ctx, hkey, "W").Result(); w != "2" {
			t.Errorf("W = %q, want 2 (both of weight 1 now)", w)
		}
		for _, k := range []string{hkey, zkey} {
			if ttl := client.PTTL(ctx, k).Val(); ttl <= time.Minute || ttl > 2*time.Minute {
				t.Errorf("%s expires in %v, want a minute past the last activity (80.5 s - 40 s + 5 s)", k, ttl)
			}
		}
	})
}

// TestSharesBound: a group's shares hold at most MaxShareTenants tenants;
// one more drops the least recently active, which comes back new (full),
// in memory and in Redis.
func TestSharesBound(t *testing.T) {
	client := newClient1(t, redistest.Start(t).Addr)
	store := newStore(t, client, "bound")
	redis, err := store.LimitShares(fleet.ShareSettings{Group: "g"})
	if err != nil {
		t.Fatal(err)
	}
	memory, _ := fleet.MemoryStore{}.LimitShares(fleet.ShareSettings{Group: "g"})
	ctx := context.Background()
	for name, s := range map[string]fleet.LimitShares{"memory": memory, "redis": redis} {
		ask := func(tenant string, at time.Duration) bool {
			now := base.Add(at)
			r, _, err := s.Take(ctx, now, fleet.ShareAsk{Tenant: tenant, Weight: 1, Fraction: 1}, now)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			return r.Taken()
		}
		// first drives its bucket to -1: it would wait a long while.
		if !ask("first", 0) || !ask("first", 0) || ask("first", 0) {
			t.Fatalf("%s: first should take twice, then wait", name)
		}
		for i := range fleet.MaxShareTenants {
			ask(fmt.Sprintf("t%d", i), time.Millisecond)
		}
		if !ask("first", 2*time.Millisecond) {
			t.Errorf("%s: first was not dropped by the tenant beyond %d", name, fleet.MaxShareTenants)
		}
	}
	zkey := redisstore.ShareActiveKey("bound", "g")
	if n := client.ZCard(ctx, zkey).Val(); n != fleet.MaxShareTenants {
		t.Errorf("Redis holds %d active tenants, want %d", n, fleet.MaxShareTenants)
	}
	if n := client.HLen(ctx, redisstore.ShareKey("bound", "g")).Val(); n != 3*fleet.MaxShareTenants+1 {
		t.Errorf("the hash holds %d fields, want %d", n, 3*fleet.MaxShareTenants+1)
	}
}

// TestSharesRefuseBadAsks: an ask with a field that cannot be used is an
// error naming it, and takes nothing, in memory and in Redis.
func TestSharesRefuseBadAsks(t *testing.T) {
	store := newStore(t, newClient1(t, redistest.Start(t).Addr), "bad")
	redis, _ := store.LimitShares(fleet.ShareSettings{Group: "g"})
	memory, _ := fleet.MemoryStore{}.LimitShares(fleet.ShareSettings{Group: "g"})
	for _, s := range []fleet.LimitShares{memory, redis} {
		for _, c := range []struct {
			ask  fleet.ShareAsk
			want string
		}{
			{fleet.ShareAsk{Tenant: "", Weight: 1, Fraction: 0.1}, `ShareAsk.Tenant = ""`},
			{fleet.ShareAsk{Tenant: "a b", Weight: 1, Fraction: 0.1}, `ShareAsk.Tenant = "a b"`},
			{fleet.ShareAsk{Tenant: "a", Weight: 0, Fraction: 0.1}, `ShareAsk.Weight = 0`},
			{fleet.ShareAsk{Tenant: "a", Weight: 1001, Fraction: 0.1}, `ShareAsk.Weight = 1001`},
			{fleet.ShareAsk{Tenant: "a", Weight: 1, Fraction: 0}, `ShareAsk.Fraction = 0`},
			{fleet.ShareAsk{Tenant: "a", Weight: 1, Fraction: 1.5}, `ShareAsk.Fraction = 1.5`},
		} {
			r, _, err := s.Take(context.Background(), base, c.ask, base)
			if err == nil || r.Taken() || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%T: Take(%+v) = %v, %v; want an error naming %s", s, c.ask, r.Taken(), err, c.want)
			}
		}
	}
	if _, err := store.LimitShares(fleet.ShareSettings{}); err == nil {
		t.Error("LimitShares of a group without a name: no error")
	}
}
