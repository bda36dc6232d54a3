package redisstore_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/redistest"
	"github.com/damper-ai/damper-go/redisstore"
	"github.com/redis/go-redis/v9"
)

// brkChanges records a breaker's changes of state.
type brkChanges struct {
	mu sync.Mutex
	cs []fleet.CircuitChange
}

func (r *brkChanges) add(c fleet.CircuitChange) {
	r.mu.Lock()
	r.cs = append(r.cs, c)
	r.mu.Unlock()
}

func (r *brkChanges) list() []fleet.CircuitChange {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.cs)
}

func brkFmt(cs []fleet.CircuitChange) string {
	var b strings.Builder
	for _, c := range cs {
		fmt.Fprintf(&b, "%v→%v at %s", c.From, c.To, c.At.Format("15:04:05.000000"))
		if !c.NextProbe.IsZero() {
			fmt.Fprintf(&b, " probe %s", c.NextProbe.Format("15:04:05.000000"))
		}
		b.WriteString("; ")
	}
	return b.String()
}

func brkSameChanges(a, b []fleet.CircuitChange) bool {
	return slices.EqualFunc(a, b, func(x, y fleet.CircuitChange) bool {
		return x.From == y.From && x.To == y.To && x.At.Equal(y.At) && x.NextProbe.Equal(y.NextProbe)
	})
}

// brkShared returns the store's breaker for st.
func brkShared(tb testing.TB, s *redisstore.Store, st fleet.BreakerSettings) fleet.Breaker {
	tb.Helper()
	b, err := s.Breaker(st)
	if err != nil {
		tb.Fatal(err)
	}
	if b == nil {
		tb.Fatal("Breaker returned nil: kept in memory")
	}
	return b
}

