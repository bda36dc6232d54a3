// Package redistest starts real redis-server processes for tests, on free
// loopback ports, each in its own temporary directory, and stops them when
// the test ends.
package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// readyWithin bounds a server's start: a fresh redis-server answers within
// milliseconds.
const readyWithin = 10 * time.Second

// Binary returns the path of redis-server, failing the test with how to
// install it when it is missing: these tests need a real server.
func Binary(t testing.TB) string {
	t.Helper()
	path, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server not found in PATH (%v): these tests run a real Redis; install it, on Debian or Ubuntu with `sudo apt-get update && sudo apt-get install -y redis-server`", err)
	}
	return path
}

// Server is one redis-server process.
type Server struct {
	Addr string // 127.0.0.1:port
	Port int

	t    testing.TB
	bin  string
	dir  string
	args []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// Start starts a redis-server with no persistence on a free loopback port
// and waits until it answers PING; extra arguments are passed to it. The
// server is killed when the test ends.
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	return start(t, freePort(t, false), extra...)
}

func start(t testing.TB, port int, extra ...string) *Server {
	t.Helper()
	s := &Server{
		Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		Port: port,
		t:    t,
		bin:  Binary(t),
		dir:  t.TempDir(),
	}
	s.args = append([]string{
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--dir", s.dir, "--logfile", "redis.log", "--loglevel", "notice",
		"--save", "", "--appendonly", "no", "--daemonize", "no",
	}, extra...)
	t.Cleanup(s.Kill)
	s.Restart()
	return s
}

