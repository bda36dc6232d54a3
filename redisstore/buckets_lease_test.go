package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/redistest"
	"github.com/damper-ai/damper-go/redisstore"
	"github.com/redis/go-redis/v9"
)

// leaseLimits are configured limits on every bucket: a lease needs every
// limit known.
var leaseLimits = fleet.RateLimits{RequestsPerMinute: 1000, InputTokensPerMinute: 100_000, OutputTokensPerMinute: 10_000}

// leaseCost is what each request of the lease tests asks for.
var leaseCost = fleet.RateAmounts{1, 10, 5}

// leaseSetup returns buckets of a store with lease on a fresh Redis, the
// store, the hook that sees its round trips and a client to read Redis.
func leaseSetup(t *testing.T, lease int, limits fleet.RateLimits) (fleet.LimitBuckets, *redisstore.Store, *tripHook, func() float64) {
	t.Helper()
	return leaseSetupOn(t, redistest.Start(t), redisstore.Options{Lease: lease}, limits)
}

// leaseSetupOn is leaseSetup on srv with o, its Name and Timeout set.
func leaseSetupOn(t *testing.T, srv *redistest.Server, o redisstore.Options, limits fleet.RateLimits) (fleet.LimitBuckets, *redisstore.Store, *tripHook, func() float64) {
	t.Helper()
	hook := &tripHook{}
	o.Name, o.Timeout = "lease", 10*time.Second
	s, err := redisstore.New(newClient1(t, srv.Addr, hook), o)
	if err != nil {
		t.Fatal(err)
	}
	b := newBuckets(t, s, fleet.LimitSettings{Group: "g", Limits: limits, BatchShare: 0.8})
	// Redis learns the scripts (EVALSHA, then EVAL) on another group.
	warm := newBuckets(t, s, fleet.LimitSettings{Group: "warm", Limits: limits, BatchShare: 0.8})
	reserveN(t, warm, base, 1)
	if err := s.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	hook.take()
	reader := newClient1(t, srv.Addr)
	// taken reads the requests bucket's net take from Redis.
	taken := func() float64 {
		t.Helper()
		v, err := reader.HGet(context.Background(), redisstore.BucketsKey("lease", "g"), "t0").Result()
		if err != nil {
			t.Fatal(err)
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	return b, s, hook, taken
}

// limitDecisions counts the trips that carried a decision, and the reserves.
func limitDecisions(trips []trip) (n, reserves int) {
	for _, tr := range trips {
		if tr.decision {
			n++
		}
		for _, op := range tr.ops {
			if op == "ratelimit:reserve" {
				reserves++
			}
		}
	}
	return n, reserves
}

// reserveN asks for n interactive requests of leaseCost at now, settling
// each as used in full, and fails unless every one takes at now.
func reserveN(t *testing.T, b fleet.LimitBuckets, now time.Time, n int) {
	t.Helper()
	ctx := context.Background()
	for i := range n {
		r, due, err := b.Reserve(ctx, now, leaseCost, fleet.Interactive, now.Add(time.Second), nil)
		if err != nil || !r.Taken() || !due.Equal(now) {
			t.Fatalf("Reserve %d: taken %v, due %v, %v; want taken at now", i, r.Taken(), due.Sub(now), err)
		}
		mustNil(t, b.Settle(ctx, now, r, leaseCost, [3]bool{true, true, true}))
	}
}

// TestLimitLeaseRoundTrips: ten interactive Reserves that fit make 2 decisions
// with Lease 5 (each takes the request and 4 more calls' worth) and 10
// with Lease 0, and take the same from the shared buckets.
func TestLimitLeaseRoundTrips(t *testing.T) {
	for _, c := range []struct{ lease, want int }{{5, 2}, {0, 10}, {1, 10}} {
		b, s, hook, _ := leaseSetup(t, c.lease, leaseLimits)
		now := base.Add(3 * time.Second)
		reserveN(t, b, now, 10)
		mustNil(t, s.Flush(context.Background()))
		n, reserves := limitDecisions(hook.take())
		if n != c.want || reserves != c.want {
			t.Errorf("Lease %d: %d decisions, %d reserves for 10 requests; want %d", c.lease, n, reserves, c.want)
		}
		st, err := b.State(context.Background(), now)
		if err != nil || st[0].Remaining != 990 || st[1].Remaining != 99_900 || st[2].Remaining != 9950 {
			t.Errorf("Lease %d: after 10 requests the shared buckets are %+v, %v; want 990, 99900, 9950 remaining", c.lease, st, err)
		}
	}
}

// TestLimitLeasePauseGivesBack: a pause gives the lease back before it empties
// the bucket, and the next request asks Redis, which refuses it.
func TestLimitLeasePauseGivesBack(t *testing.T) {
	b, s, hook, taken := leaseSetup(t, 5, leaseLimits)
	ctx := context.Background()
	now := base.Add(3 * time.Second)
	reserveN(t, b, now, 1)
	if got := taken(); got != 5 {
		t.Fatalf("after one request with Lease 5 the fleet took %v requests, want 5 (1 and a lease of 4)", got)
	}
	mustNil(t, b.Pause(ctx, now, [3]bool{true}, now.Add(10*time.Second)))
	mustNil(t, s.Flush(ctx))
	if got := taken(); got != 1 {
		t.Fatalf("after the pause the fleet has taken %v requests, want 1: the lease goes back", got)
	}
	hook.take()
	later := now.Add(500 * time.Millisecond)
	r, due, err := b.Reserve(ctx, later, leaseCost, fleet.Interactive, later.Add(time.Second), nil)
	if err != nil || r.Taken() || due.Before(now.Add(10*time.Second)) {
		t.Fatalf("Reserve in the pause: taken %v, due %v, %v; want refused until the pause ends", r.Taken(), due.Sub(now), err)
	}
	if n, _ := limitDecisions(hook.take()); n != 1 {
		t.Fatalf("Reserve in the pause made %d decisions, want 1: the lease is void", n)
	}
}

// TestLimitLeaseForGivesBack: a lease older than LeaseFor (1 s by default) is
// given back at the group's next Reserve, which asks Redis, and Flush gives
// back what is left.
func TestLimitLeaseForGivesBack(t *testing.T) {
	b, s, hook, taken := leaseSetup(t, 5, leaseLimits)
	ctx := context.Background()
	now := base.Add(3 * time.Second)
	reserveN(t, b, now, 2)
	reserveN(t, b, now.Add(999*time.Millisecond), 1) // still from the lease
	reserveN(t, b, now.Add(time.Second), 1)          // the lease has lasted LeaseFor
	mustNil(t, s.Flush(ctx))
	if n, _ := limitDecisions(hook.take()); n != 2 {
		t.Errorf("4 requests, the last 1 s after the lease: %d decisions, want 2", n)
	}
	// Taken: 1+4, 2 left given back, 1+4 again, all 4 left given back at
	// Flush: 4 requests.
	if got := taken(); got != 4 {
		t.Errorf("after Flush the fleet has taken %v requests, want 4: every lease given back", got)
	}
	st, err := b.State(ctx, now.Add(time.Second))
	if err != nil || st[0].Remaining < 996 || st[2].Remaining < 9980 {
		t.Errorf("after Flush the shared buckets are %+v, %v; want at least 996 requests and 9980 output tokens", st, err)
	}
}

// TestLimitLeaseNeedsKnownLimits: a group whose limits are learned takes no
// lease until a response has taught every limit, and a response that
// changes a learned limit gives the lease back.
func TestLimitLeaseNeedsKnownLimits(t *testing.T) {
	b, s, hook, taken := leaseSetup(t, 5, fleet.RateLimits{})
	ctx := context.Background()
	now := base.Add(3 * time.Second)
	reserveN(t, b, now, 2)
	if n, _ := limitDecisions(hook.take()); n != 2 {
		t.Fatalf("2 requests with the limits unknown: %d decisions, want 2 (no lease)", n)
	}
	r, _, err := b.Reserve(ctx, now, leaseCost, fleet.Interactive, now, nil)
	if err != nil || !r.Taken() {
		t.Fatalf("Reserve: %v, %v", r.Taken(), err)
	}
	obs := fleet.RateObservation{Has: [3]bool{true, true, true}, Limit: fleet.RateAmounts{1000, 100_000, 10_000}, Remaining: fleet.RateAmounts{990, 99_000, 9_000}}
	mustNil(t, b.Observe(ctx, now, r, obs))
	mustNil(t, b.Settle(ctx, now, r, leaseCost, [3]bool{true, true, true}))
	mustNil(t, s.Flush(ctx))
	reserveN(t, b, now, 3)                                                  // 1 decision, 2 from the lease
	before := taken()                                                       // Flush would give the lease back
	r, _, err = b.Reserve(ctx, now, leaseCost, fleet.Interactive, now, nil) // from the lease: 1 left
	if err != nil || !r.Taken() {
		t.Fatalf("Reserve: %v, %v", r.Taken(), err)
	}
	obs.Limit[0] = 2000
	mustNil(t, b.Observe(ctx, now, r, obs))
	mustNil(t, b.Settle(ctx, now, r, leaseCost, [3]bool{true, true, true}))
	mustNil(t, s.Flush(ctx))
	if got := taken(); got != before-1 {
		t.Errorf("after a new limit the fleet has taken %v requests, want %v: the lease's 1 given back", got, before-1)
	}
	hook.take()
	reserveN(t, b, now, 1)
	if n, _ := limitDecisions(hook.take()); n != 1 {
		t.Errorf("the request after a new limit made %d decisions, want 1", n)
	}
}

// TestFleetLimitLeases runs 4 processes of 2 goroutines each with Lease 5 on
// buckets configured to 200 requests a minute, never waiting (latest is
// now). At one instant they ask for 152, then 240 more; 30 s later (every
// lease past LeaseFor, the bucket refilled by 100) for 240 more. The
// fleet never admits more than the bucket held (200, then 300 in all), and
// leaves at most (Lease-1) × processes requests unspent in leases. The
// first phase, whose requests all fit, makes one decision per Lease
// requests, but for two goroutines of a process that both find the lease
// spent. After every process's Flush the bucket holds exactly what the
// fleet did not admit.
func TestFleetLimitLeases(t *testing.T) {
	const procs, lease, rpm = 4, 5, 200
	const inLeases = (lease - 1) * procs // the most that leases hold
	addr := redistest.Start(t).Addr
	const name, group = "lease-fleet", "claude-sonnet-4"
	now := base.Add(7 * time.Second)
	limits := fleet.RateLimits{RequestsPerMinute: rpm, InputTokensPerMinute: 1_000_000, OutputTokensPerMinute: 1_000_000}
	b := newBuckets(t, newStore(t, newClient1(t, addr), name), fleet.LimitSettings{Group: group, Limits: limits, BatchShare: 0.8})
	ctx := context.Background()
	remaining := func(at time.Time) float64 {
		t.Helper()
		st, err := b.State(ctx, at)
		if err != nil {
			t.Fatal(err)
		}
		return st[0].Remaining
	}
	var held float64
	got, trips := runBucketsFleet(t, procs, bucketsJob{
		Addrs: []string{addr}, Name: name, Group: group,
		Phases:     []int64{now.UnixNano(), now.UnixNano(), now.Add(30 * time.Second).UnixNano()},
		Goroutines: 2, PhaseTries: []int{19, 30, 30},
		Lease: lease, Limits: limits,
	}, func(phase int) {
		if phase == 1 {
			// 152 admitted; the rest of the 200 is in Redis or in leases.
			held = rpm - 152 - remaining(now)
		}
	})
	asked := procs * 2 * (19 + 30 + 30)
	admitted := got[0] + got[1] + got[2]
	t.Logf("admitted %v (%d in all) of %d asked, with %v decisions; after the first phase %v requests sat in leases",
		got, admitted, asked, trips, held)
	if got[0] != 152 {
		t.Errorf("first phase: admitted %d, want all 152: the bucket held 200", got[0])
	}
	if held < 0 || held > inLeases {
		t.Errorf("after the first phase %v requests sat in leases, want 0 to %d", held, inLeases)
	}
	if got[0]+got[1] > rpm || got[0]+got[1] < rpm-inLeases {
		t.Errorf("at one instant the fleet admitted %d, want %d to %d", got[0]+got[1], rpm-inLeases, rpm)
	}
	if admitted > rpm+100 || admitted < rpm+100-inLeases {
		t.Errorf("in all the fleet admitted %d, want %d to %d", admitted, rpm+100-inLeases, rpm+100)
	}
	if left := remaining(now.Add(30 * time.Second)); left != float64(rpm+100-admitted) {
		t.Errorf("after every Flush the bucket holds %v, want %d: the leases given back", left, rpm+100-admitted)
	}
	// Sequentially each process's 38 requests would be 8 decisions.
	if trips[0] < 32 || trips[0] > 152/2 {
		t.Errorf("the first phase's 152 requests made %d decisions, want 32 to 76", trips[0])
	}
}

// TestLimitLeaseFallbackDrops: a lease is spent while no operation has found
// Redis down; once one has, the lease is dropped (the local buckets decide,
// with the error), and the first decision Redis answers again takes a new
// one.
func TestLimitLeaseFallbackDrops(t *testing.T) {
	srv := redistest.Start(t)
	b, s, hook, taken := leaseSetupOn(t, srv, redisstore.Options{Lease: 5, ProbeInterval: time.Millisecond}, leaseLimits)
	ctx := context.Background()
	now := base.Add(3 * time.Second)
	reserveN(t, b, now, 1)
	srv.Kill()
	hook.take()
	reserveN(t, b, now, 1) // from the lease: Redis is not asked
	if trips := hook.take(); len(trips) != 0 {
		t.Fatalf("a request from the lease made round trips %+v", trips)
	}
	_ = s.Flush(ctx) // the Settle's batch fails
	if s.State() != redisstore.StateFallback {
		t.Fatalf("after a batch failed on a killed Redis the state is %v, want the fallback", s.State())
	}
	r, _, err := b.Reserve(ctx, now, leaseCost, fleet.Interactive, now, nil)
	if err == nil || !r.Taken() {
		t.Fatalf("Reserve in the fallback: taken %v, %v; want the local buckets' take and the error", r.Taken(), err)
	}
	srv.Restart() // empty
	deadline := time.Now().Add(10 * time.Second)
	for {
		r, _, err = b.Reserve(ctx, now, leaseCost, fleet.Interactive, now, nil)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Redis back, the store still falls back: %v", err)
		}
		time.Sleep(time.Millisecond)
	}
	// The restarted Redis heard only the request that found it back and
	// the lease it took then, and, in a record queued then, what the
	// fallback admitted; Flush gives the lease back.
	if got := taken(); (got != 5 && got != 6) || !r.Taken() {
		t.Errorf("after the return Redis holds a take of %v, want 5 (6 with the fallback's record)", got)
	}
	mustNil(t, s.Flush(ctx))
	if got := taken(); got != 2 {
		t.Errorf("after Flush Redis holds a take of %v, want 2: the request, and the one the fallback admitted", got)
	}
	if st := s.Stats(); st.Fallbacks != 1 || st.Recoveries != 1 {
		t.Errorf("stats %+v, want one fallback and one recovery", st)
	}
}

// BenchmarkReserveLease reserves and settles interactive requests one after
// another on a loopback Redis, the buckets never short, with Lease 0, 5
// and 20: it reports the decisions (round trips on the caller's path) per
// request, and ns/op, the records' batches included.
func BenchmarkReserveLease(b *testing.B) {
	for _, lease := range []int{0, 5, 20} {
		b.Run(fmt.Sprintf("lease=%d", lease), func(b *testing.B) {
			srv := redistest.Start(b)
			hook := &tripHook{}
			s, err := redisstore.New(newClientWith(b, &redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true}, hook),
				redisstore.Options{Name: "bench", Lease: lease})
			if err != nil {
				b.Fatal(err)
			}
			limits := fleet.RateLimits{RequestsPerMinute: 1_000_000_000, InputTokensPerMinute: 1_000_000_000, OutputTokensPerMinute: 1_000_000_000}
			lb := newBuckets(b, s, fleet.LimitSettings{Group: "g", Limits: limits, BatchShare: 0.8})
			ctx := context.Background()
			now := base
			step := func() {
				r, _, err := lb.Reserve(ctx, now, leaseCost, fleet.Interactive, now, nil)
				if err != nil || !r.Taken() {
					b.Fatalf("Reserve: %v, %v", r.Taken(), err)
				}
				mustNil(b, lb.Settle(ctx, now, r, leaseCost, [3]bool{true, true, true}))
				now = now.Add(time.Millisecond)
			}
			step() // loads the scripts
			mustNil(b, s.Flush(ctx))
			hook.take()
			b.ResetTimer()
			for range b.N {
				step()
			}
			mustNil(b, s.Flush(ctx))
			b.StopTimer()
			n, _ := limitDecisions(hook.take())
			b.ReportMetric(float64(n)/float64(b.N), "decisions/op")
		})
	}
}