// TestBreakerMatchesMemory runs the same random sequence of Allow, Done,
// RefusesAt and State at the same virtual times on a Redis breaker and on
// MemoryStore's: every answer, every ticket and every change of state must
// be the same. Times move on by bits of the window, jump past open
// periods, and now and then go back; attempts end in any order, some in an
// older generation; the open period doubles up to MaxOpenFor; some
// attempts come with a caller's deadline, before or after ProbeLimit.
func TestBreakerMatchesMemory(t *testing.T) {
	srv := redistest.Start(t)
	client := newClient1(t, srv.Addr)
	ctx := context.Background()
	cases := []fleet.BreakerSettings{
		{FailureRatio: 0.5, MinAttempts: 4, Window: 3 * time.Second, OpenFor: time.Second, MaxOpenFor: 5 * time.Second, ProbeLimit: 700 * time.Millisecond},
		{FailureRatio: 0.07, MinAttempts: 1, Window: 300 * time.Millisecond, OpenFor: 50 * time.Millisecond, MaxOpenFor: 1 * time.Second, ProbeLimit: 0},
		{FailureRatio: 1.0 / 3, MinAttempts: 10, Window: 30 * time.Second, OpenFor: 2 * time.Second, MaxOpenFor: 10 * time.Second, ProbeLimit: 3 * time.Second},
		{FailureRatio: 0.5, MinAttempts: 5, Window: 30 * time.Second, OpenFor: 30 * time.Second, MaxOpenFor: 300 * time.Second, ProbeLimit: 10 * time.Minute}, // else the defaults
	}
	for n, st := range cases {
		t.Run(fmt.Sprintf("case%d", n), func(t *testing.T) {
			var memChanges, redisChanges brkChanges
			ms, rs := st, st
			ms.OnChange, rs.OnChange = memChanges.add, redisChanges.add
			mem, err := fleet.MemoryStore{}.Breaker(ms)
			mustNil(t, err)
			store := thrStore(t, client, redisstore.Options{Name: fmt.Sprintf("brk-eq-%d", n), Timeout: 5 * time.Second})
			red := brkShared(t, store, rs)
			window, openFor, maxOpenFor := st.Window, st.OpenFor, st.MaxOpenFor

			// The first attempt counted falls on a slice's edge (base is a
			// whole minute), where the breaker in memory starts its slices.
			now := base
			var tickets []fleet.CircuitTicket
			var deadlineFor func(at time.Time) time.Time // set below, with the random source
			allow := func(step int, at time.Time) {
				actx := ctx
				if deadlineFor != nil {
					if dl := deadlineFor(at); !dl.IsZero() {
						var cancel context.CancelFunc
						actx, cancel = context.WithDeadline(ctx, dl)
						defer cancel()
					}
				}
				a, err := red.Allow(actx, at)
				mustNil(t, err)
				b, _ := mem.Allow(actx, at)
				if a.OK != b.OK || a.Ticket != b.Ticket || a.State != b.State || !a.NextProbe.Equal(b.NextProbe) {
					t.Fatalf("step %d: Allow at +%v = %+v, memory says %+v", step, at.Sub(base), a, b)
				}
				if w := a.NextProbe.Sub(at); !a.OK && (w <= 0 || w > maxOpenFor) {
					t.Fatalf("step %d: Allow at +%v refused with a wait of %v", step, at.Sub(base), w)
				}
				if a.OK {
					tickets = append(tickets, a.Ticket)
				}
			}
			done := func(tk fleet.CircuitTicket, at time.Time, v fleet.CircuitVerdict) {
				mustNil(t, red.Done(ctx, tk, at, v))
				mustNil(t, store.Flush(ctx)) // its change is heard with its reply
				mustNil(t, mem.Done(ctx, tk, at, v))
			}
			allow(-1, now)
			done(tickets[0], now, fleet.CircuitSuccess)
			tickets = nil

			rng := rand.New(rand.NewPCG(uint64(n), 99))
			micro := func(d time.Duration) time.Duration { return d.Truncate(time.Microsecond) }
			deadlines := 0
			deadlineFor = func(at time.Time) time.Time {
				if rng.IntN(3) > 0 {
					return time.Time{}
				}
				deadlines++
				return at.Add(micro(time.Duration(rng.Int64N(int64(2*max(st.ProbeLimit, openFor)) + 1))))
			}
			var opens, maxed, probes, closes, backwards, stale int
			for step := range 1500 {
				at := now
				switch r := rng.IntN(100); {
				case r < 70:
					now = now.Add(micro(time.Duration(rng.Int64N(int64(window / 20)))))
					at = now
				case r < 85:
					now = now.Add(micro(time.Duration(rng.Int64N(int64(openFor) * 2))))
					at = now
				case r < 88:
					now = now.Add(micro(time.Duration(rng.Int64N(int64(maxOpenFor)))))
					at = now
				default: // a clock that lags: up to half a window back
					at = now.Add(-micro(time.Duration(rng.Int64N(int64(window / 2)))))
					backwards++
				}
				switch op := rng.IntN(20); {
				case op < 7:
					allow(step, at)
				case op < 14:
					if len(tickets) == 0 {
						allow(step, at)
						break
					}
					i := rng.IntN(len(tickets))
					tk := tickets[i]
					tickets = slices.Delete(tickets, i, i+1)
					v := fleet.CircuitFailure
					switch r := rng.IntN(10); {
					case r < 3:
						v = fleet.CircuitSuccess
					case r < 4:
						v = fleet.CircuitNeutral
					}
					if tk.Probe {
						probes++
					}
					done(tk, at, v)
				case op < 17:
					later := at.Add(micro(time.Duration(rng.Int64N(int64(openFor) * 2))))
					r1, n1, err := red.RefusesAt(ctx, at, later)
					mustNil(t, err)
					r2, n2, _ := mem.RefusesAt(ctx, at, later)
					if r1 != r2 || !n1.Equal(n2) {
						t.Fatalf("step %d: RefusesAt(+%v, +%v) = %v, %v; memory says %v, %v", step, at.Sub(base), later.Sub(base), r1, n1, r2, n2)
					}
				default:
					s1, err := red.State(ctx, at)
					mustNil(t, err)
					if s2, _ := mem.State(ctx, at); s1 != s2 {
						t.Fatalf("step %d: State at +%v = %v, memory says %v", step, at.Sub(base), s1, s2)
					}
				}
				if len(tickets) > 12 { // attempts long gone, in an older generation by now, or not
					tickets = tickets[len(tickets)-12:]
					stale++
				}
				if m, r := memChanges.list(), redisChanges.list(); !brkSameChanges(m, r) {
					t.Fatalf("step %d: changes differ:\nredis  %s\nmemory %s", step, brkFmt(r), brkFmt(m))
				}
			}
			for _, c := range memChanges.list() {
				switch c.To {
				case fleet.CircuitOpen:
					opens++
					if c.NextProbe.Sub(c.At) == maxOpenFor {
						maxed++
					}
				case fleet.CircuitClosed:
					closes++
				}
			}
			t.Logf("%d changes: %d opens (%d for MaxOpenFor), %d closes, %d probes ended, %d times back, %d tickets dropped, %d deadlines",
				len(memChanges.list()), opens, maxed, closes, probes, backwards, stale, deadlines)
			if opens < 3 || maxed == 0 || closes == 0 || probes == 0 {
				t.Fatalf("the sequence missed a case: %d opens, %d for MaxOpenFor, %d closes, %d probes", opens, maxed, closes, probes)
			}
		})
	}
}

