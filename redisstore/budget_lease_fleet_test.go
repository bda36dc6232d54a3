package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/damper-ai/damper-go/internal/redistest"
	"github.com/damper-ai/damper-go/redisstore"
	"github.com/redis/go-redis/v9"
)

// Worker modes of the lease's fleet test: after the successes, every
// goroutine asks for retries as fast as it can until one is refused.
const (
	// modeLeaseOutage: observe the successes, then (after the barrier)
	// only retries.
	modeLeaseOutage = "lease-outage"
	// modeLeaseMixed: successes with a retry after every fourth, then
	// (after the second barrier) only retries.
	modeLeaseMixed = "lease-mixed"
)

// leaseWorker runs a worker's job in a lease mode, with runWorker's
// helpers.
func leaseWorker(job workerJob, barrier func(), each func(func(*workerResult)), retry func(*workerResult) bool, observe func(*workerResult)) {
	untilRefused := func(r *workerResult) {
		for range job.Tries {
			if !retry(r) {
				return
			}
		}
	}
	switch job.Mode {
	case modeLeaseOutage:
		each(func(r *workerResult) {
			for range job.Successes {
				observe(r)
			}
		})
		barrier()
		each(untilRefused)
	case modeLeaseMixed:
		barrier()
		each(func(r *workerResult) {
			for i := range job.Successes {
				observe(r)
				if i%4 == 3 {
					retry(r)
				}
			}
		})
		barrier()
		each(untilRefused)
	}
}

// decisionHook counts, in a worker, the round trips that run scripts and
// the budget's decisions among their scripts that Redis ran (a NOSCRIPT
// refusal, followed by EVAL, is not one).
type decisionHook struct{ decisions, trips atomic.Int64 }

func (h *decisionHook) count(single error, cmds ...redis.Cmder) {
	scripts := false
	for _, cmd := range cmds {
		// A command of its own: the error it returned, which its Err
		// does not always show yet inside the hook.
		err := single
		if err == nil {
			err = cmd.Err()
		}
		if cmd.Name() != "evalsha" && cmd.Name() != "eval" {
			continue
		}
		scripts = true
		ops, _ := redisstore.ScriptOps(cmd.Args())
		if len(ops) == 1 && (ops[0] == "budget:lease" || ops[0] == "budget:acquire") && !redis.HasErrorPrefix(err, "NOSCRIPT") {
			h.decisions.Add(1)
		}
	}
	if scripts {
		h.trips.Add(1)
	}
}

func (h *decisionHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *decisionHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.count(err, cmd)
		return err
	}
}
func (h *decisionHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.count(nil, cmds...)
		return err
	}
}

// waitSuccesses waits until the books of name in Redis hold n successes:
// every worker's records have landed.
func waitSuccesses(t *testing.T, client redis.UniversalClient, name string, n int) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
		s, _ := client.HGet(context.Background(), redisstore.Key(name), "s").Result()
		if s == strconv.Itoa(n) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("books of %q hold %q successes after 30 s, want %d", name, s, n)
		}
	}
}

// TestFleetLease: four worker processes of two goroutines each ask for
// retries as fast as they can in one window, in a full outage and in a
// mixed load, without a lease and with Lease 5. The fleet is granted at
// most MinTokens + Ratio × successes, and at least that less the units
// stranded in leases, (Lease-1) × processes; with a lease it asks Redis
// about once per Lease retries, plus the refusals.
func TestFleetLease(t *testing.T) {
	srv := redistest.Start(t)
	client := newClientWith(t, &redis.Options{Addr: srv.Addr})
	const workers, goroutines = 4, 2
	for _, sc := range []struct {
		name, mode string
		ratio      float64
		minTokens  int
		successes  int // per goroutine
	}{
		// 4 × 2 × 50 = 400 successes: 10 + 0.1 × 400 = 50 retries.
		{"outage", modeLeaseOutage, 0.1, 10, 50},
		// 320 successes: 100 + 0.5 × 320 = 260 retries, of which the 80
		// asked among the successes leave the budget ample room.
		{"mixed", modeLeaseMixed, 0.5, 100, 40},
	} {
		for _, lease := range []int{0, 5} {
			t.Run(fmt.Sprintf("%s/lease=%d", sc.name, lease), func(t *testing.T) {
				name := fmt.Sprintf("fleet-lease-%s-%d", sc.name, lease)
				job := workerJob{
					Mode: sc.mode, Addrs: []string{srv.Addr}, CtxTimeout: true, Name: name,
					Ratio: sc.ratio, MinTokens: sc.minTokens, Window: time.Minute, Now: fleetNow.UnixNano(),
					Successes: sc.successes, Tries: 1_000_000, Goroutines: goroutines,
					Lease: lease, LeaseFor: time.Minute,
				}
				successes := workers * goroutines * sc.successes
				// The last phase, retries alone, starts once every
				// worker's successes are in Redis.
				release := func(barrier int) {
					if barrier == job.barriers()-1 {
						waitSuccesses(t, client, name, successes)
					}
				}
				got := sum(runFleet(t, workers, job, release))
				bound := expectedGrants(t, sc.ratio, sc.minTokens, successes)
				size := max(lease, 1)
				least := bound - (size-1)*workers
				refusals := got.Asked - got.Granted
				if got.Errors != 0 {
					t.Fatalf("%d operations failed", got.Errors)
				}
				if got.Granted > bound || got.Granted < least {
					t.Fatalf("the fleet was granted %d retries, want %d to %d (MinTokens %d + Ratio %v × %d successes, less (Lease-1) × %d processes)",
						got.Granted, least, bound, sc.minTokens, sc.ratio, successes, workers)
				}
				// Each goroutine stopped at its first refusal, and none
				// was refused before.
				if refusals != workers*goroutines {
					t.Fatalf("%d refusals, want one per goroutine, %d", refusals, workers*goroutines)
				}
				// Full leases, one partial, and the refusals: a goroutine
				// that waited for a lease refused shares its refusal, one
				// that asks after it is refused by a decision of its own.
				most := (got.Granted+size-1)/size + refusals
				if lease <= 1 {
					most = got.Asked // one decision per retry asked
				}
				if got.Decisions > most || lease <= 1 && got.Decisions != most {
					t.Fatalf("%d decisions for %d retries granted and %d refused, want at most %d", got.Decisions, got.Granted, refusals, most)
				}
				t.Logf("%s, Lease %d: %d processes × %d goroutines were granted %d retries of %d asked (at most %d, at least %d); "+
					"%d decisions (%.3f per retry granted, %.3f per retry asked); %d round trips in all, records' included (%.3f per retry asked)",
					sc.name, lease, workers, goroutines, got.Granted, got.Asked, bound, least, got.Decisions,
					float64(got.Decisions)/float64(got.Granted), float64(got.Decisions)/float64(got.Asked),
					got.RoundTrips, float64(got.RoundTrips)/float64(got.Asked))
				// Every process ended on a refusal, holding no unit: Redis
				// counts exactly the units spent.
				checkBooks(t, []string{srv.Addr}, false, name, successes, got.Granted)
			})
		}
	}
}
