package redisstore_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/redistest"
	"github.com/damper-ai/damper-go/redisstore"
	"github.com/redis/go-redis/v9"
)

var (
	success = fleet.AttemptOutcome{First: true, Success: true}
	// Outcomes that do not grow the budget.
	others = []fleet.AttemptOutcome{
		{First: true, Signal: fleet.ProviderHealth},
		{Success: true},
		{Signal: fleet.CallerTraffic},
	}
)

// base is a time without a monotonic reading, as a virtual clock's, on a
// minute boundary.
var base = time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)

// budgetOptions are a store's options and its budget's values, as a
// Policy gives them: zero for the default, damper.None for 0.
type budgetOptions struct {
	Name          string
	Ratio         float64
	Window        time.Duration
	MinTokens     int
	Timeout       time.Duration
	ProbeInterval time.Duration
	FailClosed    bool
	Logger        *slog.Logger
	Lease         int
	LeaseFor      time.Duration
}

// newBudget returns the budget of a store of its own with o.
func newBudget(tb testing.TB, client redis.UniversalClient, o budgetOptions) *redisstore.Budget {
	tb.Helper()
	s, err := redisstore.New(client, redisstore.Options{
		Name: o.Name, Timeout: o.Timeout, ProbeInterval: o.ProbeInterval, FailClosed: o.FailClosed, Logger: o.Logger,
		Lease: o.Lease, LeaseFor: o.LeaseFor,
	})
	if err != nil {
		tb.Fatal(err)
	}
	b, err := s.Budget(budgetSettings(o.Ratio, o.Window, o.MinTokens))
	if err != nil {
		tb.Fatal(err)
	}
	budgetStores.Store(b, s)
	if o.Lease > 1 {
		// Units still leased go back before the client closes, and the
		// lease's timer stops.
		tb.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_ = s.Flush(ctx)
		})
	}
	return b.(*redisstore.Budget)
}

// budgetStores holds the store of each budget newBudget made.
var budgetStores sync.Map

// flushBudget sends the records queued by b's store (Observe's), and
// waits for them.
func flushBudget(tb testing.TB, b *redisstore.Budget) {
	tb.Helper()
	s, _ := budgetStores.Load(fleet.Budget(b))
	mustNil(tb, s.(*redisstore.Store).Flush(context.Background()))
}

// budgetSettings fills in the Policy's defaults: zero for the default,
// damper.None for 0.
func budgetSettings(ratio float64, window time.Duration, minTokens int) fleet.BudgetSettings {
	d := defaults
	s := fleet.BudgetSettings{Ratio: ratio, Window: window, MinTokens: minTokens}
	switch s.Ratio {
	case 0:
		s.Ratio = d.RetryBudgetRatio
	case damper.None:
		s.Ratio = 0
	}
	if s.Window == 0 {
		s.Window = d.RetryBudgetWindow
	}
	switch s.MinTokens {
	case 0:
		s.MinTokens = d.RetryBudgetMinTokens
	case damper.None:
		s.MinTokens = 0
	}
	return s
}

func newClient1(tb testing.TB, addr string, hooks ...redis.Hook) *redis.Client {
	tb.Helper()
	return newClientWith(tb, &redis.Options{Addr: addr}, hooks...)
}