// TestBreakerKey checks the hash's layout and time to live, and that an
// idle closed breaker costs no key.
func TestBreakerKey(t *testing.T) {
	srv := redistest.Start(t)
	client := newClient1(t, srv.Addr)
	ctx := context.Background()
	s := thrStore(t, client, redisstore.Options{Name: "brk-key"})
	b := brkShared(t, s, fleet.BreakerSettings{FailureRatio: 0.5, MinAttempts: 2, Window: 10 * time.Second, OpenFor: time.Second, MaxOpenFor: time.Minute})
	key := redisstore.BreakerKey("brk-key")
	if key != "damper:{brk-key}:breaker" {
		t.Fatalf("BreakerKey = %q", key)
	}
	now := base.Add(1500 * time.Millisecond)
	for range 3 {
		a, err := b.Allow(ctx, now)
		mustNil(t, err)
		if st, _ := b.State(ctx, now); !a.OK || st != fleet.CircuitClosed {
			t.Fatalf("Allow = %+v, state %v", a, st)
		}
	}
	if n := client.Exists(ctx, key).Val(); n != 0 {
		t.Fatal("reads of a closed breaker made its key")
	}
	a, _ := b.Allow(ctx, now)
	mustNil(t, b.Done(ctx, a.Ticket, now, fleet.CircuitFailure))
	mustNil(t, b.Done(ctx, a.Ticket, now, fleet.CircuitFailure))
	mustNil(t, s.Flush(ctx))
	got := client.HGetAll(ctx, key).Val()
	slice := now.UnixNano() / int64(10*time.Second/30) // slices since the epoch
	want := map[string]string{
		"st": "2", "g": "1", "of": "1000000", "ou": fmt.Sprint(now.Add(time.Second).UnixMicro()),
		"pr": "0", "nw": fmt.Sprint(slice), "i": fmt.Sprint(now.UnixMicro()),
		fmt.Sprintf("b%d", slice%30): fmt.Sprintf("%d:2:2", slice),
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("hash %v\nwant %v", got, want)
	}
	if ttl := client.PTTL(ctx, key).Val(); ttl <= 3*time.Minute-10*time.Second || ttl > 3*time.Minute {
		t.Fatalf("time to live %v, want 3 × MaxOpenFor", ttl)
	}
	if st, _ := b.State(ctx, now); st != fleet.CircuitOpen {
		t.Fatalf("state %v", st)
	}
}

