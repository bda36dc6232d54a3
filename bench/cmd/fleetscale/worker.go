package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/redis/go-redis/v9"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
	"github.com/damper-ai/damper-go/redisstore"
)

// workerEnv, when set, makes the process a client of the fleet: its value
// is the job, as JSON. The parent sends it phases on stdin, one JSON line
// each, and reads one JSON line of results per phase on stdout, after a
// first line saying it is ready.
const workerEnv = "DAMPER_FLEETSCALE_WORKER"

// job is what a worker is started with.
type job struct {
	Redis        []string      // address of the redis-server, or of the cluster's masters
	Cluster      bool          // Redis is a Redis Cluster
	Name         string        // the store's Name: one for a row on one Redis, one of a few on a cluster
	Concurrency  int           // goroutines making calls
	StoreTimeout time.Duration // redisstore.Options.Timeout
}

// phase is one order to a worker: make calls for Duration through the
// Damper whose parts are in Redis (Store) or in memory, at most Rate a
// second if Rate is above 0, and send back each call's latency if Record.
type phase struct {
	Store    bool
	Duration time.Duration
	Rate     float64
	Record   bool
}

// result is a worker's answer: Ready alone first, then one per phase.
type result struct {
	Ready      bool    `json:",omitempty"`
	Calls      int     // calls that ended in the phase
	Errors     int     // of which failed
	FirstError string  `json:",omitempty"`
	Elapsed    int64   // ns from the phase's start to its last call's end
	Latencies  []int64 `json:",omitempty"` // ns, each call's, if recorded
	RoundTrips int64   // commands and pipelines sent to Redis
	Failures   uint64  // store operations Redis failed or did not answer in time
	Unasked    uint64  // store operations decided without asking Redis
	Limited    int     // calls the fake API refused with a 429
	CPU        float64 // s of CPU the process used in the phase, user and system
}

// policy configures every part a store keeps: the retry budget, the
// throttle, the breaker and the rate limiter, at their defaults.
func policy() damper.Policy {
	return damper.Policy{
		Breaker:     &damper.BreakerPolicy{},
		Throttle:    &damper.ThrottlePolicy{},
		RateLimit:   &damper.RateLimitPolicy{},
		BackoffBase: damper.None,
	}
}

// apiLimits are the fake API's rate limits: one that no run comes near
// (each process has a fake API of its own, so this is per process), so
// that the API sends rate-limit headers for the limiter to learn from.
var apiLimits = dampertest.RateLimits{RequestsPerMinute: 1_000_000}

// roundTrips counts what a go-redis client sends: each command outside a
// pipeline, and each pipeline, is one round trip.
type roundTrips struct{ n atomic.Int64 }

func (h *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}
func (h *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmds)
	}
}

// runWorker runs a worker with the job spec, reading phases from in and
// writing results to out, and returns the process's exit code.
func runWorker(spec string, in io.Reader, out io.Writer) int {
	if err := work(spec, in, out); err != nil {
		fmt.Fprintln(os.Stderr, "fleetscale worker:", err)
		return 1
	}
	return 0
}

func work(spec string, in io.Reader, out io.Writer) error {
	var j job
	if err := json.Unmarshal([]byte(spec), &j); err != nil {
		return fmt.Errorf("bad job %q: %w", spec, err)
	}
	hook := &roundTrips{}
	// Retries off, as redisstore's documentation asks: a pipeline go-redis
	// sent again after a cut reply would apply its records twice.
	var rdb redis.UniversalClient
	if j.Cluster {
		rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: j.Redis, ContextTimeoutEnabled: true, MaxRetries: -1})
	} else if len(j.Redis) == 1 {
		rdb = redis.NewClient(&redis.Options{Addr: j.Redis[0], ContextTimeoutEnabled: true, MaxRetries: -1})
	} else {
		return fmt.Errorf("bad job %q: %d addresses for one Redis", spec, len(j.Redis))
	}
	rdb.AddHook(hook)
	defer rdb.Close()
	store, err := redisstore.New(rdb, redisstore.Options{Name: j.Name, Timeout: j.StoreTimeout})
	if err != nil {
		return err
	}
	inMemory, err := damper.New(policy(), damper.WithName(j.Name))
	if err != nil {
		return err
	}
	inRedis, err := damper.New(policy(), damper.WithName(j.Name), damper.WithStore(store))
	if err != nil {
		return err
	}
	enc := json.NewEncoder(out)
	if err := enc.Encode(result{Ready: true}); err != nil {
		return err
	}
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		var p phase
		if err := json.Unmarshal(sc.Bytes(), &p); err != nil {
			return fmt.Errorf("bad phase %q: %w", sc.Text(), err)
		}
		d := inMemory
		if p.Store {
			d = inRedis
		}
		trips, stats, cpu := hook.n.Load(), store.Stats(), cpuTime()
		r := calls(d, p, j.Concurrency)
		after := store.Stats()
		r.CPU = cpuTime() - cpu
		r.RoundTrips = hook.n.Load() - trips
		r.Failures = after.Failures - stats.Failures
		r.Unasked = after.Unasked - stats.Unasked
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return sc.Err()
}

// cpuTime is the CPU time the process has used, user and system, in
// seconds; 0 where getrusage fails.
func cpuTime() float64 {
	var u syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &u); err != nil {
		return 0
	}
	return time.Duration(u.Utime.Nano() + u.Stime.Nano()).Seconds()
}

// calls makes plain calls through d from n goroutines in a closed loop for
// the phase's duration, against a fake API of the phase's own (its request
// log grows with every call). With a Rate, the k-th call starts no earlier
// than k/Rate after the phase's start.
func calls(d *damper.Damper, p phase, n int) result {
	api := dampertest.NewServer(dampertest.InMemory(), dampertest.WithRateLimits(apiLimits))
	defer api.Close()
	client := anthropic.NewClient(append([]option.RequestOption{d.Option()}, api.Options()...)...)
	params := anthropic.MessageNewParams{Model: "claude-sonnet-4-6", MaxTokens: 100,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}}
	ctx := context.Background()

	var mu sync.Mutex
	var r result
	start := time.Now()
	deadline := start.Add(p.Duration)
	var next atomic.Int64 // the calls started, for the pace
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			var own result
			for time.Now().Before(deadline) {
				if p.Rate > 0 {
					slot := start.Add(time.Duration(float64(next.Add(1)-1) / p.Rate * 1e9))
					if slot.After(deadline) {
						break
					}
					time.Sleep(time.Until(slot))
				}
				t := time.Now()
				_, err := client.Messages.New(ctx, params)
				took := time.Since(t)
				own.Calls++
				if err != nil {
					own.Errors++
					if own.FirstError == "" {
						own.FirstError = err.Error()
					}
				}
				if p.Record {
					own.Latencies = append(own.Latencies, int64(took))
				}
			}
			mu.Lock()
			defer mu.Unlock()
			r.Calls += own.Calls
			r.Errors += own.Errors
			if r.FirstError == "" {
				r.FirstError = own.FirstError
			}
			r.Latencies = append(r.Latencies, own.Latencies...)
		})
	}
	wg.Wait()
	r.Elapsed = int64(time.Since(start))
	r.Limited = api.RateLimitStats().Limited
	return r
}