// newClientWith returns a client closed when the test ends.
func newClientWith(tb testing.TB, o *redis.Options, hooks ...redis.Hook) *redis.Client {
	tb.Helper()
	c := redis.NewClient(o)
	for _, h := range hooks {
		c.AddHook(h)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

// TestMatchesWindowBudget runs the same random sequence of operations, at
// the same times, on a Budget and on a fleet.WindowBudget with the same
// parameters: every grant and every balance must be the same. The times
// move on within a window, jump one or more windows, and now and then go
// back (a late caller), for ratios whose products are not exact.
func TestMatchesWindowBudget(t *testing.T) {
	srv := redistest.Start(t)
	client := newClient1(t, srv.Addr)
	ctx := context.Background()
	cases := []struct {
		ratio     float64 // as given to Options: damper.None for 0
		minTokens int
		window    time.Duration
	}{
		{0.1, 10, time.Minute},
		{0.1, damper.None, time.Second},
		{1.0 / 3, 1, 100 * time.Millisecond},
		{0.7, 2, 250 * time.Millisecond},
		{damper.None, 3, time.Minute},
		{2.5, damper.None, 7 * time.Second},
		{0.05, 1, 90 * time.Second},
	}
	for i, c := range cases {
		t.Run(fmt.Sprintf("ratio=%v,min=%d,window=%v", c.ratio, c.minTokens, c.window), func(t *testing.T) {
			name := fmt.Sprintf("arith-%d", i)
			rb := newBudget(t, client, budgetOptions{
				Name: name, Ratio: c.ratio, MinTokens: c.minTokens, Window: c.window, Timeout: 5 * time.Second,
			})
			wb, err := fleet.NewWindowBudget(max(c.ratio, 0), c.window, max(c.minTokens, 0))
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(uint64(i), 42))
			now := base.Add(time.Duration(rng.Int64N(int64(c.window))))
			var grants, rollovers, lates int
			for step := range 400 {
				at := now
				switch r := rng.IntN(100); {
				case r < 75:
					now = now.Add(time.Duration(rng.Int64N(int64(c.window) / 20)))
					at = now
				case r < 88:
					now = now.Add(time.Duration(1+rng.IntN(3)) * c.window)
					at = now
					rollovers++
				default: // a late caller: up to two windows back
					at = now.Add(-time.Duration(rng.Int64N(2 * int64(c.window))))
					lates++
				}
				switch op := rng.IntN(20); {
				case op < 8:
					mustNil(t, rb.Observe(ctx, at, success))
					mustNil(t, wb.Observe(ctx, at, success))
				case op < 10:
					o := others[rng.IntN(len(others))]
					mustNil(t, rb.Observe(ctx, at, o))
					mustNil(t, wb.Observe(ctx, at, o))
				case op < 18:
					got, err := rb.Acquire(ctx, at)
					mustNil(t, err)
					if want := wb.TryAcquire(at); got != want {
						t.Fatalf("step %d: Acquire at %v = %v, WindowBudget says %v", step, at, got, want)
					}
					if got {
						grants++
					}
				}
				got, err := rb.Available(ctx, at)
				mustNil(t, err)
				if want := wb.Balance(at); got != want {
					t.Fatalf("step %d: Available at %v = %v, WindowBudget says %v", step, at, got, want)
				}
			}
			if grants == 0 || rollovers == 0 || lates == 0 {
				t.Fatalf("the sequence did not cover enough: %d grants, %d rollovers, %d late callers", grants, rollovers, lates)
			}
			if s := rb.Stats(); s != (redisstore.Stats{}) {
				t.Fatalf("Stats = %+v, want no failure", s)
			}
		})
	}
}

// TestFractionalCapacity: a product that falls a hair short of a whole
// number in floating point (0.29 × 100 = 28.999999999999996) still grants
// that number, as WindowBudget's epsilon has it, and what is left shows as
// WindowBudget rounds it.
func TestFractionalCapacity(t *testing.T) {
	srv := redistest.Start(t)
	client := newClient1(t, srv.Addr)
	ctx := context.Background()
	for _, c := range []struct {
		ratio     float64
		successes int
		grants    int
	}{
		{0.1, 10, 1},
		{0.29, 100, 29},
		{0.57, 100, 57},
		{0.57, 10, 5},
	} {
		name := fmt.Sprintf("frac-%v-%d", c.ratio, c.successes)
		rb := newBudget(t, client, budgetOptions{Name: name, Ratio: c.ratio, MinTokens: damper.None})
		wb, err := fleet.NewWindowBudget(c.ratio, time.Minute, 0)
		mustNil(t, err)
		for range c.successes {
			mustNil(t, rb.Observe(ctx, base, success))
			wb.FirstAttemptSucceeded(base)
		}
		if got, err := rb.Available(ctx, base); err != nil || got != wb.Balance(base) {
			t.Fatalf("%s: Available = %v, %v; WindowBudget says %v", name, got, err, wb.Balance(base))
		}
		grants := 0
		for {
			granted, err := rb.Acquire(ctx, base)
			mustNil(t, err)
			if granted != wb.TryAcquire(base) {
				t.Fatalf("%s: Acquire %d = %v, WindowBudget disagrees", name, grants+1, granted)
			}
			if !granted {
				break
			}
			grants++
		}
		if grants != c.grants {
			t.Fatalf("%s: %d grants, want %d", name, grants, c.grants)
		}
		if got, err := rb.Available(ctx, base); err != nil || got != wb.Balance(base) {
			t.Fatalf("%s: Available after the grants = %v, %v; WindowBudget says %v", name, got, err, wb.Balance(base))
		}
	}
}

// TestKeyLayout checks the hash's fields, its expiry, and its reset when a
// new window begins.
func TestKeyLayout(t *testing.T) {
	srv := redistest.Start(t)
	client := newClient1(t, srv.Addr)
	ctx := context.Background()
	for _, c := range []struct {
		window time.Duration
		ttl    time.Duration // 3 windows, at least a second
	}{
		{time.Minute, 3 * time.Minute},
		{100 * time.Millisecond, time.Second},
	} {
		name := "layout-" + c.window.String()
		key := redisstore.Key(name)
		if want := "damper:{" + name + "}:budget"; key != want {
			t.Fatalf("Key(%q) = %q, want %q", name, key, want)
		}
		rb := newBudget(t, client, budgetOptions{Name: name, Window: c.window, Ratio: 0.5})
		mustNil(t, rb.Observe(ctx, base, success))
		mustNil(t, rb.Observe(ctx, base, success))
		if _, err := rb.Acquire(ctx, base); err != nil {
			t.Fatal(err)
		}
		id := base.UnixNano() / int64(c.window)
		checkHash(t, client, key, map[string]string{"w": fmt.Sprint(id), "s": "2", "u": "1"})
		ttl := client.PTTL(ctx, key).Val()
		if ttl <= 0 || ttl > c.ttl {
			t.Fatalf("PTTL %s = %v, want in (0, %v]", key, ttl, c.ttl)
		}

		// The next window resets the books and the expiry.
		client.PExpire(ctx, key, c.ttl/2)
		if _, err := rb.Available(ctx, base.Add(c.window)); err != nil {
			t.Fatal(err)
		}
		checkHash(t, client, key, map[string]string{"w": fmt.Sprint(id + 1), "s": "0", "u": "0"})
		if ttl := client.PTTL(ctx, key).Val(); ttl <= c.ttl/2 || ttl > c.ttl {
			t.Fatalf("PTTL %s after rollover = %v, want in (%v, %v]", key, ttl, c.ttl/2, c.ttl)
		}
	}
	// A window so long that three of them overflow a Duration still
	// expires, late.
	century := newBudget(t, client, budgetOptions{Name: "century", Window: 100 * 365 * 24 * time.Hour})
	mustNil(t, century.Observe(ctx, base, success))
	flushBudget(t, century)
	if ms, err := client.Do(ctx, "PTTL", redisstore.Key("century")).Int64(); err != nil || ms < 9e12 {
		t.Fatalf("PTTL of a century's budget = %d ms, %v; want more than 9e12 ms (285 years)", ms, err)
	}

	// A budget whose key expired starts again from its minimum.
	rb := newBudget(t, client, budgetOptions{Name: "expired", MinTokens: 2, Ratio: damper.None})
	for range 2 {
		if granted, _ := rb.Acquire(ctx, base); !granted {
			t.Fatal("Acquire refused within MinTokens")
		}
	}
	client.Del(ctx, redisstore.Key("expired"))
	if got, err := rb.Available(ctx, base); err != nil || got != 2 {
		t.Fatalf("Available after expiry = %v, %v; want 2", got, err)
	}
}

func checkHash(t *testing.T, client *redis.Client, key string, want map[string]string) {
	t.Helper()
	got, err := client.HGetAll(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("HGETALL %s = %v, want %v", key, got, want)
	}
}

// countHook counts the commands sent: one for each round trip, a
// pipeline counting as one.
type countHook struct{ n atomic.Int64 }

func (h *countHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}
func (h *countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmds)
	}
}

