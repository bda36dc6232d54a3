package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/damper-ai/damper-go"
)

// contender is one way to reach the fake API: straight, or through a proxy
// process.
type contender struct {
	name string
	base string       // the URL calls go to
	pids func() []int // the processes whose CPU and memory count; nil: none
}

// damperRun is a damper proxy contender: its -contenders key, its name
// and its policy.
type damperRun struct {
	key, name string
	policy    damper.Policy
}

// result is one measurement of one contender.
type result struct {
	rps        float64 // calls per second
	calls      int     // calls measured, over every batch
	cpuPerCall float64 // µs of the contender's CPU per call
	cpuTicks   int64   // the CPU measured, in /proc's ticks (clockTick)
	rss        float64 // MB, at the end
	p50, p99   time.Duration
	failed     int
}

// key names a measurement: contender, call kind and client count.
type key struct {
	contender, kind string
	clients         int
}

// run starts the processes, measures, and prints the tables to out.
func run(cfg config, out, log io.Writer) error {
	dir, err := os.MkdirTemp("", "proxycost-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var procs []*exec.Cmd
	defer func() {
		for _, p := range procs {
			_ = p.Process.Kill()
			_ = p.Wait()
		}
	}()
	start := func(name string, args ...string) (*exec.Cmd, error) {
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Stdout, cmd.Stderr = nil, nil // to /dev/null: a proxy's log lines are part of its cost
		if err := cmd.Start(); err != nil {
			return nil, fmt.Errorf("starting %s: %w", name, err)
		}
		procs = append(procs, cmd)
		return cmd, nil
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}

	apiAddr := freeAddr()
	if _, err := start(self, "-role", "api", "-listen", apiAddr); err != nil {
		return err
	}
	api := "http://" + apiAddr
	contenders := []contender{{name: "direct", base: api}}

	if path := nginxPath(cfg.Nginx); !cfg.runs("nginx") {
	} else if path != "" {
		addr := freeAddr()
		if err := writeNginxConf(dir, addr, apiAddr); err != nil {
			return err
		}
		cmd, err := start(path, "-p", dir, "-c", filepath.Join(dir, "nginx.conf"), "-e", filepath.Join(dir, "error.log"), "-g", "daemon off;")
		if err != nil {
			return err
		}
		master := cmd.Process.Pid
		contenders = append(contenders, contender{name: "nginx", base: "http://" + addr, pids: func() []int { return withChildren(master) }})
	} else {
		fmt.Fprintln(log, "proxycost: nginx not found: its row is left out (apt-get install nginx)")
	}

	if cfg.runs("bare") {
		addr := freeAddr()
		bare, err := start(self, "-role", "bare", "-listen", addr, "-upstream", api)
		if err != nil {
			return err
		}
		contenders = append(contenders, contender{name: "bare Go proxy", base: "http://" + addr, pids: pidsOf(bare)})
	}

	dampers := slices.DeleteFunc([]damperRun{
		{"damper-zero", "damper proxy, zero policy", damper.Policy{}},
		{"damper-recommended", "damper proxy, recommended", damper.RecommendedPolicy()},
	}, func(d damperRun) bool { return !cfg.runs(d.key) })
	bin := cfg.Damper
	if bin == "" && len(dampers) > 0 {
		bin = filepath.Join(dir, "damper")
		build := exec.Command("go", "build", "-trimpath", "-o", bin, "./cmd/damper")
		build.Dir, build.Stdout, build.Stderr = cfg.Repo, log, log
		if err := build.Run(); err != nil {
			return fmt.Errorf("building damper in %s: %w", cfg.Repo, err)
		}
	}
	for _, p := range dampers {
		addr := freeAddr()
		file := filepath.Join(dir, fmt.Sprintf("damper-%d.json", len(contenders)))
		if err := writeDamperConf(file, addr, api, p.policy); err != nil {
			return err
		}
		cmd, err := start(bin, "proxy", "-config", file)
		if err != nil {
			return err
		}
		contenders = append(contenders, contender{name: p.name, base: "http://" + addr, pids: pidsOf(cmd)})
	}
	for _, c := range contenders {
		if err := waitUp(c.base); err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
	}

	results := map[key][]result{}
	// Each cell (call kind, client count) runs every contender one after
	// the other, so that the ratios of a round (pairedRatio) compare
	// measurements seconds apart.
	for round := range cfg.Rounds {
		for _, kind := range cfg.Kinds {
			for _, n := range cfg.Clients {
				for i := range contenders {
					c := contenders[(i+round)%len(contenders)]
					r, err := measure(c, kind, n, cfg.Warmup, cfg.Requests, cfg.Batches)
					if err != nil {
						return fmt.Errorf("%s, %s, %d clients: %w", c.name, kind, n, err)
					}
					results[key{c.name, kind, n}] = append(results[key{c.name, kind, n}], r)
					fmt.Fprintf(log, "round %d: %-28s %-6s %3d clients: %8.0f calls/s, %6.1f µs CPU/call\n", round+1, c.name, kind, n, r.rps, r.cpuPerCall)
					if c.pids != nil && r.cpuTicks < minTicks {
						fmt.Fprintf(log, "proxycost: %s measured %d ticks of CPU (10 ms each): its CPU per call is within ±%.0f %% at best; ask more -requests\n",
							c.name, r.cpuTicks, 100/float64(max(r.cpuTicks, 1)))
					}
				}
			}
		}
	}
	names := make([]string, len(contenders))
	for i, c := range contenders {
		names[i] = c.name
	}
	printTables(out, cfg, names, results)
	return nil
}

// freeAddr is a loopback address with a port free now.
func freeAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err) // no loopback port at all: nothing here can run
	}
	defer ln.Close()
	return ln.Addr().String()
}

