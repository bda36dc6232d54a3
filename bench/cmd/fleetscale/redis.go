package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// server is the redis-server the command starts: no persistence, on a free
// loopback port, in a temporary directory of its own.
type server struct {
	Addr string
	cmd  *exec.Cmd
	dir  string
	rdb  *redis.Client // for INFO
}

// startRedis starts the server at bin ("" finds redis-server on the PATH)
// and waits until it answers PING.
func startRedis(bin string, extra ...string) (*server, error) {
	if bin == "" {
		var err error
		if bin, err = exec.LookPath("redis-server"); err != nil {
			return nil, fmt.Errorf("redis-server not found on the PATH (%w): on Debian or Ubuntu, apt-get install redis-server, or give -redis-server", err)
		}
	}
	addr, port, err := freePort(len(extra) > 0)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "fleetscale-redis")
	if err != nil {
		return nil, err
	}
	args := append([]string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--logfile", filepath.Join(dir, "redis.log"), "--daemonize", "no"}, extra...)
	cmd := exec.Command(bin, args...)
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	s := &server{Addr: addr, cmd: cmd, dir: dir, rdb: redis.NewClient(&redis.Options{Addr: addr})}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if s.rdb.Ping(context.Background()).Err() == nil {
			return s, nil
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
			s.stop()
			return nil, fmt.Errorf("redis-server on %s did not answer PING within 10s:\n%s", addr, log)
		}
	}
}

func (s *server) stop() {
	s.rdb.Close()
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	os.RemoveAll(s.dir)
}

// counters are the server's totals that a phase is measured by.
type counters struct {
	CPU      float64          // s: used_cpu_sys + used_cpu_user
	Commands map[string]int64 // calls of each command, INFO's own left out
	Usec     int64            // µs spent running the clients' commands (a script's time includes its commands')
}

// sample reads the counters from INFO cpu and INFO commandstats.
func (s *server) sample() (counters, error) {
	info, err := s.rdb.Info(context.Background(), "cpu", "commandstats").Result()
	if err != nil {
		return counters{}, fmt.Errorf("INFO: %w", err)
	}
	return parseInfo(info)
}

// parseInfo reads counters from INFO's text.
func parseInfo(info string) (counters, error) {
	c := counters{Commands: map[string]int64{}}
	var sys, user bool
	for line := range strings.SplitSeq(info, "\n") {
		key, value, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch {
		case key == "used_cpu_sys" || key == "used_cpu_user":
			f, err := strconv.ParseFloat(value, 64)
			if err != nil {
				return counters{}, fmt.Errorf("INFO cpu: %s is %q, not a number", key, value)
			}
			c.CPU += f
			sys, user = sys || key == "used_cpu_sys", user || key == "used_cpu_user"
		case strings.HasPrefix(key, "cmdstat_"):
			name := strings.TrimPrefix(key, "cmdstat_")
			if name == "info" {
				continue
			}
			fields := map[string]int64{}
			for f := range strings.SplitSeq(value, ",") {
				k, v, _ := strings.Cut(f, "=")
				if n, err := strconv.ParseInt(v, 10, 64); err == nil {
					fields[k] = n
				}
			}
			n, ok := fields["calls"]
			if !ok {
				return counters{}, fmt.Errorf("INFO commandstats: %s is %q, without its calls", key, value)
			}
			c.Commands[name] = n
			if clientCommand(name) {
				c.Usec += fields["usec"]
			}
		}
	}
	if !sys || !user {
		return counters{}, fmt.Errorf("INFO cpu has no used_cpu_sys or used_cpu_user:\n%s", info)
	}
	return c, nil
}

// since returns the CPU seconds, the commands of each kind and the µs
// spent running the clients' commands from o to c.
func (c counters) since(o counters) (cpu float64, commands map[string]int64, usec int64) {
	commands = map[string]int64{}
	for name, n := range c.Commands {
		if d := n - o.Commands[name]; d != 0 {
			commands[name] = d
		}
	}
	return c.CPU - o.CPU, commands, c.Usec - o.Usec
}

// version is the server's redis_version.
func (s *server) version() string {
	info, err := s.rdb.Info(context.Background(), "server").Result()
	if err != nil {
		return "unknown"
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			return v
		}
	}
	return "unknown"
}

