package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/damper-ai/damper-go/dampertest"
)

// testDeadline is short enough to keep the test quick and long enough for
// every row not bounded by it: the slowest such, the bare SDK's 429 forever
// with two retries, waits at most 0.5 s + 1 s. The bare SDK's fourth attempt
// of "max retries 5" cannot come before 0.375 + 0.75 + 1.5 s, so it is cut
// after three.
const testDeadline = 2500 * time.Millisecond

// columns splits a table line on the two or more spaces tabwriter pads with;
// no cell holds two spaces in a row.
var columns = regexp.MustCompile(`\s{2,}`)

func TestScenarios(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"scenarios", "--deadline", testDeadline.String(), "--seed", "1"}, &out, &errb)
	if code != exitOK {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}

	entries := catalogue()
	if len(entries) != 16 {
		t.Errorf("%d catalogue entries, want the article's 12 rows, the spend limit and 3 stream failures", len(entries))
	}
	cells := map[string][]string{} // situation -> the row's cells
	for _, line := range strings.Split(out.String(), "\n") {
		c := columns.Split(strings.TrimSpace(line), -1)
		if len(c) != 10 {
			continue
		}
		name := strings.TrimSuffix(c[1], " *")
		if _, dup := cells[name]; dup {
			t.Errorf("row %q printed twice", name)
		}
		cells[name] = c
	}
	for _, e := range entries {
		if _, ok := cells[e.name]; !ok {
			t.Errorf("no row for %q in:\n%s", e.name, out.String())
		}
	}
	if len(cells) != len(entries)+1 { // and the header
		t.Errorf("%d table lines, want %d rows and a header", len(cells), len(entries))
	}

	// Attempts and results. Columns: 2 bare tries, 5 bare result, 6 Damper
	// tries, 9 Damper result. The bare SDK's jitter is its own, so its rows
	// hold for any draw; Damper's come from --seed 1, whose draws put the
	// rows that depend on them far from any edge: "default retries" waits
	// 0.13 s and 0.74 s, "max retries 5" 0.82 s and 0.25 s and then draws
	// 3.29 s, which with the minimum attempt time cannot fit the deadline,
	// "529 overloaded twice" waits 0.07 s and 1.02 s, "connection dropped"
	// 0.12 s and 0.63 s, and "3 s response" starts its second attempt at
	// 1.73 s, 0.27 s before the latest start the deadline allows.
	want := map[string][4]string{
		"429 forever / default retries":           {"3", "429 rate_limit", "3", "429 rate_limit"},
		"429 forever / max retries 0":             {"1", "429 rate_limit", "1", "429 rate_limit"},
		"429 forever / max retries 5":             {"3", "cut by the 2.5s deadline", "3", "ErrDeadline, 429 rate_limit"},
		"429 + retry-after: 2":                    {"2", "ok", "1", "ErrDeadline (retry after 2s), 429 rate_limit"},
		"429 + retry-after-ms: 300":               {"2", "ok", "2", "ok"},
		"429 + retry-after: 120":                  {"1", "cut by the 2.5s deadline", "1", "ErrRetryAfterTooLong (retry after 2m0s), 429 rate_limit"},
		"529 overloaded twice":                    {"3", "ok", "3", "ok"},
		"400 invalid_request":                     {"1", "400 invalid_request", "1", "400 invalid_request"},
		"500 + x-should-retry: false":             {"1", "500 api", "1", "500 api"},
		"400 + x-should-retry: true":              {"2", "ok", "2", "ok"},
		"connection dropped":                      {"3", "connection error (EOF)", "3", "connection error (EOF)"},
		"3 s response / 1 s timeout":              {"2", "cut by the 2.5s deadline", "2", "cut by the 2.5s deadline"},
		"429 spend limit, no retry-after":         {"3", "429 enforced_spend_limit_reached", "1", "429 enforced_spend_limit_reached"},
		"stream: dropped after message_start":     {"1", "connection error (EOF)", "2", "ok"},
		"stream: error event after message_start": {"1", "200 overloaded", "2", "ok"},
		"stream: no message_stop, after content":  {"1", "no error, answer cut short", "1", "ErrAmbiguous"},
	}
	if len(want) != len(entries) {
		t.Errorf("%d expected rows for %d catalogue entries", len(want), len(entries))
	}
	for name, w := range want {
		c, ok := cells[name]
		if !ok {
			t.Errorf("no row for %q", name)
			continue
		}
		got := [4]string{c[2], c[5], c[6], c[9]}
		if got != w {
			t.Errorf("%s: bare %s tries %q, Damper %s tries %q; want %q", name, got[0], got[1], got[2], got[3], w)
		}
	}

	// Damper answers the retry-after 120 at once, measured by the command
	// itself around the SDK call.
	c := cells["429 + retry-after: 120"]
	if c == nil {
		return
	}
	total, err := time.ParseDuration(c[8])
	if err != nil {
		t.Fatalf("Damper total %q: %v", c[8], err)
	}
	if total >= time.Second {
		t.Errorf("Damper's retry-after 120 row took %v, want under 1s", total)
	}
	if bare, _ := time.ParseDuration(c[4]); bare < testDeadline {
		t.Errorf("bare SDK's retry-after 120 row took %v, want it held until the %v deadline", bare, testDeadline)
	}
	if !strings.Contains(out.String(), "The bare SDK sleeps the full 120 s it is told to") {
		t.Error("the retry-after 120 row has no note")
	}
}

func TestScenariosBadFlags(t *testing.T) {
	for _, args := range [][]string{{"--deadline", "0s"}, {"--deadline", "soon"}, {"extra"}} {
		var out, errb bytes.Buffer
		if code := run(append([]string{"scenarios"}, args...), &out, &errb); code != exitUsage {
			t.Errorf("scenarios %q: exit %d, want %d (stderr %q)", args, code, exitUsage, errb.String())
		}
	}
}

// TestCallCutTakesItsDeadline: a call that its deadline cut took at least
// that deadline, however busy the machine is between the deadline's
// setting and the call's start.
func TestCallCutTakesItsDeadline(t *testing.T) {
	srv := dampertest.NewServer()
	defer srv.Close()
	e := entry{id: "slow", name: "slow", steps: []dampertest.Step{dampertest.OK().WithDelay(time.Hour)}}
	srv.Script(e.id+"/bare", e.steps...)
	const deadline = 20 * time.Millisecond
	sides := make([]side, 200) // at once, for the machine to be busy
	var wg sync.WaitGroup
	for i := range sides {
		wg.Go(func() { sides[i] = call(context.Background(), srv, e, nil, deadline) })
	}
	wg.Wait()
	short := 0
	for _, s := range sides {
		if !s.CutByDeadline {
			t.Fatalf("a call ended %q after %v, not cut by its %v deadline", s.Result, s.Total, deadline)
		}
		if s.Total < deadline {
			short++
		}
	}
	if short > 0 {
		t.Errorf("%d of %d calls cut by their %v deadline measured shorter than it", short, len(sides), deadline)
	}
}
