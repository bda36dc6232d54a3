package main

import (
	"bytes"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
)

// TestMain runs a role (the fake API, the bare proxy) instead of the tests
// when run starts the test binary again as one.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "-role" {
		main()
	}
	os.Exit(m.Run())
}

// TestParseFlags: the defaults, -quick, and each bad value named.
func TestParseFlags(t *testing.T) {
	cfg, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Requests != 20_000 || cfg.Rounds != 3 || cfg.Batches != 10 || len(cfg.Clients) != 2 || cfg.Clients[0] != 8 || cfg.Clients[1] != 32 || len(cfg.Kinds) != 2 {
		t.Errorf("defaults: %+v", cfg)
	}
	cfg, err = parseFlags([]string{"-quick", "-contenders", "bare"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Requests != quick.Requests || cfg.Rounds != 1 || cfg.Batches != 1 || !cfg.runs("direct") || !cfg.runs("bare") || cfg.runs("nginx") || cfg.runs("damper-zero") {
		t.Errorf("-quick -contenders bare: %+v", cfg)
	}
	for _, c := range []struct{ args, want string }{
		{"-requests 0", "-requests 0: want 1 to 10000000"},
		{"-rounds 101", "-rounds 101: want 1 to 100"},
		{"-batches 0", "-batches 0: want 1 to 100"},
		{"-clients 8,x", `-clients "8,x": want numbers from 1 to 1024`},
		{"-clients 2000", `-clients "2000"`},
		{"-kinds plain,tcp", `-kinds "plain,tcp"`},
		{"-contenders envoy", `"envoy" is none of direct, nginx, bare, damper-zero, damper-recommended`},
		{"-role web -listen :0", `-role "web": want api or bare`},
		{"-role bare -listen :0", "-role bare needs -upstream"},
		{"extra", `takes no arguments, got ["extra"]`},
	} {
		_, err := parseFlags(strings.Fields(c.args))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one saying %q", c.args, err, c.want)
		}
	}
}

// TestQuickRun runs the fake API and the bare proxy as processes of their
// own, measures them, and checks the table: the machinery damper's rows
// use, without the minutes a build of damper takes.
func TestQuickRun(t *testing.T) {
	cfg, err := parseFlags([]string{"-quick", "-requests", "1000", "-contenders", "bare", "-kinds", "plain,stream"})
	if err != nil {
		t.Fatal(err)
	}
	var out, log bytes.Buffer
	if err := run(cfg, &out, &log); err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	table := out.String()
	for _, want := range []string{"plain calls: 1000 measured per cell", "stream calls: 1000 measured per cell",
		"CPU is read from /proc in ticks of 10 ms; the smallest measurement read ",
		"| direct | 4 |", "| bare Go proxy | 4 |", "| contender | clients | calls/s | vs direct | vs bare | CPU µs/call |"} {
		if !strings.Contains(table, want) {
			t.Errorf("the tables lack %q:\n%s", want, table)
		}
	}
	for line := range strings.Lines(table) {
		if strings.HasPrefix(line, "| bare Go proxy |") && (strings.Contains(line, "| – |") || strings.Contains(line, "| 0.0 |")) {
			t.Errorf("the bare proxy's CPU or RSS was not read: %s", line)
		}
	}
}

// TestStatFields reads /proc/<pid>/stat past a name holding spaces and
// parentheses.
func TestStatFields(t *testing.T) {
	f := statFields([]byte("1234 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14"))
	if len(f) != 15 || f[0] != "S" || f[1] != "1" || f[11] != "11" || f[12] != "12" {
		t.Errorf("fields %q", f)
	}
	if statFields([]byte("no name")) != nil {
		t.Error("a line with no name gave fields")
	}
}

// TestMeasureBatches: a measurement whose processes spend fewer than
// minTicks of CPU makes more batches, up to the bound; one that is not
// read (direct) makes one.
func TestMeasureBatches(t *testing.T) {
	srv := httptest.NewServer(apiHandler())
	defer srv.Close()
	idle := []int{os.Getppid()} // a process that spends next to nothing meanwhile
	r, err := measure(contender{name: "idle", base: srv.URL, pids: func() []int { return idle }}, "plain", 2, 10, 50, 3)
	if err != nil {
		t.Fatal(err)
	}
	if r.calls != 150 || r.cpuTicks >= minTicks {
		t.Errorf("%d calls measured, %d ticks; want 3 batches of 50", r.calls, r.cpuTicks)
	}
	r, err = measure(contender{name: "direct", base: srv.URL}, "plain", 2, 10, 50, 3)
	if err != nil {
		t.Fatal(err)
	}
	if r.calls != 50 {
		t.Errorf("direct: %d calls measured, want one batch of 50", r.calls)
	}
}

// TestPairedRatio: the median of each round's ratio, not the ratio of
// the medians; "–" without a base.
func TestPairedRatio(t *testing.T) {
	cpu := func(r result) float64 { return r.cpuPerCall }
	rs := []result{{cpuPerCall: 110}, {cpuPerCall: 150}, {cpuPerCall: 80}}
	base := []result{{cpuPerCall: 100}, {cpuPerCall: 150}, {cpuPerCall: 50}}
	if got := pairedRatio(rs, base, cpu); got != "1.10" { // rounds 1.1, 1.0, 1.6
		t.Errorf("pairedRatio = %s, want 1.10", got)
	}
	base[1].cpuPerCall = 75 // rounds 1.1, 2.0, 1.6: median 1.6; medians' ratio 110/75 = 1.47
	if got := pairedRatio(rs, base, cpu); got != "1.60" {
		t.Errorf("pairedRatio = %s, want 1.60", got)
	}
	if got := pairedRatio(rs, nil, cpu); got != "–" {
		t.Errorf("pairedRatio without a base = %s, want –", got)
	}
}
