package redisstore_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/redistest"
	"github.com/damper-ai/damper-go/redisstore"
	"github.com/redis/go-redis/v9"
)

// A fleet is this test binary started again as worker processes: the
// environment variable workerEnv carries the worker's job as JSON, and
// TestMain runs it instead of the tests. A worker says "ready" on stdout at
// each barrier and waits for a line on stdin, then prints its result.
const workerEnv = "REDISSTORE_TEST_WORKER"

// Worker modes.
const (
	// modeOutage: every attempt fails but the first ones counted before
	// the barrier: observe the successes, then try the retries.
	modeOutage = "outage"
	// modeInterleaved: each success is followed by a retry, across the
	// fleet at once; after a barrier, retries until the budget refuses.
	modeInterleaved = "interleaved"
	// modeBench: retries as fast as the goroutines can ask.
	modeBench = "bench"
)

type workerJob struct {
	Mode       string
	Addrs      []string
	Cluster    bool
	CtxTimeout bool // ContextTimeoutEnabled on the client
	Name       string
	Ratio      float64
	MinTokens  int
	Window     time.Duration
	Now        int64 // the time every operation passes, in Unix nanoseconds
	Successes  int   // successful first attempts, per goroutine
	Tries      int   // retries to ask for, per goroutine
	Goroutines int
	Lease      int           // Options.Lease
	LeaseFor   time.Duration // Options.LeaseFor
}

type workerResult struct {
	Granted int           // retries granted
	Asked   int           // retries asked for
	Errors  int           // operations that failed
	Elapsed time.Duration // the time of the last phase

	Decisions  int // the budget's decisions Redis answered (acquire or lease scripts)
	RoundTrips int // round trips that ran scripts, records' included
}

// barriers is the number of barriers a worker of the job waits at.
func (j workerJob) barriers() int {
	if j.Mode == modeInterleaved || j.Mode == modeLeaseMixed {
		return 2
	}
	return 1
}

func newClient(addrs []string, cluster, ctxTimeout bool) redis.UniversalClient {
	if cluster {
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: ctxTimeout})
	}
	return redis.NewClient(&redis.Options{Addr: addrs[0], ContextTimeoutEnabled: ctxTimeout})
}

