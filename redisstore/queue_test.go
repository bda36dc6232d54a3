package redisstore_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/redistest"
	"github.com/damper-ai/damper-go/redisstore"
)

// startHook tells of each pipeline of scripts as it starts, once armed,
// and holds it until release is closed.
type startHook struct {
	started chan struct{}
	release chan struct{}
	armed   atomic.Bool
}

func (h *startHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *startHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *startHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if n := cmds[0].Name(); n != "evalsha" && n != "eval" || !h.armed.Load() {
			return next(ctx, cmds) // a connection's handshake, or not armed yet
		}
		select {
		case h.started <- struct{}{}:
		default:
		}
		<-h.release
		return next(ctx, cmds)
	}
}

// TestQueueDropsWhenFull: with a batch held in flight, the
// queue takes QueueLimit records and drops the others, counting them,
// without making the caller wait; once Redis goes on, Flush sends the
// queue and every record kept reaches Redis.
func TestQueueDropsWhenFull(t *testing.T) {
	srv := redistest.Start(t)
	hook := &startHook{started: make(chan struct{}, 1), release: make(chan struct{})}
	client := newClientWith(t, &redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true}, hook)
	store, err := redisstore.New(client, redisstore.Options{Name: "full", Timeout: time.Minute})
	mustNil(t, err)
	b, err := store.Budget(budgetSettings(0, 0, 0))
	mustNil(t, err)
	ctx := context.Background()
	_, err = b.Available(ctx, base) // loads the script
	mustNil(t, err)
	hook.armed.Store(true)

	mustNil(t, b.Observe(ctx, base, success))
	select {
	case <-hook.started: // the writer's batch is in flight, held
	case <-time.After(10 * time.Second):
		t.Fatal("no batch started")
	}
	dropped := 0
	for range redisstore.QueueLimit + 5 {
		if err := b.Observe(ctx, base, success); err != nil {
			if !strings.Contains(err.Error(), "dropped") {
				t.Fatalf("Observe on a full queue: %v, want one saying it was dropped", err)
			}
			dropped++
		}
	}
	if st := store.Stats(); dropped != 5 || st.Dropped != 5 || st.Failures != 0 {
		t.Fatalf("%d records dropped, stats %+v; want 5 dropped, no failure", dropped, st)
	}
	close(hook.release)
	mustNil(t, store.Flush(ctx))
	checkHash(t, client, redisstore.Key("full"), map[string]string{
		"w": fmt.Sprint(base.UnixNano() / int64(time.Minute)), "s": fmt.Sprint(1 + redisstore.QueueLimit), "u": "0",
	})
}

// TestDecisionsSeeOwnRecords: a decision runs after every record queued
// before it, whether the record is in flight, queued, or already sent.
func TestDecisionsSeeOwnRecords(t *testing.T) {
	srv := redistest.Start(t)
	for _, ctxTimeout := range []bool{true, false} {
		client := newClientWith(t, &redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: ctxTimeout})
		name := "own-" + map[bool]string{true: "ctx", false: "read"}[ctxTimeout]
		th := thrThrottle(t, thrStore(t, client, redisstore.Options{Name: name, Timeout: 10 * time.Second}), fleet.ThrottleSettings{MaxTokens: 1000, TokenRatio: 0.2})
		ctx := context.Background()
		want := int64(1_000_000)
		for i := range 300 {
			for range i % 4 {
				mustNil(t, th.Add(ctx, -7))
				want -= 7
			}
			if got, err := th.Tokens(ctx); got != want || err != nil {
				t.Fatalf("%s: Tokens after %d steps = %d, %v; want %d", name, i, got, err, want)
			}
		}
	}
}

// TestWriterEnds: the goroutine that sends the queue ends once the queue
// is empty; a store needs no Close.
func TestWriterEnds(t *testing.T) {
	srv := redistest.Start(t)
	before := goleak.IgnoreCurrent()
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	store, err := redisstore.New(client, redisstore.Options{Name: "ends"})
	mustNil(t, err)
	th, err := store.Throttle(fleet.ThrottleSettings{MaxTokens: 10, TokenRatio: 0.2})
	mustNil(t, err)
	ctx := context.Background()
	for range 50 {
		mustNil(t, th.Add(ctx, -1))
	}
	mustNil(t, store.Flush(ctx))
	if n, err := th.Tokens(ctx); n != 9950 || err != nil {
		t.Fatalf("Tokens = %d, %v; want 9950", n, err)
	}
	mustNil(t, client.Close())
	goleak.VerifyNone(t, before)
}
