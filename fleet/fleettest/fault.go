package fleettest

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/damper-ai/damper-go/fleet"
)

// fault checks the parts while the shared state cannot be reached: each
// method returns within MaxWait and decides, within the fallback's bound.
func (e *env) fault(t *testing.T) {
	if e.o.Fault == nil {
		t.Skip("Options.Fault is not set: no fault can be driven")
	}
	probe := e.new(t)
	t.Run("Budget", e.faultBudget)
	if _, ok := probe.(fleet.BreakerStore); ok {
		t.Run("Breaker", e.faultBreaker)
	}
	if _, ok := probe.(fleet.ThrottleStore); ok {
		t.Run("Throttle", e.faultThrottle)
	}
	if _, ok := probe.(fleet.LimitStore); ok {
		t.Run("Limits", e.faultLimits)
	}
	if _, ok := probe.(fleet.ShareStore); ok {
		t.Run("Shares", e.faultShares)
	}
	if _, ok := probe.(fleet.SpendStore); ok {
		t.Run("Spend", e.faultSpend)
	}
}

// startFault starts the fault and ends it when t ends, at the latest.
func (e *env) startFault(t *testing.T) (restore func()) {
	t.Helper()
	r := e.o.Fault(t)
	var once sync.Once
	restore = func() { once.Do(r) }
	t.Cleanup(restore)
	return restore
}