// runWorker runs a worker's job and returns the process's exit code.
func runWorker(spec string) int {
	var job workerJob
	if err := json.Unmarshal([]byte(spec), &job); err != nil {
		fmt.Fprintf(os.Stderr, "worker: bad job %q: %v\n", spec, err)
		return 2
	}
	client := newClient(job.Addrs, job.Cluster, job.CtxTimeout)
	defer client.Close()
	hook := &decisionHook{}
	client.AddHook(hook)
	// A generous timeout, failing closed: a slow answer on a loaded machine
	// must not turn into a local grant that would blur the fleet's count.
	s, err := redisstore.New(client, redisstore.Options{
		Name: job.Name, Timeout: 10 * time.Second, FailClosed: true, Lease: job.Lease, LeaseFor: job.LeaseFor,
	})
	var b fleet.Budget
	if err == nil {
		b, err = s.Budget(budgetSettings(job.Ratio, job.Window, job.MinTokens))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 2
	}
	ctx, now := context.Background(), time.Unix(0, job.Now)
	stdin := bufio.NewReader(os.Stdin)
	barrier := func() {
		fmt.Println("ready")
		if _, err := stdin.ReadString('\n'); err != nil {
			fmt.Fprintln(os.Stderr, "worker: barrier:", err)
			os.Exit(2)
		}
	}
	var (
		mu  sync.Mutex
		res workerResult
	)
	// each runs f on every goroutine and adds up what they counted.
	each := func(f func(r *workerResult)) {
		var wg sync.WaitGroup
		for range job.Goroutines {
			wg.Go(func() {
				var r workerResult
				f(&r)
				mu.Lock()
				res.Granted += r.Granted
				res.Asked += r.Asked
				res.Errors += r.Errors
				mu.Unlock()
			})
		}
		wg.Wait()
	}
	success := fleet.AttemptOutcome{First: true, Success: true}
	failure := fleet.AttemptOutcome{Signal: fleet.ProviderHealth}
	retry := func(r *workerResult) bool {
		r.Asked++
		granted, err := b.Acquire(ctx, now)
		if err != nil {
			r.Errors++
		}
		if granted {
			r.Granted++
			_ = b.Observe(ctx, now, failure) // the retry fails too: no round trip
		}
		return granted
	}
	observe := func(r *workerResult) {
		if err := b.Observe(ctx, now, success); err != nil {
			r.Errors++
		}
	}

	switch job.Mode {
	case modeOutage:
		each(func(r *workerResult) {
			for range job.Successes {
				observe(r)
			}
		})
		barrier()
		each(func(r *workerResult) {
			for range job.Tries {
				retry(r)
			}
		})
	case modeInterleaved:
		barrier()
		each(func(r *workerResult) {
			for range job.Successes {
				observe(r)
				retry(r)
			}
		})
		barrier()
		each(func(r *workerResult) {
			for range job.Tries {
				if !retry(r) {
					break
				}
			}
		})
	case modeBench:
		if _, err := b.Available(ctx, now); err != nil { // loads the scripts
			fmt.Fprintln(os.Stderr, "worker:", err)
			return 2
		}
		barrier()
		start := time.Now()
		each(func(r *workerResult) {
			for range job.Tries {
				retry(r)
			}
		})
		res.Elapsed = time.Since(start)
	case modeLeaseOutage, modeLeaseMixed:
		leaseWorker(job, barrier, each, retry, observe)
	default:
		fmt.Fprintf(os.Stderr, "worker: unknown mode %q\n", job.Mode)
		return 2
	}
	res.Decisions, res.RoundTrips = int(hook.decisions.Load()), int(hook.trips.Load())
	out, _ := json.Marshal(res)
	fmt.Printf("result %s\n", out)
	return 0
}

// runFleet runs n workers on job, releases them through its barriers
// together, and returns their results. release, when set, runs at each
// barrier once every worker waits at it, just before they go on.
func runFleet(tb testing.TB, n int, job workerJob, release func(barrier int)) []workerResult {
	tb.Helper()
	spec, err := json.Marshal(job)
	if err != nil {
		tb.Fatal(err)
	}
	workers := startWorkers(tb, n, workerEnv+"="+string(spec), "-test.run=^$", "-test.bench=^$")
	for barrier := range job.barriers() {
		for _, w := range workers {
			w.next(tb, "ready")
		}
		if release != nil {
			release(barrier)
		}
		sendAll(tb, workers, "go")
	}
	results := make([]workerResult, n)
	for i, w := range workers {
		if err := json.Unmarshal([]byte(w.next(tb, "result ")), &results[i]); err != nil {
			tb.Fatalf("worker %d: %v", i, err)
		}
		w.wait(tb)
	}
	return results
}

// fleetNow is the time every worker passes: in the middle of a minute, so
// that one window holds the whole run.
var fleetNow = time.Date(2030, 1, 1, 12, 0, 30, 0, time.UTC)

// expectedGrants is what one fleet.WindowBudget grants after hearing the
// given successes: the fleet's budget must grant no more and no less.
func expectedGrants(tb testing.TB, ratio float64, minTokens, successes int) int {
	tb.Helper()
	wb, err := fleet.NewWindowBudget(ratio, time.Minute, minTokens)
	if err != nil {
		tb.Fatal(err)
	}
	for range successes {
		wb.FirstAttemptSucceeded(fleetNow)
	}
	n := 0
	for wb.TryAcquire(fleetNow) {
		n++
	}
	return n
}

func sum(results []workerResult) workerResult {
	var s workerResult
	for _, r := range results {
		s.Granted += r.Granted
		s.Asked += r.Asked
		s.Errors += r.Errors
		s.Decisions += r.Decisions
		s.RoundTrips += r.RoundTrips
	}
	return s
}

