package redisstore_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/damper-ai/damper-go/fleet"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
	"github.com/damper-ai/damper-go/internal/redistest"
	"github.com/damper-ai/damper-go/redisstore"
)

// rlFleet is what one run of a fleet of Dampers against an API that
// enforces its rate limits did.
type rlFleet struct {
	offered  int // calls made
	ok       int // calls answered
	api429   int // 429s the API sent
	refused  int // calls the limiters refused before sending
	okLater  int // calls answered after the first minute
	minutes  float64
	duration time.Duration
}

// Fleet run: 4 Dampers, one shared virtual clock, one fake API enforcing
// 60 requests a minute; the Dampers call in turn, one call every 500 ms in
// all (120 a minute, twice what the limit admits), never waiting in line.
const (
	rlFleetSize  = 4
	rlFleetRPM   = 60
	rlFleetTick  = 500 * time.Millisecond
	rlFleetSpan  = 6 * time.Minute
	rlFleetModel = "claude-sonnet-4-6"
	rlFleetGroup = "claude-sonnet-4" // rlFleetModel's limit group
)

var rlFleetStart = time.Now().UTC().Truncate(time.Second)

// runRLFleet runs the fleet with each Damper's rate limiter kept as mode
// says: "none" (no limiter), "memory" (each in its own memory) or "redis"
// (shared in the Redis at addr).
func runRLFleet(t *testing.T, mode, addr string) rlFleet {
	t.Helper()
	// The clock starts at the real time: the SDK gives each call a real
	// deadline, which the limiter leaves room before.
	clock := dampertest.NewClock(rlFleetStart)
	api := dampertest.NewServer(dampertest.InMemory(), dampertest.WithClock(clock),
		dampertest.WithRateLimits(dampertest.RateLimits{RequestsPerMinute: rlFleetRPM, OutputTokensPerMinute: 100_000}))
	t.Cleanup(api.Close)
	clients := make([]anthropic.Client, rlFleetSize)
	for i := range clients {
		p := damper.Policy{MaxAttempts: 1}
		settings := []damper.Setting{damper.WithClock(clock)}
		if mode != "none" {
			p.RateLimit = &damper.RateLimitPolicy{MaxWait: damper.None}
		}
		if mode == "redis" {
			store := newStore(t, newClient1(t, addr), "rl-fleet")
			settings = append(settings, damper.WithStore(store))
		}
		d, err := damper.New(p, settings...)
		if err != nil {
			t.Fatal(err)
		}
		clients[i] = anthropic.NewClient(append([]option.RequestOption{d.Option(), option.WithMaxRetries(0)}, api.Options()...)...)
	}
	params := anthropic.MessageNewParams{
		Model:     rlFleetModel,
		MaxTokens: 100,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hello"))},
	}
	var r rlFleet
	ctx := context.Background()
	start := clock.Now()
	for n := 0; clock.Now().Sub(start) < rlFleetSpan; n++ {
		r.offered++
		_, err := clients[n%rlFleetSize].Messages.New(ctx, params)
		var apiErr *anthropic.Error
		switch {
		case err == nil:
			r.ok++
			if clock.Now().Sub(start) >= time.Minute {
				r.okLater++
			}
		case errors.Is(err, damper.ErrRateLimited):
			r.refused++
		case errors.As(err, &apiErr) && apiErr.StatusCode == 429:
		default:
			t.Fatalf("call %d: %v", n, err)
		}
		clock.Advance(rlFleetTick)
	}
	st := api.RateLimitStats()
	r.api429 = st.Limited
	if st.Admitted != r.ok {
		t.Fatalf("%s: the API admitted %d calls, %d answered", mode, st.Admitted, r.ok)
	}
	r.minutes = (rlFleetSpan - time.Minute).Minutes()
	return r
}