// TestOneRoundTrip: every operation is one round trip once the scripts are
// loaded (Observe's is the queue's, sent by Flush here); an outcome that
// changes nothing costs none.
func TestOneRoundTrip(t *testing.T) {
	srv := redistest.Start(t)
	hook := &countHook{}
	client := newClient1(t, srv.Addr, hook)
	ctx := context.Background()
	rb := newBudget(t, client, budgetOptions{Name: "trips"})
	// The first run of each script is EVALSHA, refused, then EVAL; the
	// connection's handshake goes through the hook too.
	mustNil(t, rb.Observe(ctx, base, success))
	flushBudget(t, rb)
	_, _ = rb.Acquire(ctx, base)
	_, _ = rb.Available(ctx, base)
	for _, c := range []struct {
		name string
		op   func() error
		want int64
	}{
		{"Observe(success)", func() error { mustNil(t, rb.Observe(ctx, base, success)); flushBudget(t, rb); return nil }, 1},
		{"Observe(failure)", func() error { mustNil(t, rb.Observe(ctx, base, others[0])); flushBudget(t, rb); return nil }, 0},
		{"Acquire", func() error { _, err := rb.Acquire(ctx, base); return err }, 1},
		{"Available", func() error { _, err := rb.Available(ctx, base); return err }, 1},
	} {
		hook.n.Store(0)
		for range 10 {
			mustNil(t, c.op())
		}
		if n := hook.n.Load(); n != 10*c.want {
			t.Errorf("10 × %s took %d round trips, want %d", c.name, n, 10*c.want)
		}
	}
}

