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
func startRedis(bin string) (*server, error) {
	if bin == "" {
		var err error
		if bin, err = exec.LookPath("redis-server"); err != nil {
			return nil, fmt.Errorf("redis-server not found on the PATH (%w): on Debian or Ubuntu, apt-get install redis-server, or give -redis-server", err)
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	dir, err := os.MkdirTemp("", "fleetscale-redis")
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--logfile", filepath.Join(dir, "redis.log"), "--daemonize", "no")
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