// TestFleetSharesRateLimits runs a fleet of 4 Dampers, offered twice what
// the API's limit admits, three times: without a limiter, with each
// Damper's buckets in its own memory, and with the buckets in Redis. The
// fleet sharing Redis learns the limit once and keeps under it together:
// at least 95 % fewer 429s than without a limiter, and, after the first
// minute, a goodput within 5 % of the limit.
func TestFleetSharesRateLimits(t *testing.T) {
	srv := redistest.Start(t)
	none := runRLFleet(t, "none", "")
	memory := runRLFleet(t, "memory", "")
	shared := runRLFleet(t, "redis", srv.Addr)
	for _, x := range []struct {
		name string
		r    rlFleet
	}{{"no limiter", none}, {"in memory", memory}, {"Redis", shared}} {
		t.Logf("%-10s: %d calls, %d answered, %d 429s from the API, %d refused by the limiter; %.1f answered a minute after the first minute (limit %d)",
			x.name, x.r.offered, x.r.ok, x.r.api429, x.r.refused, float64(x.r.okLater)/x.r.minutes, rlFleetRPM)
	}
	if none.api429 < none.offered/3 {
		t.Fatalf("without a limiter the API sent only %d 429s of %d calls: the load is not twice the limit", none.api429, none.offered)
	}
	if float64(shared.api429) > 0.05*float64(none.api429) {
		t.Errorf("with Redis the API sent %d 429s, more than 5 %% of the %d without a limiter", shared.api429, none.api429)
	}
	if goodput := float64(shared.okLater) / shared.minutes; math.Abs(goodput-rlFleetRPM) > 0.05*rlFleetRPM {
		t.Errorf("with Redis the fleet got %.1f calls a minute through, want within 5 %% of %d", goodput, rlFleetRPM)
	}
	// Learned once, shared by all.
	b := newBuckets(t, newStore(t, newClient1(t, srv.Addr), "rl-fleet"), fleet.LimitSettings{Group: rlFleetGroup, BatchShare: 0.8})
	st, err := b.State(context.Background(), rlFleetStart.Add(rlFleetSpan))
	if err != nil || st[0].Limit != rlFleetRPM || !st[0].Learned {
		t.Fatalf("the shared requests bucket: %+v, %v; want a learned limit of %d", st[0], err, rlFleetRPM)
	}
}

// A worker of TestFleetProcessesShareBuckets is this test binary started
// again with bucketsWorkerEnv set to its job: init runs it, before
// TestMain.
const bucketsWorkerEnv = "REDISSTORE_TEST_BUCKETS_WORKER"

type bucketsJob struct {
	Addrs      []string
	Cluster    bool
	Name       string
	Group      string
	Phases     []int64 // the time of each phase, in Unix nanoseconds
	Goroutines int
	Tries      int   // reservations asked for per goroutine and phase
	PhaseTries []int // when set, Tries per phase
	Lease      int
	Limits     fleet.RateLimits
	Cost       fleet.RateAmounts // default {1, 10, 0}
}

func init() {
	if spec := os.Getenv(bucketsWorkerEnv); spec != "" {
		os.Exit(runBucketsWorker(spec))
	}
}

