package redisstore_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/internal/redistest"
	"github.com/damper-ai/damper-go/redisstore"
	"github.com/redis/go-redis/v9"
)

// warmScripts loads the lease's scripts into the server behind client, so
// that the round trips counted after are one command each (a script new
// to a server is EVALSHA, refused, then EVAL).
func warmScripts(t *testing.T, client redis.UniversalClient) {
	t.Helper()
	warm := newBudget(t, client, budgetOptions{Name: "warm", Lease: 2, LeaseFor: time.Minute})
	if granted, err := warm.Acquire(context.Background(), base); !granted || err != nil {
		t.Fatalf("warm-up Acquire = %v, %v", granted, err)
	}
	flushBudget(t, warm) // gives back the unit left: the return script
}

// decisions returns the round trips among trips that carried op, and
// fails the test if one carried anything else.
func decisions(t *testing.T, trips []trip, op string) int {
	t.Helper()
	for _, tr := range trips {
		if !slices.Equal(tr.ops, []string{op}) {
			t.Fatalf("round trips %v: want each to run %s alone", trips, op)
		}
	}
	return len(trips)
}

// books returns the budget's hash of name.
func booksOf(t *testing.T, client redis.UniversalClient, name string) map[string]string {
	t.Helper()
	h, err := client.HGetAll(context.Background(), redisstore.Key(name)).Result()
	mustNil(t, err)
	return h
}

// TestLeaseRoundTrips: with Lease 5, ten Acquires in one window make two
// decisions, each taking five units, and the balance counts the units
// held; Flush gives them back in a record.
func TestLeaseRoundTrips(t *testing.T) {
	srv := redistest.Start(t)
	hook := &tripHook{}
	client := newClient1(t, srv.Addr, hook)
	ctx := context.Background()
	warmScripts(t, client)
	rb := newBudget(t, client, budgetOptions{
		Name: "lease-trips", Ratio: damper.None, MinTokens: 20, Lease: 5, LeaseFor: time.Minute,
	})
	hook.take()
	for i := range 10 {
		if granted, err := rb.Acquire(ctx, base); !granted || err != nil {
			t.Fatalf("Acquire %d = %v, %v; want a grant", i, granted, err)
		}
	}
	if n := decisions(t, hook.take(), "budget:lease"); n != 2 {
		t.Fatalf("10 Acquires made %d decisions, want 2", n)
	}
	// Two more: a third lease, three of its units held.
	for range 2 {
		if granted, err := rb.Acquire(ctx, base); !granted || err != nil {
			t.Fatalf("Acquire = %v, %v; want a grant", granted, err)
		}
	}
	if n := decisions(t, hook.take(), "budget:lease"); n != 1 {
		t.Fatalf("2 more Acquires made %d decisions, want 1", n)
	}
	checkHash(t, client, redisstore.Key("lease-trips"), map[string]string{"w": fmt.Sprint(base.Unix() / 60), "s": "0", "u": "15"})
	// 20 units, 12 spent: Redis holds 5 and this process 3.
	if got := rb.KnownBalance(base); got != 8 {
		t.Fatalf("KnownBalance = %v, want 8 (5 in Redis, 3 leased)", got)
	}
	if got, err := rb.Available(ctx, base); got != 8 || err != nil {
		t.Fatalf("Available = %v, %v; want 8 (5 in Redis, 3 leased)", got, err)
	}
	hook.take()

	flushBudget(t, rb)
	if n := decisions(t, hook.take(), "budget:return"); n != 1 {
		t.Fatalf("Flush made %d round trips, want 1", n)
	}
	checkHash(t, client, redisstore.Key("lease-trips"), map[string]string{"w": fmt.Sprint(base.Unix() / 60), "s": "0", "u": "12"})
	if got := rb.KnownBalance(base); got != 8 {
		t.Fatalf("KnownBalance after Flush = %v, want 8 (all in Redis)", got)
	}
	if s := rb.Stats(); s != (redisstore.Stats{}) {
		t.Fatalf("Stats = %+v, want no failure", s)
	}
}

