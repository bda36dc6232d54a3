package redisstore_test

import (
	"context"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// benchMinTokens keeps every admission granted: a refusal costs the same
// round trip, but a granted one is the case to measure.
const benchMinTokens = 1 << 30

// eachClientKindB runs bench once with each kind of client.
func eachClientKindB(b *testing.B, bench func(b *testing.B, ctxTimeout bool)) {
	for _, k := range clientKinds {
		b.Run(k.name, func(b *testing.B) { bench(b, k.ctxTimeout) })
	}
}

// BenchmarkAcquire admits retries one after another on a loopback Redis,
// through two budgets on one server: one on a client with go-redis's
// default options (the round trip runs on a goroutine of its own) and one
// on a client with ContextTimeoutEnabled (it runs on the caller's). Each
// iteration makes one admission through each and one PING, in rotating
// order, so that all three see the same load. It reports the round trips
// per admission and the latency percentiles of each; ns/op is the three's.
func BenchmarkAcquire(b *testing.B) {
	srv := redistest.Start(b)
	ctx := context.Background()
	hook := &countHook{}
	var ops []func()
	var lat [][]time.Duration
	timed := func(op func() error) {
		i := len(ops)
		lat = append(lat, make([]time.Duration, 0, b.N))
		ops = append(ops, func() {
			start := time.Now()
			if err := op(); err != nil {
				b.Fatal(err)
			}
			lat[i] = append(lat[i], time.Since(start))
		})
	}
	for _, k := range clientKinds {
		client := newClientWith(b, &redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: k.ctxTimeout}, hook)
		rb := newBudget(b, client, budgetOptions{Name: "bench", MinTokens: benchMinTokens})
		if _, err := rb.Acquire(ctx, base); err != nil { // loads the script
			b.Fatal(err)
		}
		timed(func() error { _, err := rb.Acquire(ctx, base); return err })
	}
	pinger := newClientWith(b, &redis.Options{Addr: srv.Addr})
	mustNil(b, pinger.Ping(ctx).Err())
	timed(func() error { return pinger.Ping(ctx).Err() })
	hook.n.Store(0)
	b.ResetTimer()
	for i := range b.N {
		for j := range ops {
			ops[(i+j)%len(ops)]()
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(hook.n.Load())/float64(2*b.N), "roundtrips/op")
	for i, name := range []string{"goroutine", "inline", "ping"} {
		b.ReportMetric(percentile(lat[i], 50), name+"-p50-µs")
		b.ReportMetric(percentile(lat[i], 99), name+"-p99-µs")
	}
}

// percentile returns the p-th percentile of d, in microseconds.
func percentile(d []time.Duration, p int) float64 {
	slices.Sort(d)
	return float64(d[(len(d)-1)*p/100].Nanoseconds()) / 1e3
}

// BenchmarkAcquireParallel admits retries from 8 goroutines of one
// process, and reports admissions per second.
func BenchmarkAcquireParallel(b *testing.B) {
	eachClientKindB(b, func(b *testing.B, ctxTimeout bool) {
		srv := redistest.Start(b)
		client := newClientWith(b, &redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: ctxTimeout})
		rb := newBudget(b, client, budgetOptions{Name: "bench", MinTokens: benchMinTokens})
		ctx := context.Background()
		if _, err := rb.Acquire(ctx, base); err != nil {
			b.Fatal(err)
		}
		b.SetParallelism(max(1, 8/runtime.GOMAXPROCS(0)))
		start := time.Now()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := rb.Acquire(ctx, base); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "admissions/s")
	})
}

// BenchmarkAcquireFleet admits retries from 4 processes of 8 goroutines
// each, on one budget, and reports the fleet's admissions per second.
func BenchmarkAcquireFleet(b *testing.B) {
	eachClientKindB(b, func(b *testing.B, ctxTimeout bool) {
		srv := redistest.Start(b)
		const workers, goroutines = 4, 8
		job := workerJob{
			Mode: modeBench, Addrs: []string{srv.Addr}, CtxTimeout: ctxTimeout, Name: "bench-fleet",
			MinTokens: benchMinTokens, Window: time.Minute, Now: base.UnixNano(),
			Tries: max(1, b.N/(workers*goroutines)), Goroutines: goroutines,
		}
		var start time.Time
		b.ResetTimer()
		results := runFleet(b, workers, job, func(int) { start = time.Now() })
		elapsed := time.Since(start)
		b.StopTimer()
		total := sum(results)
		if total.Errors != 0 || total.Granted != total.Asked {
			b.Fatalf("%d errors, %d of %d granted", total.Errors, total.Granted, total.Asked)
		}
		b.ReportMetric(float64(total.Asked)/elapsed.Seconds(), "admissions/s")
	})
}

// BenchmarkShareTake is the cost of a tenant's share on a loopback Redis:
// each iteration takes for one of two tenants, in turn (one round trip),
// and settles what the call used (a record, queued); a PING on the same
// server, timed in the same iterations, is the floor of a round trip.
func BenchmarkShareTake(b *testing.B) {
	srv := redistest.Start(b)
	ctx := context.Background()
	client := newClientWith(b, &redis.Options{Addr: srv.Addr})
	store := newStore(b, client, "bench")
	s, err := store.LimitShares(fleet.ShareSettings{Group: "claude-sonnet-4"})
	if err != nil {
		b.Fatal(err)
	}
	pinger := newClientWith(b, &redis.Options{Addr: srv.Addr})
	asks := []fleet.ShareAsk{{Tenant: "alpha", Weight: 3, Fraction: 1e-9}, {Tenant: "beta", Weight: 1, Fraction: 1e-9}}
	var take, ping time.Duration
	now := base
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		now = now.Add(time.Millisecond)
		start := time.Now()
		r, _, err := s.Take(ctx, now, asks[i%2], now)
		if err != nil || !r.Taken() {
			b.Fatalf("Take: %v, %v", r.Taken(), err)
		}
		mustNil(b, s.Settle(ctx, now, r, 0.5e-9))
		take += time.Since(start)
		start = time.Now()
		mustNil(b, pinger.Ping(ctx).Err())
		ping += time.Since(start)
		i++
	}
	mustNil(b, store.Flush(ctx))
	b.ReportMetric(float64(take.Nanoseconds())/float64(i), "share-ns/op")
	b.ReportMetric(float64(ping.Nanoseconds())/float64(i), "ping-ns/op")
}
