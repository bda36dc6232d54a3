package redisstore_test

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/damper-ai/damper-go/internal/syncbuf"
)

// worker is a copy of the test binary running as a fleet member, seen
// from the test: it reads its orders on stdin and answers in lines on
// stdout.
type worker struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	stderr *syncbuf.Buffer // written as the worker runs
}

// startWorkers starts n copies of the test binary with args and env (the
// variable that makes a copy a worker, and its job), killed at the test's
// end.
func startWorkers(tb testing.TB, n int, env string, args ...string) []*worker {
	tb.Helper()
	workers := make([]*worker, n)
	for i := range workers {
		cmd := exec.Command(os.Args[0], args...)
		cmd.Env = append(os.Environ(), env)
		w := &worker{cmd: cmd, lines: make(chan string, 8), stderr: &syncbuf.Buffer{}}
		cmd.Stderr = w.stderr
		var err error
		if w.stdin, err = cmd.StdinPipe(); err != nil {
			tb.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			tb.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			tb.Fatalf("starting worker %d: %v", i, err)
		}
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				w.lines <- sc.Text()
			}
			close(w.lines)
		}()
		workers[i] = w
		tb.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}
	return workers
}

// next returns the rest of the worker's next line that begins with want.
// Lines that do not are the test framework's, and skipped; it fails the
// test if the worker ends, or says nothing for 60 s, first.
func (w *worker) next(tb testing.TB, want string) string {
	tb.Helper()
	for {
		select {
		case line, ok := <-w.lines:
			if !ok {
				tb.Fatalf("worker ended before %q; stderr:\n%s", want, w.stderr)
			}
			if rest, found := strings.CutPrefix(line, want); found {
				return rest
			}
		case <-time.After(60 * time.Second):
			tb.Fatalf("worker: no %q within 60s; stderr:\n%s", want, w.stderr)
		}
	}
}

// sendAll writes line to every worker.
func sendAll(tb testing.TB, workers []*worker, line string) {
	tb.Helper()
	for _, w := range workers {
		if _, err := io.WriteString(w.stdin, line+"\n"); err != nil {
			tb.Fatal(err)
		}
	}
}

// wait waits for the worker to exit, failing the test if it failed.
func (w *worker) wait(tb testing.TB) {
	tb.Helper()
	if err := w.cmd.Wait(); err != nil {
		tb.Fatalf("worker: %v; stderr:\n%s", err, w.stderr)
	}
}
