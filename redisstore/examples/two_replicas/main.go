// Example two_replicas runs two replicas of a service, two OS processes,
// against one Redis: each builds its Damper with damper.WithStore on
// redisstore.New with the same Name, so the two share one retry budget,
// one retry throttle, one circuit breaker and one set of rate-limit
// buckets.
//
//	cd redisstore && go run ./examples/two_replicas
//
// It starts a redis-server of its own on a loopback port (redis-server
// must be on the PATH: on Debian or Ubuntu, apt-get install redis-server)
// and a fake Anthropic API in a full outage (every attempt 529), then:
//
//   - budget: both replicas send 20 calls each at once. Separate budgets
//     would allow 10 retries each; the shared budget allows 10 in all.
//   - breaker: replica a sends calls until the shared breaker opens; then
//     replica b sends 5 calls, and every one fails at once with
//     damper.ErrCircuitOpen, sending nothing: b's breaker heard a's
//     failures.
//
// It exits with status 1 if either does not happen. Both phases run in
// real time and take about a second.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/redis/go-redis/v9"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
	"github.com/damper-ai/damper-go/redisstore"
)

// minTokens is the retries each budget window starts with.
const minTokens = 10

// policy is every replica's Policy: the same on every process of a fleet.
// The backoff is short so that the example runs at once, and the budget's
// window long so that the run falls in one window.
func policy(phase string) damper.Policy {
	p := damper.Policy{
		BackoffBase:          time.Millisecond,
		BackoffMax:           5 * time.Millisecond,
		RetryBudgetWindow:    time.Hour,
		RetryBudgetMinTokens: minTokens,
	}
	if phase == "breaker" {
		p.MaxAttempts = 1
		p.Breaker = &damper.BreakerPolicy{MinAttempts: 8, OpenFor: time.Hour, MaxOpenFor: time.Hour}
	}
	return p
}

// result is what one replica reports to the parent, as JSON.
type result struct {
	Calls, Retries, CircuitOpen int
}

func main() {
	replica := flag.String("replica", "", "run as a replica with this name (set by the parent)")
	phase := flag.String("phase", "", "the phase a replica runs: budget or breaker")
	calls := flag.Int("calls", 0, "the calls a replica makes")
	redisAddr := flag.String("redis", "", "the Redis address a replica uses")
	api := flag.String("api", "", "the fake API's base URL a replica calls")
	name := flag.String("name", "", "the Damper's name in Redis")
	flag.Parse()
	if *replica != "" {
		r, err := runReplica(*phase, *calls, *redisAddr, *api, *name)
		if err != nil {
			log.Fatalf("replica %s: %v", *replica, err)
		}
		_ = json.NewEncoder(os.Stdout).Encode(r)
		return
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "two_replicas:", err)
		os.Exit(1)
	}
}

// runReplica is one replica: a Damper whose state lives in Redis, and an
// SDK client that makes calls calls.
func runReplica(phase string, calls int, redisAddr, api, name string) (result, error) {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true, MaxRetries: -1})
	defer rdb.Close()
	store, err := redisstore.New(rdb, redisstore.Options{Name: name})
	if err != nil {
		return result{}, err
	}
	d, err := damper.New(policy(phase), damper.WithName(name), damper.WithStore(store))
	if err != nil {
		return result{}, err
	}
	client := anthropic.NewClient(d.Option(), option.WithBaseURL(api), option.WithAPIKey("test-key"))
	params := anthropic.MessageNewParams{
		Model:     anthropic.ModelClaudeSonnet4_6,
		MaxTokens: 256,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Hello"))},
	}
	var r result
	for range calls {
		var rep damper.Report
		_, err := client.Messages.New(context.Background(), params, damper.ReportInto(&rep))
		r.Calls++
		r.Retries += max(rep.Attempts-1, 0)
		if errors.Is(err, damper.ErrCircuitOpen) {
			r.CircuitOpen++
		}
	}
	if s := store.Stats(); s.Failures > 0 {
		return r, fmt.Errorf("Redis failed %d operations: %+v", s.Failures, s)
	}
	return r, nil
}

