// Command proxycost measures what a proxy in front of the Messages API
// costs per request, side by side: calls straight to a fake API, through
// nginx as a plain reverse proxy (when nginx is installed), through a bare
// Go httputil.ReverseProxy, and through `damper proxy` with the zero and
// the recommended policy. Run it from the bench module:
//
//	cd bench && go run ./cmd/proxycost
//
// Every contender is a process of its own, as a sidecar is: the fake API
// and the bare proxy are this command started again in a role
// (proxycost -role api|bare), nginx is the system's, and damper is built
// from this checkout. The load is a closed loop of -clients goroutines in
// this process, with keep-alive connections, each reading every answer
// whole, plain calls and whole streams in turn. Each measurement is
// -requests calls after a warm-up; in each of -rounds rounds, each cell
// (call kind and client count) measures every contender in turn, in an
// order that rotates from round to round, so that all see the same
// machine. For each it
// reports the proxy process's CPU time per request (utime + stime from
// /proc, its children's included for nginx's workers), its RSS at the
// end, the throughput as a share of calling the API directly and of the
// bare proxy's, and the p50 and p99 a call gains over a direct one:
// medians over the rounds. The ratios are medians of each round's own
// ratio, the contenders of a round measured within seconds of each other:
// on a machine whose load changes, they hold where each one's figure
// moves.
//
// /proc counts CPU time in ticks of 10 ms, so a measurement's CPU per call
// is as exact as the ticks it spans are many: each of its two readings is
// off by up to one. The default run's 20,000 calls a measurement, at some
// 100 µs of a proxy's CPU a call, span about 200 ticks (within 1 %); a
// measurement that spans fewer than 100 makes more batches of -requests
// calls until it does, up to -batches (10; nginx, at some 25 µs a call,
// takes three). The tables say the fewest ticks any measurement spanned,
// and one still under 100 is flagged in the log. -quick's few calls are
// for a check that everything runs, not for figures.
//
// The figures are only as steady as the machine: run it on a machine
// otherwise idle (a load average well under 1 before it starts).
package main

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "proxycost:", err)
		os.Exit(2)
	}
	switch cfg.Role {
	case "api":
		os.Exit(serveRole(cfg.Listen, apiHandler()))
	case "bare":
		os.Exit(serveRole(cfg.Listen, bareProxy(cfg.Upstream)))
	}
	if err := run(cfg, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "proxycost:", err)
		os.Exit(1)
	}
}

// config is one run's settings.
type config struct {
	Requests int      // measured calls per contender, call kind and client count
	Warmup   int      // unmeasured calls before each measurement
	Rounds   int      // rounds, each contender once per round
	Batches  int      // at most this many batches of Requests a measurement, until minTicks
	Clients  []int    // client goroutines of each measurement
	Kinds    []string // "plain", "stream"
	Only     []string // the contenders to run (contenderKeys); none: all
	Nginx    string   // path of nginx; "" looks it up; "-" leaves nginx out
	Damper   string   // path of a damper binary; "" builds one from Repo
	Repo     string   // the checkout's root

	// A role: this command started again as one process of the run.
	Role     string
	Listen   string
	Upstream string
}

// contenderKeys name the contenders for -contenders.
var contenderKeys = []string{"direct", "nginx", "bare", "damper-zero", "damper-recommended"}

// runs reports whether cfg runs the contender named k.
func (cfg config) runs(k string) bool {
	return len(cfg.Only) == 0 || k == "direct" || slices.Contains(cfg.Only, k)
}

// quick is the -quick run: small, for a test.
var quick = config{Requests: 300, Warmup: 50, Rounds: 1, Batches: 1, Clients: []int{4}, Kinds: []string{"plain", "stream"}}

// Bounds on what the flags may ask.
const (
	maxRequests = 10_000_000
	maxRounds   = 100
	maxClients  = 1024
)

