package redisstore_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/damper-ai/damper-go/fleet"
	"github.com/redis/go-redis/v9"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
	"github.com/damper-ai/damper-go/internal/redistest"
	"github.com/damper-ai/damper-go/internal/syncbuf"
	"github.com/damper-ai/damper-go/redisstore"
)

// recoveryTimeout is the store's timeout in these tests: long enough that
// a loaded machine's pauses do not pass for Redis failing.
const recoveryTimeout = 200 * time.Millisecond

// heldKey marks the context of an operation that holdHook holds.
type heldKey struct{}

// holdHook counts the scripts sent to Redis, and while on holds those
// whose context carries heldKey until their context ends, unsent: the
// operation then fails by its timeout while Redis answers the others.
type holdHook struct {
	on      atomic.Bool
	scripts atomic.Int64
}

func (h *holdHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *holdHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "evalsha" || cmd.Name() == "eval" {
			h.scripts.Add(1)
		}
		if h.on.Load() && ctx.Value(heldKey{}) != nil {
			<-ctx.Done()
			cmd.SetErr(ctx.Err())
			return ctx.Err()
		}
		return next(ctx, cmd)
	}
}
func (h *holdHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if cmd.Name() == "evalsha" || cmd.Name() == "eval" {
				h.scripts.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}

// recoveryClient returns a client of the kind ctxTimeout says; one that
// waits by its ReadTimeout waits no longer than the store's timeout, and
// does not try again, so that a round trip the store gave up on ends soon
// after.
func recoveryClient(t *testing.T, addr string, ctxTimeout bool, hook redis.Hook) *redis.Client {
	o := &redis.Options{Addr: addr, ContextTimeoutEnabled: ctxTimeout, MaxRetries: -1}
	if !ctxTimeout {
		o.ReadTimeout, o.WriteTimeout = recoveryTimeout, recoveryTimeout
	}
	return newClientWith(t, o, hook)
}

// waitState polls s until it is in state want, failing the test after
// within.
func waitState(t *testing.T, s *redisstore.Store, want redisstore.State, within time.Duration, poll func()) {
	t.Helper()
	deadline := time.Now().Add(within)
	for s.State() != want {
		if time.Now().After(deadline) {
			t.Fatalf("not %v within %v: stats %+v", want, within, s.Stats())
		}
		poll()
		time.Sleep(2 * time.Millisecond)
	}
}

// TestOneSwitchPerOutage stops Redis (SIGSTOP) under a steady flow of
// operations, and lets it go on again: the store falls back once, and
// comes back once, and stays. After Redis is back, some operations still
// fail by their timeout while Redis answers the others (a hook holds them,
// as a connection the outage left stuck, or a queue behind the burst of
// callers coming back, would): those are failures of the operation, not of
// Redis, and switch nothing.
func TestOneSwitchPerOutage(t *testing.T) {
	eachClientKind(t, func(t *testing.T, ctxTimeout bool) {
		srv := redistest.Start(t)
		hook := &holdHook{}
		logs := &syncbuf.Buffer{}
		s, err := redisstore.New(recoveryClient(t, srv.Addr, ctxTimeout, hook), redisstore.Options{
			Name: "flap", Timeout: recoveryTimeout, Logger: slog.New(slog.NewTextHandler(logs, nil)),
		})
		mustNil(t, err)
		b, err := s.Budget(fleet.BudgetSettings{Ratio: 0.1, Window: time.Minute, MinTokens: 10})
		mustNil(t, err)
		ctx := context.Background()
		_, _ = b.Available(ctx, base) // loads the script

		// The steady flow: one operation every couple of milliseconds.
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, _ = b.Available(ctx, base)
				time.Sleep(2 * time.Millisecond)
			}
		})
		defer func() { close(stop); wg.Wait() }()

		srv.Pause()
		waitState(t, s, redisstore.StateFallback, 10*recoveryTimeout, func() {})
		time.Sleep(3 * recoveryTimeout) // a few probes fail
		srv.Resume()
		waitState(t, s, redisstore.StateShared, 10*recoveryTimeout, func() {})

		hook.on.Store(true)
		held := context.WithValue(ctx, heldKey{}, true)
		for range 3 {
			if _, err := b.Available(held, base); err == nil {
				t.Fatal("an operation held past its timeout returned no error")
			}
		}
		hook.on.Store(false)
		time.Sleep(recoveryTimeout)

		st := s.Stats()
		if st.State != redisstore.StateShared || st.Fallbacks != 1 || st.Recoveries != 1 {
			t.Fatalf("stats %+v: want shared, after one fallback and one recovery", st)
		}
		if lines := logs.Lines(); len(lines) != 2 {
			t.Fatalf("log lines:\n%s\nwant one at the fallback and one at the return", strings.Join(lines, "\n"))
		}
	})
}