// runBucketsWorker asks, in each phase, for one request at a time at the
// phase's time, never waiting (latest is now), from every goroutine, and
// prints how many took, per phase, and how many of its round trips carried
// a decision; at the end it flushes its store, giving back its lease.
func runBucketsWorker(spec string) int {
	var job bucketsJob
	if err := json.Unmarshal([]byte(spec), &job); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 2
	}
	cost := job.Cost
	if cost == (fleet.RateAmounts{}) {
		cost = fleet.RateAmounts{1, 10, 0}
	}
	client := newClient(job.Addrs, job.Cluster, false)
	defer client.Close()
	hook := &tripHook{}
	client.AddHook(hook)
	s, err := redisstore.New(client, redisstore.Options{Name: job.Name, Timeout: 10 * time.Second, Lease: job.Lease})
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 2
	}
	b, err := s.LimitBuckets(fleet.LimitSettings{Group: job.Group, Limits: job.Limits, BatchShare: 0.8})
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 2
	}
	stdin := bufio.NewReader(os.Stdin)
	var taken, phaseDecisions []int
	errs := 0
	for i, at := range job.Phases {
		tries := job.Tries
		if job.PhaseTries != nil {
			tries = job.PhaseTries[i]
		}
		fmt.Println("ready")
		if _, err := stdin.ReadString('\n'); err != nil {
			return 2
		}
		now := time.Unix(0, at)
		var mu sync.Mutex
		n := 0
		var wg sync.WaitGroup
		for range job.Goroutines {
			wg.Go(func() {
				for range tries {
					r, _, err := b.Reserve(context.Background(), now, cost, fleet.Interactive, now, nil)
					mu.Lock()
					if err != nil {
						errs++
					}
					if r.Taken() {
						n++
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		taken = append(taken, n)
		d, _ := limitDecisions(hook.take())
		phaseDecisions = append(phaseDecisions, d)
	}
	if err := s.Flush(context.Background()); err != nil {
		errs++
	}
	out, _ := json.Marshal(map[string]any{"taken": taken, "errors": errs, "decisions": phaseDecisions})
	fmt.Printf("result %s\n", out)
	return 0
}

// runBucketsFleet runs n workers on job through its phases together and
// returns what each phase's reservations took, all workers together, and
// the round trips that carried a decision in each. between, when set, runs before
// each phase but the first, once the one before has ended.
func runBucketsFleet(t *testing.T, n int, job bucketsJob, between func(phase int)) (total, decisions []int) {
	t.Helper()
	spec, _ := json.Marshal(job)
	workers := startWorkers(t, n, bucketsWorkerEnv+"="+string(spec), "-test.run=^$", "-test.bench=^$")
	for i := range job.Phases {
		for _, w := range workers {
			w.next(t, "ready")
		}
		if i > 0 && between != nil {
			between(i)
		}
		sendAll(t, workers, "go")
	}
	total = make([]int, len(job.Phases))
	decisions = make([]int, len(job.Phases))
	for i, w := range workers {
		var res struct {
			Taken     []int
			Errors    int
			Decisions []int
		}
		if err := json.Unmarshal([]byte(w.next(t, "result ")), &res); err != nil {
			t.Fatal(err)
		}
		if res.Errors != 0 || len(res.Taken) != len(job.Phases) || len(res.Decisions) != len(job.Phases) {
			t.Fatalf("worker %d: %+v", i, res)
		}
		for k, n := range res.Taken {
			total[k] += n
		}
		for k, n := range res.Decisions {
			decisions[k] += n
		}
	}
	return total, decisions
}

// TestFleetProcessesShareBuckets runs 4 processes of 2 goroutines each,
// every one asking for far more requests than the limit, at one instant
// and then 30 s later, on buckets whose limit the test taught them once
// (100 requests a minute, 99 remaining): the fleet takes exactly 99, then
// exactly the 50 that 30 s refill. On one Redis and on a 3-master Cluster,
// whose keys of one Name share a slot.
func TestFleetProcessesShareBuckets(t *testing.T) {
	for _, cluster := range []bool{false, true} {
		t.Run(fmt.Sprintf("cluster=%v", cluster), func(t *testing.T) {
			var addrs []string
			if cluster {
				addrs = redistest.Addrs(redistest.StartCluster(t, 3))
			} else {
				addrs = []string{redistest.Start(t).Addr}
			}
			client := newClient(addrs, cluster, false)
			defer client.Close()
			const name, group = "procs", "claude-sonnet-4"
			now := base.Add(7 * time.Second)
			b := newBuckets(t, newStore(t, client, name), fleet.LimitSettings{Group: group, BatchShare: 0.8})
			ctx := context.Background()
			r, _, err := b.Reserve(ctx, now, fleet.RateAmounts{1, 10, 0}, fleet.Interactive, now, nil)
			if err != nil || !r.Taken() {
				t.Fatalf("first Reserve: %v, %v", r.Taken(), err)
			}
			obs := fleet.RateObservation{Has: [3]bool{true}, Limit: fleet.RateAmounts{100}, Remaining: fleet.RateAmounts{99}}
			mustNil(t, b.Observe(ctx, now, r, obs))
			mustNil(t, b.Settle(ctx, now, r, fleet.RateAmounts{1, 10, 0}, [3]bool{true, true, true}))

			got, _ := runBucketsFleet(t, 4, bucketsJob{
				Addrs: addrs, Cluster: cluster, Name: name, Group: group,
				Phases:     []int64{now.UnixNano(), now.Add(30 * time.Second).UnixNano()},
				Goroutines: 2, Tries: 60,
			}, nil)
			if got[0] != 99 || got[1] != 50 {
				t.Fatalf("the fleet took %v, want [99 50] (480 asked each time)", got)
			}
			if cluster {
				checkOneSlot(t, addrs, name, redisstore.BucketsKey(name, group))
			}
		})
	}
}

// checkOneSlot checks that the keys of name across the cluster are want,
// each once, all on the slot of its hash tag.
func checkOneSlot(t *testing.T, addrs []string, name string, want ...string) {
	t.Helper()
	ctx := context.Background()
	var found []string
	for _, a := range addrs {
		c := newClient1(t, a)
		keys, err := c.Keys(ctx, "damper:{"+name+"}:*").Result()
		if err != nil {
			t.Fatal(err)
		}
		tag, err := c.ClusterKeySlot(ctx, name).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			slot, err := c.ClusterKeySlot(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			if slot != tag {
				t.Errorf("key %s: slot %d, want %d", k, slot, tag)
			}
			if k != redisstore.MembersKey(name) { // there once a store has sent a record
				found = append(found, a+" "+k)
			}
		}
	}
	for _, w := range want {
		n := 0
		for _, f := range found {
			if strings.HasSuffix(f, " "+w) {
				n++
			}
		}
		if n != 1 {
			t.Errorf("key %s found %d times across the cluster: %q", w, n, found)
		}
	}
	if len(found) != len(want) {
		t.Errorf("keys of %q across the cluster: %q, want only %q", name, found, want)
	}
	nodes := map[string]bool{}
	for _, f := range found {
		nodes[strings.Fields(f)[0]] = true
	}
	if len(nodes) != 1 {
		t.Errorf("keys of %q on %d nodes: %q", name, len(nodes), found)
	}
}