// Restart starts the server again on its port, after Kill, and waits until
// it answers PING. A server without persistence comes back empty.
func (s *Server) Restart() {
	s.t.Helper()
	s.mu.Lock()
	if s.cmd != nil {
		s.mu.Unlock()
		s.t.Fatalf("redistest: Restart of %s: the server is running", s.Addr)
	}
	cmd := exec.Command(s.bin, s.args...)
	cmd.Dir = s.dir
	if err := cmd.Start(); err != nil {
		s.mu.Unlock()
		s.t.Fatalf("redistest: starting %s %s: %v", s.bin, strings.Join(s.args, " "), err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()

	deadline := time.Now().Add(readyWithin)
	for !ping(s.Addr) {
		select {
		case <-done:
			s.t.Fatalf("redistest: redis-server on %s exited at start:\n%s", s.Addr, s.Log())
		default:
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("redistest: redis-server on %s did not answer PING within %v:\n%s", s.Addr, readyWithin, s.Log())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Kill kills the server at once (SIGKILL, as a crash would) and waits for
// it to exit. It does nothing if the server is not running.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGCONT) // a paused server dies too
	_ = s.cmd.Process.Kill()
	<-s.done
	s.cmd, s.done = nil, nil
}

// Pause stops the server (SIGSTOP): connections are still accepted by the
// kernel, and nothing is answered, as with a server that hangs.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig os.Signal) {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		s.t.Fatalf("redistest: signal %v to %s: the server is not running", sig, s.Addr)
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("redistest: signal %v to %s: %v", sig, s.Addr, err)
	}
}

// Log returns the server's log file.
func (s *Server) Log() string {
	b, err := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	return string(b)
}

// StartCluster starts a Redis Cluster of masters servers with no replicas,
// the 16384 slots split evenly between them, and waits until every node
// reports the cluster ok.
func StartCluster(t testing.TB, masters int) []*Server {
	t.Helper()
	if masters < 1 {
		t.Fatalf("redistest: StartCluster(%d): at least one master is required", masters)
	}
	nodes := make([]*Server, masters)
	for i := range nodes {
		// The cluster bus listens on port + 10000, which must be free too.
		nodes[i] = start(t, freePort(t, true),
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "5000")
	}
	for i, n := range nodes {
		lo, hi := i*16384/masters, (i+1)*16384/masters-1
		if _, err := command(n.Addr, "CLUSTER", "SET-CONFIG-EPOCH", strconv.Itoa(i+1)); err != nil {
			t.Fatalf("redistest: CLUSTER SET-CONFIG-EPOCH on %s: %v", n.Addr, err)
		}
		if err := addSlots(n.Addr, lo, hi); err != nil {
			t.Fatalf("redistest: assigning slots %d to %d to %s: %v", lo, hi, n.Addr, err)
		}
	}
	// Each node meets every other: a handshake that fails is then made
	// again, and the meetings are sent again while the cluster is not ok.
	meet := func() {
		for i, from := range nodes {
			for j, n := range nodes {
				if i == j {
					continue
				}
				if _, err := command(from.Addr, "CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(n.Port)); err != nil {
					t.Fatalf("redistest: CLUSTER MEET %s from %s: %v", n.Addr, from.Addr, err)
				}
			}
		}
	}
	meet()
	lastMeet := time.Now()
	deadline := time.Now().Add(readyWithin)
	for i := 0; i < masters; {
		info, err := command(nodes[i].Addr, "CLUSTER", "INFO")
		if err == nil && strings.Contains(info, "cluster_state:ok") &&
			strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(masters)+"\r\n") {
			i++
			continue
		}
		if time.Since(lastMeet) > time.Second {
			meet()
			lastMeet = time.Now()
		}
		if time.Now().After(deadline) {
			var views strings.Builder
			for _, n := range nodes {
				view, _ := command(n.Addr, "CLUSTER", "NODES")
				fmt.Fprintf(&views, "CLUSTER NODES on %s:\n%s\n", n.Addr, view)
			}
			t.Fatalf("redistest: the cluster on %s is not ok after %v: %v\n%s\n%s", nodes[i].Addr, readyWithin, err, info, views.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nodes
}

// addSlots assigns the slots lo to hi to the node on addr: by CLUSTER
// ADDSLOTSRANGE, or, on a server older than Redis 7.0 (the redis-server
// of Debian 11 or Ubuntu 22.04), by CLUSTER ADDSLOTS with every slot.
func addSlots(addr string, lo, hi int) error {
	_, err := command(addr, "CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(lo), strconv.Itoa(hi))
	if err == nil || !strings.Contains(strings.ToLower(err.Error()), "unknown subcommand") {
		return err
	}
	args := []string{"CLUSTER", "ADDSLOTS"}
	for slot := lo; slot <= hi; slot++ {
		args = append(args, strconv.Itoa(slot))
	}
	_, err = command(addr, args...)
	return err
}

// Addrs returns the servers' addresses.
func Addrs(servers []*Server) []string {
	addrs := make([]string, len(servers))
	for i, s := range servers {
		addrs[i] = s.Addr
	}
	return addrs
}

// ping reports whether a server on addr answers PING.
func ping(addr string) bool {
	reply, err := command(addr, "PING")
	return err == nil && reply == "PONG"
}

// command sends one command to the server on addr, on a connection of its
// own, and returns its reply: a status or a bulk string, or a Redis error.
// The package speaks the protocol itself, for these few administrative
// commands, so that the module it lives in needs no Redis client.
func command(addr string, args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	var req strings.Builder
	fmt.Fprintf(&req, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&req, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(c, req.String()); err != nil {
		return "", err
	}
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimSuffix(line, "\r\n")
	switch {
	case strings.HasPrefix(line, "+"):
		return line[1:], nil
	case strings.HasPrefix(line, "-"):
		return "", errors.New(line[1:])
	case strings.HasPrefix(line, "$"):
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", fmt.Errorf("reply %q: not a bulk string", line)
		}
		body := make([]byte, n+2)
		if _, err := io.ReadFull(r, body); err != nil {
			return "", err
		}
		return string(body[:n]), nil
	}
	return "", fmt.Errorf("reply %q: not a status, an error or a bulk string", line)
}

// freePort returns a loopback port nothing listens on; with bus, port +
// 10000 is free as well.
func freePort(t testing.TB, bus bool) int {
	t.Helper()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("redistest: no free loopback port: %v", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !bus {
			return port
		}
		if port+10000 > 65535 {
			continue
		}
		if b, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+10000))); err == nil {
			b.Close()
			return port
		}
	}
	t.Fatalf("redistest: no free loopback port with a free cluster bus port")
	return 0
}
