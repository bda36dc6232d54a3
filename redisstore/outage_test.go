package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/redistest"
	"github.com/damper-ai/damper-go/internal/syncbuf"
	"github.com/damper-ai/damper-go/redisstore"
	"github.com/redis/go-redis/v9"
)

const (
	outageTimeout = 50 * time.Millisecond
	// slack is the scheduling delay allowed on top of a bound, on a loaded
	// two-core machine under the race detector.
	slack = 40 * time.Millisecond
)

// timed runs op and fails the test if it took longer than bound.
func timed(t *testing.T, what string, bound time.Duration, op func()) {
	t.Helper()
	start := time.Now()
	op()
	if d := time.Since(start); d > bound {
		t.Fatalf("%s took %v, more than %v", what, d, bound)
	}
}

// clientKinds are the two ways a go-redis client waits: by its own socket
// timeouts (the default, seconds), which the budget must bound itself, or
// by the context's deadline.
var clientKinds = []struct {
	name       string
	ctxTimeout bool
}{
	{"ReadTimeout", false},
	{"ContextTimeoutEnabled", true},
}

// eachClientKind runs test once with each kind of client.
func eachClientKind(t *testing.T, test func(t *testing.T, ctxTimeout bool)) {
	for _, k := range clientKinds {
		t.Run(k.name, func(t *testing.T) { test(t, k.ctxTimeout) })
	}
}

// outagePair returns a budget and a second one on the same books, as two
// processes of a fleet would have.
func outagePair(t *testing.T, srv *redistest.Server, ctxTimeout bool, o budgetOptions) (b, peer *redisstore.Budget) {
	o.Timeout = outageTimeout
	b = newBudget(t, newClientWith(t, &redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: ctxTimeout, MaxRetries: -1}), o)
	o.Logger = nil
	peer = newBudget(t, newClientWith(t, &redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: ctxTimeout, MaxRetries: -1}), o)
	return b, peer
}

