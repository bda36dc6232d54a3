package redisstore_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/redistest"
	"github.com/damper-ai/damper-go/redisstore"
	"github.com/redis/go-redis/v9"
)

// faultFleet is a fleet of stores on one Name, each a process with a
// client of its own.
type faultFleet struct {
	srv    *redistest.Server
	name   string
	o      redisstore.Options
	stores []*redisstore.Store
}

func newFaultFleet(t *testing.T, srv *redistest.Server, name string, n int, o redisstore.Options) *faultFleet {
	f := &faultFleet{srv: srv, name: name, o: o}
	for range n {
		f.add(t)
	}
	return f
}

// add starts one more process.
func (f *faultFleet) add(t *testing.T) *redisstore.Store {
	t.Helper()
	o := f.o
	o.Name = f.name
	o.Timeout = conformanceTimeout
	o.ProbeInterval = time.Second // no probe within a fault's steps
	s, err := redisstore.New(newClientWith(t, &redis.Options{Addr: f.srv.Addr, ContextTimeoutEnabled: true, MaxRetries: -1}), o)
	mustNil(t, err)
	f.stores = append(f.stores, s)
	return s
}

// join has every store refresh its membership now, by a record, until
// each counts the whole fleet.
func (f *faultFleet) join(t *testing.T, record func(i int)) {
	t.Helper()
	ctx := context.Background()
	for range 2 {
		for i, s := range f.stores {
			redisstore.JoinNow(s)
			record(i)
			mustNil(t, s.Flush(ctx))
		}
	}
	for i, s := range f.stores {
		if n := s.Members(); n != len(f.stores) {
			t.Fatalf("store %d: Members = %d, want %d", i, n, len(f.stores))
		}
	}
}

// fault stops Redis (SIGSTOP) and returns the way to end it, which waits
// until every store decides in Redis again.
func (f *faultFleet) fault(t *testing.T) (end func()) {
	f.srv.Pause()
	return func() {
		f.srv.Resume()
		ctx := context.Background()
		deadline := time.Now().Add(10 * time.Second)
		for _, s := range f.stores {
			for s.State() != redisstore.StateShared {
				if time.Now().After(deadline) {
					t.Fatalf("not shared again 10 s after Redis was resumed: %+v", s.Stats())
				}
				_ = s.Probe(ctx)
				time.Sleep(5 * time.Millisecond)
			}
		}
	}
}

// TestLimitShareInFault: three processes share requests_per_minute: 60.
// The bucket drained, they ask for a request each every 100 ms of a
// virtual clock for 15 s, Redis stopped (SIGSTOP) from 5 s to 8 s: the
// fleet admits within 1.1 × what the shared bucket refills over the
// window (15) plus the leases outstanding, each process deciding in memory
// on a third of the bucket as last heard. A process that joins after the
// fault takes a full bucket alone: its full part, Redis deciding again.
func TestLimitShareInFault(t *testing.T) {
	srv := redistest.Start(t)
	for _, lease := range []int{0, 5} {
		t.Run(fmt.Sprintf("lease=%d", lease), func(t *testing.T) {
			const n, window, step = 3, 15 * time.Second, 100 * time.Millisecond
			faultFrom, faultTo := 5*time.Second, 8*time.Second
			f := newFaultFleet(t, srv, fmt.Sprintf("share-limit-%d", lease), n, redisstore.Options{Lease: lease})
			settings := fleet.LimitSettings{Group: "claude-sonnet-4", Limits: fleet.RateLimits{RequestsPerMinute: 60}, BatchShare: 1}
			bs := make([]fleet.LimitBuckets, n)
			for i, s := range f.stores {
				bs[i] = newBuckets(t, s, settings)
			}
			ctx := context.Background()
			one := fleet.RateAmounts{1, 0, 0}
			take := func(b fleet.LimitBuckets, now time.Time) bool {
				r, _, _ := b.Reserve(ctx, now, one, fleet.Interactive, now, nil)
				if !r.Taken() {
					return false
				}
				_ = b.Settle(ctx, now, r, one, [3]bool{true, true, true})
				return true
			}
			// Drain the bucket at base, each process in turn, and count
			// the whole fleet as members.
			drained := 0
			for i := 0; ; i++ {
				if !take(bs[i%n], base) {
					break
				}
				drained++
			}
			if drained != 60 {
				t.Fatalf("the fleet drained %d from a full bucket, want 60", drained)
			}
			// A record: a success for another Name's budget.
			notes := make([]fleet.Budget, n)
			for i, s := range f.stores {
				var err error
				notes[i], err = s.Budget(fleet.BudgetSettings{Ratio: 0.1, Window: time.Minute, MinTokens: 1, Tenant: "notes"})
				mustNil(t, err)
			}
			f.join(t, func(i int) { mustNil(t, notes[i].Observe(ctx, base, success)) })

			admitted := make([]int, n)
			var inFault int
			var end func()
			for at := step; at <= window; at += step {
				now := base.Add(at)
				if at == faultFrom {
					end = f.fault(t)
				}
				if at == faultTo {
					end()
				}
				for i, b := range bs {
					if take(b, now) {
						admitted[i]++
						if at >= faultFrom && at < faultTo {
							inFault++
						}
					}
				}
			}
			total := 0
			for _, a := range admitted {
				total += a
			}
			refill := int(window / time.Second) // 60 a minute, from empty
			leases := n * max(lease-1, 0)
			bound := 1.1*float64(refill) + float64(leases)
			t.Logf("fleet admitted %d over %v (%d in the %v fault; per process %v); bound 1.1 × %d + %d leases = %.1f",
				total, window, inFault, faultTo-faultFrom, admitted, refill, leases, bound)
			if float64(total) > bound {
				t.Errorf("fleet admitted %d over %v across a %v fault, more than 1.1 × %d + %d leases = %.1f",
					total, window, faultTo-faultFrom, refill, leases, bound)
			}

			// After the fault: a process that joins takes its full part,
			// a whole bucket once it has refilled.
			late := newBuckets(t, f.add(t), settings)
			later := base.Add(window + time.Minute)
			got := 0
			for take(late, later) {
				got++
			}
			if got != 60 {
				t.Errorf("a process that joined after the fault took %d of a full bucket, want 60", got)
			}
		})
	}
}

