package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"time"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/cmd/damper/internal/outage"
	"github.com/damper-ai/damper-go/conf"
)

// defaultMaxAmplification is the demo's pass/fail line, as in the Python
// Damper's demo.
const defaultMaxAmplification = 1.10

// demoFlags are the demo's settings, as parsed from the command line.
type demoFlags struct {
	cfg              outage.Config
	maxAmplification float64
	json             bool
	svg              string
}

func parseDemo(args []string, stdout, stderr io.Writer) (demoFlags, error) {
	def := outage.DefaultConfig()
	var pol damper.Policy // the defaults, from the Policy's declaration
	if err := conf.Fill(&pol); err != nil {
		return demoFlags{}, err
	}
	var f demoFlags
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.IntVar(&f.cfg.Requests, "requests", def.Requests, "logical requests to make")
	fs.IntVar(&f.cfg.Failures, "failures", def.Failures, "attempts of each request that fail (529 overloaded) before one succeeds")
	fs.IntVar(&f.cfg.Concurrency, "concurrency", def.Concurrency,
		"requests in flight at once. At 1 the run is exact and repeatable. Above 1 Damper still spends\n"+
			"exactly its window's units (1,010 attempts by default), but which requests get them depends on\n"+
			"scheduling: ten requests may each get one retry and then be refused, so the budget-exhausted\n"+
			"count can rise from 995 up to 1,000 and the successes fall to 0")
	fs.Uint64Var(&f.cfg.Seed, "seed", def.Seed, "seed of the backoff jitter")
	maxAttempts := fs.Int("max-attempts", pol.MaxAttempts, "attempts per logical request, the first included, for both strategies")
	ratio := fs.Float64("budget-ratio", pol.RetryBudgetRatio, "retry budget units added per successful first attempt")
	minTokens := fs.Int("budget-min", pol.RetryBudgetMinTokens, "retry budget units each window starts with")
	window := fs.Duration("budget-window", pol.RetryBudgetWindow, "length of the retry budget's fixed window")
	fs.Float64Var(&f.maxAmplification, "max-amplification", defaultMaxAmplification, "exit with status 1 when Damper's attempts per logical request exceed this")
	fs.BoolVar(&f.json, "json", false, "print the result as JSON")
	fs.StringVar(&f.svg, "svg", "", "also write a chart of provider attempts over virtual time to this `file`")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: damper demo [flags]

The outage demo. Every logical request fails with 529 overloaded a set
number of times before it succeeds. The same requests go, through the
official Go SDK, to a fake Messages API served in memory, three times:

  naive           a plain loop of up to --max-attempts SDK calls per request,
                  with the SDK's own retries off and full-jitter backoff
  damper          one SDK call per request, retries owned by Damper
  damper+breaker  the same Damper policy with a circuit breaker and a retry
                  throttle added, each with its defaults

Backoffs sleep on a virtual clock, so the run takes about a second of real
time and nothing touches the network. With the defaults the result is exact:
naive 3,000 attempts (3.00x); Damper 1,010 attempts (1.01x) and 995
budget-exhausted events, because each budget window starts with 10 units and
grows only with first attempts that succeed, which an outage has none of.
With the breaker and throttle, 20 attempts: the throttle stops retrying once
failures have taken half its tokens, and the breaker opens at the 20th
attempt, after which nothing is sent.

The command exits with status 1 when Damper's amplification (the second
run) is above --max-amplification, 2 on a bad flag.

