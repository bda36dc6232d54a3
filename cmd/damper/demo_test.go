package main

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// defaultDemo runs the README's first command once for the tests that
// read its output.
var defaultDemo = sync.OnceValues(func() (string, error) {
	var out, errb bytes.Buffer
	if code := run([]string{"demo"}, &out, &errb); code != exitOK {
		return "", fmt.Errorf("exit %d, stderr %q", code, errb.String())
	}
	return out.String(), nil
})

// The README's first command, exactly as a newcomer sees it.
func TestDemoDefault(t *testing.T) {
	demo, err := defaultDemo()
	if err != nil {
		t.Fatal(err)
	}
	out := bytes.NewBufferString(demo)
	naive, rest, ok := strings.Cut(out.String(), "Damper (")
	dmp, brk, ok2 := strings.Cut(rest, "Damper with breaker and throttle (")
	if !ok || !ok2 {
		t.Fatalf("no Damper section, or no breaker section, in:\n%s", out.String())
	}
	for _, want := range []string{
		"logical requests:         1,000\n",
		"provider attempts:        3,000\n",
		"amplification:            3.00x\n",
	} {
		if !strings.Contains(naive, want) {
			t.Errorf("naive section lacks %q:\n%s", want, naive)
		}
	}
	for _, want := range []string{
		"logical requests:         1,000\n",
		"provider attempts:        1,010\n",
		"amplification:            1.01x\n",
		"budget exhausted events:  995\n",
	} {
		if !strings.Contains(dmp, want) {
			t.Errorf("Damper section lacks %q:\n%s", want, dmp)
		}
	}
	// The breaker's rule: the throttle refuses the third request's second
	// retry and every retry after; the 20th attempt, 18 of them failed,
	// opens the breaker, and the remaining 986 requests send nothing.
	for _, want := range []string{
		"at least 50% of at least 20 attempts\nin 30s fail, and admits one probe 30s later",
		"provider attempts:        20\n",
		"amplification:            0.02x\n",
		"retry throttled events:   12\n",
		"circuit open events:      986\n",
		"succeeded:                2\n",
		"PASS: Damper's amplification 1.01x is within the 1.10x limit",
	} {
		if !strings.Contains(brk, want) {
			t.Errorf("breaker section lacks %q:\n%s", want, brk)
		}
	}
}

// TestDemoInREADME: the README shows the demo's output as it is, line for
// line.
func TestDemoInREADME(t *testing.T) {
	demo, err := defaultDemo()
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	// The first block after the paragraph that introduces the demo.
	const intro = "`go run ./cmd/damper demo` sends"
	_, after, ok := strings.Cut(string(readme), "\n"+intro)
	if !ok {
		t.Fatalf("README.md has no paragraph starting %q", intro)
	}
	_, block, ok := strings.Cut(after, "\n```\n")
	if ok {
		block, _, ok = strings.Cut(block, "\n```\n")
	}
	if !ok {
		t.Fatal("README.md has no block after the demo's paragraph")
	}
	if want := strings.TrimSuffix(demo, "\n"); block != want {
		t.Errorf("README.md's demo block:\n%s\n\nthe demo prints:\n%s", block, want)
	}
}

func TestDemoJSON(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"demo", "--json", "--requests", "400", "--failures", "1", "--budget-min", "30"}, &out, &errb)
	if code != exitOK {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
	var got struct {
		Pass  bool `json:"pass"`
		Naive struct {
			Attempts int     `json:"provider_attempts"`
			Amp      float64 `json:"amplification"`
		} `json:"naive"`
		Damper struct {
			Requests  int `json:"logical_requests"`
			Attempts  int `json:"provider_attempts"`
			Exhausted int `json:"budget_exhausted_events"`
			Succeeded int `json:"succeeded"`
		} `json:"damper"`
		Breaker struct {
			Attempts    int `json:"provider_attempts"`
			Succeeded   int `json:"succeeded"`
			Throttled   int `json:"retry_throttled_events"`
			CircuitOpen int `json:"circuit_open_events"`
		} `json:"damper_breaker"`
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out.String())
	}
	// One failure each: 30 units buy 30 retries, all succeed; the other
	// 370 requests are refused. Naive: two attempts each.
	if !got.Pass || got.Naive.Attempts != 800 || got.Naive.Amp != 2 ||
		got.Damper.Requests != 400 || got.Damper.Attempts != 430 || got.Damper.Exhausted != 370 || got.Damper.Succeeded != 30 {
		t.Errorf("got %+v, want pass, naive 800 attempts (2x), Damper 400 requests, 430 attempts, 370 exhausted, 30 succeeded", got)
	}
	// With the breaker and throttle: five requests retry and succeed (the
	// throttle falls from 10 to 6 tokens), the next nine are throttled, and
	// the 20th attempt (15 failed) opens the breaker for the remaining 386.
	if b := got.Breaker; b.Attempts != 20 || b.Succeeded != 5 || b.Throttled != 9 || b.CircuitOpen != 386 {
		t.Errorf("breaker run %+v, want 20 attempts, 5 succeeded, 9 throttled, 386 circuit open", b)
	}
}

