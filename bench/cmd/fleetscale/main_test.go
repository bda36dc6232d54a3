package main

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestMain runs a client of the fleet instead of the tests when the test
// binary was started as one.
func TestMain(m *testing.M) {
	if spec := os.Getenv(workerEnv); spec != "" {
		os.Exit(runWorker(spec, os.Stdin, os.Stdout))
	}
	os.Exit(m.Run())
}

// needRedis skips the test when redis-server is missing, unless
// DAMPER_REQUIRE_REDIS is set.
func needRedis(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("DAMPER_REQUIRE_REDIS") != "" {
			t.Fatalf("redis-server not found in PATH (%v) and DAMPER_REQUIRE_REDIS is set: install it, on Debian or Ubuntu with `sudo apt-get update && sudo apt-get install -y redis-server`", err)
		}
		t.Skip("redis-server is not installed (apt-get install redis-server): this test runs a real Redis")
	}
}

// TestQuickRun runs the -quick -cluster measurement, 1 and 2 client
// processes on a real redis-server and on a three-master Redis Cluster, and
// checks the tables it prints and the figures.
func TestQuickRun(t *testing.T) {
	needRedis(t)
	cfg, err := parseFlags([]string{"-quick", "-cluster"})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	rows, err := run(cfg, &out, io.Discard)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Logf("\n%s", out.String())

	if got := len(rows); got != 4 {
		t.Fatalf("%d rows, want 4 (1 and 2 processes on one Redis, then on the cluster)", got)
	}
	for i, r := range rows {
		if r.Procs != i%2+1 || r.Cluster != (i >= 2) {
			t.Errorf("row %d is of %d processes, cluster %v; want %d, %v", i, r.Procs, r.Cluster, i%2+1, i >= 2)
		}
		// On the cluster each process has a store Name of its own (up to
		// three), each on a master of its own; on one Redis, one Name.
		wantNames := 1
		if r.Cluster {
			wantNames = r.Procs
		}
		if r.Names != wantNames || r.Masters != wantNames {
			t.Errorf("row %d (%d processes, cluster %v): %d store Names on %d nodes, want %d on %d",
				i, r.Procs, r.Cluster, r.Names, r.Masters, wantNames, wantNames)
		}
		if r.CallsPerSec <= 0 || r.MemCallsPerSec <= 0 {
			t.Errorf("%d processes: %.0f calls/s in Redis, %.0f in memory; want more than 0", r.Procs, r.CallsPerSec, r.MemCallsPerSec)
		}
		if r.CPUPerCall <= 0 || r.CPUPerCall > 1e5 || r.ClientCPUPerCall <= 0 || r.MemCPUPerCall <= 0 {
			t.Errorf("%d processes: CPU per call %.1f µs in Redis, %.1f / %.1f µs in the clients; want above 0 (and Redis's below 100 ms)",
				r.Procs, r.CPUPerCall, r.ClientCPUPerCall, r.MemCPUPerCall)
		}
		// Every call asks Redis at least once, and a call that succeeds at
		// once asks no more than a few dozen times.
		if r.CommandsPerCall < 1 || r.CommandsPerCall > 50 || r.RoundTripsPerCall < 1 || r.RoundTripsPerCall > 50 {
			t.Errorf("%d processes: %.2f commands and %.2f round trips per call; want 1 to 50", r.Procs, r.CommandsPerCall, r.RoundTripsPerCall)
		}
		if r.P50 <= 0 || r.P99 < r.P50 || r.P50Mem <= 0 || r.P99Mem < r.P50Mem {
			t.Errorf("%d processes: p50 / p99 %v / %v in Redis, %v / %v in memory", r.Procs, r.P50, r.P99, r.P50Mem, r.P99Mem)
		}
		if r.Failures != 0 || r.Unasked != 0 {
			t.Errorf("%d processes: %d store operations failed and %d not asked of Redis; want 0: the figures would be the fallback's", r.Procs, r.Failures, r.Unasked)
		}
	}

	// The table has a row per fleet size, whose calls/s and CPU per call
	// are the figures above.
	const header = "| processes | calls/s | Redis CPU per call (µs) | Redis commands per call |"
	tables := strings.Split(out.String(), header)[1:]
	if len(tables) != 2 {
		t.Fatalf("the report has %d tables beginning %q, want 2 (one Redis, the cluster):\n%s", len(tables), header, out.String())
	}
	var lines []string
	for _, table := range tables {
		table, _, _ = strings.Cut(table, "\n\n")
		lines = append(lines, strings.Split(table, "\n")[2:]...) // the header's end, the separator
	}
	var procs []int
	for _, line := range lines {
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		if len(cells) != 8 {
			t.Errorf("table row %q: %d cells, want 8", line, len(cells))
			continue
		}
		n, err := strconv.Atoi(cells[0])
		if err != nil {
			t.Errorf("table row %q: processes %q", line, cells[0])
		}
		procs = append(procs, n)
		perSec, err1 := strconv.Atoi(strings.ReplaceAll(cells[1], ",", ""))
		cpu, err2 := strconv.ParseFloat(cells[2], 64)
		if err1 != nil || err2 != nil || perSec <= 0 || cpu <= 0 {
			t.Errorf("table row %q: calls/s %q and CPU per call %q, want numbers above 0", line, cells[1], cells[2])
		}
	}
	if !slices.Equal(procs, []int{1, 2, 1, 2}) {
		t.Errorf("the tables have rows for %v processes, want [1 2 1 2]:\n%s", procs, out.String())
	}
	for _, want := range []string{"Machine: ", "redis-server ", "Code: ", "Redis Cluster of 3 masters", "- 2 processes on 2 store Names, 2 masters: EVALSHA"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the report has no %q:\n%s", want, out.String())
		}
	}
}

