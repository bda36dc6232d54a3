package damper_test

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// The chaos soak drives thousands of logical requests, plain and streaming,
// from many goroutines through several Dampers, against a server that fails
// each attempt in a randomly drawn way, and checks after every call and at
// the end the invariants of docs/RELIABILITY.md.
//
// The in-memory half (soak_memory_test.go) runs in a synctest bubble on
// dampertest.Transport: the bubble's clock is the Damper's, the server's and
// the caller's deadlines', so stalls, slow headers, backoffs and timeouts
// cost no real time and every duration is exact. The loopback half
// (soak_loopback_test.go) runs fewer requests over real sockets. Both serve
// the plans of soak_plan_test.go from dampertest.Server and check them with
// soak_check_test.go; this file makes the calls.
//
// go test -run Soak -soak.long (or DAMPER_SOAK=long) runs the long form;
// -soak.seed=N replays a draw.
var (
	soakLong = flag.Bool("soak.long", false, "run the long chaos soak (at least 100,000 logical requests)")
	soakSeed = flag.Uint64("soak.seed", 0, "seed of the chaos soak's draw; 0 picks one from the time")
)

func soakIsLong() bool { return *soakLong || os.Getenv("DAMPER_SOAK") == "long" }

func soakSeedFor(t *testing.T) uint64 {
	seed := *soakSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("chaos soak seed %d: rerun with -soak.seed=%d", seed, seed)
		}
	})
	return seed
}

// Secrets the soak's clients send; no output may contain them.
const (
	soakAPIKey    = "sk-ant-api03-SOAKSECRETKEY-7f3a9c1e5b2d4f6a8c0e"
	soakAuthToken = "soak-auth-token-SECRETBEARER-0b1c2d3e4f5a6b7c"
)

// soakResult is what one logical request left behind, for the end checks.
type soakResult struct {
	start   time.Time
	report  damper.Report
	err     error
	elapsed time.Duration
}

// soakCall makes p's call and returns what the caller got.
func soakCall(client anthropic.Client, p reqPlan) (soakResult, []anthropic.MessageStreamEventUnion, *anthropic.Message) {
	ctx, cancel := context.WithTimeout(context.Background(), p.deadline)
	defer cancel()
	if p.cancelAt > 0 {
		stop := time.AfterFunc(p.cancelAt, cancel)
		defer stop.Stop()
	}
	params := anthropic.MessageNewParams{
		Model:     anthropic.Model(p.model),
		MaxTokens: 256,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Explain retry storms"))},
	}
	res := soakResult{start: time.Now()}
	opts := []option.RequestOption{dampertest.Scenario(strconv.Itoa(p.id)), damper.ReportInto(&res.report)}
	if p.sdkLimit > 0 {
		opts = append(opts, option.WithRequestTimeout(p.sdkLimit))
	}
	var evs []anthropic.MessageStreamEventUnion
	var msg *anthropic.Message
	if p.stream {
		evs, res.err = drain(client.Messages.NewStreaming(ctx, params, opts...))
	} else {
		msg, res.err = client.Messages.New(ctx, params, opts...)
	}
	res.elapsed = time.Since(res.start)
	return res, evs, msg
}

// soakClients builds, for each profile, a Damper with the soak's telemetry
// and jitter drawn from src, and two clients through it: one with an API
// key and one with an auth token (the SDK takes one credential per client).
func soakClients(t *testing.T, profiles []soakProfile, tel *soakTelemetry, src rand.Source, opts ...option.RequestOption) [][2]anthropic.Client {
	t.Helper()
	var mu sync.Mutex
	jitter := rand.New(src)
	random := func() float64 {
		mu.Lock()
		defer mu.Unlock()
		return jitter.Float64()
	}
	clients := make([][2]anthropic.Client, len(profiles))
	for i, pr := range profiles {
		d, err := damper.New(pr.policy, append(tel.settings(), damper.WithRand(random))...)
		if err != nil {
			t.Fatal(err)
		}
		for k, cred := range []option.RequestOption{option.WithAPIKey(soakAPIKey), option.WithAuthToken(soakAuthToken)} {
			clients[i][k] = anthropic.NewClient(append([]option.RequestOption{d.Option(), cred}, opts...)...)
		}
	}
	return clients
}

// runSoak makes every planned call from workers goroutines, each through
// its Damper's clients, checks each as it ends (received(i) is what the
// server got of call i; lossy as checkCall takes it), and
// returns the results and how each report stands to its caller's result.
func runSoak(ck *checker, tel *soakTelemetry, workers int, plans []reqPlan, profiles []soakProfile, clients [][2]anthropic.Client,
	received func(int) served, lossy bool) ([]soakResult, []callEnd) {
	results := make([]soakResult, len(plans))
	ends := make([]callEnd, len(plans))
	next := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range next {
				p := plans[i]
				pr := profiles[p.damper]
				res, evs, msg := soakCall(clients[p.damper][i%2], p)
				results[i] = res
				ends[i] = checkCall(ck, p, cmpOr(pr.policy.MaxAttempts, defaults.MaxAttempts), res, received(i), evs, msg, lossy)
				tel.check(ck, fmt.Sprintf("request %d", i), res)
			}
		})
	}
	for i := range plans {
		next <- i
		if i%2000 == 1999 {
			tel.flush(ck) // keeps memory flat over the long form
		}
	}
	close(next)
	wg.Wait()
	return results, ends
}