// Above the limit, the demo fails: 50 requests with 10 retries is 1.20x.
func TestDemoFailsAboveLimit(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"demo", "--requests", "50"}, &out, &errb); code != exitFail {
		t.Errorf("exit %d, want %d", code, exitFail)
	}
	if !strings.Contains(out.String(), "FAIL: Damper's amplification 1.20x is above the 1.10x limit") {
		t.Errorf("no FAIL line in:\n%s", out.String())
	}
}

func TestDemoBadFlags(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--requests", "0"}, "--requests 0: must be at least 1"},
		{[]string{"--failures", "-2"}, "--failures -2: must be at least 0"},
		{[]string{"--concurrency", "0"}, "--concurrency 0: must be at least 1"},
		{[]string{"--concurrency", "1000000000"}, "--concurrency 1000000000: must be at most 1000"},
		{[]string{"--requests", "1000001"}, "--requests 1000001: must be at most 1000000"},
		{[]string{"--budget-min", "0"}, "--budget-min 0: must be at least 1"},
		{[]string{"--budget-ratio", "0"}, "--budget-ratio 0: must be a finite number above 0"},
		{[]string{"--budget-ratio", "NaN"}, "--budget-ratio NaN: must be a finite number above 0"},
		{[]string{"--budget-ratio", "+Inf"}, "--budget-ratio +Inf: must be a finite number above 0"},
		{[]string{"--budget-window", "0s"}, "--budget-window 0s: must be above 0"},
		{[]string{"--max-attempts", "0"}, "--max-attempts 0: must be at least 1"},
		{[]string{"--max-attempts", "1000000000000000000"}, "--max-attempts 1000000000000000000: must be at most 100"},
		{[]string{"--budget-ratio", "1e9"}, "--budget-ratio 1e+09: must be at most 1000"},
		{[]string{"--budget-min", "2000000"}, "--budget-min 2000000: must be at most 1000000"},
		{[]string{"--budget-window", "1000h"}, "--budget-window 1000h0m0s: must be at most 24h0m0s"},
		{[]string{"--max-amplification", "-1"}, "--max-amplification -1: must be a finite number above 0"},
		{[]string{"--max-amplification", "NaN"}, "--max-amplification NaN: must be a finite number above 0"},
		{[]string{"--requests", "many"}, `invalid value "many" for flag -requests`},
		{[]string{"extra"}, `demo takes no arguments, got ["extra"]`},
	}
	for _, tt := range tests {
		var out, errb bytes.Buffer
		if code := run(append([]string{"demo"}, tt.args...), &out, &errb); code != exitUsage {
			t.Errorf("demo %q: exit %d, want %d", tt.args, code, exitUsage)
		}
		if !strings.Contains(errb.String(), tt.want) {
			t.Errorf("demo %q: stderr %q, want it to name %q", tt.args, errb.String(), tt.want)
		}
		// The flag, never the field of a Go type behind it.
		if strings.Contains(errb.String(), "Config.") || strings.Contains(errb.String(), "Policy.") {
			t.Errorf("demo %q: stderr %q names an internal field", tt.args, errb.String())
		}
	}
}

func TestDemoSVG(t *testing.T) {
	path := filepath.Join(t.TempDir(), "chart.svg")
	var out, errb bytes.Buffer
	if code := run([]string{"demo", "--requests", "200", "--svg", path}, &out, &errb); code != exitOK {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
	if !strings.Contains(out.String(), "Chart written to "+path) {
		t.Errorf("output does not name the chart:\n%s", out.String())
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	dec := xml.NewDecoder(bytes.NewReader(data))
	for {
		tok, err := dec.Token()
		if err != nil {
			break
		}
		if se, ok := tok.(xml.StartElement); ok {
			for _, a := range se.Attr {
				if a.Name.Local == "id" {
					ids[a.Value] = true
				}
			}
		}
	}
	if !ids["naive"] || !ids["damper"] || !ids["damper-breaker"] {
		t.Errorf("chart series found: %v, want naive, damper and damper-breaker", ids)
	}

	code := run([]string{"demo", "--svg", filepath.Join(t.TempDir(), "missing", "chart.svg")}, &out, &errb)
	if code != exitFail || !strings.Contains(errb.String(), "no such file or directory") {
		t.Errorf("unwritable --svg: exit %d, stderr %q; want %d and the file error", code, errb.String(), exitFail)
	}
}