// waitUp waits until base answers HTTP, for up to 60 s.
func waitUp(base string) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		res, err := http.Get(base + "/healthz")
		if err == nil {
			res.Body.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not answering at %s after 60 s: %w", base, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// nginxPath is the nginx to run: given, or found; "" for none.
func nginxPath(given string) string {
	switch given {
	case "-":
		return ""
	case "":
		if p, err := exec.LookPath("nginx"); err == nil {
			return p
		}
		if _, err := os.Stat("/usr/sbin/nginx"); err == nil {
			return "/usr/sbin/nginx"
		}
		return ""
	}
	return given
}

// writeNginxConf writes a plain reverse proxy to api: as many workers as
// CPUs, keep-alive to the upstream (256 idle), no buffering (streams pass
// as they come), an access log line per request to /dev/null, as damper's
// log line goes.
func writeNginxConf(dir, listen, api string) error {
	conf := `worker_processes auto;
pid nginx.pid;
events { worker_connections 4096; }
http {
	access_log /dev/null;
	client_body_temp_path tmp;
	proxy_temp_path tmp;
	upstream api { server ` + api + `; keepalive 256; }
	server {
		listen ` + listen + `;
		location / {
			proxy_pass http://api;
			proxy_http_version 1.1;
			proxy_set_header Connection "";
			proxy_buffering off;
		}
	}
}
`
	if err := os.MkdirAll(filepath.Join(dir, "tmp"), 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "nginx.conf"), []byte(conf), 0o644)
}

// writeDamperConf writes a damper proxy file: listen, upstream and policy.
func writeDamperConf(file, listen, api string, p damper.Policy) error {
	policy, err := p.MarshalJSON()
	if err != nil {
		return err
	}
	b, err := json.Marshal(map[string]any{"listen": listen, "upstream": api, "policy": json.RawMessage(policy)})
	if err != nil {
		return err
	}
	return os.WriteFile(file, b, 0o600)
}

// pidsOf is the process of cmd.
func pidsOf(cmd *exec.Cmd) func() []int {
	return func() []int { return []int{cmd.Process.Pid} }
}

// withChildren is pid and its children: nginx's master and workers.
func withChildren(pid int) []int {
	out := []int{pid}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if child, ok := parsePid(e.Name()); ok && parentOf(child) == pid {
			out = append(out, child)
		}
	}
	return out
}

var errNoProc = errors.New("no /proc: CPU and memory are read from Linux's /proc")

// median is the median of xs.
func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// label is a contender's name for a table.
func label(name string) string { return strings.ReplaceAll(name, "|", "/") }
