package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestHostileClientsMeasured runs a real damper proxy process and attacks
// it as a client on loopback would, measuring its resident memory before
// and after each attack: the numbers of "The proxy under hostile clients"
// in docs/RELIABILITY.md. It takes about half a minute and real time, so
// it runs only when asked:
//
//	DAMPER_MEASURE=1 go test -run TestHostileClientsMeasured -v ./cmd/damper
//
// DAMPER_MEASURE_BIN=path measures that damper binary instead of one built
// from this tree (an older build, to compare), and DAMPER_MEASURE_ATTACKS
// (a list of stall, models, utf8 and headers) runs only those attacks.
func TestHostileClientsMeasured(t *testing.T) {
	if os.Getenv("DAMPER_MEASURE") == "" {
		t.Skip("set DAMPER_MEASURE=1 to run: it builds and runs a damper proxy process")
	}
	bin := os.Getenv("DAMPER_MEASURE_BIN")
	if bin == "" {
		bin = filepath.Join(t.TempDir(), "damper")
		if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, out)
		}
	}
	srv := fakeAPI(t)
	config := filepath.Join(t.TempDir(), "proxy.yaml")
	if err := os.WriteFile(config, []byte("listen: 127.0.0.1:0\nupstream: "+srv.URL()+"\nlog_level: warn\npolicy:\n  rate_limit: {}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "proxy", "-config", config, "-log-level", "info")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	lines := bufio.NewScanner(stderr)
	lines.Buffer(make([]byte, 1<<20), 64<<20)
	var addr string
	for addr == "" && lines.Scan() {
		var l struct{ Msg, Listen string }
		if json.Unmarshal(lines.Bytes(), &l) == nil && l.Msg == "damper proxy: serving" {
			addr = l.Listen
		}
	}
	if addr == "" {
		t.Fatal("the proxy did not say where it listens")
	}
	var logBytes int64
	var logMu sync.Mutex
	longest := 0
	go func() {
		for lines.Scan() {
			logMu.Lock()
			logBytes += int64(len(lines.Bytes()) + 1)
			longest = max(longest, len(lines.Bytes()))
			logMu.Unlock()
		}
	}()
	base := "http://" + addr
	rss := func() int64 {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				return kb << 10
			}
		}
		t.Fatal("no VmRSS")
		return 0
	}
	mb := func(n int64) string { return fmt.Sprintf("%.1f MB", float64(n)/1e6) }
	metrics := func() (int, int) {
		res, err := http.Get(base + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, len(b)
	}
	post := func(body string) int {
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/messages", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode
	}
	if code := post(`{"model":"claude-sonnet-4-6","max_tokens":64,"messages":[]}`); code != 200 {
		t.Fatalf("a good call: %d", code)
	}
	runs := func(attack string) bool {
		list := os.Getenv("DAMPER_MEASURE_ATTACKS")
		return list == "" || strings.Contains(list, attack)
	}

	// 40 connections that declare 32 MiB, send one byte and stall.
	if runs("stall") {
		stall(t, addr, rss, mb)
	}
	if runs("models") {
		models(t, rss, mb, post, metrics, func() (int64, int) {
			logMu.Lock()
			defer logMu.Unlock()
			return logBytes, longest
		})
	}
	if runs("utf8") {
		// A model of invalid UTF-8, then a scrape.
		code := post(`{"model":"bad` + "\xff\xfe" + `","max_tokens":64,"messages":[]}`)
		mcode, size := metrics()
		t.Logf("| a model of invalid UTF-8, then /metrics | answer %d; /metrics %d, %d bytes |", code, mcode, size)
	}
	if runs("headers") {
		// 300 connections, each a 1 MiB header that never ends.
		before, peak, answers := headerFlood(t, addr, cmd.Process.Pid, 300, 1<<20, 2*time.Second)
		t.Logf("| 300 connections × 1 MiB header, never ended | RSS %s before, %s at the peak: %s grown; answers read %v |", mb(before), mb(peak), mb(peak-before), answers)
		// 1,100 connections, each a 60 KiB header (under the bound) that
		// never ends: max_connections hold theirs until read_header_timeout.
		before, peak, answers = headerFlood(t, addr, cmd.Process.Pid, 1100, 60<<10, 2*time.Second)
		t.Logf("| 1,100 connections × 60 KiB header, never ended | RSS %s before, %s at the peak: %s grown; answers read %v |", mb(before), mb(peak), mb(peak-before), answers)
	}
	t.Logf("RSS at the end: %s", mb(rss()))
}

// stall opens 40 connections that declare a 32 MiB body, send one byte of
// it and stall, and logs the proxy's memory before and 4 s after.
func stall(t *testing.T, addr string, rss func() int64, mb func(int64) string) {
	before := rss()
	var conns []net.Conn
	for range 40 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", 32<<20)
		conns = append(conns, c)
	}
	time.Sleep(4 * time.Second)
	after := rss()
	t.Logf("| 40 connections declare 32 MiB, send 1 byte, stall (4 s) | RSS %s before, %s after: %s grown |", mb(before), mb(after), mb(after-before))
	for _, c := range conns {
		c.Close()
	}
}

// models sends 1,000 requests, each with a distinct 256 KiB model, 8 at a
// time, and logs the proxy's memory, /metrics and log sizes.
func models(t *testing.T, rss func() int64, mb func(int64) string, post func(string) int, metrics func() (int, int), logs func() (int64, int)) {
	before := rss()
	codes := map[int]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	work := make(chan int)
	for range 8 {
		wg.Go(func() {
			for i := range work {
				model := fmt.Sprintf("%06d", i) + strings.Repeat("m", 256<<10-6)
				code := post(`{"model":"` + model + `","max_tokens":64,"messages":[]}`)
				mu.Lock()
				codes[code]++
				mu.Unlock()
			}
		})
	}
	for i := range 1000 {
		work <- i
	}
	close(work)
	wg.Wait()
	after := rss()
	code, size := metrics()
	lb, ll := logs()
	t.Logf("| 1,000 requests with distinct 256 KiB models | answers %v; RSS %s before, %s after: %s grown; /metrics %d, %d bytes; log %d bytes, longest line %d |",
		codes, mb(before), mb(after), mb(after-before), code, size, lb, ll)
}
