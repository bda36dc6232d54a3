package redisstore_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/redistest"
	"github.com/damper-ai/damper-go/redisstore"
	"github.com/redis/go-redis/v9"
)

// A breaker fleet is this test binary started again with -test.run on
// TestBreakerFleetWorker and brkWorkerEnv holding the job as JSON. At each
// step the worker says "brk-ready" on stdout and waits for "go <t>" on
// stdin, t the virtual time in Unix nanoseconds to move its clock to; it
// then makes its calls. "end" on stdin ends it, after it prints
// "brk-result <json>".
const brkWorkerEnv = "REDISSTORE_TEST_BREAKER_WORKER"

type brkJob struct {
	RedisAddr string // empty: MemoryStore, each process on its own
	API       string // the fake API's base URL
	Name      string
	Start     int64 // the virtual clock's start, Unix nanoseconds
	First     int   // calls made one after another at the first step
	Calls     int   // calls made at once at every later step
}

type brkResult struct {
	Sent, Refused, Failed int // calls that reached the API, refused by the breaker, that failed otherwise
}

// TestBreakerFleetWorker is a worker of the breaker fleet; without its
// job it does nothing.
func TestBreakerFleetWorker(t *testing.T) {
	spec := os.Getenv(brkWorkerEnv)
	if spec == "" {
		t.Skip("a worker of TestBreakerFleetProbes")
	}
	var job brkJob
	mustNil(t, json.Unmarshal([]byte(spec), &job))
	clk := dampertest.NewClock(time.Unix(0, job.Start))
	var store fleet.Store = fleet.MemoryStore{}
	if job.RedisAddr != "" {
		client := redis.NewClient(&redis.Options{Addr: job.RedisAddr})
		defer client.Close()
		store = thrStore(t, client, redisstore.Options{Name: job.Name, Timeout: 10 * time.Second})
	}
	d, err := damper.New(damper.Policy{
		MaxAttempts: 1,
		Breaker:     &damper.BreakerPolicy{MinAttempts: 4, OpenFor: 10 * time.Second, MaxOpenFor: 40 * time.Second},
		Throttle:    &damper.ThrottlePolicy{},
	}, damper.WithStore(store), damper.WithClock(clk), damper.WithName(job.Name))
	mustNil(t, err)
	client := anthropic.NewClient(option.WithBaseURL(job.API), option.WithAPIKey("test-key"), d.Option(), option.WithMaxRetries(0))
	params := anthropic.MessageNewParams{
		Model: dampertest.DefaultModel, MaxTokens: 16,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))},
	}
	var (
		mu  sync.Mutex
		res brkResult
	)
	call := func() {
		_, err := client.Messages.New(context.Background(), params)
		mu.Lock()
		defer mu.Unlock()
		var apiErr *anthropic.Error
		switch {
		case errors.Is(err, damper.ErrCircuitOpen):
			res.Refused++
		case errors.As(err, &apiErr):
			res.Sent++
		default:
			res.Failed++
		}
	}
	in := bufio.NewReader(os.Stdin)
	for step := 0; ; step++ {
		fmt.Println("brk-ready")
		line, err := in.ReadString('\n')
		mustNil(t, err)
		line = strings.TrimSpace(line)
		if line == "end" {
			break
		}
		at, err := strconv.ParseInt(strings.TrimPrefix(line, "go "), 10, 64)
		mustNil(t, err)
		clk.Advance(time.Unix(0, at).Sub(clk.Now()))
		if step == 0 {
			for range job.First {
				call()
			}
			continue
		}
		var wg sync.WaitGroup
		for range job.Calls {
			wg.Go(call)
		}
		wg.Wait()
	}
	out, _ := json.Marshal(res)
	fmt.Printf("brk-result %s\n", out)
}

// brkFleet runs n breaker workers on job against api: the first step at
// the clock's start, then one every step for steps more, and returns the
// requests the API received at each step and the workers' results.
func brkFleet(t *testing.T, n int, job brkJob, api *dampertest.Server, steps int, step time.Duration) ([]int, []brkResult) {
	t.Helper()
	spec, err := json.Marshal(job)
	mustNil(t, err)
	workers := startWorkers(t, n, brkWorkerEnv+"="+string(spec), "-test.run=^TestBreakerFleetWorker$", "-test.count=1")
	start := time.Unix(0, job.Start)
	perStep := make([]int, 0, steps+1)
	for _, w := range workers {
		w.next(t, "brk-ready")
	}
	for k := 0; k <= steps; k++ {
		before := api.Count("")
		sendAll(t, workers, "go "+strconv.FormatInt(start.Add(time.Duration(k)*step).UnixNano(), 10))
		for _, w := range workers { // each has made its calls
			w.next(t, "brk-ready")
		}
		perStep = append(perStep, api.Count("")-before)
	}
	sendAll(t, workers, "end")
	results := make([]brkResult, n)
	for i, w := range workers {
		mustNil(t, json.Unmarshal([]byte(w.next(t, "brk-result ")), &results[i]))
		w.wait(t)
	}
	return perStep, results
}

// TestBreakerFleetProbes: four processes in a full outage of the API (every
// answer a 529), their clocks moved together in steps of 5 s for a minute.
// Sharing the breaker in Redis, the fleet opens it once, and the API sees
// one probe per open period from the whole fleet (open periods of 10 s,
// then 20 s, then 40 s: probes at +10 s and +30 s); with MemoryStore, each
// process opens its own and probes on its own: four per period.
func TestBreakerFleetProbes(t *testing.T) {
	if os.Getenv(brkWorkerEnv) != "" {
		t.Skip("in a worker")
	}
	rds := redistest.Start(t)
	const workers, steps, step = 4, 12, 5 * time.Second
	start := time.Now().Truncate(time.Minute).Add(time.Minute).UnixNano()
	for _, shared := range []bool{true, false} {
		t.Run(map[bool]string{true: "Redis", false: "MemoryStore"}[shared], func(t *testing.T) {
			api := dampertest.NewServer()
			t.Cleanup(api.Close)
			api.Script("", dampertest.Status(529))
			job := brkJob{API: api.URL(), Name: "brk-fleet", Start: start, First: 4, Calls: 3}
			if shared {
				job.RedisAddr = rds.Addr
			}
			perStep, results := brkFleet(t, workers, job, api, steps, step)
			var total brkResult
			for _, r := range results {
				total.Sent += r.Sent
				total.Refused += r.Refused
				total.Failed += r.Failed
			}
			probes := 0
			for _, n := range perStep[1:] {
				probes += n
			}
			t.Logf("requests per step: %v; sent %d, refused %d, failed %d", perStep, total.Sent, total.Refused, total.Failed)
			if total.Failed != 0 {
				t.Fatalf("%d calls failed otherwise than by a 529 or the breaker", total.Failed)
			}
			if shared {
				if perStep[0] < 4 || perStep[0] > workers*4 {
					t.Fatalf("%d requests before the fleet's breaker opened", perStep[0])
				}
				want := make([]int, steps)
				want[1], want[5] = 1, 1 // +10 s and +30 s
				if fmt.Sprint(perStep[1:]) != fmt.Sprint(want) {
					t.Fatalf("requests per step after the opening %v, want one probe per open period: %v", perStep[1:], want)
				}
				return
			}
			if perStep[0] != workers*4 || probes != 2*workers {
				t.Fatalf("MemoryStore: %d requests at first and %d probes, want %d and %d (one per process and period)", perStep[0], probes, workers*4, 2*workers)
			}
		})
	}
}