// TestLeaseConcurrent: goroutines of one process share its lease: while
// one takes a lease the others wait for it, so no more units are taken
// than granted and the decisions are one per lease, plus the refusals.
func TestLeaseConcurrent(t *testing.T) {
	srv := redistest.Start(t)
	hook := &tripHook{}
	client := newClientWith(t, &redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true}, hook)
	ctx := context.Background()
	warmScripts(t, client)
	const minTokens, lease, goroutines = 100, 7, 8
	rb := newBudget(t, client, budgetOptions{
		Name: "lease-concurrent", Ratio: damper.None, MinTokens: minTokens, Lease: lease, LeaseFor: time.Minute,
	})
	hook.take()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		granted int
	)
	for range goroutines {
		wg.Go(func() {
			for {
				ok, err := rb.Acquire(ctx, base)
				if err != nil {
					t.Error(err)
					return
				}
				if !ok {
					return
				}
				mu.Lock()
				granted++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	// Every goroutine ended on a refusal, so no unit is held: the grants
	// are exact.
	if granted != minTokens {
		t.Fatalf("%d grants, want %d", granted, minTokens)
	}
	trips := hook.take()
	n := decisions(t, trips, "budget:lease")
	// 14 full leases, one of 2 units, and at most one refusal per goroutine.
	if most := (minTokens+lease-1)/lease + goroutines; n > most {
		t.Fatalf("%d decisions for %d grants, want at most %d", n, granted, most)
	}
	t.Logf("%d grants from %d goroutines in %d decisions", granted, goroutines, n)
	checkHash(t, client, redisstore.Key("lease-concurrent"), map[string]string{"w": fmt.Sprint(base.Unix() / 60), "s": "0", "u": fmt.Sprint(minTokens)})
}

// TestLeaseNeverExceeds: two stores on one server, as two processes, take
// leases of one window in turns: they are granted at most MinTokens +
// Ratio × successes together, and, since each stops at a refusal, exactly
// that.
func TestLeaseNeverExceeds(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	const ratio, minTokens, lease = 0.5, 7, 5
	o := budgetOptions{Name: "lease-two", Ratio: ratio, MinTokens: minTokens, Lease: lease, LeaseFor: time.Minute}
	a := newBudget(t, newClient1(t, srv.Addr), o)
	b := newBudget(t, newClient1(t, srv.Addr), o)
	for range 9 {
		mustNil(t, a.Observe(ctx, base, success))
	}
	for range 4 {
		mustNil(t, b.Observe(ctx, base, success))
	}
	flushBudget(t, a)
	flushBudget(t, b)
	want := expectedGrants(t, ratio, minTokens, 13) // 7 + 0.5 × 13 = 13.5
	grants := map[*redisstore.Budget]int{}
	refused := map[*redisstore.Budget]bool{}
	for step := 0; !refused[a] || !refused[b]; step++ {
		for _, rb := range []*redisstore.Budget{a, b} {
			if refused[rb] {
				continue
			}
			granted, err := rb.Acquire(ctx, base)
			mustNil(t, err)
			if granted {
				grants[rb]++
			} else {
				refused[rb] = true
			}
			if total := grants[a] + grants[b]; total > want {
				t.Fatalf("step %d: %d grants, more than %d (MinTokens %d + Ratio %v × 13 successes)", step, total, want, minTokens, ratio)
			}
		}
	}
	if total := grants[a] + grants[b]; want != 13 || total != want {
		t.Fatalf("%d + %d grants, want %d in all", grants[a], grants[b], want)
	}
	checkHash(t, newClient1(t, srv.Addr), redisstore.Key("lease-two"), map[string]string{
		"w": fmt.Sprint(base.Unix() / 60), "s": "13", "u": "13",
	})
	for _, rb := range []*redisstore.Budget{a, b} {
		if got := rb.KnownBalance(base); got != 0.5 {
			t.Fatalf("KnownBalance after the refusals = %v, want 0.5", got)
		}
	}
}

// TestLeaseWindowChange: units left when the window changes are void: the
// next window's first Acquire takes a lease of its own, and the old units
// are neither spent nor given back.
func TestLeaseWindowChange(t *testing.T) {
	srv := redistest.Start(t)
	hook := &tripHook{}
	client := newClient1(t, srv.Addr, hook)
	ctx := context.Background()
	warmScripts(t, client)
	rb := newBudget(t, client, budgetOptions{
		Name: "lease-window", Ratio: damper.None, MinTokens: 10, Lease: 5, LeaseFor: time.Minute,
	})
	next := base.Add(time.Minute)
	hook.take()
	for _, now := range []time.Time{base, next} {
		if granted, err := rb.Acquire(ctx, now); !granted || err != nil {
			t.Fatalf("Acquire at %v = %v, %v; want a grant", now, granted, err)
		}
	}
	if n := decisions(t, hook.take(), "budget:lease"); n != 2 {
		t.Fatalf("an Acquire in each of two windows made %d decisions, want 2", n)
	}
	key := redisstore.Key("lease-window")
	checkHash(t, client, key, map[string]string{"w": fmt.Sprint(next.Unix() / 60), "s": "0", "u": "5"})
	if got := rb.KnownBalance(next); got != 9 {
		t.Fatalf("KnownBalance in the new window = %v, want 9 (5 in Redis, 4 leased)", got)
	}
	// The new window's lease is given back to it, and only it.
	flushBudget(t, rb)
	checkHash(t, client, key, map[string]string{"w": fmt.Sprint(next.Unix() / 60), "s": "0", "u": "1"})
	if got := rb.KnownBalance(next); got != 9 {
		t.Fatalf("KnownBalance after Flush = %v, want 9", got)
	}
	// A lease of a window gone is void too: given back, it changes nothing.
	if granted, err := rb.Acquire(ctx, next); !granted || err != nil {
		t.Fatalf("Acquire = %v, %v; want a grant", granted, err)
	}
	client.HSet(ctx, key, "w", fmt.Sprint(next.Unix()/60+1), "u", 0)
	flushBudget(t, rb)
	checkHash(t, client, key, map[string]string{"w": fmt.Sprint(next.Unix()/60 + 1), "s": "0", "u": "0"})
}

// TestLeaseForGivesBack: units kept unspent for LeaseFor go back to the
// window, in a record of their own.
func TestLeaseForGivesBack(t *testing.T) {
	srv := redistest.Start(t)
	hook := &tripHook{}
	client := newClient1(t, srv.Addr, hook)
	ctx := context.Background()
	warmScripts(t, client)
	rb := newBudget(t, client, budgetOptions{
		Name: "lease-for", Ratio: damper.None, MinTokens: 10, Lease: 5, LeaseFor: 20 * time.Millisecond,
	})
	key := redisstore.Key("lease-for")
	hook.take()
	start := time.Now()
	if granted, err := rb.Acquire(ctx, base); !granted || err != nil {
		t.Fatalf("Acquire = %v, %v; want a grant", granted, err)
	}
	for deadline := time.Now().Add(10 * time.Second); booksOf(t, client, "lease-for")["u"] != "1"; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the lease's 4 units were not given back within 10 s: books %v", booksOf(t, client, "lease-for"))
		}
	}
	if d := time.Since(start); d < 20*time.Millisecond {
		t.Fatalf("the units went back after %v, before LeaseFor", d)
	}
	trips := hook.take()
	if len(trips) != 2 || !slices.Equal(trips[0].ops, []string{"budget:lease"}) || !slices.Equal(trips[1].ops, []string{"budget:return"}) || trips[1].decision {
		t.Fatalf("round trips %v, want the lease's decision and the return's record", trips)
	}
	checkHash(t, client, key, map[string]string{"w": fmt.Sprint(base.Unix() / 60), "s": "0", "u": "1"})
	for deadline := time.Now().Add(10 * time.Second); rb.KnownBalance(base) != 9; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("KnownBalance = %v after the return, want 9", rb.KnownBalance(base))
		}
	}
	// Nothing held: the next Acquire takes a lease.
	if granted, err := rb.Acquire(ctx, base); !granted || err != nil {
		t.Fatalf("Acquire = %v, %v; want a grant", granted, err)
	}
	if n := decisions(t, hook.take()[:1], "budget:lease"); n != 1 {
		t.Fatalf("Acquire after the return made %d decisions, want 1", n)
	}
}