func TestNewBudgetRejects(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer client.Close()
	for _, c := range []struct {
		o    redisstore.Options
		want string
	}{
		{redisstore.Options{}, `Options.Name = ""`},
		{redisstore.Options{Name: strings.Repeat("x", 65)}, "Options.Name = \"xxxx"},
		{redisstore.Options{Name: "a b"}, `Options.Name = "a b": must be printable ASCII without spaces or braces`},
		{redisstore.Options{Name: "a{b}"}, `Options.Name = "a{b}"`},
		{redisstore.Options{Name: "ok", Timeout: -time.Millisecond}, "Options.Timeout = -1ms"},
		{redisstore.Options{Name: "ok", ProbeInterval: -time.Second}, "Options.ProbeInterval = -1s"},
		{redisstore.Options{Name: "ok", Lease: -1}, "Options.Lease = -1: must be 0 to 1000"},
		{redisstore.Options{Name: "ok", Lease: 1001}, "Options.Lease = 1001: must be 0 to 1000"},
		{redisstore.Options{Name: "ok", Lease: 5, LeaseFor: -time.Second}, "Options.LeaseFor = -1s: must be 0 to 1m0s"},
		{redisstore.Options{Name: "ok", Lease: 5, LeaseFor: time.Minute + time.Millisecond}, "Options.LeaseFor = 1m0.001s: must be 0 to 1m0s"},
	} {
		s, err := redisstore.New(client, c.o)
		if err == nil || !strings.Contains(err.Error(), c.want) || s != nil {
			t.Errorf("New(%+v) = %v, %v; want an error with %q", c.o, s, err, c.want)
		}
	}
	if _, err := redisstore.New(nil, redisstore.Options{Name: "ok"}); err == nil || !strings.Contains(err.Error(), "client is nil") {
		t.Errorf("New(nil) error = %v, want one naming the client", err)
	}
}

func mustNil(tb testing.TB, err error) {
	tb.Helper()
	if err != nil {
		tb.Fatal(err)
	}
}
