package fleet_test

import (
	"context"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/damper-ai/damper-go/fleet"
)

// TestMemorySpendByUTCDay: MemoryStore's spend counts exact nanodollars
// in the UTC day holding now, starts again at 00:00 UTC whatever now's
// zone, counts a late Add in the current day, and is in memory.
func TestMemorySpendByUTCDay(t *testing.T) {
	sp, err := fleet.MemoryStore{}.Spend(fleet.SpendSettings{Tenant: "batch"})
	if err != nil {
		t.Fatal(err)
	}
	if !fleet.InMemory(sp) {
		t.Error("MemoryStore's spend is not InMemory")
	}
	ctx := context.Background()
	want := func(now time.Time, usd float64) {
		t.Helper()
		if got, err := sp.Spent(ctx, now); err != nil || got != usd {
			t.Fatalf("Spent at %v = %v, %v; want %v", now, got, err, usd)
		}
	}
	// 23:30 in New York's winter is 04:30 UTC the next day.
	ny := time.FixedZone("EST", -5*3600)
	day := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	var wg sync.WaitGroup
	for range 100 {
		wg.Go(func() {
			if err := sp.Add(ctx, day.Add(time.Hour), 0.1); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	want(day.Add(23*time.Hour), 10) // 100 × 0.1, no drift
	want(time.Date(2026, 12, 7, 18, 59, 59, 0, ny), 10)
	want(time.Date(2026, 12, 7, 19, 0, 0, 0, ny), 0)              // 00:00 UTC
	if err := sp.Add(ctx, day.Add(time.Hour), 1e-9); err != nil { // late: the current day's
		t.Fatal(err)
	}
	want(day.Add(24*time.Hour), 0.000000001)
}

// TestMemorySpendRefusesBadValues: a name that is not a tenant's, or an
// amount outside [0, MaxSpendAdd], is an error naming the field and the
// value.
func TestMemorySpendRefusesBadValues(t *testing.T) {
	for name, want := range map[string]string{
		"":                      `fleet: SpendSettings.Tenant = "": want 1 to 64`,
		"a b":                   `fleet: SpendSettings.Tenant = "a b": want 1 to 64`,
		"a\x00":                 `fleet: SpendSettings.Tenant = "a\x00": want`,
		strings.Repeat("x", 70): `fleet: SpendSettings.Tenant = "` + strings.Repeat("x", 64) + `...": want`,
	} {
		if _, err := (fleet.MemoryStore{}).Spend(fleet.SpendSettings{Tenant: name}); err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("Spend(Tenant %q): %v; want %s...", name, err, want)
		}
	}
	sp, _ := fleet.MemoryStore{}.Spend(fleet.SpendSettings{Tenant: "t"})
	for _, usd := range []float64{-1e-9, math.NaN(), math.Inf(1), math.Inf(-1), fleet.MaxSpendAdd * 2} {
		if err := sp.Add(context.Background(), time.Now(), usd); err == nil || !strings.HasPrefix(err.Error(), "fleet: Spend.Add usd = ") {
			t.Errorf("Add(%v): %v; want an error naming usd", usd, err)
		}
	}
	if got, _ := sp.Spent(context.Background(), time.Now()); got != 0 {
		t.Errorf("refused Adds counted %v", got)
	}
}
