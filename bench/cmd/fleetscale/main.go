// Command fleetscale measures what one redis-server sustains for a fleet:
// the calls per second through Damper with every part a store keeps (retry
// budget, throttle, breaker, rate limiter) in Redis, for fleets of 1, 2, 4
// and 8 client processes sharing one store Name on one redis-server that it
// starts itself. Run it from the bench module (redis-server must be on the
// PATH; about 11 s per row by default):
//
//	cd bench && go run ./cmd/fleetscale
//
// Each client process is this command started again as a worker. It runs
// -concurrency goroutines making plain calls in a closed loop, through the
// SDK with d.Option(), against an in-process fake API that costs next to
// nothing, so that Redis and the clients are the bottleneck. Each row has
// two phases of -duration, at the same processes and concurrency: one
// through a Damper whose parts are in Redis, then one through a Damper
// whose parts are in memory, paced at the rate the first phase reached (a
// free closed loop in memory would fill the cores, and its tail would be
// the scheduler's). The command prints a Markdown table: the calls per
// second through Redis; Redis's CPU time per call (INFO cpu, system and
// user, before and after the phase); the commands the clients sent per
// call (INFO commandstats) and the round trips per call (a go-redis hook
// in each worker); how busy Redis's core was; and the p50 and p99 latency
// a call gains from the store, the phase in Redis less the phase in
// memory. A second table gives the calls per second one Redis core would
// serve at that CPU per call, the clients' CPU per call, and the latencies
// the differences come from.
//
// With -cluster each row is measured again on a Redis Cluster of three
// masters (no replicas) that the command starts too, the row's processes
// split over three store Names whose keys land one on each master, through
// a go-redis ClusterClient; the report then has the same tables for one
// Redis and for the cluster. Every go-redis client has MaxRetries -1, as
// redisstore asks: the store's own fallback is the one retry layer.
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

func main() {
	if spec := os.Getenv(workerEnv); spec != "" {
		os.Exit(runWorker(spec, os.Stdin, os.Stdout))
	}
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleetscale:", err)
		os.Exit(2)
	}
	if _, err := run(cfg, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "fleetscale:", err)
		os.Exit(1)
	}
}

// config is one run's settings.
type config struct {
	Procs        []int         // client processes of each row
	Concurrency  int           // goroutines per process
	Duration     time.Duration // measured time of each phase
	Warmup       time.Duration // unmeasured calls before each phase
	StoreTimeout time.Duration // redisstore.Options.Timeout
	RedisServer  string        // path of redis-server; "" looks it up on the PATH
	Cluster      bool          // also measure each row on a Redis Cluster
}

// quick is the -quick run: two small rows, for a test.
var quick = config{
	Procs:        []int{1, 2},
	Concurrency:  4,
	Duration:     time.Second,
	Warmup:       200 * time.Millisecond,
	StoreTimeout: time.Second,
}

// parseFlags reads the command line; -quick gives the defaults of a short
// run, which the other flags given after it override.
func parseFlags(args []string) (config, error) {
	fs := flag.NewFlagSet("fleetscale", flag.ContinueOnError)
	procs := fs.String("procs", "1,2,4,8", "client processes of each row, comma-separated")
	conc := fs.Int("concurrency", 8, "goroutines making calls in each client process")
	dur := fs.Duration("duration", 5*time.Second, "measured time of each phase (parts in memory, parts in Redis)")
	warm := fs.Duration("warmup", 500*time.Millisecond, "unmeasured calls before each phase")
	timeout := fs.Duration("store-timeout", time.Second, "redisstore.Options.Timeout: generous, so that a loaded Redis is waited for, not left for the fallback")
	server := fs.String("redis-server", "", "path of redis-server (default: found on the PATH)")
	cluster := fs.Bool("cluster", false, "also measure each row on a Redis Cluster of 3 masters that the command starts, the processes split over 3 store Names, one on each master")
	q := fs.Bool("quick", false, "a short run: 1 and 2 processes of 4 goroutines, 1 s phases")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var cfg config
	if *q {
		cfg = quick
	} else {
		cfg = config{Concurrency: *conc, Duration: *dur, Warmup: *warm, StoreTimeout: *timeout}
	}
	if !*q || set["procs"] {
		p, err := parseProcs(*procs)
		if err != nil {
			return config{}, err
		}
		cfg.Procs = p
	}
	if set["concurrency"] {
		cfg.Concurrency = *conc
	}
	if set["duration"] {
		cfg.Duration = *dur
	}
	if set["warmup"] {
		cfg.Warmup = *warm
	}
	if set["store-timeout"] {
		cfg.StoreTimeout = *timeout
	}
	cfg.RedisServer = *server
	cfg.Cluster = *cluster
	return cfg, cfg.validate()
}

// maxProcs bounds -procs: a fleet on one machine.
const maxProcs = 64

func parseProcs(s string) ([]int, error) {
	var procs []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > maxProcs {
			return nil, fmt.Errorf("-procs %q: %q is not a number of processes from 1 to %d", s, f, maxProcs)
		}
		procs = append(procs, n)
	}
	return procs, nil
}

func (c config) validate() error {
	switch {
	case len(c.Procs) == 0:
		return fmt.Errorf("-procs is empty; want a number of processes for each row, such as 1,2,4,8")
	case c.Concurrency < 1 || c.Concurrency > 4096:
		return fmt.Errorf("-concurrency is %d; want 1 to 4096", c.Concurrency)
	case c.Duration <= 0:
		return fmt.Errorf("-duration is %v; want more than 0", c.Duration)
	case c.Warmup < 0:
		return fmt.Errorf("-warmup is %v; want 0 or more", c.Warmup)
	case c.StoreTimeout <= 0:
		return fmt.Errorf("-store-timeout is %v; want more than 0", c.StoreTimeout)
	}
	return nil
}