// TestBreakerSharedThroughDamper: two Dampers on two stores of one Name,
// in front of the fake API. Failures seen by A open the breaker for B: B's
// call is refused with ErrCircuitOpen and sends nothing; B's probe closes
// it for A. Each hears the changes it sees; the throttle is shared too.
func TestBreakerSharedThroughDamper(t *testing.T) {
	rds := redistest.Start(t)
	clk := dampertest.NewClock(time.Now().Truncate(time.Minute).Add(time.Minute))
	api := dampertest.NewServer(dampertest.InMemory(), dampertest.WithClock(clk))
	t.Cleanup(api.Close)
	type replica struct {
		d       *damper.Damper
		client  anthropic.Client
		changes brkChanges
		store   *redisstore.Store
	}
	newReplica := func() *replica {
		r := &replica{}
		store := thrStore(t, newClient1(t, rds.Addr), redisstore.Options{Name: "brk-damper"})
		r.store = store
		p := damper.Policy{
			MaxAttempts: 1,
			Breaker:     &damper.BreakerPolicy{MinAttempts: 4, OpenFor: 10 * time.Second, OnStateChange: r.changes.add},
			Throttle:    &damper.ThrottlePolicy{},
		}
		d, err := damper.New(p, damper.WithStore(store), damper.WithClock(clk), damper.WithName("brk-damper"))
		mustNil(t, err)
		r.d = d
		r.client = anthropic.NewClient(append(api.Options(), d.Option())...)
		return r
	}
	a, b := newReplica(), newReplica()
	ctx := context.Background()
	params := anthropic.MessageNewParams{
		Model: dampertest.DefaultModel, MaxTokens: 16,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))},
	}
	send := func(r *replica) error {
		_, err := r.client.Messages.New(ctx, params, option.WithMaxRetries(0))
		mustNil(t, r.store.Flush(ctx)) // the call's records reach Redis, and their replies it
		return err
	}

	api.Script("", dampertest.Status(529))
	for i := range 4 {
		if err := send(a); err == nil || errors.Is(err, damper.ErrCircuitOpen) {
			t.Fatalf("A's call %d: %v, want the 529", i, err)
		}
	}
	opened := clk.Now()
	wantA := []fleet.CircuitChange{{From: fleet.CircuitClosed, To: fleet.CircuitOpen, At: opened, NextProbe: opened.Add(10 * time.Second)}}
	if got := a.changes.list(); !brkSameChanges(got, wantA) {
		t.Fatalf("A's changes %s, want %s", brkFmt(got), brkFmt(wantA))
	}
	clk.Advance(time.Second)
	sent := api.Count("")
	err := send(b)
	var de *damper.Error
	if !errors.Is(err, damper.ErrCircuitOpen) || !errors.As(err, &de) || !de.NextProbe.Equal(opened.Add(10*time.Second)) {
		t.Fatalf("B's call with the fleet's breaker open: %v, want ErrCircuitOpen with the next probe at +10s", err)
	}
	if n := api.Count(""); n != sent {
		t.Fatalf("B's refused call sent %d requests", n-sent)
	}
	wantB := []fleet.CircuitChange{{From: fleet.CircuitClosed, To: fleet.CircuitOpen, At: clk.Now(), NextProbe: opened.Add(10 * time.Second)}}
	if got := b.changes.list(); !brkSameChanges(got, wantB) {
		t.Fatalf("B's changes %s, want %s", brkFmt(got), brkFmt(wantB))
	}
	rdb := newClient1(t, rds.Addr)
	if got := rdb.Get(ctx, redisstore.ThrottleKey("brk-damper")).Val(); got != "6000" {
		t.Fatalf("the shared throttle holds %q after 4 failures, want 6000", got)
	}

	// B's probe succeeds and closes the fleet's breaker; A's next call goes.
	clk.Advance(9 * time.Second)
	api.Script("", dampertest.OK())
	mustNil(t, send(b))
	mustNil(t, send(a))
	if n := api.Count(""); n != sent+2 {
		t.Fatalf("%d requests after the probe, want 2", n-sent)
	}
	probeAt := clk.Now()
	wantB = append(wantB,
		fleet.CircuitChange{From: fleet.CircuitOpen, To: fleet.CircuitHalfOpen, At: probeAt},
		fleet.CircuitChange{From: fleet.CircuitHalfOpen, To: fleet.CircuitClosed, At: probeAt})
	if got := b.changes.list(); !brkSameChanges(got, wantB) {
		t.Fatalf("B's changes %s, want %s", brkFmt(got), brkFmt(wantB))
	}
	// A saw open, then closed: the changes between collapse into one.
	wantA = append(wantA, fleet.CircuitChange{From: fleet.CircuitOpen, To: fleet.CircuitClosed, At: probeAt})
	if got := a.changes.list(); !brkSameChanges(got, wantA) {
		t.Fatalf("A's changes %s, want %s", brkFmt(got), brkFmt(wantA))
	}
	if got := rdb.Get(ctx, redisstore.ThrottleKey("brk-damper")).Val(); got != "6400" {
		t.Fatalf("the shared throttle holds %q after 2 answers, want 6400", got)
	}
}

