package main

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/damper-ai/damper-go/internal/redistest"
	"github.com/damper-ai/damper-go/internal/syncbuf"
)

// runAsDamperEnv, set to 1, makes the test binary run the damper command
// (see TestMain).
const runAsDamperEnv = "DAMPER_TEST_RUN_AS_DAMPER"

// processWait bounds a proxy process's start and its stop.
const processWait = 15 * time.Second

// proxyProcess is `damper proxy -config file` running as a process of its
// own: the test binary, run as the command.
type proxyProcess struct {
	name  string
	url   string // the API listener, http://127.0.0.1:port
	admin string // the admin listener's address, if any
	logs  *syncbuf.Buffer
	cmd   *exec.Cmd
	read  chan struct{} // closed when stderr is read to its end
}

// startProxyProcess writes config (YAML) to a file, starts the proxy on
// it with env added to the test's environment, and returns once it logs
// that it serves. The config should listen on 127.0.0.1:0: the address is
// read from the log line. At cleanup the process gets SIGTERM and must
// exit with status 0; its logs are shown when the test failed, and must
// not hold the clients' key.
func startProxyProcess(t *testing.T, name, config string, env ...string) *proxyProcess {
	t.Helper()
	path := filepath.Join(t.TempDir(), name+".yaml")
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	return startProxyArgs(t, name, []string{"-config", path}, env...)
}

// startProxyArgs is startProxyProcess with the command line's flags,
// args, rather than a file.
func startProxyArgs(t *testing.T, name string, args []string, env ...string) *proxyProcess {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p := &proxyProcess{name: name, logs: &syncbuf.Buffer{}, read: make(chan struct{})}
	p.cmd = exec.Command(exe, append([]string{"proxy"}, args...)...)
	p.cmd.Env = append(append(os.Environ(), runAsDamperEnv+"=1"), env...)
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	type serving struct{ listen, admin string }
	ready := make(chan serving, 1)
	go func() {
		defer close(p.read)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			p.logs.Write(append(sc.Bytes(), '\n'))
			var line struct {
				Msg    string `json:"msg"`
				Listen string `json:"listen"`
				Admin  string `json:"admin_listen"`
			}
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "damper proxy: serving" {
				select {
				case ready <- serving{line.Listen, line.Admin}:
				default:
				}
			}
		}
	}()
	exited := make(chan error, 1)
	go func() {
		<-p.read // Wait closes the pipe: read it whole first
		exited <- p.cmd.Wait()
	}()
	t.Cleanup(func() {
		select {
		case err := <-exited:
			exited <- err
		default:
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
		}
		var err error
		select {
		case err = <-exited:
		case <-time.After(processWait):
			_ = p.cmd.Process.Kill()
			err = <-exited
			t.Errorf("proxy %s did not stop within %v of SIGTERM", name, processWait)
		}
		if err != nil {
			t.Errorf("proxy %s: %v", name, err)
		}
		if strings.Contains(p.logs.String(), testKey) {
			t.Errorf("the key is in the logs of proxy %s", name)
		}
		if t.Failed() {
			t.Logf("logs of proxy %s:\n%s", name, p.logs)
		}
	})
	select {
	case s := <-ready:
		p.url, p.admin = "http://"+s.listen, s.admin
	case err := <-exited:
		exited <- err
		t.Fatalf("proxy %s exited at start (%v):\n%s", name, err, p.logs)
	case <-time.After(processWait):
		t.Fatalf("proxy %s did not serve within %v:\n%s", name, processWait, p.logs)
	}
	return p
}

// needRedis skips the test when redis-server is missing, unless
// DAMPER_REQUIRE_REDIS is set.
func needRedis(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("DAMPER_REQUIRE_REDIS") != "" {
			redistest.Binary(t) // fails, saying how to install it
		}
		t.Skip("redis-server is not installed (apt-get install redis-server): these tests run a real Redis")
	}
}

// needNode returns the path of node, skipping the test when Node or the
// TypeScript SDK is missing, unless DAMPER_REQUIRE_NODE is set.
func needNode(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if _, statErr := os.Stat(filepath.Join("testdata", "tsclient", "node_modules", "@anthropic-ai", "sdk")); err != nil || statErr != nil {
		msg := "the TypeScript SDK is not installed: run npm ci --prefix cmd/damper/testdata/tsclient (Node.js 20 or later)"
		if os.Getenv("DAMPER_REQUIRE_NODE") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return node
}