// freePort finds a free loopback port, and with bus one whose cluster bus
// port (10000 above it) is free too.
func freePort(bus bool) (addr, port string, err error) {
	for range 50 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", "", err
		}
		p := l.Addr().(*net.TCPAddr).Port
		addr := l.Addr().String()
		if !bus {
			l.Close()
			return addr, strconv.Itoa(p), nil
		}
		if p+10000 <= 65535 {
			if b, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+10000)); err == nil {
				b.Close()
				l.Close()
				return addr, strconv.Itoa(p), nil
			}
		}
		l.Close()
	}
	return "", "", fmt.Errorf("no free loopback port with its cluster bus port free in 50 tries")
}

// target is what a row's fleet keeps its parts in: one redis-server, or
// the masters of a Redis Cluster.
type target struct {
	Cluster bool
	nodes   []*server
}

// startCluster starts a Redis Cluster of masters nodes, no replicas, each
// serving an even share of the slots, and waits until every node says the
// cluster is ok. It does what the root module's test helper
// redistest.StartCluster does, which needs a testing.TB and cannot serve a
// command.
func startCluster(bin string, masters int) (*target, error) {
	t := &target{Cluster: true}
	for range masters {
		s, err := startRedis(bin, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000")
		if err != nil {
			t.stop()
			return nil, err
		}
		t.nodes = append(t.nodes, s)
	}
	ctx := context.Background()
	fail := func(err error) (*target, error) { t.stop(); return nil, err }
	for i, n := range t.nodes {
		if err := n.rdb.Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err(); err != nil {
			return fail(fmt.Errorf("CLUSTER SET-CONFIG-EPOCH on %s: %w", n.Addr, err))
		}
		if err := n.rdb.ClusterAddSlotsRange(ctx, i*16384/masters, (i+1)*16384/masters-1).Err(); err != nil {
			return fail(fmt.Errorf("CLUSTER ADDSLOTS on %s: %w", n.Addr, err))
		}
	}
	meet := func() error {
		for i, from := range t.nodes {
			for j, n := range t.nodes {
				if i == j {
					continue
				}
				host, port, _ := net.SplitHostPort(n.Addr)
				if err := from.rdb.ClusterMeet(ctx, host, port).Err(); err != nil {
					return fmt.Errorf("CLUSTER MEET %s from %s: %w", n.Addr, from.Addr, err)
				}
			}
		}
		return nil
	}
	if err := meet(); err != nil {
		return fail(err)
	}
	lastMeet, deadline := time.Now(), time.Now().Add(30*time.Second)
	for i := 0; i < masters; {
		info, err := t.nodes[i].rdb.ClusterInfo(ctx).Result()
		if err == nil && strings.Contains(info, "cluster_state:ok") &&
			strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(masters)+"\r\n") {
			i++
			continue
		}
		if time.Since(lastMeet) > time.Second {
			if err := meet(); err != nil {
				return fail(err)
			}
			lastMeet = time.Now()
		}
		if time.Now().After(deadline) {
			return fail(fmt.Errorf("the cluster on %s is not ok after 30s: %v\n%s", t.nodes[i].Addr, err, info))
		}
		time.Sleep(20 * time.Millisecond)
	}
	return t, nil
}

// names returns a store Name for each master, base-0, base-1, ..., the
// first whose keys (their hash tag is the Name) land on that master.
func (t *target) names(base string) ([]string, error) {
	if !t.Cluster {
		return []string{base}, nil
	}
	masters := len(t.nodes)
	found := make([]string, masters)
	left := masters
	for k := 0; left > 0; k++ {
		if k > 10000 {
			return nil, fmt.Errorf("no store Name %s-k for every master in 10000 tries", base)
		}
		name := base + "-" + strconv.Itoa(k)
		slot, err := t.nodes[0].rdb.ClusterKeySlot(context.Background(), "damper:{"+name+"}:budget").Result()
		if err != nil {
			return nil, fmt.Errorf("CLUSTER KEYSLOT: %w", err)
		}
		m := masters - 1
		for m > 0 && int64(m*16384/masters) > slot {
			m--
		}
		if found[m] == "" {
			found[m] = name
			left--
		}
	}
	return found, nil
}

func (t *target) addrs() []string {
	var a []string
	for _, n := range t.nodes {
		a = append(a, n.Addr)
	}
	return a
}

// label names the target in the report.
func (t *target) label() string {
	if t.Cluster {
		return fmt.Sprintf("Redis Cluster, %d masters", len(t.nodes))
	}
	return "one Redis"
}

// sample reads each node's counters.
func (t *target) sample() ([]counters, error) {
	var cs []counters
	for _, n := range t.nodes {
		c, err := n.sample()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", n.Addr, err)
		}
		cs = append(cs, c)
	}
	return cs, nil
}

func (t *target) stop() {
	for _, n := range t.nodes {
		n.stop()
	}
}
