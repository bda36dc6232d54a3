package main

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// row is what one fleet size measured.
type row struct {
	Procs             int
	Cluster           bool    // on the Redis Cluster, not on one Redis
	Names             int     // store Names the row's processes were split over
	Masters           int     // nodes that ran the row's commands
	CallsPerSec       float64 // through the Damper with its parts in Redis
	MemCallsPerSec    float64 // through the Damper with its parts in memory, paced at CallsPerSec
	CPUPerCall        float64 // µs of Redis CPU per call
	CommandsPerCall   float64 // commands the clients sent per call (INFO commandstats, less those the scripts ran)
	ClientCPUPerCall  float64 // µs of the client processes' CPU per call, parts in Redis
	MemCPUPerCall     float64 // the same with the parts in memory
	UsecPerCall       float64 // µs Redis spent running a call's commands, scripts included (commandstats)
	Commands          string  // each command's calls per call, the most called first
	RoundTripsPerCall float64
	Busy              float64 // Redis CPU seconds per second of the phase
	P50Mem, P99Mem    time.Duration
	P50, P99          time.Duration // with the parts in Redis
	Failures          uint64        // store operations Redis failed or did not answer in time
	Unasked           uint64        // store operations decided without asking Redis
}

// run measures every row of cfg and prints the report to w, and a line
// per row to progress as it is measured.
func run(cfg config, w, progress io.Writer) ([]row, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	srv, err := startRedis(cfg.RedisServer)
	if err != nil {
		return nil, err
	}
	targets := []*target{{nodes: []*server{srv}}}
	defer func() {
		for _, t := range targets {
			t.stop()
		}
	}()
	if cfg.Cluster {
		c, err := startCluster(cfg.RedisServer, clusterMasters)
		if err != nil {
			return nil, fmt.Errorf("Redis Cluster: %w", err)
		}
		targets = append(targets, c)
	}
	fmt.Fprintf(w, "Machine: %s; Go %s, %s/%s; redis-server %s (one process, on a loopback port",
		cores(), runtime.Version(), runtime.GOOS, runtime.GOARCH, srv.version())
	if cfg.Cluster {
		fmt.Fprintf(w, "; and a Redis Cluster of %d masters, no replicas, each a process on a loopback port", clusterMasters)
	}
	fmt.Fprintf(w, ").\nCode: %s.\n", commit())
	fmt.Fprintf(w, "Each row: that many client processes of %d goroutines each, plain calls in a closed loop; "+
		"%v with the parts in Redis, then %v with them in memory at the rate Redis allowed, each after %v of warm-up; store timeout %v.\n\n",
		cfg.Concurrency, cfg.Duration, cfg.Duration, cfg.Warmup, cfg.StoreTimeout)
	var rows []row
	for ti, t := range targets {
		for i, n := range cfg.Procs {
			r, err := measure(cfg, t, n, fmt.Sprintf("fleetscale-%d-%d-%d", ti, i, n))
			if err != nil {
				return rows, fmt.Errorf("%s, %s: %w", t.label(), processes(n), err)
			}
			rows = append(rows, r)
			fmt.Fprintf(progress, "fleetscale: %s, %s: %.0f calls/s\n", t.label(), processes(n), r.CallsPerSec)
		}
	}
	writeTables(w, rows)
	return rows, nil
}

// clusterMasters is the size of the -cluster run's Redis Cluster, and the
// store Names its fleets are split over, one Name's keys on each master.
const clusterMasters = 3

