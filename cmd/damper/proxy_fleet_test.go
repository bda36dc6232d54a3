package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/damper-ai/damper-go/dampertest"
	"github.com/damper-ai/damper-go/internal/redistest"
)

// nodeResult is one call of the TypeScript SDK, as client.mjs prints it.
type nodeResult struct {
	Case    string `json:"case"`
	OK      bool   `json:"ok"`
	Status  int    `json:"status"`
	Type    string `json:"type"`
	Error   string `json:"error"`
	Outcome string `json:"outcome"`
}

// tsCalls is what one node process, the TypeScript SDK, got from a proxy.
type tsCalls struct {
	proxy   string
	results []nodeResult
	err     error
	stderr  string
}

// tsRun is a node process to run: calls of scenario through proxy.
type tsRun struct {
	proxy    *proxyProcess
	scenario string
}

// runTSClients runs node processes at once, each making calls of its
// scenario one after another through its proxy with the official
// TypeScript SDK, and returns what each got, in order.
func runTSClients(t *testing.T, node string, calls int, runs ...tsRun) []tsCalls {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out := make([]tsCalls, len(runs))
	var wg sync.WaitGroup
	for i, run := range runs {
		p := run.proxy
		wg.Go(func() {
			args := append([]string{"client.mjs", p.url}, slices.Repeat([]string{run.scenario}, calls)...)
			cmd := exec.CommandContext(ctx, node, args...)
			cmd.Dir = filepath.Join("testdata", "tsclient")
			cmd.Env = append(os.Environ(), "ANTHROPIC_API_KEY="+testKey)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			stdout, err := cmd.Output()
			r := tsCalls{proxy: p.name, err: err, stderr: stderr.String()}
			for sc := bufio.NewScanner(bytes.NewReader(stdout)); sc.Scan(); {
				var res nodeResult
				if jerr := json.Unmarshal(sc.Bytes(), &res); jerr != nil {
					r.err = fmt.Errorf("%v: %s", jerr, sc.Bytes())
					break
				}
				r.results = append(r.results, res)
			}
			out[i] = r
		})
	}
	wg.Wait()
	for _, r := range out {
		if r.err != nil || len(r.results) != calls {
			t.Fatalf("node through proxy %s: %v, %d results of %d:\n%s", r.proxy, r.err, len(r.results), calls, r.stderr)
		}
		if strings.Contains(r.stderr, testKey) {
			t.Errorf("the key is in what node printed through proxy %s", r.proxy)
		}
	}
	return out
}

