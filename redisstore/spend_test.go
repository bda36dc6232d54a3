package redisstore_test

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/redistest"
	"github.com/damper-ai/damper-go/redisstore"
)

// spdSpend returns the store's spend of tenant.
func spdSpend(tb testing.TB, s *redisstore.Store, tenant string) fleet.Spend {
	tb.Helper()
	sp, err := s.Spend(fleet.SpendSettings{Tenant: tenant})
	if err != nil {
		tb.Fatal(err)
	}
	return sp
}

// spdWant checks sp's Spent at now.
func spdWant(tb testing.TB, sp fleet.Spend, now time.Time, want float64) {
	tb.Helper()
	got, err := sp.Spent(context.Background(), now)
	if err != nil || got != want {
		tb.Fatalf("Spent at %v = %v, %v; want %v", now, got, err, want)
	}
}

// TestSpendCountsByUTCDay: a tenant's spend is one integer of
// nanodollars per UTC day, shared by every store of the Name, kept apart
// from other tenants', set to expire after SpendTTL, and 0 again at
// 00:00 UTC.
func TestSpendCountsByUTCDay(t *testing.T) {
	srv := redistest.Start(t)
	client := newClient1(t, srv.Addr)
	ctx := context.Background()
	o := redisstore.Options{Name: "spend-day", Timeout: 5 * time.Second}
	s1, s2 := thrStore(t, client, o), thrStore(t, newClient1(t, srv.Addr), o)
	a1, a2, b := spdSpend(t, s1, "batch"), spdSpend(t, s2, "batch"), spdSpend(t, s1, "web.v2")

	late := time.Date(2026, 12, 7, 23, 59, 59, 999_000_000, time.FixedZone("CET", 3600)) // 22:59:59.999 UTC
	mustNil(t, a1.Add(ctx, late, 0.25))
	mustNil(t, a2.Add(ctx, late, 0.5))
	mustNil(t, a2.Add(ctx, late, 1e-9))
	mustNil(t, b.Add(ctx, late, 2))
	mustNil(t, s1.Flush(ctx))
	mustNil(t, s2.Flush(ctx))
	spdWant(t, a1, late, 0.750000001)
	spdWant(t, a2, late, 0.750000001)
	spdWant(t, b, late, 2)

	key := redisstore.SpendKey("spend-day", "batch", late)
	if key != "damper:{spend-day}:spend:batch:2026-12-07" {
		t.Fatalf("SpendKey = %q", key)
	}
	if v, err := client.Get(ctx, key).Result(); err != nil || v != "750000001" {
		t.Fatalf("%s = %q, %v; want 750000001 nanodollars", key, v, err)
	}
	if ttl, err := client.PTTL(ctx, key).Result(); err != nil || ttl <= redisstore.SpendTTL-time.Minute || ttl > redisstore.SpendTTL {
		t.Fatalf("PTTL %s = %v, %v; want about %v", key, ttl, err, redisstore.SpendTTL)
	}

	// 00:00 UTC: a new day, a new key, nothing spent.
	day2 := time.Date(2026, 12, 8, 0, 0, 0, 0, time.UTC)
	spdWant(t, a1, day2, 0)
	mustNil(t, a1.Add(ctx, day2, 0.1))
	mustNil(t, s1.Flush(ctx))
	spdWant(t, a2, day2, 0.1)
	spdWant(t, a2, late, 0.750000001) // the day before keeps its own
	if v, err := client.Get(ctx, "damper:{spend-day}:spend:batch:2026-12-08").Result(); err != nil || v != "100000000" {
		t.Fatalf("the second day's key = %q, %v; want 100000000", v, err)
	}
}

// TestSpendRefusesBadValues: a tenant's name that cannot be a key, and
// an amount that is not a finite number of dollars in [0, 1e6], are
// refused with the field and the value.
func TestSpendRefusesBadValues(t *testing.T) {
	srv := redistest.Start(t)
	s := thrStore(t, newClient1(t, srv.Addr), redisstore.Options{Name: "spend-bad"})
	for _, name := range []string{"", "a b", "a:b", "{x}", strings.Repeat("t", 65)} {
		_, err := s.Spend(fleet.SpendSettings{Tenant: name})
		shown := name
		if len(shown) > 64 {
			shown = shown[:64] + "..."
		}
		if err == nil || !strings.Contains(err.Error(), "SpendSettings.Tenant = \""+shown+"\"") {
			t.Errorf("Spend(Tenant %q): %v; want an error naming SpendSettings.Tenant and the name", name, err)
		}
	}
	sp := spdSpend(t, s, "ok")
	for _, usd := range []float64{-0.01, math.NaN(), math.Inf(1), 1e6 + 1} {
		if err := sp.Add(context.Background(), time.Now(), usd); err == nil || !strings.Contains(err.Error(), "usd = ") {
			t.Errorf("Add(%v): %v; want an error naming usd", usd, err)
		}
	}
}

// TestSpendWhileRedisFails: while Redis is down, Spent answers the most
// the process knows (the fleet's count last heard and its own Adds since)
// with the error; the Adds Redis did not take go with the next Add or
// Spent that reaches it.
func TestSpendWhileRedisFails(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	o := redisstore.Options{Name: "spend-out", Timeout: outageTimeout, ProbeInterval: time.Millisecond}
	s, peer := thrStore(t, newClient1(t, srv.Addr), o), thrStore(t, newClient1(t, srv.Addr), o)
	sp, pp := spdSpend(t, s, "batch"), spdSpend(t, peer, "batch")
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	mustNil(t, sp.Add(ctx, now, 0.25))
	mustNil(t, pp.Add(ctx, now, 0.5))
	mustNil(t, s.Flush(ctx))
	mustNil(t, peer.Flush(ctx))
	spdWant(t, sp, now, 0.75) // heard: the fleet's count

	srv.Kill()
	_ = sp.Add(ctx, now, 0.125) // fails in its batch, or is not sent
	_ = s.Flush(ctx)
	var got float64
	var err error
	timed(t, "Spent with Redis down", outageTimeout+slack, func() { got, err = sp.Spent(ctx, now) })
	if err == nil || got != 0.875 {
		t.Fatalf("Spent with Redis down = %v, %v; want 0.875 (0.75 heard + 0.125 not taken) and an error", got, err)
	}

	// Redis comes back empty: the Add it did not take goes with the next.
	srv.Restart()
	back := time.Now()
	for {
		if got, err = sp.Spent(ctx, now); err == nil {
			break
		}
		if time.Since(back) > time.Second {
			t.Fatalf("not shared again %v after the restart: %v", time.Since(back), err)
		}
		time.Sleep(time.Millisecond)
	}
	if got != 0.125 {
		t.Fatalf("Spent on a restarted Redis = %v, want 0.125: the Add it did not take", got)
	}
	// The Spent that reached Redis took it there: the peer counts it, though
	// this process added nothing since.
	mustNil(t, s.Flush(ctx))
	spdWant(t, pp, now, 0.125)
	mustNil(t, sp.Add(ctx, now, 0.0625))
	mustNil(t, s.Flush(ctx))
	spdWant(t, pp, now, 0.1875)
}