// parseFlags reads the command line; -quick gives the settings of a short
// run, which the other flags given after it override.
func parseFlags(args []string) (config, error) {
	fs := flag.NewFlagSet("proxycost", flag.ContinueOnError)
	requests := fs.Int("requests", 20_000, "measured calls per contender, call kind and client count")
	warmup := fs.Int("warmup", 1_000, "unmeasured calls before each measurement")
	rounds := fs.Int("rounds", 3, "rounds; the contenders' order rotates each round")
	batches := fs.Int("batches", 10, "at most this many batches of -requests calls a measurement, until the proxy has spent 100 ticks of CPU")
	clients := fs.String("clients", "8,32", "client goroutines of each measurement, comma-separated")
	kinds := fs.String("kinds", "plain,stream", "call kinds: plain, stream")
	only := fs.String("contenders", "", "the contenders to run, comma-separated, of "+strings.Join(contenderKeys, ", ")+" (direct always runs); default all")
	nginx := fs.String("nginx", "", `path of nginx ("" looks it up on the PATH and in /usr/sbin; "-" leaves it out)`)
	damper := fs.String("damper", "", `path of a damper binary ("" builds one from -repo)`)
	repo := fs.String("repo", "..", "the checkout's root, where ./cmd/damper is")
	role := fs.String("role", "", "internal: run as the fake API (api) or the bare proxy (bare)")
	listen := fs.String("listen", "", "internal: a role's address")
	upstream := fs.String("upstream", "", "internal: the bare proxy's upstream URL")
	q := fs.Bool("quick", false, "a short run: 300 calls, 1 round, 1 batch, 4 clients")
	if len(args) > 0 && args[0] == "-quick" {
		args = args[1:]
		*q = true
		*requests, *warmup, *rounds, *batches, *clients = quick.Requests, quick.Warmup, quick.Rounds, quick.Batches, "4"
	}
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("takes no arguments, got %q", fs.Args())
	}
	cfg := config{Requests: *requests, Warmup: *warmup, Rounds: *rounds, Batches: *batches, Nginx: *nginx, Damper: *damper, Repo: *repo,
		Role: *role, Listen: *listen, Upstream: *upstream}
	switch {
	case cfg.Role != "" && cfg.Role != "api" && cfg.Role != "bare":
		return cfg, fmt.Errorf("-role %q: want api or bare", cfg.Role)
	case cfg.Role != "" && cfg.Listen == "":
		return cfg, fmt.Errorf("-role %s needs -listen", cfg.Role)
	case cfg.Role == "bare" && cfg.Upstream == "":
		return cfg, fmt.Errorf("-role bare needs -upstream")
	case cfg.Requests < 1 || cfg.Requests > maxRequests:
		return cfg, fmt.Errorf("-requests %d: want 1 to %d", cfg.Requests, maxRequests)
	case cfg.Warmup < 0 || cfg.Warmup > maxRequests:
		return cfg, fmt.Errorf("-warmup %d: want 0 to %d", cfg.Warmup, maxRequests)
	case cfg.Rounds < 1 || cfg.Rounds > maxRounds:
		return cfg, fmt.Errorf("-rounds %d: want 1 to %d", cfg.Rounds, maxRounds)
	case cfg.Batches < 1 || cfg.Batches > maxBatches:
		return cfg, fmt.Errorf("-batches %d: want 1 to %d", cfg.Batches, maxBatches)
	}
	for _, f := range strings.Split(*clients, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > maxClients {
			return cfg, fmt.Errorf("-clients %q: want numbers from 1 to %d, comma-separated", *clients, maxClients)
		}
		cfg.Clients = append(cfg.Clients, n)
	}
	if *only != "" {
		for _, c := range strings.Split(*only, ",") {
			if c = strings.TrimSpace(c); !slices.Contains(contenderKeys, c) {
				return cfg, fmt.Errorf("-contenders %q: %q is none of %s", *only, c, strings.Join(contenderKeys, ", "))
			}
			cfg.Only = append(cfg.Only, c)
		}
	}
	for _, k := range strings.Split(*kinds, ",") {
		if k = strings.TrimSpace(k); k != "plain" && k != "stream" {
			return cfg, fmt.Errorf("-kinds %q: want plain, stream or both, comma-separated", *kinds)
		}
		cfg.Kinds = append(cfg.Kinds, k)
	}
	return cfg, nil
}