// TestRedisKilledAndRestarted kills Redis in the middle of a run and starts
// it again on the same port. No operation waits past the timeout; while
// Redis is gone the local budget, which heard this process's successes and
// grants all along, decides on this process's share, and the error is
// returned; one log line marks the fallback and one the return, which
// comes within one probe interval (the timeout) of Redis answering again.
// The return charges the restarted Redis's books of the window with the
// fallback's grants and the successes Redis never heard, every one of
// them, though the probes of the outage failed.
func TestRedisKilledAndRestarted(t *testing.T) {
	eachClientKind(t, func(t *testing.T, ctxTimeout bool) {
		srv := redistest.Start(t)
		logs := &syncbuf.Buffer{}
		b, peer := outagePair(t, srv, ctxTimeout, budgetOptions{
			Name: "killed", Ratio: 0.5, MinTokens: 2, Window: time.Minute,
			Logger: slog.New(slog.NewTextHandler(logs, nil)),
		})
		// What this process alone has seen: its successes and its grants.
		local, err := fleet.NewWindowBudget(0.5, time.Minute, 2)
		mustNil(t, err)
		ctx, now := context.Background(), base.Add(10*time.Second)

		// Shared: 4 successes elsewhere and 4 here give 2 + 0.5 × 8 = 6
		// units. The peer's records, its membership with them, reach Redis
		// first, so b's membership, sent with its first record, counts 2.
		for range 4 {
			mustNil(t, peer.Observe(ctx, now, success))
		}
		flushBudget(t, peer)
		for range 4 {
			mustNil(t, b.Observe(ctx, now, success))
			local.FirstAttemptSucceeded(now)
		}
		flushBudget(t, b)
		const members = 2
		if n := redisstore.BudgetMembers(b); n != members {
			t.Fatalf("members known before the outage = %d, want %d", n, members)
		}
		for range 3 {
			granted, err := b.Acquire(ctx, now)
			if !granted || err != nil {
				t.Fatalf("shared Acquire = %v, %v; want a grant", granted, err)
			}
			local.TryAcquire(now)
		}
		if got, err := b.Available(ctx, now); got != 3 || err != nil {
			t.Fatalf("shared Available = %v, %v; want 3 (6 units, 3 used)", got, err)
		}

		srv.Kill()
		// The local budget decides as one of the 2 processes sharing the
		// budget: 2 / 2 + 0.5 × its successes (4, then one more after each
		// Acquire), less its 3 units, grants at the 3rd, 5th, ... 15th
		// Acquire: 7 units.
		bound := outageTimeout + slack
		var unasked, grants int
		for i := range 15 {
			var granted bool
			var err error
			timed(t, "Acquire with Redis down", bound, func() { granted, err = b.Acquire(ctx, now) })
			if want := local.TryAcquireShare(now, members); granted != want || err == nil {
				t.Fatalf("Acquire %d with Redis down = %v, %v; want %v, the local budget's, and an error", i, granted, err, want)
			}
			if granted {
				grants++
			}
			if errors.Is(err, redisstore.ErrUnavailable) {
				unasked++
			}
			timed(t, "Observe with Redis down", bound, func() { err = b.Observe(ctx, now, success) })
			local.FirstAttemptSucceeded(now)
			if err == nil {
				t.Fatal("Observe with Redis down returned no error")
			}
			var balance float64
			timed(t, "Available with Redis down", bound, func() { balance, err = b.Available(ctx, now) })
			if want := local.BalanceShare(now, members); balance != want || err == nil {
				t.Fatalf("Available with Redis down = %v, %v; want %v, the local budget's, and an error", balance, err, want)
			}
			time.Sleep(5 * time.Millisecond)
		}
		if grants != 7 {
			t.Fatalf("%d grants with Redis down, want 7", grants)
		}
		if st := b.Stats(); st.State != redisstore.StateFallback || st.Fallbacks != 1 || st.Failures == 0 || st.Unasked == 0 || unasked == 0 {
			t.Fatalf("Stats with Redis down = %+v (%d unasked Acquires)", st, unasked)
		}

		srv.Restart()
		back := time.Now()
		for b.State() != redisstore.StateShared {
			if time.Since(back) > outageTimeout+slack {
				t.Fatalf("still %v %v after Redis answered PING again; stats %+v", b.State(), time.Since(back), b.Stats())
			}
			timed(t, "Available after restart", bound, func() { _, _ = b.Available(ctx, now) })
			time.Sleep(time.Millisecond)
		}
		t.Logf("shared again %v after Redis answered PING", time.Since(back))

		// The restarted Redis lost the books from before the outage; the
		// probe charged the window's new books with the 7 units the fallback
		// granted, and the 15 successes counted in it followed, before the
		// probing Available read them. Nothing else reached Redis: a dial
		// refused sends nothing. So 2 + 0.5 × 15 - 7 = 2.5 units are left.
		checkHash(t, newClient1(t, srv.Addr), redisstore.Key("killed"),
			map[string]string{"w": fmt.Sprint(now.Unix() / 60), "s": "15", "u": "7"})
		if got, err := b.Available(ctx, now); got != 2.5 || err != nil {
			t.Fatalf("Available after restart = %v, %v; want 2.5", got, err)
		}
		for i := range 3 {
			if granted, err := peer.Acquire(ctx, now); granted != (i < 2) || err != nil {
				t.Fatalf("peer Acquire %d after restart = %v, %v; want %v: 2 of the 2.5 units", i, granted, err, i < 2)
			}
		}
		if got, err := b.Available(ctx, now); got != 0.5 || err != nil {
			t.Fatalf("Available after the peer took 2 units = %v, %v; want 0.5", got, err)
		}
		if st := b.Stats(); st.State != redisstore.StateShared || st.Fallbacks != 1 || st.Recoveries != 1 {
			t.Fatalf("Stats after restart = %+v", st)
		}
		lines := logs.Lines()
		if len(lines) != 2 || !strings.Contains(lines[0], "level=WARN") || !strings.Contains(lines[0], "falls back") ||
			!strings.Contains(lines[0], "store=killed") || !strings.Contains(lines[1], "level=INFO") || !strings.Contains(lines[1], "shared again") {
			t.Fatalf("log lines:\n%s\nwant one warning at the fallback and one line at the return", strings.Join(lines, "\n"))
		}
	})
}

// TestRedisHangs stops Redis (SIGSTOP): connections open and nothing is
// answered, the case a client's own timeouts (seconds by default) would
// turn into stuck calls. Every operation still returns within the timeout.
func TestRedisHangs(t *testing.T) {
	eachClientKind(t, func(t *testing.T, ctxTimeout bool) {
		srv := redistest.Start(t)
		b, _ := outagePair(t, srv, ctxTimeout, budgetOptions{Name: "hangs", MinTokens: 3, Ratio: damper.None})
		client := newClient1(t, srv.Addr)
		ctx, now := context.Background(), base

		if granted, err := b.Acquire(ctx, now); !granted || err != nil {
			t.Fatalf("shared Acquire = %v, %v; want a grant", granted, err)
		}
		srv.Pause()
		bound := outageTimeout + slack
		deadline := time.Now().Add(500 * time.Millisecond)
		grants := 0
		for time.Now().Before(deadline) {
			var granted bool
			var err error
			timed(t, "Acquire with Redis stopped", bound, func() { granted, err = b.Acquire(ctx, now) })
			if err == nil {
				t.Fatal("Acquire with Redis stopped returned no error")
			}
			if granted {
				grants++
			}
			timed(t, "Available with Redis stopped", bound, func() { _, _ = b.Available(ctx, now) })
			time.Sleep(2 * time.Millisecond)
		}
		// The local budget had given one of its 3 units with the shared one.
		if grants != 2 || b.State() != redisstore.StateFallback {
			t.Fatalf("with Redis stopped: %d grants, state %v; want 2 grants, the local budget's, in fallback", grants, b.State())
		}

		srv.Resume()
		back := time.Now()
		for b.State() != redisstore.StateShared {
			if time.Since(back) > outageTimeout+slack {
				t.Fatalf("still %v %v after Redis was resumed; stats %+v", b.State(), time.Since(back), b.Stats())
			}
			timed(t, "Available after resume", bound, func() { _, _ = b.Available(ctx, now) })
			time.Sleep(time.Millisecond)
		}
		t.Logf("shared again %v after Redis was resumed", time.Since(back))
		// 4 units used of 3: the shared grant; the Acquire that timed out,
		// which reached Redis on its open connection and ran once Redis
		// resumed, its caller answered by the fallback; and the fallback's 2
		// grants, charged by the probe. A unit is counted twice, erring
		// towards fewer retries. The probes of the stop (charges) reached no
		// script: each waited on a new connection's HELLO, and with
		// ReadTimeout the one stuck until the resume found the charge script
		// unknown to this Redis and its expired context kept the EVAL unsent.
		checkHash(t, client, redisstore.Key("hangs"), map[string]string{"w": fmt.Sprint(now.UnixNano() / int64(budgetSettings(0, 0, 0).Window)), "s": "0", "u": "4"})
		if got, err := b.Available(ctx, now); got != 0 || err != nil {
			t.Fatalf("Available after resume = %v, %v; want 0, the shared books'", got, err)
		}
	})
}

