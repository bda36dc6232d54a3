package redisstore_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/redistest"
	"github.com/damper-ai/damper-go/redisstore"
)

// faultKind is one way Redis fails a fleet: start begins it, end (nil for
// none) ends it; the fleet then waits until every store is shared again.
type faultKind struct {
	name       string
	length     time.Duration // of the fault, on the virtual clock
	start, end func(t *testing.T, f *faultFleet)
	atStart    bool // Redis is down before any store has heard it
}

func adminDo(t *testing.T, f *faultFleet, args ...any) {
	t.Helper()
	if err := newClient1(t, f.srv.Addr).Do(context.Background(), args...).Err(); err != nil {
		t.Fatalf("%v: %v", args, err)
	}
}

var faultKinds = []faultKind{
	{name: "SIGSTOP 3 s", length: 3 * time.Second,
		start: func(_ *testing.T, f *faultFleet) { f.srv.Pause() }, end: func(_ *testing.T, f *faultFleet) { f.srv.Resume() }},
	{name: "SIGSTOP 30 s", length: 30 * time.Second,
		start: func(_ *testing.T, f *faultFleet) { f.srv.Pause() }, end: func(_ *testing.T, f *faultFleet) { f.srv.Resume() }},
	{name: "kill 3 s, restart empty", length: 3 * time.Second,
		start: func(_ *testing.T, f *faultFleet) { f.srv.Kill() }, end: func(_ *testing.T, f *faultFleet) { f.srv.Restart() }},
	{name: "kill 30 s, restart empty", length: 30 * time.Second,
		start: func(_ *testing.T, f *faultFleet) { f.srv.Kill() }, end: func(_ *testing.T, f *faultFleet) { f.srv.Restart() }},
	{name: "CLIENT PAUSE 3 s", length: 3 * time.Second,
		start: func(t *testing.T, f *faultFleet) { adminDo(t, f, "client", "pause", 120000, "write") },
		end:   func(t *testing.T, f *faultFleet) { adminDo(t, f, "client", "unpause") }},
	{name: "OOM 3 s", length: 3 * time.Second,
		start: func(t *testing.T, f *faultFleet) {
			adminDo(t, f, "config", "set", "maxmemory-policy", "noeviction")
			adminDo(t, f, "config", "set", "maxmemory", 1)
		},
		end: func(t *testing.T, f *faultFleet) { adminDo(t, f, "config", "set", "maxmemory", 0) }},
	{name: "FLUSHALL", start: func(t *testing.T, f *faultFleet) { adminDo(t, f, "flushall") }},
	{name: "restart empty", start: func(_ *testing.T, f *faultFleet) { f.srv.Kill(); f.srv.Restart() }},
	{name: "down at start 3 s", length: 3 * time.Second, atStart: true,
		start: func(_ *testing.T, f *faultFleet) { f.srv.Kill() }, end: func(_ *testing.T, f *faultFleet) { f.srv.Restart() }},
}

