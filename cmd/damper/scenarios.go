package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// defaultDeadline bounds every call of `damper scenarios`, so that the
// bare SDK's 120 s sleep does not hold the run up for two minutes.
const defaultDeadline = 10 * time.Second

func runScenarios(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("scenarios", flag.ContinueOnError)
	deadline := fs.Duration("deadline", defaultDeadline, "context deadline of every call, bare SDK and Damper alike; it is what stops the\nbare SDK's sleeps of minutes, and the whole run takes about this long")
	seed := fs.Uint64("seed", 1, "seed of Damper's backoff jitter (the bare SDK draws its own)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: damper scenarios [flags]

The failure catalogue of the article "A 429 with retry-after: 120 makes the
Anthropic SDK try to wait 120 seconds", plus a spend-limit 429 and three
stream failures, each sent twice to a fake Messages API on loopback: once
through the bare official Go SDK (its default two retries unless the row
says otherwise) and once through the same SDK with Damper owning retries
(default policy, or the row's equivalent setting).

Every call runs at once, in real time, so the waits shown are real. Each row
prints attempts, the waits between them, the total time and the result of
both. Calls are bounded by --deadline; a row cut by it says so.

Flags:
`)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, stdout, stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "damper scenarios: takes no arguments, got %q\n", fs.Args())
		return exitUsage
	}
	if *deadline <= 0 {
		fmt.Fprintf(stderr, "damper scenarios: --deadline %v: must be above 0\n", *deadline)
		return exitUsage
	}
	rows, err := runCatalogue(context.Background(), catalogue(), *deadline, *seed)
	if err != nil {
		fmt.Fprintln(stderr, "damper scenarios:", err)
		return exitFail
	}
	printRows(stdout, rows, *deadline)
	return exitOK
}

// side is one call of a row, as measured around the SDK.
type side struct {
	Attempts int
	Waits    []time.Duration
	Total    time.Duration
	Result   string
	// CutByDeadline is true when the scenario's deadline ended the call.
	CutByDeadline bool
}

// row is one catalogue entry run both ways.
type row struct {
	Entry        entry
	Bare, Damper side
}

// runCatalogue runs every entry, bare and with Damper, all at once, on one
// loopback fake API.
func runCatalogue(ctx context.Context, entries []entry, deadline time.Duration, seed uint64) ([]row, error) {
	srv := dampertest.NewServer()
	defer srv.Close()
	rows := make([]row, len(entries))
	errs := make([]error, len(entries))
	var wg sync.WaitGroup
	for i, e := range entries {
		rows[i].Entry = e
		srv.Script(e.id+"/bare", e.steps...)
		srv.Script(e.id+"/damper", e.steps...)
		wg.Go(func() {
			rows[i].Bare = call(ctx, srv, e, nil, deadline)
		})
		d, err := damper.New(e.policy, damper.WithRand(seededRand(seed+uint64(i))))
		if err != nil {
			errs[i] = fmt.Errorf("%s: %w", e.name, err)
			continue
		}
		wg.Go(func() {
			rows[i].Damper = call(ctx, srv, e, d, deadline)
		})
	}
	wg.Wait()
	return rows, errors.Join(errs...)
}

// call makes the entry's request once, through Damper when d is not nil,
// and measures it from outside: a middleware placed after Damper's sees
// every attempt, as it would with the SDK's own retries.
func call(ctx context.Context, srv *dampertest.Server, e entry, d *damper.Damper, deadline time.Duration) side {
	var (
		mu       sync.Mutex
		attempts int
		lastEnd  time.Time
		waits    []time.Duration
	)
	probe := option.WithMiddleware(func(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		mu.Lock()
		attempts++
		if !lastEnd.IsZero() {
			waits = append(waits, time.Since(lastEnd))
		}
		mu.Unlock()
		res, err := next(req)
		mu.Lock()
		lastEnd = time.Now()
		mu.Unlock()
		return res, err
	})
	opts := []option.RequestOption{}
	scenario := e.id + "/bare"
	if d != nil {
		scenario = e.id + "/damper"
		opts = append(opts, d.Option())
	}
	opts = append(opts, srv.Options()...)
	opts = append(opts, probe, dampertest.Scenario(scenario))
	if d == nil {
		opts = append(opts, e.bare...)
	}
	client := anthropic.NewClient(opts...)

	params := anthropic.MessageNewParams{
		Model:     anthropic.Model("claude-sonnet-5-5"),
		MaxTokens: 512,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Summarize the incident report."))},
	}
	// One reading of the clock for both, so that a call the deadline cuts
	// measures at least the deadline.
	start := time.Now()
	ctx, cancel := context.WithDeadline(ctx, start.Add(deadline))
	defer cancel()
	var err error
	truncated := false
	if e.stream {
		stream := client.Messages.NewStreaming(ctx, params)
		stopped := false
		for stream.Next() {
			stopped = stopped || stream.Current().Type == "message_stop"
		}
		err = stream.Err()
		stream.Close()
		truncated = err == nil && !stopped
	} else {
		_, err = client.Messages.New(ctx, params)
	}
	s := side{Total: time.Since(start), CutByDeadline: errors.Is(ctx.Err(), context.DeadlineExceeded)}
	mu.Lock()
	s.Attempts, s.Waits = attempts, waits
	mu.Unlock()
	s.Result = describe(err, truncated, s.CutByDeadline, deadline)
	return s
}

// describe sums up how a call ended, in a few words.
func describe(err error, truncated, cut bool, deadline time.Duration) string {
	var dErr *damper.Error
	var apiErr *anthropic.Error
	switch {
	case err == nil && truncated:
		return "no error, answer cut short"
	case err == nil:
		return "ok"
	case cut:
		return fmt.Sprintf("cut by the %v deadline", deadline)
	case errors.As(err, &dErr):
		s := reasonName(dErr.Reason)
		if dErr.RetryAfter > 0 {
			s += fmt.Sprintf(" (retry after %v)", dErr.RetryAfter)
		}
		if errors.As(dErr.Last, &apiErr) {
			s += ", " + apiSummary(apiErr)
		}
		return s
	case errors.As(err, &apiErr):
		return apiSummary(apiErr)
	case errors.Is(err, context.DeadlineExceeded):
		return "attempt timed out"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection error (EOF)"
	}
	return "error: " + err.Error()
}

// apiSummary is an API error as its status and its error code, or its
// type when it has no code: 429 rate_limit, 429 enforced_spend_limit_reached.
func apiSummary(e *anthropic.Error) string {
	what := strings.TrimSuffix(string(e.Type()), "_error")
	if code := e.ErrorCode(); code != "" {
		what = string(code)
	}
	return strings.TrimSpace(fmt.Sprintf("%d %s", e.StatusCode, what))
}

func reasonName(reason error) string {
	for _, r := range []struct {
		err  error
		name string
	}{
		{damper.ErrRetryBudgetExhausted, "ErrRetryBudgetExhausted"},
		{damper.ErrRetryCostCeiling, "ErrRetryCostCeiling"},
		{damper.ErrRetryAfterTooLong, "ErrRetryAfterTooLong"},
		{damper.ErrDeadline, "ErrDeadline"},
		{damper.ErrAmbiguous, "ErrAmbiguous"},
		{damper.ErrHoldBackExceeded, "ErrHoldBackExceeded"},
		{damper.ErrAttemptTimeout, "ErrAttemptTimeout"},
	} {
		if errors.Is(reason, r.err) {
			return r.name
		}
	}
	return reason.Error()
}

func printRows(w io.Writer, rows []row, deadline time.Duration) {
	fmt.Fprintf(w, "SDK failure catalogue: bare official Go SDK vs the same SDK with Damper (loopback fake API, real time, %v deadline per call)\n\n", deadline)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\t\tBARE SDK\t\t\t\tDAMPER\t\t\t")
	fmt.Fprintln(tw, "#\tSITUATION\tTRIES\tWAITS (s)\tTOTAL\tRESULT\tTRIES\tWAITS (s)\tTOTAL\tRESULT")
	var notes []string
	for i, r := range rows {
		mark := ""
		if r.Entry.note != "" || r.Bare.CutByDeadline || r.Damper.CutByDeadline {
			notes = append(notes, noteFor(i+1, r, deadline))
			mark = " *"
		}
		fmt.Fprintf(tw, "%d\t%s%s\t%d\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", i+1, r.Entry.name, mark,
			r.Bare.Attempts, waitList(r.Bare.Waits), seconds(r.Bare.Total), r.Bare.Result,
			r.Damper.Attempts, waitList(r.Damper.Waits), seconds(r.Damper.Total), r.Damper.Result)
	}
	tw.Flush()
	if len(notes) > 0 {
		fmt.Fprintln(w, "\n* Notes:")
		for _, n := range notes {
			fmt.Fprintln(w, n)
		}
	}
}

func noteFor(n int, r row, deadline time.Duration) string {
	var parts []string
	if r.Bare.CutByDeadline {
		parts = append(parts, fmt.Sprintf("The bare SDK was still retrying or waiting when the %v deadline ended it.", deadline))
	}
	if r.Damper.CutByDeadline {
		parts = append(parts, fmt.Sprintf("Damper was cut by the %v deadline.", deadline))
	}
	if r.Entry.note != "" {
		parts = append(parts, r.Entry.note)
	}
	return fmt.Sprintf("  %d. %s", n, strings.Join(parts, " "))
}

func waitList(ws []time.Duration) string {
	if len(ws) == 0 {
		return "-"
	}
	s := make([]string, len(ws))
	for i, w := range ws {
		s[i] = fmt.Sprintf("%.2f", w.Seconds())
	}
	return strings.Join(s, ",")
}

func seconds(d time.Duration) string { return fmt.Sprintf("%.2fs", d.Seconds()) }

// seededRand is a source of numbers in [0, 1) for damper.WithRand, safe
// for concurrent use.
func seededRand(seed uint64) func() float64 {
	var mu sync.Mutex
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	return func() float64 {
		mu.Lock()
		defer mu.Unlock()
		return r.Float64()
	}
}