// members has each store of a fleet that counts its members
// ([fleet.MemberCounter]) record, by record, until it counts the whole
// fleet, or 5 s pass, and returns each store's count (1 for a store that
// does not count). A store may refresh its count at intervals of its own:
// the stores' own counts are the bounds checked.
func (e *env) members(t *testing.T, stores []fleet.Store, record func(i int)) []int {
	t.Helper()
	counts := make([]int, len(stores))
	deadline := time.Now().Add(5 * time.Second)
	for {
		done := true
		for i, s := range stores {
			counts[i] = 1
			if m, ok := s.(fleet.MemberCounter); ok {
				if counts[i] = m.Members(); counts[i] < len(stores) {
					done = false
					record(i)
				}
			}
		}
		flush(t, stores...)
		if done || time.Now().After(deadline) {
			return counts
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// faultBudget: each store grants at most MinTokens / N + Ratio × its own
// successes (none failing closed), N the members it counts (1 for a store
// that does not count them): a fleet that counts itself whole, one budget.
func (e *env) faultBudget(t *testing.T) {
	const minTokens, successes, asks = 2, 4, 10
	stores := e.stores(t, fleetSize)
	bs := make([]fleet.Budget, len(stores))
	for i, s := range stores {
		bs[i] = newBudget(t, s, fleet.BudgetSettings{Ratio: 0.5, Window: time.Minute, MinTokens: minTokens})
	}
	ctx := context.Background()
	// The window before Base's: its records count the members.
	members := e.members(t, stores, func(i int) {
		_ = bs[i].Observe(ctx, Base.Add(-time.Minute), fleet.AttemptOutcome{First: true, Success: true})
	})
	e.startFault(t)
	grants := make([]atomic.Int64, len(stores))
	parallel(len(stores), func(i int) {
		for range successes {
			e.timed(t, "Budget.Observe", func() {
				_ = bs[i].Observe(ctx, Base, fleet.AttemptOutcome{First: true, Success: true})
			})
		}
		for range asks {
			var ok bool
			e.timed(t, "Budget.Acquire", func() { ok, _ = bs[i].Acquire(ctx, Base) })
			if ok {
				grants[i].Add(1)
			}
		}
		e.timed(t, "Budget.Available", func() {
			if n, _ := bs[i].Available(ctx, Base); n < 0 || math.IsNaN(n) {
				t.Errorf("Available in a fault = %v", n)
			}
		})
	})
	for i := range grants {
		bound := int64(float64(minTokens)/float64(members[i]) + 0.5*successes + 1e-9)
		if e.o.FailClosed {
			bound = 0
		}
		if g := grants[i].Load(); g > bound {
			t.Errorf("store %d granted %d retries in a fault, more than its share, MinTokens / %d members + Ratio × its successes = %d", i, g, members[i], bound)
		}
	}
}

// faultBreaker: each store's breaker still admits, and opens on the
// failures its store sees.
func (e *env) faultBreaker(t *testing.T) {
	s := e.new(t)
	b := newBreaker(t, s, breakerValues())
	e.startFault(t)
	ctx := context.Background()
	for i := range 4 {
		var a fleet.CircuitAdmission
		e.timed(t, "Breaker.Allow", func() { a, _ = b.Allow(ctx, Base) })
		if !a.OK {
			t.Fatalf("Allow %d in a fault, closed = refused; want admitted", i+1)
		}
		e.timed(t, "Breaker.Done", func() { _ = b.Done(ctx, a.Ticket, ms(time.Second), fleet.CircuitFailure) })
	}
	var a fleet.CircuitAdmission
	e.timed(t, "Breaker.Allow", func() { a, _ = b.Allow(ctx, ms(2*time.Second)) })
	if a.OK {
		t.Errorf("Allow in a fault after 4 failures of 4 = admitted; want refused, open")
	}
	e.timed(t, "Breaker.State", func() { _, _ = b.State(ctx, ms(2*time.Second)) })
	e.timed(t, "Breaker.RefusesAt", func() { _, _, _ = b.RefusesAt(ctx, ms(2*time.Second), ms(3*time.Second)) })
}

// faultThrottle: the count is the store's own (a new throttle's: its
// own Adds from full), or 0 failing closed: no retry.
func (e *env) faultThrottle(t *testing.T) {
	s := e.new(t)
	th := newThrottle(t, s, 10)
	e.startFault(t)
	ctx := context.Background()
	for i := int64(1); i <= 3; i++ {
		e.timed(t, "Throttle.Add", func() { _ = th.Add(ctx, -1500) })
		var n int64
		e.timed(t, "Throttle.Tokens", func() { n, _ = th.Tokens(ctx) })
		want := 10000 - 1500*i
		if e.o.FailClosed {
			want = 0
		}
		if n != want {
			t.Errorf("Tokens in a fault after %d Adds of -1500 = %d, want %d", i, n, want)
		}
	}
}

// faultLimits: each store admits at one instant at most its share of the
// bucket's limit, the limit over the members N it counts (1 for a store
// that does not count them): a fleet that counts itself whole, the limit.
func (e *env) faultLimits(t *testing.T) {
	stores := e.stores(t, fleetSize)
	bs := make([]fleet.LimitBuckets, len(stores))
	for i, s := range stores {
		bs[i] = newBuckets(t, s, limitValues)
	}
	ctx := context.Background()
	// A call taken and given back whole: a record that leaves the buckets
	// full.
	members := e.members(t, stores, func(i int) {
		if r, _, _ := bs[i].Reserve(ctx, Base, oneCall, fleet.Interactive, Base, nil); r != nil && r.Taken() {
			_ = bs[i].Settle(ctx, Base, r, fleet.RateAmounts{}, [3]bool{true, true, true})
		}
	})
	e.startFault(t)
	taken := make([]atomic.Int64, len(stores))
	parallel(len(stores)*4, func(i int) {
		k := i % len(stores)
		for range 25 {
			var r fleet.RateReservation
			e.timed(t, "LimitBuckets.Reserve", func() {
				r, _, _ = bs[k].Reserve(ctx, Base, oneCall, fleet.Interactive, Base, nil)
			})
			if r == nil {
				t.Errorf("Reserve in a fault returned no reservation")
				return
			}
			if r.Taken() {
				taken[k].Add(1)
				e.timed(t, "LimitBuckets.Settle", func() { _ = bs[k].Settle(ctx, Base, r, oneCall, [3]bool{true, true, true}) })
			}
		}
	})
	for k := range taken {
		if n, bound := taken[k].Load(), int64(60/float64(members[k])+1e-9); n > bound {
			t.Errorf("store %d admitted %d calls at one instant in a fault, more than its share, the limit 60 over its %d members = %d", k, n, members[k], bound)
		}
	}
	e.timed(t, "LimitBuckets.State", func() { _, _ = bs[0].State(ctx, Base) })
	e.timed(t, "LimitBuckets.PausedUntil", func() { _, _ = bs[0].PausedUntil(ctx, Base) })
}

// faultShares: a take still decides.
func (e *env) faultShares(t *testing.T) {
	s := e.new(t)
	sh := newShares(t, s)
	e.startFault(t)
	ctx := context.Background()
	var r fleet.ShareReservation
	e.timed(t, "LimitShares.Take", func() {
		r, _, _ = sh.Take(ctx, Base, fleet.ShareAsk{Tenant: "alpha", Weight: 1, Fraction: 0.5}, Base)
	})
	if r == nil || !r.Taken() {
		t.Fatalf("Take of a new tenant's half share in a fault: not taken")
	}
	e.timed(t, "LimitShares.Settle", func() { _ = sh.Settle(ctx, Base, r, 0.5) })
}

// faultSpend: the count still answers, from what the store knows.
func (e *env) faultSpend(t *testing.T) {
	s := e.new(t)
	sp := newSpend(t, s, "alpha")
	e.startFault(t)
	ctx := context.Background()
	e.timed(t, "Spend.Add", func() { _ = sp.Add(ctx, Base, 0.25) })
	var usd float64
	e.timed(t, "Spend.Spent", func() { usd, _ = sp.Spent(ctx, Base) })
	if usd < 0 || math.IsNaN(usd) || math.IsInf(usd, 0) {
		t.Errorf("Spent in a fault = %v", usd)
	}
}