// TestBreakerRedisKilled kills Redis with the fleet's breaker open: no
// call waits past the timeout, the local breaker decides (its tickets
// marked LocalTicket) and its changes reach OnChange; once Redis is back
// (empty), the breaker is shared again and a peer's failures open it.
func TestBreakerRedisKilled(t *testing.T) {
	eachClientKind(t, func(t *testing.T, ctxTimeout bool) {
		srv := redistest.Start(t)
		ctx := context.Background()
		var changes brkChanges
		st := fleet.BreakerSettings{FailureRatio: 0.5, MinAttempts: 2, Window: 30 * time.Second, OpenFor: 10 * time.Second, MaxOpenFor: 300 * time.Second, ProbeLimit: time.Second}
		o := redisstore.Options{Name: "brk-killed", Timeout: outageTimeout}
		s := thrStore(t, newClientWith(t, &redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: ctxTimeout}), o)
		sst := st
		sst.OnChange = changes.add
		b := brkShared(t, s, sst)
		peerStore := thrStore(t, newClient1(t, srv.Addr), o)
		peer := brkShared(t, peerStore, st)
		now := base
		for range 2 {
			a, err := peer.Allow(ctx, now)
			mustNil(t, err)
			mustNil(t, peer.Done(ctx, a.Ticket, now, fleet.CircuitFailure))
		}
		mustNil(t, peerStore.Flush(ctx)) // another process's records, read at once
		if a, err := b.Allow(ctx, now); a.OK || err != nil || a.State != fleet.CircuitOpen {
			t.Fatalf("Allow with the fleet's breaker open = %+v, %v", a, err)
		}

		srv.Kill()
		bound := outageTimeout + slack
		var tickets []fleet.CircuitTicket
		for i := range 6 {
			now = now.Add(time.Millisecond)
			var a fleet.CircuitAdmission
			var err error
			timed(t, "Allow with Redis down", bound, func() { a, err = b.Allow(ctx, now) })
			if err == nil || (i < 2 && (!a.OK || a.Ticket.Generation&redisstore.LocalTicket == 0)) {
				t.Fatalf("Allow %d with Redis down = %+v, %v; want the local breaker's admission and an error", i, a, err)
			}
			if a.OK {
				tickets = append(tickets, a.Ticket)
			}
			if i < 2 {
				timed(t, "Done with Redis down", bound, func() { err = b.Done(ctx, a.Ticket, now, fleet.CircuitFailure) })
				mustNil(t, err) // the local breaker's ticket
			}
			var refused bool
			timed(t, "RefusesAt with Redis down", bound, func() { refused, _, err = b.RefusesAt(ctx, now, now) })
			if err == nil || refused != (i >= 1) {
				t.Fatalf("RefusesAt %d with Redis down = %v, %v", i, refused, err)
			}
			time.Sleep(5 * time.Millisecond)
		}
		if len(tickets) != 2 {
			t.Fatalf("the local breaker admitted %d attempts, want 2 before it opened", len(tickets))
		}
		got := changes.list()
		if len(got) != 2 || got[0].To != fleet.CircuitOpen || got[1].From != fleet.CircuitClosed || got[1].To != fleet.CircuitOpen {
			t.Fatalf("changes %s: want the shared breaker's opening, then the local one's", brkFmt(got))
		}

		srv.Restart()
		back := time.Now()
		for {
			a, err := b.Allow(ctx, now)
			if err == nil {
				if !a.OK || a.State != fleet.CircuitClosed || a.Ticket.Generation != 0 {
					t.Fatalf("Allow on a restarted, empty Redis = %+v", a)
				}
				break
			}
			if time.Since(back) > time.Second {
				t.Fatalf("not shared again %v after the restart: %v", time.Since(back), err)
			}
			time.Sleep(time.Millisecond)
		}
		for range 2 {
			a, err := peer.Allow(ctx, now)
			mustNil(t, err)
			mustNil(t, peer.Done(ctx, a.Ticket, now, fleet.CircuitFailure))
		}
		mustNil(t, peerStore.Flush(ctx)) // another process's records, read at once
		if s, err := b.State(ctx, now); s != fleet.CircuitOpen || err != nil {
			t.Fatalf("State after the peer's failures = %v, %v; want open, shared", s, err)
		}
		got = changes.list()
		if last := got[len(got)-1]; len(got) != 3 || last.From != fleet.CircuitOpen || last.To != fleet.CircuitOpen || !last.NextProbe.Equal(now.Add(10*time.Second)) {
			t.Fatalf("changes %s: want a third, to the fleet's new open period", brkFmt(got))
		}
	})
}