// TestLeaseZeroOrOne: without a lease every Acquire is a decision of its
// own, by the script of one unit, as before.
func TestLeaseZeroOrOne(t *testing.T) {
	srv := redistest.Start(t)
	hook := &tripHook{}
	client := newClient1(t, srv.Addr, hook)
	ctx := context.Background()
	for _, size := range []int{0, 1} {
		name := fmt.Sprint("no-lease-", size)
		rb := newBudget(t, client, budgetOptions{Name: name, Ratio: damper.None, MinTokens: 20, Lease: size})
		_, _ = rb.Available(ctx, base) // loads the script of Available on the server
		if granted, err := rb.Acquire(ctx, base); !granted || err != nil {
			t.Fatalf("Lease %d: Acquire = %v, %v", size, granted, err)
		}
		hook.take() // the first Acquire on a server loads its script
		for range 10 {
			if granted, err := rb.Acquire(ctx, base); !granted || err != nil {
				t.Fatalf("Lease %d: Acquire = %v, %v", size, granted, err)
			}
		}
		if n := decisions(t, hook.take(), "budget:acquire"); n != 10 {
			t.Fatalf("Lease %d: 10 Acquires made %d decisions, want 10", size, n)
		}
		checkHash(t, client, redisstore.Key(name), map[string]string{"w": fmt.Sprint(base.Unix() / 60), "s": "0", "u": "11"})
		if got := rb.KnownBalance(base); got != 9 {
			t.Fatalf("Lease %d: KnownBalance = %v, want 9", size, got)
		}
	}
}