// fleetScenarios runs the outage and interleaved scenarios with four
// worker processes against the Redis at addrs.
func fleetScenarios(t *testing.T, addrs []string, cluster bool) {
	const workers, goroutines = 4, 2
	t.Run("outage", func(t *testing.T) {
		// 4 processes × 2 goroutines × 5 successes = 40 successes: 10 +
		// 0.1 × 40 = 14 retries for the fleet, where four separate
		// budgets would grant 4 × (10 + 0.1 × 10) = 44.
		job := workerJob{
			Mode: modeOutage, Addrs: addrs, Cluster: cluster, Name: "fleet-outage",
			Ratio: 0.1, MinTokens: 10, Window: time.Minute, Now: fleetNow.UnixNano(),
			Successes: 5, Tries: 25, Goroutines: goroutines,
		}
		got := sum(runFleet(t, workers, job, nil))
		successes := workers * goroutines * job.Successes
		want := expectedGrants(t, job.Ratio, job.MinTokens, successes)
		alone := workers * expectedGrants(t, job.Ratio, job.MinTokens, successes/workers)
		if got.Errors != 0 {
			t.Fatalf("%d operations failed", got.Errors)
		}
		if want != 14 || got.Granted != want {
			t.Fatalf("the fleet was granted %d retries of %d asked, want %d (MinTokens %d + Ratio %v × %d successes); separate budgets would grant %d",
				got.Granted, got.Asked, want, job.MinTokens, job.Ratio, successes, alone)
		}
		t.Logf("fleet granted %d of %d retries asked (separate budgets: %d)", got.Granted, got.Asked, alone)
		checkBooks(t, addrs, cluster, job.Name, successes, got.Granted)
	})
	t.Run("interleaved", func(t *testing.T) {
		// 4 × 2 × 20 = 160 successes: 3 + 0.25 × 160 = 43 retries.
		job := workerJob{
			Mode: modeInterleaved, Addrs: addrs, Cluster: cluster, Name: "fleet-interleaved",
			Ratio: 0.25, MinTokens: 3, Window: time.Minute, Now: fleetNow.UnixNano(),
			Successes: 20, Tries: 100, Goroutines: goroutines,
		}
		got := sum(runFleet(t, workers, job, nil))
		successes := workers * goroutines * job.Successes
		want := expectedGrants(t, job.Ratio, job.MinTokens, successes)
		if got.Errors != 0 {
			t.Fatalf("%d operations failed", got.Errors)
		}
		if want != 43 || got.Granted != want {
			t.Fatalf("the fleet was granted %d retries of %d asked, want %d (MinTokens %d + Ratio %v × %d successes)",
				got.Granted, got.Asked, want, job.MinTokens, job.Ratio, successes)
		}
		checkBooks(t, addrs, cluster, job.Name, successes, got.Granted)
	})
}

// checkBooks checks the budget's hash in Redis against what the fleet did.
func checkBooks(t *testing.T, addrs []string, cluster bool, name string, successes, granted int) {
	t.Helper()
	client := newClient(addrs, cluster, false)
	defer client.Close()
	books, err := client.HGetAll(context.Background(), redisstore.Key(name)).Result()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"w": fmt.Sprint(fleetNow.UnixNano() / int64(time.Minute)),
		"s": fmt.Sprint(successes),
		"u": fmt.Sprint(granted),
	}
	if fmt.Sprint(books) != fmt.Sprint(want) {
		t.Fatalf("books of %q = %v, want %v", name, books, want)
	}
}

func TestFleetSharesOneBudget(t *testing.T) {
	srv := redistest.Start(t)
	fleetScenarios(t, []string{srv.Addr}, false)
}

func TestFleetOnCluster(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	addrs := redistest.Addrs(nodes)
	fleetScenarios(t, addrs, true)

	// Every key of a Damper is on its hash tag's slot, and so on one node.
	for _, name := range []string{"fleet-outage", "fleet-interleaved"} {
		checkOneSlot(t, addrs, name, redisstore.Key(name))
	}
}