// TestProxyFleet runs fleets of three proxy processes, each with the
// official TypeScript SDK as its client, against a fake API in a full
// outage: with the store, one Redis, the fleet shares one retry budget
// and one breaker; without it, each process has its own budget.
func TestProxyFleet(t *testing.T) {
	node := needNode(t)
	needRedis(t)
	cloudEnv(t, false)
	rds := redistest.Start(t)
	api := dampertest.NewServer()
	t.Cleanup(api.Close)
	api.Script("outage-shared", dampertest.Status(529))
	api.Script("outage-local", dampertest.Status(529))
	api.Script("outage-breaker", dampertest.Status(500))

	config := func(store, policy string) string {
		c := "listen: 127.0.0.1:0\nupstream: " + api.URL() + "\nname: fleet\n"
		if store != "" {
			// A timeout a loaded machine keeps to: a fallback would grant more.
			c += fmt.Sprintf("store: {address: '%s', name: %s, timeout: 1s}\n", rds.Addr, store)
		}
		return c + "policy:\n" + policy
	}
	// Retries at once, from a budget of 10 a window and nothing earned: an
	// outage has no successes to earn with.
	const budgetPolicy = "  max_attempts: 3\n  backoff_base: 0\n  retry_budget_min_tokens: 10\n  retry_budget_window: 1h\n"
	const window = time.Hour
	var shared, local []*proxyProcess
	for _, n := range []string{"a", "b", "c"} {
		shared = append(shared, startProxyProcess(t, "shared-"+n, config("fleet-budget", budgetPolicy)))
		local = append(local, startProxyProcess(t, "local-"+n, config("", budgetPolicy)))
	}

	t.Run("budget", func(t *testing.T) {
		const perClient = 10
		var runs []tsRun
		for i := range shared {
			runs = append(runs, tsRun{shared[i], "outage-shared"}, tsRun{local[i], "outage-local"})
		}
		start := time.Now()
		got := runTSClients(t, node, perClient, runs...)
		end := time.Now()
		for _, r := range got {
			for _, res := range r.results {
				if res.OK || res.Status != 529 || res.Type != "overloaded_error" {
					t.Errorf("through proxy %s: %+v, want the provider's 529 overloaded_error", r.proxy, res)
				}
			}
		}
		// Each window the run touches starts with 10 units for the fleet (or
		// for each process, without the store).
		windows := int(end.UnixNano()/int64(window) - start.UnixNano()/int64(window) + 1)
		calls := perClient * len(shared)
		sharedAttempts, localAttempts := api.Count("outage-shared"), api.Count("outage-local")
		t.Logf("%d calls in %v over %d budget window(s): %d upstream attempts with the store, %d without",
			calls, end.Sub(start).Round(time.Millisecond), windows, sharedAttempts, localAttempts)
		if windows == 1 {
			if sharedAttempts != calls+10 {
				t.Errorf("with the store, the fleet made %d upstream attempts, want %d calls + 10 retries of the one budget", sharedAttempts, calls)
			}
			if localAttempts != calls+30 {
				t.Errorf("without the store, the fleet made %d upstream attempts, want %d calls + 3 × 10 retries", localAttempts, calls)
			}
		} else if sharedAttempts < calls+10 || sharedAttempts > calls+10*windows || localAttempts > calls+30*windows {
			t.Errorf("over %d windows: %d upstream attempts with the store (want %d to %d), %d without (at most %d)",
				windows, sharedAttempts, calls+10, calls+10*windows, localAttempts, calls+30*windows)
		}
	})

	t.Run("breaker", func(t *testing.T) {
		const breakerPolicy = "  max_attempts: 1\n  breaker: {min_attempts: 3, open_for: 1m}\n"
		var fleet []*proxyProcess
		for _, n := range []string{"a", "b", "c"} {
			fleet = append(fleet, startProxyProcess(t, "breaker-"+n, config("fleet-breaker", breakerPolicy)))
		}
		// Through A alone until its breaker opens: three failures.
		a := runTSClients(t, node, 5, tsRun{fleet[0], "outage-breaker"})[0]
		for i, res := range a.results {
			want := nodeResult{Case: "outage-breaker", Status: 500, Type: "api_error", Error: "InternalServerError", Outcome: "attempts_exhausted"}
			if i >= 3 {
				want = nodeResult{Case: "outage-breaker", Status: 529, Type: "overloaded_error", Error: "OverloadedError", Outcome: "circuit_open"}
			}
			if res != want {
				t.Errorf("call %d through A: %+v, want %+v", i+1, res, want)
			}
		}
		if n := api.Count("outage-breaker"); n != 3 {
			t.Fatalf("the fake API got %d requests through A, want 3: the breaker opens at its third failure", n)
		}
		for _, r := range runTSClients(t, node, 3, tsRun{fleet[1], "outage-breaker"}, tsRun{fleet[2], "outage-breaker"}) {
			for i, res := range r.results {
				if res.OK || res.Status != 529 || res.Type != "overloaded_error" || res.Outcome != "circuit_open" {
					t.Errorf("call %d through %s: %+v, want 529 overloaded_error, circuit_open: A's failures opened the fleet's breaker", i+1, r.proxy, res)
				}
			}
		}
		if n := api.Count("outage-breaker"); n != 3 {
			t.Errorf("the fake API got %d requests, want still 3: B and C sent nothing", n)
		}
	})
}