// TestBudgetShareInFault: three processes share a budget of MinTokens
// 12 and Ratio 0.5. Redis stopped (SIGSTOP) through a window, each counts
// its own successes (2, 4 and 6) and asks for 20 retries: each grants its
// share of one budget, 12 / 3 + 0.5 × its successes, and the fleet one
// budget, 12 + 0.5 × 12 = 18, exactly.
func TestBudgetShareInFault(t *testing.T) {
	srv := redistest.Start(t)
	const n = 3
	f := newFaultFleet(t, srv, "share-budget", n, redisstore.Options{})
	ctx := context.Background()
	bs := make([]fleet.Budget, n)
	for i, s := range f.stores {
		var err error
		bs[i], err = s.Budget(fleet.BudgetSettings{Ratio: 0.5, Window: time.Minute, MinTokens: 12})
		mustNil(t, err)
	}
	// The window before: each process's record counts it a member.
	f.join(t, func(i int) { mustNil(t, bs[i].Observe(ctx, base.Add(-time.Minute), success)) })

	end := f.fault(t)
	granted := make([]int, n)
	for i, b := range bs {
		for range 2 * (i + 1) {
			_ = b.Observe(ctx, base, success)
		}
		for range 20 {
			if ok, _ := b.Acquire(ctx, base); ok {
				granted[i]++
			}
		}
		if got, _ := b.Available(ctx, base); got != 0 {
			t.Errorf("process %d: Available in the fault after its share was spent = %v, want 0", i, got)
		}
	}
	end()
	total := granted[0] + granted[1] + granted[2]
	t.Logf("in a fault the fleet granted %d retries (per process %v); one budget is 12 + 0.5 × 12 = 18", total, granted)
	if want := []int{5, 6, 7}; !slices.Equal(granted, want) || total != 18 {
		t.Errorf("in a fault the processes granted %v (%d), want %v (18: 12 / 3 + 0.5 × their own successes each)", granted, total, want)
	}
}

// TestBudgetFaultChargedBack: a window that a fault splits grants one
// budget, not one before the fault and more after it: when Redis answers,
// each process charges the window's books with the successes it counted
// and the units it granted in the fault, before its next operation on
// them.
func TestBudgetFaultChargedBack(t *testing.T) {
	srv := redistest.Start(t)
	const n = 3
	f := newFaultFleet(t, srv, "charge-budget", n, redisstore.Options{})
	ctx := context.Background()
	bs := make([]fleet.Budget, n)
	for i, s := range f.stores {
		var err error
		bs[i], err = s.Budget(fleet.BudgetSettings{Ratio: 0.5, Window: time.Minute, MinTokens: 12})
		mustNil(t, err)
	}
	f.join(t, func(i int) { mustNil(t, bs[i].Observe(ctx, base.Add(-time.Minute), success)) })
	granted := 0
	ask := func(b fleet.Budget, k int) {
		for range k {
			if ok, _ := b.Acquire(ctx, base); ok {
				granted++
			}
		}
	}
	// Before: 6 successes in Redis's books, 9 units granted of 15.
	for i, b := range bs {
		for range 2 {
			mustNil(t, b.Observe(ctx, base, success))
		}
		mustNil(t, f.stores[i].Flush(ctx))
	}
	for _, b := range bs {
		ask(b, 3)
	}
	if granted != 9 {
		t.Fatalf("before the fault: %d granted, want 9", granted)
	}
	// In: 2 successes more each, counted in memory; each process's share
	// is 12 / 3 + 0.5 × 4 = 6, less its 3 units: 3 each.
	end := f.fault(t)
	for _, b := range bs {
		for range 2 {
			_ = b.Observe(ctx, base, success)
		}
		ask(b, 20)
	}
	if granted != 18 {
		t.Fatalf("before and in the fault: %d granted, want 18", granted)
	}
	end()
	// After: each process's first operation on the budget charges the
	// books, which then hold 12 successes and 18 units, one budget spent.
	// (A process that asks before another has charged can still be
	// granted that other's fault units: at most one budget more.)
	for _, b := range bs {
		_, _ = b.Available(ctx, base)
	}
	for _, b := range bs {
		ask(b, 20)
	}
	for _, s := range f.stores {
		mustNil(t, s.Flush(ctx))
	}
	if granted != 18 {
		t.Errorf("the window the fault split granted %d, want 18: one budget, 12 + 0.5 × 12", granted)
	}
	h, err := newClient1(t, srv.Addr).HGetAll(ctx, redisstore.Key("charge-budget")).Result()
	mustNil(t, err)
	// A decision that timed out in the fault runs when Redis resumes: its
	// unit counts as well as the fallback's, erring towards fewer grants.
	if u, _ := strconv.Atoi(h["u"]); h["s"] != "12" || u < 18 {
		t.Errorf("Redis's books: %v, want s=12 u≥18 (the fault's successes and units charged)", h)
	}
}