// TestFleetKeysOnOneSlot: on a 3-master cluster, a Damper whose every
// part lives in the store keeps all its keys (budget, throttle, breaker,
// rate-limit buckets) on its Name's hash-tag slot, for Names whose slots
// fall on different nodes.
func TestFleetKeysOnOneSlot(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	addrs := redistest.Addrs(nodes)
	client := newClient(addrs, true, false)
	defer client.Close()
	api := dampertest.NewServer(dampertest.InMemory(),
		dampertest.WithRateLimits(dampertest.RateLimits{RequestsPerMinute: 1_000_000}))
	defer api.Close()
	params := anthropic.MessageNewParams{Model: "claude-sonnet-4-6", MaxTokens: 100,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}}
	for _, name := range []string{"slot-a", "slot-b", "slot-c", "slot-d"} {
		api.Script(name, dampertest.Status(529), dampertest.OK())
		d, err := damper.New(allParts(), damper.WithStore(newStore(t, client, name)))
		mustNil(t, err)
		c := anthropic.NewClient(append([]option.RequestOption{d.Option()}, api.Options()...)...)
		var rep damper.Report
		_, err = c.Messages.New(context.Background(), params, damper.ReportInto(&rep), dampertest.Scenario(name))
		mustNil(t, err)
		if rep.Attempts != 2 {
			t.Fatalf("%s: %d attempts, want 2 (a 529, then an answer)", name, rep.Attempts)
		}
		checkOneSlot(t, addrs, name, redisstore.Key(name), redisstore.ThrottleKey(name),
			redisstore.BreakerKey(name), redisstore.BucketsKey(name, "claude-sonnet-4"))
	}
}

