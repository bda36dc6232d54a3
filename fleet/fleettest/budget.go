package fleettest

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/damper-ai/damper-go/fleet"
)

func (e *env) budget(t *testing.T) {
	t.Run("Settings", e.budgetSettings)
	t.Run("Exact", e.budgetExact)
	t.Run("Interleaved", e.budgetInterleaved)
	t.Run("RefusalTakesNothing", e.budgetRefusal)
	t.Run("Arithmetic", e.budgetArithmetic)
	t.Run("Windows", e.budgetWindows)
	t.Run("UnalignedWindow", e.budgetUnaligned)
	t.Run("Tenants", e.budgetTenants)
}

func newBudget(t *testing.T, s fleet.Store, set fleet.BudgetSettings) fleet.Budget {
	t.Helper()
	b, err := s.Budget(set)
	if err != nil || b == nil {
		t.Fatalf("Budget(%+v) = %v, %v; want a budget", set, b, err)
	}
	return b
}

// budgetSettings: a value the budget cannot use is an error naming it.
func (e *env) budgetSettings(t *testing.T) {
	s := e.new(t)
	ok := fleet.BudgetSettings{Ratio: 0.1, Window: time.Minute, MinTokens: 10}
	for _, c := range []struct {
		edit         func(*fleet.BudgetSettings)
		field, value string
	}{
		{func(b *fleet.BudgetSettings) { b.Ratio = -0.5 }, "Ratio", "-0.5"},
		{func(b *fleet.BudgetSettings) { b.Ratio = math.NaN() }, "Ratio", "NaN"},
		{func(b *fleet.BudgetSettings) { b.Ratio = math.Inf(1) }, "Ratio", "Inf"},
		{func(b *fleet.BudgetSettings) { b.Window = 0 }, "Window", "0s"},
		{func(b *fleet.BudgetSettings) { b.Window = -time.Second }, "Window", "-1s"},
		{func(b *fleet.BudgetSettings) { b.MinTokens = -1 }, "MinTokens", "-1"},
		{func(b *fleet.BudgetSettings) { b.Tenant = "a b" }, "Tenant", `"a b"`},
		{func(b *fleet.BudgetSettings) { b.Tenant = string(make([]byte, 65)) }, "Tenant", `"`},
	} {
		set := ok
		c.edit(&set)
		_, err := s.Budget(set)
		wantFieldError(t, "Budget", err, c.field, c.value)
	}
}

// budgetExact: goroutines of every store of the fleet ask at once; the
// fleet is granted MinTokens + Ratio × its successes, never more.
func (e *env) budgetExact(t *testing.T) {
	const (
		minTokens  = 4
		successes  = 4 // per store
		goroutines = 6 // per store
		asks       = 5 // per goroutine
	)
	set := fleet.BudgetSettings{Ratio: 0.5, Window: time.Minute, MinTokens: minTokens}
	stores := e.stores(t, fleetSize)
	budgets := make([]fleet.Budget, len(stores))
	ctx := context.Background()
	now := ms(10 * time.Second)
	for i, s := range stores {
		budgets[i] = newBudget(t, s, set)
		for range successes {
			must(t, "Observe", budgets[i].Observe(ctx, now, fleet.AttemptOutcome{First: true, Success: true}))
		}
		// Neither a first attempt that failed nor a retry that
		// succeeded earns anything.
		must(t, "Observe", budgets[i].Observe(ctx, now, fleet.AttemptOutcome{First: true, Signal: fleet.ProviderHealth}))
		must(t, "Observe", budgets[i].Observe(ctx, now, fleet.AttemptOutcome{Success: true}))
	}
	flush(t, stores...)
	groups := e.groups(len(stores))
	perGroup := minTokens + 0.5*successes*float64(len(stores)/groups)
	bound := int(perGroup) * groups
	for i, b := range budgets {
		got, err := b.Available(ctx, now)
		if err != nil || got != perGroup {
			t.Errorf("store %d: Available = %v, %v; want %v", i, got, err, perGroup)
		}
	}
	var granted atomic.Int64
	parallel(len(stores)*goroutines, func(i int) {
		b := budgets[i%len(stores)]
		for range asks {
			ok, err := b.Acquire(ctx, now)
			if err != nil {
				t.Errorf("Acquire: %v", err)
			}
			if ok {
				granted.Add(1)
			}
		}
	})
	got := int(granted.Load())
	if got > bound {
		t.Fatalf("the fleet was granted %d retries, more than MinTokens + Ratio × successes = %d", got, bound)
	}
	if !e.leased() && got != bound {
		t.Fatalf("the fleet was granted %d retries asking %d times, want exactly %d", got, len(stores)*goroutines*asks, bound)
	}
	if e.leased() {
		// Units leased and unspent count as used for the others: at most
		// Lease-1 per store are missing, and flushed they come back.
		if low := bound - (e.o.Lease-1)*len(stores); got < low {
			t.Errorf("the fleet was granted %d retries, fewer than %d less (Lease-1) per store = %d", got, bound, low)
		}
		flush(t, stores...)
		for _, b := range budgets {
			for {
				ok, err := b.Acquire(ctx, now)
				must(t, "Acquire", err)
				if !ok {
					break
				}
				got++
			}
		}
		if got != bound {
			t.Errorf("after the leases went back, the fleet was granted %d retries in all, want exactly %d", got, bound)
		}
	}
	flush(t, stores...)
	for i, b := range budgets {
		if got, err := b.Available(ctx, now); err != nil || got != 0 {
			t.Errorf("store %d: Available after the fleet asked until refused = %v, %v; want 0", i, got, err)
		}
	}
}