// TestRecoveryAfterLongOutage: after enough failed dials in a row (its
// PoolSize), go-redis stops dialing and tries again once a second, so
// after a long outage the budget is back on Redis within about a second
// of Redis, not within the probe interval.
func TestRecoveryAfterLongOutage(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 2})
	defer client.Close()
	b := newBudget(t, client, budgetOptions{Name: "long", Timeout: outageTimeout})
	ctx := context.Background()
	mustNil(t, b.Observe(ctx, base, success))
	srv.Kill()
	for end := time.Now().Add(600 * time.Millisecond); time.Now().Before(end); {
		timed(t, "Available with Redis down", outageTimeout+slack, func() { _, _ = b.Available(ctx, base) })
		time.Sleep(time.Millisecond)
	}
	srv.Restart()
	back := time.Now()
	for b.State() != redisstore.StateShared {
		if time.Since(back) > time.Second+outageTimeout+slack {
			t.Fatalf("still %v %v after Redis answered PING again; stats %+v", b.State(), time.Since(back), b.Stats())
		}
		timed(t, "Available after restart", outageTimeout+slack, func() { _, _ = b.Available(ctx, base) })
		time.Sleep(time.Millisecond)
	}
	t.Logf("shared again %v after Redis answered PING (stats %+v)", time.Since(back), b.Stats())
}

// TestFailClosed: with FailClosed, no retry is granted while Redis is
// down, whatever the local books hold.
func TestFailClosed(t *testing.T) {
	eachClientKind(t, func(t *testing.T, ctxTimeout bool) {
		srv := redistest.Start(t)
		b, _ := outagePair(t, srv, ctxTimeout, budgetOptions{Name: "closed", MinTokens: 5, FailClosed: true})
		ctx, now := context.Background(), base
		if granted, err := b.Acquire(ctx, now); !granted || err != nil {
			t.Fatalf("shared Acquire = %v, %v; want a grant", granted, err)
		}
		srv.Kill()
		for range 10 {
			granted, err := b.Acquire(ctx, now)
			if granted || err == nil {
				t.Fatalf("Acquire with Redis down, failing closed = %v, %v; want a refusal and an error", granted, err)
			}
			if got, err := b.Available(ctx, now); got != 0 || err == nil {
				t.Fatalf("Available with Redis down, failing closed = %v, %v; want 0 and an error", got, err)
			}
			if err := b.Observe(ctx, now, success); err == nil {
				t.Fatal("Observe with Redis down returned no error")
			}
			time.Sleep(5 * time.Millisecond)
		}
		srv.Restart()
		deadline := time.Now().Add(time.Second)
		for {
			granted, err := b.Acquire(ctx, now)
			if err == nil {
				if !granted {
					t.Fatal("Acquire on a restarted, empty Redis refused")
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no shared Acquire within 1s of the restart: %v", err)
			}
			time.Sleep(time.Millisecond)
		}
	})
}

// TestCallerContextIsNotRedisFailure: a caller whose context has ended
// gets its error, and the budget stays on Redis.
func TestCallerContextIsNotRedisFailure(t *testing.T) {
	srv := redistest.Start(t)
	b := newBudget(t, newClient1(t, srv.Addr), budgetOptions{Name: "canceled", Timeout: outageTimeout})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := b.Acquire(ctx, base); !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire with a canceled context: error %v, want context.Canceled", err)
	}
	if st := b.Stats(); st != (redisstore.Stats{}) {
		t.Fatalf("Stats after a canceled call = %+v, want nothing counted", st)
	}
	if _, err := b.Available(context.Background(), base); err != nil {
		t.Fatal(err)
	}
}
