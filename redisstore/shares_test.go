package redisstore_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/fleet/fleettest"
	"github.com/damper-ai/damper-go/internal/redistest"
	"github.com/damper-ai/damper-go/redisstore"
)

// TestSharesArithmetic: the conformance suite's arithmetic of the shares
// (fleettest.ShareSteps), run on Redis, leaves only the tenants active in
// Redis, with their weights and a key that expires a minute after their
// last activity.
func TestSharesArithmetic(t *testing.T) {
	client := newClient1(t, redistest.Start(t).Addr)
	store := newStore(t, client, "shares")
	s, err := store.LimitShares(fleet.ShareSettings{Group: "claude-sonnet-4"})
	if err != nil {
		t.Fatal(err)
	}
	fleettest.ShareSteps(t, s)
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