// waitShared waits until every store decides in Redis again.
func (f *faultFleet) waitShared(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for _, s := range f.stores {
		for s.State() != redisstore.StateShared {
			if time.Now().After(deadline) {
				t.Fatalf("not shared again 30 s after the fault ended: %+v", s.Stats())
			}
			_ = s.Probe(ctx)
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// TestFaultTableMeasured measures, for each kind of fault, what a fleet of
// three processes admits through the breaker, the retry throttle, the
// tenants' shares and a tenant's daily spend (see measureBreaker,
// measureThrottle, measureShares, measureSpend), and what it
// admits on requests_per_minute: 60 (a request asked by
// each every 100 ms of a virtual clock, the bucket drained first, over the
// fault and 12 s after it, from 5 s before it) and grants of a retry budget
// of MinTokens 12, Ratio 0.5 (each process counting 2, 4 and 6 successes
// and asking 20 retries in the fault's window, then 20 more once Redis is
// back, in the same window), beside the fleet guide's
// bounds. The numbers are in docs/RELIABILITY.md.
//
//	DAMPER_MEASURE=1 DAMPER_REQUIRE_REDIS=1 go test -run TestFaultTableMeasured -v ./redisstore
func TestFaultTableMeasured(t *testing.T) {
	if os.Getenv("DAMPER_MEASURE") == "" {
		t.Skip("set DAMPER_MEASURE=1 to run: it drives every kind of fault on a real redis-server")
	}
	var rows, more []string
	for _, k := range faultKinds {
		t.Run(k.name, func(t *testing.T) {
			lim, limBound := measureLimiter(t, k)
			bud := measureBudget(t, k)
			budBound := "36: 18 in the fault, one budget once every process has charged, twice before"
			switch {
			case k.atStart:
				budBound = "60: 13 + 14 + 15 (N = 1 each) in the fault, 18 after"
			case k.length == 0:
				budBound = "36: 18 before, 18 after the state is lost"
			}
			brk, brkBound := measureBreaker(t, k)
			thr, thrBound := measureThrottle(t, k)
			big, small, shBound := measureShares(t, k)
			spent, spBound := measureSpend(t, k)
			rows = append(rows, fmt.Sprintf("| %s | %d | %s | %d | %s | %d | %s | %d | %s |", k.name, lim, limBound, bud, budBound, brk, brkBound, thr, thrBound))
			more = append(more, fmt.Sprintf("| %s | %d + %d = %d | %s | $%.2f | %s |", k.name, big, small, big+small, shBound, spent, spBound))
		})
	}
	t.Logf("\n| fault | limiter admitted | limiter bound | budget granted | budget bound | breaker admitted | breaker bound | throttle retries | throttle bound |\n|---|---|---|---|---|---|---|---|---|\n%s", strings.Join(rows, "\n"))
	t.Logf("\n| fault | shares admitted (big + small) | shares bound | spend | spend bound |\n|---|---|---|---|---|\n%s", strings.Join(more, "\n"))
}

func measureLimiter(t *testing.T, k faultKind) (int, string) {
	const n, step = 3, 100 * time.Millisecond
	before, after := 5*time.Second, 12*time.Second
	srv := redistest.Start(t)
	f := newFaultFleet(t, srv, "measure-limit", n, redisstore.Options{})
	settings := fleet.LimitSettings{Group: "claude-sonnet-4", Limits: fleet.RateLimits{RequestsPerMinute: 60}, BatchShare: 1}
	bs := make([]fleet.LimitBuckets, n)
	for i, s := range f.stores {
		bs[i] = newBuckets(t, s, settings)
	}
	ctx := context.Background()
	one := fleet.RateAmounts{1, 0, 0}
	take := func(b fleet.LimitBuckets, now time.Time) bool {
		r, _, _ := b.Reserve(ctx, now, one, fleet.Interactive, now, nil)
		if !r.Taken() {
			return false
		}
		_ = b.Settle(ctx, now, r, one, [3]bool{true, true, true})
		return true
	}
	window := before + k.length + after
	if k.atStart {
		k.start(t, f)
		before = 0
	} else {
		for i := 0; take(bs[i%n], base); i++ {
		}
		notes := make([]fleet.Budget, n)
		for i, s := range f.stores {
			var err error
			notes[i], err = s.Budget(fleet.BudgetSettings{Ratio: 0.1, Window: time.Minute, MinTokens: 1, Tenant: "notes"})
			mustNil(t, err)
		}
		f.join(t, func(i int) { mustNil(t, notes[i].Observe(ctx, base, success)) })
	}
	total := 0
	for at := step; at <= window; at += step {
		now := base.Add(at)
		if at == before && !k.atStart {
			k.start(t, f)
		}
		if at == before+k.length {
			if k.end != nil {
				k.end(t, f)
			}
			f.waitShared(t)
		}
		for _, b := range bs {
			if take(b, now) {
				total++
			}
		}
	}
	refill := int(window / time.Second)
	bound := fmt.Sprintf("%d", refill)
	switch {
	case k.atStart:
		bound = fmt.Sprintf("%d × (60 + %d) = %d", n, int(k.length/time.Second), n*(60+int(k.length/time.Second)))
	case k.length == 0 || strings.HasPrefix(k.name, "kill"):
		bound = fmt.Sprintf("%d + 60 (state lost: a full bucket) = %d", refill, refill+60)
	}
	t.Logf("limiter: %d admitted over %v; bound %s", total, window, bound)
	return total, bound
}

func measureBudget(t *testing.T, k faultKind) int {
	const n = 3
	srv := redistest.Start(t)
	f := newFaultFleet(t, srv, "measure-budget", n, redisstore.Options{})
	ctx := context.Background()
	bs := make([]fleet.Budget, n)
	for i, s := range f.stores {
		var err error
		bs[i], err = s.Budget(fleet.BudgetSettings{Ratio: 0.5, Window: time.Minute, MinTokens: 12})
		mustNil(t, err)
	}
	if k.atStart {
		k.start(t, f)
	} else {
		f.join(t, func(i int) { mustNil(t, bs[i].Observe(ctx, base.Add(-time.Minute), success)) })
	}
	granted := 0
	ask := func() {
		for _, b := range bs {
			for range 20 {
				if ok, _ := b.Acquire(ctx, base); ok {
					granted++
				}
			}
		}
	}
	observe := func() {
		for i, b := range bs {
			for range 2 * (i + 1) {
				_ = b.Observe(ctx, base, success)
			}
		}
	}
	if k.length == 0 {
		observe()
		// State lost: the window's budget spent, then lost, then asked again.
		for _, s := range f.stores {
			mustNil(t, s.Flush(ctx))
		}
		ask()
		k.start(t, f)
		f.waitShared(t)
		ask()
	} else {
		if !k.atStart {
			k.start(t, f)
		}
		observe() // counted locally only
		ask()
		if k.end != nil {
			k.end(t, f)
		}
		f.waitShared(t)
		ask() // the same window, Redis back
	}
	t.Logf("budget: %d granted in the window (one budget: 12 + 0.5 × 12 = 18; twice: 36)", granted)
	return granted
}

// faultSteps drives a fleet through fault k on a virtual clock, a step
// every 100 ms from 5 s before the fault (none for one at start) to 12 s
// after it; step runs each step, with inFault true for the steps after
// the fault's start (the fault's length and 12 s).
func faultSteps(t *testing.T, k faultKind, f *faultFleet, before time.Duration, step func(now time.Time, inFault bool)) {
	const every = 100 * time.Millisecond
	after := 12 * time.Second
	if k.atStart {
		before = 0
		k.start(t, f)
	}
	window := before + k.length + after
	for at := every; at <= window; at += every {
		if at == before && !k.atStart {
			k.start(t, f)
		}
		if at == before+k.length {
			if k.end != nil {
				k.end(t, f)
			}
			f.waitShared(t)
		}
		step(base.Add(at), k.atStart || at > before)
	}
}

// joinByBudget has each store of f count the whole fleet, by a success
// each records on a budget of its own.
func joinByBudget(t *testing.T, f *faultFleet) {
	t.Helper()
	notes := make([]fleet.Budget, len(f.stores))
	for i, s := range f.stores {
		var err error
		notes[i], err = s.Budget(fleet.BudgetSettings{Ratio: 0.1, Window: time.Minute, MinTokens: 1, Tenant: "notes"})
		mustNil(t, err)
	}
	f.join(t, func(i int) { mustNil(t, notes[i].Observe(context.Background(), base, success)) })
}

// breakerSettings open on 3 attempts, half of them failed, for 1 s each
// time (MaxOpenFor = OpenFor: one probe per second, open or not).
var breakerSettings = fleet.BreakerSettings{FailureRatio: 0.5, MinAttempts: 3, Window: 10 * time.Second,
	OpenFor: time.Second, MaxOpenFor: time.Second, ProbeLimit: 500 * time.Millisecond}

// oneBreaker counts what one breaker, fleet.MemoryStore's, admits from
// closed with an empty window when asked calls times a step, every 100 ms
// for d, every admitted attempt failing: the unit of the fleet guide's
// bound.
func oneBreaker(t *testing.T, calls int, d time.Duration) int {
	b, err := fleet.MemoryStore{}.Breaker(breakerSettings)
	mustNil(t, err)
	ctx := context.Background()
	n := 0
	for at := 100 * time.Millisecond; at <= d; at += 100 * time.Millisecond {
		for range calls {
			if a, _ := b.Allow(ctx, base.Add(at)); a.OK {
				n++
				_ = b.Done(ctx, a.Ticket, base.Add(at), fleet.CircuitFailure)
			}
		}
	}
	return n
}

// measureBreaker counts the attempts a fleet of three processes admits
// through a shared breaker from the fault's start to 12 s after it, each
// process asking every 100 ms and every admitted attempt failing (the
// provider down throughout), the breaker opened in Redis before the fault.
// The bound is the fleet guide's: in the fault, N breakers of their own,
// each from an empty window; after it, one breaker, from closed should
// Redis have lost its state.
func measureBreaker(t *testing.T, k faultKind) (int, string) {
	const n = 3
	srv := redistest.Start(t)
	f := newFaultFleet(t, srv, "measure-breaker", n, redisstore.Options{})
	bs := make([]fleet.Breaker, n)
	for i, s := range f.stores {
		var err error
		bs[i], err = s.Breaker(breakerSettings)
		mustNil(t, err)
	}
	ctx := context.Background()
	if !k.atStart {
		joinByBudget(t, f)
	}
	admitted, probes := 0, 0
	faultSteps(t, k, f, 5*time.Second, func(now time.Time, inFault bool) {
		for _, b := range bs {
			a, _ := b.Allow(ctx, now)
			if !a.OK {
				continue
			}
			if inFault {
				admitted++
				if a.Ticket.Probe {
					probes++
				}
			}
			_ = b.Done(ctx, a.Ticket, now, fleet.CircuitFailure)
		}
	})
	// The steps faultSteps counts: those strictly inside the fault, then
	// from its end to 12 s after it, both included (after a fault of no
	// length, the 12 s after it).
	inFault, after := 0, oneBreaker(t, n, 12*time.Second)
	if k.length > 0 {
		inFault, after = oneBreaker(t, 1, k.length-100*time.Millisecond), oneBreaker(t, n, 12*time.Second+100*time.Millisecond)
	}
	bound := fmt.Sprintf("%d × %d + %d = %d", n, inFault, after, n*inFault+after)
	t.Logf("breaker: %d admitted (%d probes) from the fault's start; bound %s", admitted, probes, bound)
	return admitted, bound
}

// throttleSettings: 10 tokens, no retry at 5 or fewer.
var throttleSettings = fleet.ThrottleSettings{MaxTokens: 10, TokenRatio: 0.1}

// throttleStep is one failed attempt of a process and the retry the
// throttle allows it (Damper's rule: a retryable failure takes a token, a
// retry goes while more than half are left), the retry failing as well.
func throttleStep(ctx context.Context, th fleet.Throttle) bool {
	_ = th.Add(ctx, -1000)
	n, _ := th.Tokens(ctx)
	if n <= int64(throttleSettings.MaxTokens)*500 {
		return false
	}
	_ = th.Add(ctx, -1000)
	return true
}

// oneThrottle counts the retries one full throttle allows calls failing
// attempts a step: the unit of the fleet guide's bound.
func oneThrottle(t *testing.T, calls int) int {
	th, err := fleet.MemoryStore{}.Throttle(throttleSettings)
	mustNil(t, err)
	n := 0
	for range 200 * calls {
		if throttleStep(context.Background(), th) {
			n++
		}
	}
	return n
}

// measureThrottle counts the retries a fleet of three processes' shared
// throttle allows from the fault's start to 12 s after it, each process
// failing an attempt every 100 ms (the provider down throughout), the
// shared count drained below half before the fault. The bound is the
// fleet guide's: N throttles in the fault, each from full, and one after
// it, full should Redis have lost its state.
func measureThrottle(t *testing.T, k faultKind) (int, string) {
	const n = 3
	srv := redistest.Start(t)
	f := newFaultFleet(t, srv, "measure-throttle", n, redisstore.Options{})
	ths := make([]fleet.Throttle, n)
	for i, s := range f.stores {
		var err error
		ths[i], err = s.Throttle(throttleSettings)
		mustNil(t, err)
	}
	ctx := context.Background()
	if !k.atStart {
		joinByBudget(t, f)
	}
	retries := 0
	faultSteps(t, k, f, 5*time.Second, func(_ time.Time, inFault bool) {
		for _, th := range ths {
			if throttleStep(ctx, th) && inFault {
				retries++
			}
		}
	})
	one := oneThrottle(t, 1)
	bound := fmt.Sprintf("%d × %d + %d = %d", n, one, one, (n+1)*one)
	if k.length == 0 {
		bound = fmt.Sprintf("%d: the state lost, one throttle full again", one)
	}
	t.Logf("throttle: %d retries from the fault's start; bound %s", retries, bound)
	return retries, bound
}

// measureShares counts what a fleet of three processes admits for two
// tenants sharing requests_per_minute: 60 by weight, "big" (3) and
// "small" (1), each process asking once a step for each, in turns first
// (a request takes its tenant's share, 1/60 of a minute of the limit,
// then a token of the shared bucket; a share taken for a request the
// bucket refuses is given back), on the limiter's steps (from 5 s before
// the fault, the bucket drained first). The bound is the fleet guide's:
// the tenants together within the limiter's, and each tenant within its
// share's bucket in Redis over the window plus, in a fault, one in each
// process's memory, starting full.
func measureShares(t *testing.T, k faultKind) (big, small int, bound string) {
	const n, step = 3, 100 * time.Millisecond
	before, after := 5*time.Second, 12*time.Second
	srv := redistest.Start(t)
	f := newFaultFleet(t, srv, "measure-shares", n, redisstore.Options{})
	settings := fleet.LimitSettings{Group: "claude-sonnet-4", Limits: fleet.RateLimits{RequestsPerMinute: 60}, BatchShare: 1}
	bs := make([]fleet.LimitBuckets, n)
	shs := make([]fleet.LimitShares, n)
	for i, s := range f.stores {
		bs[i] = newBuckets(t, s, settings)
		var err error
		shs[i], err = s.LimitShares(fleet.ShareSettings{Group: settings.Group})
		mustNil(t, err)
	}
	ctx := context.Background()
	one := fleet.RateAmounts{1, 0, 0}
	take := func(i int, tenant string, weight int, now time.Time) bool {
		sr, _, _ := shs[i].Take(ctx, now, fleet.ShareAsk{Tenant: tenant, Weight: weight, Fraction: 1.0 / 60}, now)
		if !sr.Taken() {
			return false
		}
		r, _, _ := bs[i].Reserve(ctx, now, one, fleet.Interactive, now, nil)
		if !r.Taken() {
			_ = shs[i].Settle(ctx, now, sr, 0)
			return false
		}
		_ = bs[i].Settle(ctx, now, r, one, [3]bool{true, true, true})
		return true
	}
	window := before + k.length + after
	if k.atStart {
		k.start(t, f)
		before = 0
	} else {
		for i := 0; ; i++ {
			r, _, _ := bs[i%n].Reserve(ctx, base, one, fleet.Interactive, base, nil)
			if !r.Taken() {
				break
			}
			_ = bs[i%n].Settle(ctx, base, r, one, [3]bool{true, true, true})
		}
		joinByBudget(t, f)
	}
	for at := step; at <= window; at += step {
		now := base.Add(at)
		if at == before && !k.atStart {
			k.start(t, f)
		}
		if at == before+k.length {
			if k.end != nil {
				k.end(t, f)
			}
			f.waitShared(t)
		}
		for i := range n {
			// Each process asks for both, in turns first.
			first := (int(at/step)+i)%2 == 0
			for _, isBig := range []bool{first, !first} {
				switch {
				case isBig && take(i, "big", 3, now):
					big++
				case !isBig && take(i, "small", 1, now):
					small++
				}
			}
		}
	}
	refill := int(window / time.Second)
	total := refill
	switch {
	case k.atStart:
		total = n * (60 + int(k.length/time.Second))
	case k.length == 0 || strings.HasPrefix(k.name, "kill"):
		total = refill + 60
	}
	// A tenant's share is a bucket of w/W of a minute of the limit,
	// refilled at that a minute: Redis's over the whole window (it hears
	// nothing of a fault's takes), plus, in a fault, one in each process's
	// memory, starting full, plus a full one again where Redis lost it.
	perTenant := func(w float64) float64 {
		x := w * (60 + window.Seconds())
		if k.length > 0 {
			x += n * w * (60 + k.length.Seconds())
		}
		if k.length == 0 || strings.HasPrefix(k.name, "kill") || k.atStart {
			x += w * 60
		}
		return x
	}
	bigMax, smallMax := perTenant(0.75), perTenant(0.25)
	bound = fmt.Sprintf("together ≤ %d (the limiter's); big ≤ %.0f, small ≤ %.0f", total, bigMax, smallMax)
	t.Logf("shares: big %d, small %d over %v; bound %s", big, small, window, bound)
	if float64(big) > bigMax || float64(small) > smallMax || big+small > total {
		t.Errorf("shares: big %d, small %d past the bound %s", big, small, bound)
	}
	return big, small, bound
}

// measureSpend counts the dollars a fleet of three processes spends for a
// tenant with a ceiling of $10 a day, each process asking Spent before
// each call and adding $0.10 after it, one call a step, from the fault's
// start (the fleet's count at $4, heard by each, before it; nothing for a
// fault at start) to 12 s after it. The bound is the fleet guide's: each
// process stops on its own knowledge, the count last heard plus its own
// Adds, so the fleet reaches at most S₀ + N × (C − S₀); a fault that loses
// Redis's count lets up to C more through once Redis answers, less what
// the processes' Adds owed to it bring back; and each process may pass the
// ceiling by one call, checked before the others' Adds reached Redis.
func measureSpend(t *testing.T, k faultKind) (spent float64, bound string) {
	const n = 3
	const ceiling, cost, s0 = 10.0, 0.1, 4.0
	srv := redistest.Start(t)
	f := newFaultFleet(t, srv, "measure-spend", n, redisstore.Options{})
	sps := make([]fleet.Spend, n)
	for i, s := range f.stores {
		var err error
		sps[i], err = s.Spend(fleet.SpendSettings{Tenant: "acme"})
		mustNil(t, err)
	}
	ctx := context.Background()
	calls := 0
	start := 0.0
	if !k.atStart {
		start = s0
		mustNil(t, sps[0].Add(ctx, base, s0))
		joinByBudget(t, f)
		for i, sp := range sps {
			if got, err := sp.Spent(ctx, base); err != nil || got != s0 {
				t.Fatalf("store %d: Spent before the fault = %v, %v; want %v", i, got, err, s0)
			}
		}
	}
	faultSteps(t, k, f, 100*time.Millisecond, func(now time.Time, _ bool) {
		for _, sp := range sps {
			if got, _ := sp.Spent(ctx, now); got < ceiling-1e-9 {
				_ = sp.Add(ctx, now, cost)
				calls++
			}
		}
	})
	spent = start + float64(calls)*cost
	// Each process may pass the ceiling by the call it checked before the
	// others' Adds reached Redis, shared or not: N calls.
	over := n * cost
	bound = fmt.Sprintf("%.0f + %d × (%.0f − %.0f) + %.1f", start, n, ceiling, start, over)
	limit := start + n*(ceiling-start)
	switch {
	case k.atStart:
		bound = fmt.Sprintf("%d × %.0f + %.1f (N = 1 each)", n, ceiling, over)
	case k.length == 0:
		limit = start + ceiling
		bound = fmt.Sprintf("%.0f + %.0f + %.1f: the count lost, C again", start, ceiling, over)
	case strings.HasPrefix(k.name, "kill"):
		limit = start + max(n*(ceiling-start), ceiling)
		bound = fmt.Sprintf("%.0f + max(%d × %.0f, %.0f) + %.1f: the count lost", start, n, ceiling-start, ceiling, over)
	}
	limit += over
	bound += fmt.Sprintf(" = %.1f", limit)
	t.Logf("spend: $%.2f spent by the fleet (ceiling $%.0f); bound %s", spent, ceiling, bound)
	if spent > limit+1e-9 {
		t.Errorf("spend: $%.2f past the bound %s", spent, bound)
	}
	return spent, bound
}