// budgetInterleaved: successes arrive while the fleet asks; it is never
// granted more than the bound of every success heard, and asking until
// refused once they are all heard, exactly that.
func (e *env) budgetInterleaved(t *testing.T) {
	const goroutines, rounds = 4, 10 // per store
	set := fleet.BudgetSettings{Ratio: 0.2, Window: time.Minute, MinTokens: 3}
	stores := e.stores(t, fleetSize)
	budgets := make([]fleet.Budget, len(stores))
	for i, s := range stores {
		budgets[i] = newBudget(t, s, set)
	}
	ctx := context.Background()
	now := ms(30 * time.Second)
	var granted atomic.Int64
	parallel(len(stores)*goroutines, func(i int) {
		b := budgets[i%len(stores)]
		for range rounds {
			if err := b.Observe(ctx, now, fleet.AttemptOutcome{First: true, Success: true}); err != nil {
				t.Errorf("Observe: %v", err)
			}
			for range 2 {
				ok, err := b.Acquire(ctx, now)
				if err != nil {
					t.Errorf("Acquire: %v", err)
				}
				if ok {
					granted.Add(1)
				}
			}
		}
	})
	groups := e.groups(len(stores))
	perGroup := 3 + int(0.2*float64(goroutines*rounds*len(stores)/groups)+1e-9)
	bound := perGroup * groups
	got := int(granted.Load())
	if got > bound {
		t.Fatalf("the fleet was granted %d retries, more than MinTokens + Ratio × successes = %d", got, bound)
	}
	flush(t, stores...)
	for _, b := range budgets {
		for {
			ok, err := b.Acquire(ctx, now)
			must(t, "Acquire", err)
			if !ok {
				break
			}
			got++
		}
	}
	if got != bound {
		t.Errorf("the fleet was granted %d retries, asking until refused once every success was heard; want exactly %d", got, bound)
	}
}

// budgetRefusal: refused retries take nothing, so one success after them
// is one more retry (Ratio 1).
func (e *env) budgetRefusal(t *testing.T) {
	s := e.new(t)
	b := newBudget(t, s, fleet.BudgetSettings{Ratio: 1, Window: time.Minute, MinTokens: 2})
	ctx := context.Background()
	now := Base
	var got []bool
	for range 7 {
		ok, err := b.Acquire(ctx, now)
		must(t, "Acquire", err)
		got = append(got, ok)
	}
	must(t, "Observe", b.Observe(ctx, now, fleet.AttemptOutcome{First: true, Success: true}))
	flush(t, s)
	for range 3 {
		ok, err := b.Acquire(ctx, now)
		must(t, "Acquire", err)
		got = append(got, ok)
	}
	want := []bool{true, true, false, false, false, false, false, true, false, false}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("grants %v, want %v: MinTokens 2, five refusals, then one success at Ratio 1", got, want)
		}
	}
}