// measure runs one row: n workers on one store Name on one Redis, or
// split over the cluster's Names (worker i on Name i mod the masters).
func measure(cfg config, tgt *target, n int, base string) (row, error) {
	storeNames, err := tgt.names(base)
	if err != nil {
		return row{}, err
	}
	var specs []string
	for i := range n {
		spec, err := json.Marshal(job{Redis: tgt.addrs(), Cluster: tgt.Cluster, Name: storeNames[i%len(storeNames)],
			Concurrency: cfg.Concurrency, StoreTimeout: cfg.StoreTimeout})
		if err != nil {
			return row{}, err
		}
		specs = append(specs, string(spec))
	}
	ws, err := startWorkers(specs)
	if err != nil {
		return row{}, err
	}
	defer func() {
		for _, wk := range ws {
			wk.kill()
		}
	}()
	if _, err := await(ws, 60*time.Second); err != nil {
		return row{}, err
	}
	phaseOf := func(p phase) ([]result, error) {
		for _, wk := range ws {
			if err := wk.send(p); err != nil {
				return nil, err
			}
		}
		return await(ws, p.Duration+60*time.Second)
	}
	if cfg.Warmup > 0 {
		if _, err := phaseOf(phase{Store: true, Duration: cfg.Warmup}); err != nil {
			return row{}, err
		}
	}
	before, err := tgt.sample()
	if err != nil {
		return row{}, err
	}
	start := time.Now()
	red, err := phaseOf(phase{Store: true, Duration: cfg.Duration, Record: true})
	wall := time.Since(start)
	if err != nil {
		return row{}, err
	}
	after, err := tgt.sample()
	if err != nil {
		return row{}, err
	}
	lat, perSec, calls := merge(red)
	if calls == 0 {
		return row{}, fmt.Errorf("no call ended in %v with the parts in Redis", cfg.Duration)
	}
	// The parts in memory at the rate Redis allowed, shared evenly: left
	// to run free, a closed loop in memory fills the cores, and its tail
	// is the scheduler's time slices, not the engine's work.
	paced := phase{Duration: cfg.Duration, Rate: perSec / float64(n)}
	if cfg.Warmup > 0 {
		if _, err := phaseOf(phase{Duration: cfg.Warmup, Rate: paced.Rate}); err != nil {
			return row{}, err
		}
	}
	paced.Record = true
	mem, err := phaseOf(paced)
	if err != nil {
		return row{}, err
	}
	for _, w := range ws {
		if err := w.close(); err != nil {
			return row{}, err
		}
	}

	r := row{Procs: n, Cluster: tgt.Cluster, Names: min(n, len(storeNames))}
	memLat, memPerSec, memCalls := merge(mem)
	r.MemCallsPerSec = memPerSec
	if err := failed(mem, "in memory"); err != nil {
		return row{}, err
	}
	if err := failed(red, "in Redis"); err != nil {
		return row{}, err
	}
	if memCalls == 0 {
		return row{}, fmt.Errorf("no call ended in %v with the parts in memory", cfg.Duration)
	}
	r.CallsPerSec = perSec
	// The nodes' counters summed: a cluster's CPU is its masters' together.
	var cpu float64
	var usec int64
	commands := map[string]int64{}
	for i := range after {
		c, cmds, u := after[i].since(before[i])
		cpu += c
		usec += u
		for name, k := range cmds {
			commands[name] += k
		}
		for name := range cmds {
			if strings.HasPrefix(name, "eval") {
				r.Masters++ // a node that ran the stores' scripts
				break
			}
		}
	}
	total := float64(calls)
	r.CPUPerCall = cpu / total * 1e6
	r.Busy = cpu / wall.Seconds()
	// commandstats counts the commands a script runs as well: those
	// that read and write keys are the scripts', the others the clients'.
	var sent int64
	var names []string
	for name, c := range commands {
		names = append(names, name)
		if clientCommand(name) {
			sent += c
		}
	}
	r.CommandsPerCall = float64(sent) / total
	r.UsecPerCall = float64(usec) / total
	slices.SortFunc(names, func(a, b string) int { return cmp.Or(cmp.Compare(commands[b], commands[a]), cmp.Compare(a, b)) })
	var list []string
	for _, name := range names {
		list = append(list, fmt.Sprintf("%s %.2f", strings.ToUpper(name), float64(commands[name])/total))
	}
	r.Commands = strings.Join(list, ", ")
	var trips int64
	for _, x := range red {
		trips += x.RoundTrips
		r.Failures += x.Failures
		r.Unasked += x.Unasked
	}
	r.RoundTripsPerCall = float64(trips) / total
	r.ClientCPUPerCall = cpuOf(red) / total * 1e6
	r.MemCPUPerCall = cpuOf(mem) / float64(memCalls) * 1e6
	r.P50Mem, r.P99Mem = percentile(memLat, 50), percentile(memLat, 99)
	r.P50, r.P99 = percentile(lat, 50), percentile(lat, 99)
	return r, nil
}