// TestLeaseVoidInFallback: a fallback voids the lease: the local budget
// decides during it, and after it the units held before are not spent (the
// next Acquire takes a lease of its own).
func TestLeaseVoidInFallback(t *testing.T) {
	srv := redistest.Start(t)
	hook := &tripHook{}
	client := newClientWith(t, &redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true}, hook)
	ctx := context.Background()
	warmScripts(t, client)
	rb := newBudget(t, client, budgetOptions{
		Name: "lease-fallback", Ratio: damper.None, MinTokens: 10, Lease: 5, LeaseFor: time.Minute,
		Timeout: outageTimeout, ProbeInterval: time.Millisecond,
	})
	if granted, err := rb.Acquire(ctx, base); !granted || err != nil {
		t.Fatalf("Acquire = %v, %v; want a grant", granted, err)
	}
	srv.Kill()
	for deadline := time.Now().Add(10 * time.Second); rb.State() != redisstore.StateFallback; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no fallback with Redis killed: %+v", rb.Stats())
		}
		_, _ = rb.Available(ctx, base)
	}
	// The local budget has heard the one grant: 9 left, the lease not.
	if got := rb.KnownBalance(base); got != 9 {
		t.Fatalf("KnownBalance in the fallback = %v, want the local budget's 9", got)
	}
	if granted, err := rb.Acquire(ctx, base); !granted || err == nil {
		t.Fatalf("Acquire in the fallback = %v, %v; want the local budget's grant and an error", granted, err)
	}
	if got := rb.KnownBalance(base); got != 8 {
		t.Fatalf("KnownBalance after the fallback's grant = %v, want 8", got)
	}
	srv.Restart()
	for deadline := time.Now().Add(10 * time.Second); rb.State() != redisstore.StateShared; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not shared again after Redis restarted: %+v", rb.Stats())
		}
		_, _ = rb.Available(ctx, base)
	}
	warmScripts(t, client) // the restarted server lost its scripts
	hook.take()
	if granted, err := rb.Acquire(ctx, base); !granted || err != nil {
		t.Fatalf("Acquire after the fallback = %v, %v; want a grant", granted, err)
	}
	if n := decisions(t, hook.take(), "budget:lease"); n != 1 {
		t.Fatalf("the first Acquire after the fallback made %d decisions, want 1: the lease held before is void", n)
	}
	// The restarted Redis lost the books: the fallback's grant, charged,
	// and this lease are the window's first.
	checkHash(t, client, redisstore.Key("lease-fallback"), map[string]string{"w": fmt.Sprint(base.Unix() / 60), "s": "0", "u": "6"})
}