// TestOneTimeoutPerCall makes calls through a Damper whose every part
// lives in Redis while Redis is stopped (SIGSTOP): each call sends at most
// one operation to Redis, and so waits out at most one timeout; the
// others decide at once, on state kept in memory. Once Redis goes on, the
// calls are shared again, every operation asking Redis.
func TestOneTimeoutPerCall(t *testing.T) {
	eachClientKind(t, func(t *testing.T, ctxTimeout bool) {
		srv := redistest.Start(t)
		hook := &holdHook{}
		s, err := redisstore.New(recoveryClient(t, srv.Addr, ctxTimeout, hook), redisstore.Options{Name: "per-call", Timeout: recoveryTimeout})
		mustNil(t, err)
		api := dampertest.NewServer(dampertest.InMemory(),
			dampertest.WithRateLimits(dampertest.RateLimits{RequestsPerMinute: 1_000_000}))
		defer api.Close()
		d, err := damper.New(allParts(), damper.WithStore(s), damper.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
		mustNil(t, err)
		c := anthropic.NewClient(append([]option.RequestOption{d.Option()}, api.Options()...)...)
		params := anthropic.MessageNewParams{Model: "claude-sonnet-4-6", MaxTokens: 100,
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}}
		ctx := context.Background()
		// call makes one call and returns the operations it sent to Redis.
		call := func() int64 {
			t.Helper()
			before := hook.scripts.Load()
			start := time.Now()
			if _, err := c.Messages.New(ctx, params); err != nil {
				t.Fatal(err)
			}
			mustNil(t, s.Flush(ctx)) // the call's records count as its own
			n := hook.scripts.Load() - before
			if n > 0 && s.State() == redisstore.StateFallback {
				t.Logf("a call that asked Redis %d times took %v", n, time.Since(start))
			}
			return n
		}
		for range 2 {
			call() // loads the scripts
		}
		// 7 operations; the limiter's Observe and Settle go as one script
		// when the second finds the first queued still.
		if n := call(); n != 7 && n != 6 {
			t.Fatalf("a call with Redis up asked it %d times, want 7 (or 6)", n)
		}

		srv.Pause()
		asked := 0 // calls that asked Redis, each once
		deadline := time.Now().Add(20 * recoveryTimeout)
		for i := 0; asked < 3; i++ {
			if time.Now().After(deadline) {
				t.Fatalf("only %d of %d calls asked Redis while it was stopped: stats %+v", asked, i, s.Stats())
			}
			switch n := call(); {
			case n > 1:
				t.Fatalf("call %d with Redis stopped asked it %d times, want at most once: stats %+v", i, n, s.Stats())
			case n == 1:
				asked++
			}
			time.Sleep(time.Millisecond)
		}
		if st := s.Stats(); st.State != redisstore.StateFallback || st.Fallbacks != 1 || st.Unasked == 0 {
			t.Fatalf("stats with Redis stopped %+v", st)
		}

		srv.Resume()
		waitState(t, s, redisstore.StateShared, 10*recoveryTimeout, func() { call() })
		if n := call(); n != 7 && n != 6 {
			t.Fatalf("a call with Redis back asked it %d times, want 7 (or 6)", n)
		}
	})
}

// TestProbesSpaced: while Redis is stopped, an operation asks it only
// when no probe is in flight and the last one ended at least a probe
// interval ago, so that a caller making one operation after another (with
// no call's context to mark its earlier failure) is not held by a probe on
// each.
func TestProbesSpaced(t *testing.T) {
	srv := redistest.Start(t)
	hook := &holdHook{}
	b := newBudget(t, recoveryClient(t, srv.Addr, true, hook), budgetOptions{Name: "spaced", Timeout: outageTimeout})
	ctx := context.Background()
	mustNil(t, b.Observe(ctx, base, success))
	srv.Pause()
	hook.scripts.Store(0)
	start := time.Now()
	for time.Since(start) < 20*outageTimeout {
		_, _ = b.Available(ctx, base)
		time.Sleep(time.Millisecond)
	}
	elapsed := time.Since(start)
	// Each probe takes a timeout and is followed by an interval (a timeout
	// too) without one; the first operation is no probe, but fails.
	if n, most := hook.scripts.Load(), int64(elapsed/(2*outageTimeout))+2; n > most {
		t.Fatalf("%d operations asked Redis in %v, want at most %d", n, elapsed, most)
	}
	srv.Resume()
}