// budgetWindows: windows are aligned on the epoch, unused units do not
// carry over, and a late caller counts in the newest window.
func (e *env) budgetWindows(t *testing.T) {
	s := e.new(t)
	b := newBudget(t, s, fleet.BudgetSettings{Ratio: 0, Window: 10 * time.Second, MinTokens: 3})
	ctx := context.Background()
	ask := func(at time.Duration, n int) int {
		granted := 0
		for range n {
			ok, err := b.Acquire(ctx, ms(at))
			must(t, "Acquire", err)
			if ok {
				granted++
			}
		}
		return granted
	}
	if got := ask(0, 5); got != 3 {
		t.Errorf("window [0s, 10s): %d granted, want MinTokens = 3", got)
	}
	if got := ask(10*time.Second-time.Nanosecond, 1); got != 0 {
		t.Errorf("at 9.999999999s, the same window: %d granted, want 0", got)
	}
	if got := ask(10*time.Second, 1); got != 1 {
		t.Errorf("at 10s, a new window: %d granted, want 1", got)
	}
	// Two units of [10s, 20s) are left unused: they do not carry over.
	first := ask(20*time.Second, 1)
	late := ask(15*time.Second, 1) // counted in [20s, 30s), or refused
	rest := ask(20*time.Second, 5)
	if first != 1 || first+late+rest != 3 {
		t.Errorf("window [20s, 30s) with a late caller from [10s, 20s): %d + %d late + %d granted, want 3 in all, the first granted", first, late, rest)
	}
	if !e.leased() && late != 1 {
		t.Errorf("a late caller with units left in the newest window: refused, want granted")
	}
}

// budgetArithmetic: Ratio × successes is counted without a float's
// rounding taking a unit away (0.29 × 100 is 28.999999999999996 in a
// float64).
func (e *env) budgetArithmetic(t *testing.T) {
	s := e.new(t)
	b := newBudget(t, s, fleet.BudgetSettings{Ratio: 0.29, Window: time.Minute, MinTokens: 0})
	ctx := context.Background()
	for range 100 {
		must(t, "Observe", b.Observe(ctx, Base, fleet.AttemptOutcome{First: true, Success: true}))
	}
	flush(t, s)
	if got, err := b.Available(ctx, Base); err != nil || got != 29 {
		t.Errorf("Available after 100 successes at Ratio 0.29 = %v, %v; want 29", got, err)
	}
	granted := 0
	for range 40 {
		ok, err := b.Acquire(ctx, Base)
		must(t, "Acquire", err)
		if ok {
			granted++
		}
	}
	if granted != 29 {
		t.Errorf("%d granted after 100 successes at Ratio 0.29, want 29", granted)
	}
}

// budgetUnaligned: a window that does not divide a minute starts at a
// multiple of itself since the Unix epoch: 7 s windows start 5 s before
// Base, whose Unix time is 5 past a multiple of 7.
func (e *env) budgetUnaligned(t *testing.T) {
	s := e.new(t)
	b := newBudget(t, s, fleet.BudgetSettings{Ratio: 0, Window: 7 * time.Second, MinTokens: 1})
	ctx := context.Background()
	var got []bool
	for _, at := range []time.Duration{0, 2*time.Second - time.Nanosecond, 2 * time.Second, 9*time.Second - time.Nanosecond, 9 * time.Second} {
		ok, err := b.Acquire(ctx, ms(at))
		must(t, "Acquire", err)
		got = append(got, ok)
	}
	if want := []bool{true, false, true, false, true}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("grants at 0, 1.999999999s, 2s, 8.999999999s and 9s with MinTokens 1 in 7 s windows = %v; want %v (windows start at 2s and 9s)", got, want)
	}
}

// budgetTenants: each tenant's books are apart.
func (e *env) budgetTenants(t *testing.T) {
	stores := e.stores(t, 2)
	ctx := context.Background()
	granted := map[string]int{}
	for _, tenant := range []string{"", "alpha", "beta"} {
		for _, s := range stores {
			b := newBudget(t, s, fleet.BudgetSettings{Ratio: 0, Window: time.Minute, MinTokens: 2, Tenant: tenant})
			for range 3 {
				ok, err := b.Acquire(ctx, Base)
				must(t, "Acquire", err)
				if ok {
					granted[tenant]++
				}
			}
			flush(t, s)
		}
	}
	want := 2 * e.groups(2)
	for _, tenant := range []string{"", "alpha", "beta"} {
		if granted[tenant] != want {
			t.Errorf("tenant %q: %d granted, want %d (MinTokens 2 for each tenant's books)", tenant, granted[tenant], want)
		}
	}
}