func run() error {
	addr, stop, err := startRedis()
	if err != nil {
		return err
	}
	defer stop()
	api := dampertest.NewServer()
	defer api.Close()
	api.Script("", dampertest.Status(529))
	self, err := os.Executable()
	if err != nil {
		return err
	}
	replica := func(name, phase, store string, calls int) (result, error) {
		cmd := exec.Command(self, "-replica", name, "-phase", phase, "-calls", strconv.Itoa(calls),
			"-redis", addr, "-api", api.URL(), "-name", store)
		cmd.Stderr = os.Stderr
		out, err := cmd.Output()
		if err != nil {
			return result{}, fmt.Errorf("replica %s: %w", name, err)
		}
		var r result
		return r, json.Unmarshal(out, &r)
	}

	// Budget: two replicas at once, in one window of one shared budget.
	fmt.Println("budget: replicas a and b, 20 calls each at once, every attempt 529")
	start := time.Now()
	var wg sync.WaitGroup
	var results [2]result
	var errs [2]error
	for i, name := range []string{"a", "b"} {
		wg.Go(func() { results[i], errs[i] = replica(name, "budget", "two-replicas-budget", 20) })
	}
	wg.Wait()
	if err := errors.Join(errs[:]...); err != nil {
		return err
	}
	retries := results[0].Retries + results[1].Retries
	fmt.Printf("  retries: a %d + b %d = %d (two budgets of their own would allow %d)\n",
		results[0].Retries, results[1].Retries, retries, 2*minTokens)
	// Windows are aligned on whole hours since the Unix epoch: a run
	// across the turn of an hour has two windows' retries.
	windows := int(time.Now().Unix()/3600-start.Unix()/3600) + 1
	if retries != windows*minTokens {
		return fmt.Errorf("the replicas made %d retries; one shared budget allows %d in %d window(s)", retries, windows*minTokens, windows)
	}

	// Breaker: a opens the shared breaker; b finds it open.
	fmt.Println("breaker: replica a, 10 calls; then replica b, 5 calls")
	ra, err := replica("a", "breaker", "two-replicas-breaker", 10)
	if err != nil {
		return err
	}
	before := api.Count("")
	rb, err := replica("b", "breaker", "two-replicas-breaker", 5)
	if err != nil {
		return err
	}
	sent := api.Count("") - before
	fmt.Printf("  a: %d of %d calls refused by the open breaker\n", ra.CircuitOpen, ra.Calls)
	fmt.Printf("  b: %d of %d calls refused by the open breaker, %d attempts sent\n", rb.CircuitOpen, rb.Calls, sent)
	if rb.CircuitOpen != rb.Calls || sent != 0 {
		return fmt.Errorf("replica b sent %d attempts and had %d calls refused; the shared breaker, opened by a, refuses all %d", sent, rb.CircuitOpen, rb.Calls)
	}
	fmt.Println("ok: one budget and one breaker for the two replicas")
	return nil
}

// startRedis starts a redis-server on a free loopback port, keeping
// nothing on disk, and returns its address and how to stop it.
func startRedis() (addr string, stop func(), err error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return "", nil, fmt.Errorf("redis-server not found on the PATH (%w): on Debian or Ubuntu, apt-get install redis-server", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	addr = l.Addr().String()
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	dir, err := os.MkdirTemp("", "two-replicas-redis")
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command(bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir,
		"--logfile", filepath.Join(dir, "redis.log"))
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	stop = func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		os.RemoveAll(dir)
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if rdb.Ping(context.Background()).Err() == nil {
			return addr, stop, nil
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, fmt.Errorf("redis-server on %s did not answer PING within 5s", addr)
		}
	}
}