// BenchmarkBreakerAllow measures Allow, Done, State and the throttle's Add
// on a loopback Redis with a client that has ContextTimeoutEnabled (the
// round trip on the caller's goroutine): Allow and State are a round trip
// each, and the records, Done and Add, ride with them or go in a batch of
// their own. It reports the round trips per operation, with Allow's
// latency percentiles.
func BenchmarkBreakerAllow(b *testing.B) {
	srv := redistest.Start(b)
	ctx := context.Background()
	hook := &countHook{}
	client := newClientWith(b, &redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true}, hook)
	s := thrStore(b, client, redisstore.Options{Name: "brk-bench"})
	br := brkShared(b, s, fleet.BreakerSettings{FailureRatio: 0.5, MinAttempts: 20, Window: 30 * time.Second, OpenFor: 30 * time.Second, MaxOpenFor: 300 * time.Second, ProbeLimit: time.Minute})
	th := thrThrottle(b, s, fleet.ThrottleSettings{MaxTokens: 10, TokenRatio: 0.2})
	now := base
	a, err := br.Allow(ctx, now) // loads the script
	mustNil(b, err)
	mustNil(b, br.Done(ctx, a.Ticket, now, fleet.CircuitSuccess))
	mustNil(b, th.Add(ctx, 1))
	lat := make([]time.Duration, 0, b.N)
	hook.n.Store(0)
	b.ResetTimer()
	for range b.N {
		now = now.Add(time.Millisecond)
		start := time.Now()
		a, err := br.Allow(ctx, now)
		lat = append(lat, time.Since(start))
		mustNil(b, err)
		mustNil(b, br.Done(ctx, a.Ticket, now, fleet.CircuitSuccess)) // successes: it stays closed
		if _, err := br.State(ctx, now); err != nil {
			b.Fatal(err)
		}
		mustNil(b, th.Add(ctx, 200))
	}
	b.StopTimer()
	b.ReportMetric(float64(hook.n.Load())/float64(4*b.N), "roundtrips/call")
	b.ReportMetric(percentile(lat, 50), "allow-p50-µs")
	b.ReportMetric(percentile(lat, 99), "allow-p99-µs")
}