Flags:
`)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, stdout, stderr); err != nil {
		return f, err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return f, fmt.Errorf("demo takes no arguments, got %q", fs.Args())
	}
	if err := checkDemoFlags(f, *maxAttempts, *ratio, *minTokens, *window); err != nil {
		return f, err
	}
	f.cfg.Policy = damper.Policy{
		MaxAttempts:          *maxAttempts,
		RetryBudgetRatio:     *ratio,
		RetryBudgetMinTokens: *minTokens,
		RetryBudgetWindow:    *window,
	}
	// checkDemoFlags refuses every value that Validate would; this is a
	// backstop, whose message names a Config field, not a flag.
	if err := f.cfg.Validate(); err != nil {
		return f, err
	}
	return f, nil
}

// The largest --requests and --concurrency.
const (
	maxDemoRequests    = 1_000_000
	maxDemoConcurrency = 1_000
)

// checkDemoFlags returns an error naming the first flag whose value the
// demo cannot use, in the form "--flag value: what it must be". Policy
// reads 0 as "the default", so 0 on the command line would silently mean
// something else: it is refused too. A ratio or a limit must be a finite
// number.
func checkDemoFlags(f demoFlags, maxAttempts int, ratio float64, minTokens int, window time.Duration) error {
	bad := func(flag string, value any, why string) error {
		return fmt.Errorf("--%s %v: %s", flag, value, why)
	}
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	switch {
	case f.cfg.Requests < 1:
		return bad("requests", f.cfg.Requests, "must be at least 1")
	case f.cfg.Requests > maxDemoRequests: // a second of real time per 1,000
		return bad("requests", f.cfg.Requests, fmt.Sprintf("must be at most %d", maxDemoRequests))
	case f.cfg.Failures < 0:
		return bad("failures", f.cfg.Failures, "must be at least 0")
	case f.cfg.Concurrency < 1:
		return bad("concurrency", f.cfg.Concurrency, "must be at least 1")
	case f.cfg.Concurrency > maxDemoConcurrency: // a goroutine each
		return bad("concurrency", f.cfg.Concurrency, fmt.Sprintf("must be at most %d", maxDemoConcurrency))
	case maxAttempts < 1:
		return bad("max-attempts", maxAttempts, "must be at least 1")
	case !finite(ratio) || ratio <= 0:
		return bad("budget-ratio", ratio, "must be a finite number above 0")
	case minTokens < 1:
		return bad("budget-min", minTokens, "must be at least 1")
	case window <= 0:
		return bad("budget-window", window, "must be above 0")
	case !finite(f.maxAmplification) || f.maxAmplification <= 0:
		return bad("max-amplification", f.maxAmplification, "must be a finite number above 0")
	}
	// The Policy's largest values, as New states them, named by the flag.
	for _, c := range []struct {
		flag  string
		value any
		p     damper.Policy
	}{
		{"max-attempts", maxAttempts, damper.Policy{MaxAttempts: maxAttempts}},
		{"budget-ratio", ratio, damper.Policy{RetryBudgetRatio: ratio}},
		{"budget-min", minTokens, damper.Policy{RetryBudgetMinTokens: minTokens}},
		{"budget-window", window, damper.Policy{RetryBudgetWindow: window}},
	} {
		if _, err := damper.New(c.p); err != nil {
			msg := err.Error() // "damper: Policy.Field = value: why"
			return bad(c.flag, c.value, msg[strings.LastIndex(msg, ": ")+2:])
		}
	}
	return nil
}

func runDemo(args []string, stdout, stderr io.Writer) int {
	f, err := parseDemo(args, stdout, stderr)
	if code, stop := badFlags("demo", err, stderr); stop {
		return code
	}
	res, err := outage.Simulate(context.Background(), f.cfg)
	if err != nil {
		fmt.Fprintln(stderr, "damper demo:", err)
		return exitFail
	}
	pass := res.Damper.Amplification <= f.maxAmplification

	if f.svg != "" {
		if err := writeChart(f.svg, res, f.maxAmplification); err != nil {
			fmt.Fprintln(stderr, "damper demo:", err)
			return exitFail
		}
	}
	if f.json {
		out := struct {
			outage.Result
			MaxAmplification float64 `json:"max_amplification"`
			Pass             bool    `json:"pass"`
		}{res, f.maxAmplification, pass}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			fmt.Fprintln(stderr, "damper demo:", err)
			return exitFail
		}
	} else {
		printDemo(stdout, res, f.maxAmplification, pass)
		if f.svg != "" {
			fmt.Fprintf(stdout, "Chart written to %s\n", f.svg)
		}
	}
	if !pass {
		return exitFail
	}
	return exitOK
}

func writeChart(path string, res outage.Result, maxAmplification float64) error {
	file, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := outage.WriteSVG(file, res, maxAmplification); err != nil {
		file.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return file.Close()
}

func printDemo(w io.Writer, res outage.Result, maxAmplification float64, pass bool) {
	p := res.Policy
	times := "times"
	if res.Failures == 1 {
		times = "time"
	}
	fmt.Fprintf(w, "Outage demo: %s logical requests, each failing %d %s (529 overloaded) before it succeeds.\n",
		thousands(res.Requests), res.Failures, times)
	fmt.Fprintf(w, "Official Go SDK against a fake Messages API in memory, on a virtual clock: no network, no waiting.\n")
	fmt.Fprintf(w, "Concurrency %d, seed %d.\n\n", res.Concurrency, res.Seed)

	fmt.Fprintf(w, "Naive per-request retries (%d attempts, SDK retries off):\n", p.MaxAttempts)
	printRun(w, res.Naive, false)
	fmt.Fprintf(w, "\nDamper (%d attempts; budget of %d units + %g per first-attempt success, per %v window):\n",
		p.MaxAttempts, p.RetryBudgetMinTokens, p.RetryBudgetRatio, p.RetryBudgetWindow)
	printRun(w, res.Damper, true)
	b, t := res.Protected.Breaker, res.Protected.Throttle
	fmt.Fprintf(w, "\nDamper with breaker and throttle (as above; the breaker opens when at least %g%% of at least %d attempts\n"+
		"in %v fail, and admits one probe %v later; the throttle holds %d tokens, -1 per failure, +%g per success):\n",
		100*b.FailureRatio, b.MinAttempts, b.Window, b.OpenFor, t.MaxTokens, t.TokenRatio)
	printRun(w, res.Breaker, true)
	if res.Breaker.CircuitOpen > 0 && res.Breaker.Elapsed < b.OpenFor {
		fmt.Fprintf(w, "  (the requests come back to back and only retries wait, so the run is over before a probe is due)\n")
	}

	verdict := "PASS"
	relation := "is within"
	if !pass {
		verdict, relation = "FAIL", "is above"
	}
	fmt.Fprintf(w, "\n%s: Damper's amplification %.2fx %s the %.2fx limit (naive: %.2fx).\n",
		verdict, res.Damper.Amplification, relation, maxAmplification, res.Naive.Amplification)
}

func printRun(w io.Writer, r outage.Run, budget bool) {
	line := func(label, value string) { fmt.Fprintf(w, "  %-26s%s\n", label+":", value) }
	line("logical requests", thousands(r.Requests))
	line("provider attempts", thousands(r.Attempts))
	line("amplification", fmt.Sprintf("%.2fx", r.Amplification))
	if budget {
		line("budget exhausted events", thousands(r.BudgetExhausted))
	}
	if r.Throttled > 0 || r.CircuitOpen > 0 {
		line("retry throttled events", thousands(r.Throttled))
		line("circuit open events", thousands(r.CircuitOpen))
	}
	line("succeeded", thousands(r.Succeeded))
	line("virtual time", r.Elapsed.Round(100*time.Millisecond).String())
}

// thousands formats n with comma separators: 1,010.
func thousands(n int) string {
	if n < 0 {
		return "-" + thousands(-n)
	}
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