// cpuOf is the CPU seconds the workers used in a phase.
func cpuOf(rs []result) float64 {
	var s float64
	for _, r := range rs {
		s += r.CPU
	}
	return s
}

// clientCommand reports whether a command of INFO commandstats is one a
// client sends (scripts, and a connection's setup), not one a script runs.
func clientCommand(name string) bool {
	for _, prefix := range []string{"eval", "fcall", "script", "hello", "client", "ping", "select", "multi", "exec"} {
		if strings.HasPrefix(name, prefix) {
			return true
		}
	}
	return false
}

// merge returns the phase's latencies, sorted, its calls per second (the
// fleet's calls over the longest worker's time) and its calls.
func merge(rs []result) (lat []int64, perSec float64, calls int64) {
	var longest int64
	for _, r := range rs {
		lat = append(lat, r.Latencies...)
		calls += int64(r.Calls)
		longest = max(longest, r.Elapsed)
	}
	slices.Sort(lat)
	if longest > 0 {
		perSec = float64(calls) / (float64(longest) / 1e9)
	}
	return lat, perSec, calls
}

// failed reports the first failed call of a phase, or a call the fake API
// refused: either would make the figures those of something else.
func failed(rs []result, what string) error {
	for i, r := range rs {
		if r.Errors > 0 {
			return fmt.Errorf("worker %d: %d of %d calls with the parts %s failed, the first: %s", i, r.Errors, r.Calls, what, r.FirstError)
		}
		if r.Limited > 0 {
			return fmt.Errorf("worker %d: the fake API refused %d calls with the parts %s", i, r.Limited, what)
		}
	}
	return nil
}

// percentile is the p-th percentile of sorted, by the nearest rank.
func percentile(sorted []int64, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p/100*float64(len(sorted))+0.5) - 1
	return time.Duration(sorted[min(max(i, 0), len(sorted)-1)])
}

// worker is a client process seen from the parent.
type worker struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	results chan result
	done    chan error // the decoder's end: the process's output closed or unreadable
	stderr  *lockedBuffer
}

// lockedBuffer is a bytes.Buffer a process's output and its reader share.
// The root module's tests have one such (internal/syncbuf); this module
// keeps a copy of its own, as a module imports no other's internal
// packages.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what has been written so far.
func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startWorkers starts a copy of this executable as a worker for each job
// spec.
func startWorkers(specs []string) ([]*worker, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	var ws []*worker
	for i, spec := range specs {
		cmd := exec.Command(self)
		cmd.Env = append(os.Environ(), workerEnv+"="+spec)
		w := &worker{cmd: cmd, results: make(chan result, 1), done: make(chan error, 1), stderr: &lockedBuffer{}}
		cmd.Stderr = w.stderr
		if w.stdin, err = cmd.StdinPipe(); err == nil {
			var stdout io.ReadCloser
			if stdout, err = cmd.StdoutPipe(); err == nil {
				if err = cmd.Start(); err == nil {
					go w.read(stdout)
				}
			}
		}
		if err != nil {
			for _, w := range ws {
				w.kill()
			}
			return nil, fmt.Errorf("starting worker %d: %w", i, err)
		}
		ws = append(ws, w)
	}
	return ws, nil
}

func (w *worker) read(stdout io.Reader) {
	dec := json.NewDecoder(stdout)
	for {
		var r result
		if err := dec.Decode(&r); err != nil {
			w.done <- err
			return
		}
		w.results <- r
	}
}

func (w *worker) send(p phase) error {
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	if _, err := w.stdin.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("worker: %w; stderr:\n%s", err, w.stderr)
	}
	return nil
}

// await returns each worker's next result, failing if one ends or takes
// longer than within.
func await(ws []*worker, within time.Duration) ([]result, error) {
	timeout := time.After(within)
	rs := make([]result, len(ws))
	for i, w := range ws {
		select {
		case rs[i] = <-w.results:
		case err := <-w.done:
			return nil, fmt.Errorf("worker %d ended (%v); stderr:\n%s", i, err, w.stderr)
		case <-timeout:
			return nil, fmt.Errorf("worker %d: no result within %v; stderr:\n%s", i, within, w.stderr)
		}
	}
	return rs, nil
}