func TestFlags(t *testing.T) {
	cfg, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.Procs, []int{1, 2, 4, 8}) || cfg.Concurrency != 8 || cfg.Duration != 5*time.Second || cfg.Warmup != 500*time.Millisecond || cfg.Cluster {
		t.Errorf("defaults: %+v", cfg)
	}
	cfg, err = parseFlags([]string{"-quick", "-procs", "3", "-duration", "2s", "-cluster"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.Procs, []int{3}) || cfg.Duration != 2*time.Second || cfg.Concurrency != quick.Concurrency || cfg.Warmup != quick.Warmup || !cfg.Cluster {
		t.Errorf("-quick -procs 3 -duration 2s: %+v", cfg)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-procs", "1,x"}, `-procs "1,x": "x" is not`},
		{[]string{"-procs", "0"}, `-procs "0": "0" is not`},
		{[]string{"-procs", "65"}, `"65" is not a number of processes from 1 to 64`},
		{[]string{"-concurrency", "0"}, "-concurrency is 0"},
		{[]string{"-duration", "0s"}, "-duration is 0s"},
		{[]string{"-warmup", "-1s"}, "-warmup is -1s"},
		{[]string{"-store-timeout", "0s"}, "-store-timeout is 0s"},
		{[]string{"extra"}, `unexpected argument "extra"`},
	} {
		_, err := parseFlags(c.args)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want one containing %q", c.args, err, c.want)
		}
	}
}

func TestParseInfo(t *testing.T) {
	info := "# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:2.250000\r\nused_cpu_sys_children:9.000000\r\n" +
		"# Commandstats\r\n" +
		"cmdstat_evalsha:calls=70,usec=2100,usec_per_call=30.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_hset:calls=40,usec=80,usec_per_call=2.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_info:calls=5,usec=500,usec_per_call=100.00,rejected_calls=0,failed_calls=0\r\n"
	c, err := parseInfo(info)
	if err != nil {
		t.Fatal(err)
	}
	if c.CPU != 3.75 || c.Usec != 2100 || len(c.Commands) != 2 || c.Commands["evalsha"] != 70 || c.Commands["hset"] != 40 {
		t.Errorf("parseInfo: %+v; want CPU 3.75, usec 2100 (EVALSHA's), evalsha 70 and hset 40 without info", c)
	}
	before := counters{CPU: 1.75, Commands: map[string]int64{"evalsha": 7, "hset": 40}, Usec: 100}
	cpu, commands, usec := c.since(before)
	if cpu != 2 || usec != 2000 || len(commands) != 1 || commands["evalsha"] != 63 {
		t.Errorf("since: %v s, %v, %d µs; want 2 s, evalsha 63 alone, 2000 µs", cpu, commands, usec)
	}
	if _, err := parseInfo("# CPU\r\nused_cpu_sys:x\r\nused_cpu_user:1\r\n"); err == nil || !strings.Contains(err.Error(), `used_cpu_sys is "x"`) {
		t.Errorf("a bad used_cpu_sys: %v", err)
	}
	if _, err := parseInfo("# Server\r\nredis_version:7.0.15\r\n"); err == nil {
		t.Error("INFO without cpu: no error")
	}
}

func TestThousands(t *testing.T) {
	for f, want := range map[float64]string{0: "0", 999.4: "999", 999.5: "1,000", 12345: "12,345", 1234567: "1,234,567"} {
		if got := thousands(f); got != want {
			t.Errorf("thousands(%v) = %q, want %q", f, got, want)
		}
	}
}