// TestBreakerProbeWaitBoundedByOpenPeriod: a refusal from the fleet's
// breaker tells of the time until the probe in flight is due to answer,
// whichever process sent it, bounded by the current open period: with an
// open period of 2 s and a ProbeLimit of 60 s, 2 s; with a ProbeLimit or a
// caller's deadline shorter than the open period, its remainder; past the
// probe's due time, OverdueWait. A probe started by a process that does not
// write its due time is due ProbeLimit after its start.
func TestBreakerProbeWaitBoundedByOpenPeriod(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	ms, sec := time.Millisecond, time.Second
	for _, tc := range []struct {
		name     string
		limit    time.Duration // ProbeLimit
		deadline time.Duration // the probe's caller's, after its start; 0: none
		checks   [][2]time.Duration
	}{
		{"ProbeLimit 60s", 60 * sec, 0, [][2]time.Duration{{0, 2 * sec}, {58 * sec, 2 * sec}, {58500 * ms, 1500 * ms}, {60 * sec, fleet.CircuitOverdueWait}}},
		{"ProbeLimit 1.5s", 1500 * ms, 0, [][2]time.Duration{{0, 1500 * ms}, {sec, 500 * ms}, {1500 * ms, fleet.CircuitOverdueWait}}},
		{"deadline 30s", 60 * sec, 30 * sec, [][2]time.Duration{{0, 2 * sec}, {28500 * ms, 1500 * ms}, {29900 * ms, 100 * ms}, {31 * sec, fleet.CircuitOverdueWait}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := fleet.BreakerSettings{FailureRatio: 0.5, MinAttempts: 2, Window: 30 * time.Second, OpenFor: 2 * sec, MaxOpenFor: 10 * sec, ProbeLimit: tc.limit}
			o := redisstore.Options{Name: "brk-wait-" + strings.ReplaceAll(tc.name, " ", "-")}
			aStore := thrStore(t, newClient1(t, srv.Addr), o)
			a, b := brkShared(t, aStore, st), brkShared(t, thrStore(t, newClient1(t, srv.Addr), o), st)
			mem, err := fleet.MemoryStore{}.Breaker(st)
			mustNil(t, err)
			wantWait := func(br fleet.Breaker, now time.Time, state fleet.CircuitState, want time.Duration) {
				t.Helper()
				got, err := br.Allow(ctx, now)
				mustNil(t, err)
				if got.OK || got.State != state || got.NextProbe.Sub(now) != want {
					t.Fatalf("Allow at +%v = %+v (wait %v); want refused, %v, wait %v", now.Sub(base), got, got.NextProbe.Sub(now), state, want)
				}
			}
			now := base
			for _, br := range []fleet.Breaker{a, mem} {
				for range 2 {
					adm, err := br.Allow(ctx, now)
					mustNil(t, err)
					mustNil(t, br.Done(ctx, adm.Ticket, now, fleet.CircuitFailure))
				}
			}
			mustNil(t, aStore.Flush(ctx))
			wantWait(b, now.Add(500*ms), fleet.CircuitOpen, 1500*ms)

			// A sends the probe; B and the breaker in memory refuse alike.
			start := now.Add(2 * sec)
			pctx := ctx
			if tc.deadline > 0 {
				var cancel context.CancelFunc
				pctx, cancel = context.WithDeadline(ctx, start.Add(tc.deadline))
				defer cancel()
			}
			for _, br := range []fleet.Breaker{a, mem} {
				if adm, err := br.Allow(pctx, start); err != nil || !adm.OK || !adm.Ticket.Probe {
					t.Fatalf("the probe: %+v, %v", adm, err)
				}
			}
			for _, c := range tc.checks {
				at := start.Add(c[0])
				wantWait(b, at, fleet.CircuitHalfOpen, c[1])
				wantWait(mem, at, fleet.CircuitHalfOpen, c[1])
				refused, next, err := b.RefusesAt(ctx, at, at)
				mustNil(t, err)
				if want := c[0] < cmp.Or(min(tc.deadline, tc.limit), tc.limit); refused != want || next.Sub(at) != c[1] {
					t.Fatalf("RefusesAt at +%v = %v, wait %v; want %v, %v", at.Sub(base), refused, next.Sub(at), want, c[1])
				}
			}
		})
	}

	// A probe of a process that writes no due time (ps alone, and a pd of
	// an earlier probe): due ProbeLimit after its start.
	st := fleet.BreakerSettings{FailureRatio: 0.5, MinAttempts: 1, Window: 30 * time.Second, OpenFor: 2 * sec, MaxOpenFor: 10 * sec, ProbeLimit: 1500 * ms}
	client := newClient1(t, srv.Addr)
	s := thrStore(t, client, redisstore.Options{Name: "brk-wait-old"})
	b := brkShared(t, s, st)
	adm, err := b.Allow(ctx, base)
	mustNil(t, err)
	mustNil(t, b.Done(ctx, adm.Ticket, base, fleet.CircuitFailure))
	mustNil(t, s.Flush(ctx))
	start := base.Add(2 * sec)
	mustNil(t, client.HSet(ctx, redisstore.BreakerKey("brk-wait-old"), "st", "3", "pr", "1", "ps", fmt.Sprint(start.UnixMicro()),
		"pd", fmt.Sprintf("%d:%d", base.UnixMicro(), base.UnixMicro())).Err())
	got, err := b.Allow(ctx, start.Add(sec))
	mustNil(t, err)
	if got.OK || got.NextProbe.Sub(start) != 1500*ms {
		t.Fatalf("Allow with an older process's probe in flight = %+v; want refused until 1.5s after its start", got)
	}
}
