package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/damper-ai/damper-go/internal/redistest"
	"github.com/damper-ai/damper-go/internal/syncbuf"
	"github.com/damper-ai/damper-go/redisstore"
)

// cutHook holds the first pipeline of scripts until release is closed,
// and arms cut for the second: its connection is cut after Redis has
// answered all n of its commands, the client having read half.
type cutHook struct {
	cut      *redistest.Cutter
	n        int
	pipes    int
	started  chan struct{}
	release  chan struct{}
	attempts int // pipelines the second Exec's commands went out in
}

func (h *cutHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *cutHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *cutHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if n := cmds[0].Name(); n != "evalsha" && n != "eval" {
			return next(ctx, cmds) // a connection's handshake
		}
		h.pipes++ // one writer at a time
		switch h.pipes {
		case 1:
			h.started <- struct{}{}
			<-h.release
		case 2:
			h.cut.CutAfter(h.n)
		}
		return next(ctx, cmds)
	}
}

// TestCutBatchAppliedOnce: a connection cut in the middle of the replies
// to a batch of records, after Redis ran it (as a failover's reset does).
// With the client's retries off, as the store asks, the batch fails once,
// the store falls back, and Redis's books hold each record once. With
// go-redis's default retries the batch is sent again and Redis counts
// each of its records twice: the reason for one retry layer.
func TestCutBatchAppliedOnce(t *testing.T) {
	srv := redistest.Start(t)
	const k = 20
	window := fmt.Sprint(base.UnixNano() / int64(time.Minute))
	for _, tc := range []struct {
		name      string
		retries   int
		successes int
		state     redisstore.State
	}{
		{"retries-off", -1, 1 + k, redisstore.StateFallback},
		{"go-redis-default", 0, 1 + 2*k, redisstore.StateShared},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cut := redistest.NewCutter(t, srv.Addr)
			hook := &cutHook{cut: cut, n: k, started: make(chan struct{}, 1), release: make(chan struct{})}
			client := newClientWith(t, &redis.Options{Addr: cut.Addr, ContextTimeoutEnabled: true, MaxRetries: tc.retries, PoolSize: 1}, hook)
			name := "cut-" + tc.name
			store, err := redisstore.New(client, redisstore.Options{Name: name, Timeout: 10 * time.Second})
			mustNil(t, err)
			b, err := store.Budget(budgetSettings(0, 0, 0))
			mustNil(t, err)
			ctx := context.Background()
			_, err = b.Available(ctx, base) // the window's books, and a connection
			mustNil(t, err)

			mustNil(t, b.Observe(ctx, base, success))
			select {
			case <-hook.started: // the first batch, of one record, held
			case <-time.After(10 * time.Second):
				t.Fatal("no batch started")
			}
			for range k { // the second batch
				mustNil(t, b.Observe(ctx, base, success))
			}
			close(hook.release)
			mustNil(t, store.Flush(ctx))
			if cut.Cuts() != 1 || hook.pipes != 2 {
				t.Fatalf("%d connections cut, %d pipelines; want 1 cut in the second of 2", cut.Cuts(), hook.pipes)
			}
			direct := newClientWith(t, &redis.Options{Addr: srv.Addr})
			checkHash(t, direct, redisstore.Key(name), map[string]string{"w": window, "s": fmt.Sprint(tc.successes), "u": "0"})
			if st := store.State(); st != tc.state {
				t.Errorf("state %v, want %v", st, tc.state)
			}
		})
	}
}

// TestRetriesWarned: a store given a client that retries says so, once,
// naming the client's MaxRetries; one on a client with retries off says
// nothing.
func TestRetriesWarned(t *testing.T) {
	for _, tc := range []struct {
		retries int
		want    string
	}{
		{0, "max_retries=3"},
		{5, "max_retries=5"},
		{-1, ""},
	} {
		logs := &syncbuf.Buffer{}
		client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: tc.retries})
		_, err := redisstore.New(client, redisstore.Options{Name: "warned", Logger: slog.New(slog.NewTextHandler(logs, nil))})
		mustNil(t, err)
		client.Close()
		got := logs.String()
		switch {
		case tc.want == "" && got != "":
			t.Errorf("MaxRetries %d: %s, want no line", tc.retries, got)
		case tc.want != "" && (strings.Count(got, "\n") != 1 || !strings.Contains(got, "MaxRetries: -1") ||
			!strings.Contains(got, tc.want) || !strings.Contains(got, "store=warned")):
			t.Errorf("MaxRetries %d: %q, want one line with %s", tc.retries, got, tc.want)
		}
	}
}

// TestProbe: a store whose Redis was never reached falls back at its
// first Probe, at once; a Probe once Redis is up brings it back, and the
// records it queues then reach Redis, the fallback's charge ahead of them.
func TestProbe(t *testing.T) {
	srv := redistest.Start(t)
	srv.Kill()
	logs := &syncbuf.Buffer{}
	client := newClientWith(t, &redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	store, err := redisstore.New(client, redisstore.Options{Name: "probed", Timeout: time.Second, ProbeInterval: time.Nanosecond,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	mustNil(t, err)
	ctx := context.Background()
	var op *net.OpError
	if err := store.Probe(ctx); err == nil || !strings.Contains(err.Error(), `redisstore: Probe on "probed": `) || !errors.As(err, &op) {
		t.Fatalf("Probe with Redis down: %v, want a dial error", err)
	}
	if st := store.Stats(); st.State != redisstore.StateFallback || st.Fallbacks != 1 || st.Failures != 1 {
		t.Fatalf("after a failed Probe: %+v", st)
	}
	b, err := store.Budget(budgetSettings(0, 0, 0))
	mustNil(t, err)
	if err := b.Observe(ctx, base, success); err == nil {
		t.Fatal("Observe in the fallback: no error, want one saying Redis was not asked")
	}

	srv.Restart()
	mustNil(t, store.Probe(ctx))
	if st := store.Stats(); st.State != redisstore.StateShared || st.Recoveries != 1 {
		t.Fatalf("after Probe with Redis up: %+v", st)
	}
	mustNil(t, b.Observe(ctx, base, success))
	mustNil(t, store.Flush(ctx))
	// The success counted in the fallback is charged with it.
	checkHash(t, client, redisstore.Key("probed"), map[string]string{"w": fmt.Sprint(base.UnixNano() / int64(time.Minute)), "s": "2", "u": "0"})
	mustNil(t, store.Probe(ctx)) // shared: a PING, nothing moves
	if st := store.Stats(); st.State != redisstore.StateShared || st.Fallbacks != 1 || st.Recoveries != 1 {
		t.Fatalf("after Probe on a shared store: %+v", st)
	}
	if n := strings.Count(logs.String(), "\n"); n != 2 {
		t.Errorf("%d log lines, want 2 (one switch each way):\n%s", n, logs)
	}
}
