package fleettest

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/damper-ai/damper-go/fleet"
)

func (e *env) spend(t *testing.T) {
	t.Run("Settings", e.spendSettings)
	t.Run("UTCDay", e.spendDay)
	t.Run("Exact", e.spendExact)
}

func newSpend(t *testing.T, s fleet.Store, tenant string) fleet.Spend {
	t.Helper()
	sp, err := s.(fleet.SpendStore).Spend(fleet.SpendSettings{Tenant: tenant})
	if err != nil || sp == nil {
		t.Fatalf("Spend(%q) = %v, %v; want a spend", tenant, sp, err)
	}
	return sp
}

func (e *env) spendSettings(t *testing.T) {
	s := e.new(t)
	for _, c := range []struct{ tenant, value string }{{"", `""`}, {"a b", `"a b"`}, {string(make([]byte, 65)), `"`}} {
		_, err := s.(fleet.SpendStore).Spend(fleet.SpendSettings{Tenant: c.tenant})
		wantFieldError(t, "Spend", err, "Tenant", c.value)
	}
	sp := newSpend(t, s, "alpha")
	ctx := context.Background()
	for _, c := range []struct {
		usd   float64
		value string
	}{{math.NaN(), "NaN"}, {-0.01, "-0.01"}, {math.Inf(1), "Inf"}, {fleet.MaxSpendAdd * 1.5, "1.5e+06"}} {
		wantFieldError(t, "Add", sp.Add(ctx, Base, c.usd), "usd", c.value)
	}
	flush(t, s)
	if got, err := sp.Spent(ctx, Base); err != nil || got != 0 {
		t.Errorf("Spent after refused adds = %v, %v; want 0", got, err)
	}
}

// spendDay: a day's count is in nanodollars, and ends at 00:00 UTC
// whatever the location of now.
func (e *env) spendDay(t *testing.T) {
	s := e.new(t)
	sp := newSpend(t, s, "alpha")
	other := newSpend(t, s, "beta")
	ctx := context.Background()
	east := time.FixedZone("UTC+5", 5*3600)
	lastNano := time.Date(2030, 1, 1, 23, 59, 59, 999999999, time.UTC)
	for range 10 {
		must(t, "Add", sp.Add(ctx, lastNano.In(east), 0.1))
	}
	must(t, "Add", other.Add(ctx, lastNano, 7))
	flush(t, s)
	if got, err := sp.Spent(ctx, time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)); err != nil || got != 1 {
		t.Errorf("Spent on 2030-01-01 after ten adds of 0.1 = %v, %v; want 1 exactly", got, err)
	}
	if got, err := sp.Spent(ctx, time.Date(2030, 1, 2, 4, 0, 0, 0, east)); err != nil || got != 1 {
		t.Errorf("Spent at 2030-01-02 04:00 UTC+5 (23:00 UTC the day before) = %v, %v; want 1", got, err)
	}
	next := lastNano.Add(time.Nanosecond)
	if got, err := sp.Spent(ctx, next); err != nil || got != 0 {
		t.Errorf("Spent at 00:00 UTC the next day = %v, %v; want 0", got, err)
	}
	must(t, "Add", sp.Add(ctx, next, 2.5))
	must(t, "Add", sp.Add(ctx, next, 1e-10)) // rounds to no nanodollar
	flush(t, s)
	if got, err := sp.Spent(ctx, next.Add(time.Hour)); err != nil || got != 2.5 {
		t.Errorf("Spent the next day = %v, %v; want 2.5", got, err)
	}
	if got, err := other.Spent(ctx, lastNano); err != nil || got != 7 {
		t.Errorf("Spent of another tenant = %v, %v; want its own 7", got, err)
	}
}

// spendExact: every add of every goroutine of the fleet counts.
func (e *env) spendExact(t *testing.T) {
	const goroutines, adds = 8, 25
	stores := e.stores(t, fleetSize)
	sps := make([]fleet.Spend, len(stores))
	for i, s := range stores {
		sps[i] = newSpend(t, s, "alpha")
	}
	ctx := context.Background()
	parallel(len(stores)*goroutines, func(i int) {
		for range adds {
			if err := sps[i%len(stores)].Add(ctx, Base, 0.001); err != nil {
				t.Errorf("Add: %v", err)
			}
		}
	})
	flush(t, stores...)
	want := float64(int64(goroutines*adds*len(stores)/e.groups(len(stores)))*1_000_000) / 1e9
	for i, sp := range sps {
		if got, err := sp.Spent(ctx, Base); err != nil || got != want {
			t.Errorf("store %d: Spent = %v, %v; want %v", i, got, err, want)
		}
	}
}