// close ends the worker's input and waits for it to exit.
func (w *worker) close() error {
	w.stdin.Close()
	if err := w.cmd.Wait(); err != nil {
		return fmt.Errorf("worker: %v; stderr:\n%s", err, w.stderr)
	}
	return nil
}

// kill ends a worker that is still running.
func (w *worker) kill() {
	if w.cmd.ProcessState == nil {
		_ = w.cmd.Process.Kill()
		_ = w.cmd.Wait()
	}
}

// writeTables prints the rows as Markdown: the table of the ceiling, and
// the latencies it is computed from.
func writeTables(w io.Writer, rows []row) {
	var one, cluster []row
	for _, r := range rows {
		if r.Cluster {
			cluster = append(cluster, r)
		} else {
			one = append(one, r)
		}
	}
	if len(cluster) == 0 {
		writeTable(w, one)
		return
	}
	fmt.Fprintln(w, "One Redis, one store Name per row:")
	fmt.Fprintln(w)
	writeTable(w, one)
	fmt.Fprintln(w)
	fmt.Fprintf(w, "Redis Cluster of %d masters, each row's processes split over %d store Names, one on each master "+
		"(Redis CPU and commands are the masters' together; a busy core above 100 %% is more than one master's):\n\n", clusterMasters, clusterMasters)
	writeTable(w, cluster)
}

// writeTable prints one target's rows.
func writeTable(w io.Writer, rows []row) {
	fmt.Fprintln(w, "| processes | calls/s | Redis CPU per call (µs) | Redis commands per call | round trips per call | Redis core busy | p50 added | p99 added |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rows {
		fmt.Fprintf(w, "| %d | %s | %.1f | %.2f | %.2f | %.0f %% | %s | %s |\n",
			r.Procs, thousands(r.CallsPerSec), r.CPUPerCall, r.CommandsPerCall, r.RoundTripsPerCall,
			100*r.Busy, added(r.P50-r.P50Mem), added(r.P99-r.P99Mem))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| processes | calls/s at one busy Redis core | Redis µs running the commands per call | client CPU per call, parts in Redis / in memory | calls/s, parts in memory (paced) | p50 / p99, parts in memory | p50 / p99, parts in Redis | store operations failed / not asked of Redis |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rows {
		fmt.Fprintf(w, "| %d | %s | %.1f | %s / %s | %s | %s / %s | %s / %s | %d / %d |\n",
			r.Procs, thousands(1e6/r.CPUPerCall), r.UsecPerCall, micros(time.Duration(r.ClientCPUPerCall*1e3)), micros(time.Duration(r.MemCPUPerCall*1e3)),
			thousands(r.MemCallsPerSec), micros(r.P50Mem), micros(r.P99Mem),
			micros(r.P50), micros(r.P99), r.Failures, r.Unasked)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Commands Redis ran per call (INFO commandstats, the scripts' own included):")
	fmt.Fprintln(w)
	for _, r := range rows {
		on := ""
		if r.Cluster {
			on = fmt.Sprintf(" on %s, %s", plural(r.Names, "store Name"), plural(r.Masters, "master"))
		}
		fmt.Fprintf(w, "- %s%s: %s\n", processes(r.Procs), on, r.Commands)
	}
}

func processes(n int) string {
	if n == 1 {
		return "1 process"
	}
	return strconv.Itoa(n) + " processes"
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return strconv.Itoa(n) + " " + what + "s"
}

func micros(d time.Duration) string { return thousands(float64(d.Microseconds())) + " µs" }

func added(d time.Duration) string {
	if d < 0 {
		return "−" + micros(-d)
	}
	return "+" + micros(d)
}

// thousands formats f rounded to a whole number, with commas.
func thousands(f float64) string {
	s := strconv.FormatInt(int64(f+0.5), 10)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// cores describes the machine's processors.
func cores() string {
	s := fmt.Sprintf("%d cores", runtime.NumCPU())
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				return s + " (" + strings.TrimSpace(v) + ")"
			}
		}
	}
	return s
}

// commit names the code measured: the repository's commit, and whether the
// work tree had changes.
func commit() string {
	out, err := exec.Command("git", "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return "unknown commit (git rev-parse failed)"
	}
	c := "commit " + strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(bytes.TrimSpace(st)) > 0 {
		c += ", with uncommitted changes"
	}
	return c
}
