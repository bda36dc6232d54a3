package ratelimit

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Every test drives the group with explicit times: t0 plus durations.
// Real time appears only in guard, as a deadlock guard.

var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

const (
	sec = time.Second
	ms  = time.Millisecond
)

// at is t0+d.
func at(d time.Duration) time.Time { return t0.Add(d) }

// far is a latest time that refuses nothing in these tests.
var far = t0.Add(1000 * time.Hour)

var allKinds = [NumKinds]bool{true, true, true}

// std are the limits most tests configure: one request a second, 100
// input tokens a second, 200 output tokens a second.
var std = Amounts{60, 6000, 12000}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Sub(t0).String()
}

// levels returns the buckets' levels at now, refilling them up to now as
// every method does; during a pause, the level at the pause's end.
func levels(g *Group, now time.Time) Amounts {
	g.mu.Lock()
	defer g.mu.Unlock()
	var a Amounts
	for k := range g.b {
		g.b[k].advance(now)
		a[k] = g.b[k].level
	}
	return a
}

// takenCounts returns each bucket's taken count.
func takenCounts(g *Group) Amounts {
	g.mu.Lock()
	defer g.mu.Unlock()
	var a Amounts
	for k := range g.b {
		a[k] = g.b[k].taken
	}
	return a
}

func near(a, b float64) bool {
	return math.Abs(a-b) <= 1e-9*max(1, math.Abs(a), math.Abs(b))
}

func nearAmounts(a, b Amounts) bool {
	for k := range a {
		if !near(a[k], b[k]) {
			return false
		}
	}
	return true
}

func wantLevels(t *testing.T, g *Group, now time.Time, want Amounts) {
	t.Helper()
	if got := levels(g, now); !nearAmounts(got, want) {
		t.Fatalf("levels at %s = %v, want %v", fmtTime(now), got, want)
	}
}

// wantReserve asks Reserve and checks its due time and whether it took;
// a request that takes nothing must return the zero Reservation.
func wantReserve(t *testing.T, g *Group, now time.Time, cost Amounts, p Priority, latest time.Time, tk *Ticket, wantDue time.Time, wantTaken bool) Reservation {
	t.Helper()
	r, due, taken := g.Reserve(now, cost, p, latest, tk)
	if !due.Equal(wantDue) || taken != wantTaken {
		t.Fatalf("Reserve(%s, %v, p%d, latest %s) = due %s taken %v; want due %s taken %v",
			fmtTime(now), cost, p, fmtTime(latest), fmtTime(due), taken, fmtTime(wantDue), wantTaken)
	}
	if r.Taken() != taken {
		t.Fatalf("Reservation.Taken() = %v, Reserve said %v", r.Taken(), taken)
	}
	if !taken && r != (Reservation{}) {
		t.Fatalf("a request that took nothing returned %+v", r)
	}
	if want := g.held(cost); taken && r.Cost() != want {
		t.Fatalf("Cost() = %v, want %v", r.Cost(), want)
	}
	return r
}

// take reserves an interactive request that must take, whatever its due.
func take(t *testing.T, g *Group, now time.Time, cost Amounts) Reservation {
	t.Helper()
	r, _, taken := g.Reserve(now, cost, Interactive, far, nil)
	if !taken {
		t.Fatalf("Reserve(%s, %v) took nothing", fmtTime(now), cost)
	}
	return r
}

// clone copies g's state into a new group.
func clone(g *Group) *Group {
	g.mu.Lock()
	defer g.mu.Unlock()
	return &Group{b: g.b, batchShare: g.batchShare, line: slices.Clone(g.line)}
}

// raw is g's whole state, to compare before and after a call that must
// change nothing.
type raw struct {
	b         [NumKinds]bucket
	batchNext time.Time // the line's end
	inLine    int       // slots in the line
}

func rawState(g *Group) raw {
	g.mu.Lock()
	defer g.mu.Unlock()
	return raw{g.b, g.lineEnd(), len(g.line)}
}

func TestKindString(t *testing.T) {
	for k, want := range map[Kind]string{Requests: "requests", InputTokens: "input_tokens", OutputTokens: "output_tokens", 3: "unknown", -1: "unknown"} {
		if got := k.String(); got != want {
			t.Errorf("Kind(%d).String() = %q, want %q", k, got, want)
		}
	}
	if Kinds != [NumKinds]Kind{Requests, InputTokens, OutputTokens} {
		t.Errorf("Kinds = %v", Kinds)
	}
}

// TestNew checks that configured buckets start full and the others
// unknown.
func TestNew(t *testing.T) {
	g := New(Settings{Limits: Amounts{60, 0, 12000}, BatchShare: 0.8})
	want := [NumKinds]BucketState{
		{Kind: Requests, Limit: 60, Remaining: 60, Configured: true},
		{Kind: InputTokens},
		{Kind: OutputTokens, Limit: 12000, Remaining: 12000, Configured: true},
	}
	if got := g.State(t0); got != want {
		t.Fatalf("State = %+v\nwant %+v", got, want)
	}
	// Full at any time, even the zero time.
	if got := New(Settings{Limits: std}).State(time.Time{}); got[2].Remaining != 12000 {
		t.Fatalf("State(zero time) = %+v", got)
	}
	if got := g.PausedUntil(t0); !got.IsZero() {
		t.Fatalf("PausedUntil = %s", fmtTime(got))
	}
}

// TestInteractiveTakesFromAll checks that a request takes from the three
// buckets at once.
func TestInteractiveTakesFromAll(t *testing.T) {
	g := New(Settings{Limits: std, BatchShare: 0.8})
	wantReserve(t, g, t0, Amounts{1, 100, 200}, Interactive, t0, nil, t0, true)
	wantLevels(t, g, t0, Amounts{59, 5900, 11800})
	st := g.State(t0)
	for k, want := range (Amounts{59, 5900, 11800}) {
		if st[k].Remaining != want || st[k].Limit != std[k] || !st[k].Configured || st[k].Kind != Kind(k) {
			t.Fatalf("State[%d] = %+v, want Remaining %v", k, st[k], want)
		}
	}
	if got := takenCounts(g); got != (Amounts{1, 100, 200}) {
		t.Fatalf("taken = %v", got)
	}
}

// TestDueWhenBucketRefills checks the exact due time of a request that
// lacks room in one bucket or more: a bucket of limit L refills L a
// minute. It is refused 1 ns short of its due time, taking nothing, and
// admitted at it, taking from every bucket.
func TestDueWhenBucketRefills(t *testing.T) {
	cost := Amounts{1, 100, 200}
	cases := []struct {
		name string
		pre  Amounts       // taken at t0
		ask  time.Duration // when the request asks
		due  time.Duration
		// the levels at the request's asking time, before it takes
		before Amounts
	}{
		{"room in every bucket", Amounts{}, 0, 0, std},
		{"exactly room", Amounts{59, 5900, 11800}, 0, 0, Amounts{1, 100, 200}},
		{"requests empty: one a second", Amounts{60, 0, 0}, 0, sec, Amounts{0, 6000, 12000}},
		{"input short by 50: 100 a second", Amounts{0, 5950, 0}, 0, 500 * ms, Amounts{60, 50, 12000}},
		{"output in debt", Amounts{0, 0, 12100}, 0, 1500 * ms, Amounts{60, 6000, -100}},
		{"the latest bucket decides", Amounts{60, 5950, 12100}, 0, 1500 * ms, Amounts{0, 50, -100}},
		{"partly refilled when asked", Amounts{60, 0, 0}, 250 * ms, sec, Amounts{0.25, 6000, 12000}},
		{"refilled when asked", Amounts{60, 6000, 12000}, 2 * sec, 2 * sec, Amounts{2, 200, 400}},
		{"capped at the limit", Amounts{30, 3000, 0}, 10 * time.Minute, 10 * time.Minute, std},
		{"a minute refills the whole bucket", Amounts{60, 6000, 12000}, time.Minute, time.Minute, std},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := New(Settings{Limits: std, BatchShare: 0.8})
			if c.pre != (Amounts{}) {
				// In two requests: one takes no more than a bucket.
				for range 2 {
					take(t, g, t0, Amounts{c.pre[0] / 2, c.pre[1] / 2, c.pre[2] / 2})
				}
			}
			now, due := at(c.ask), at(c.due)
			wantLevels(t, g, now, c.before)
			if due.After(now) {
				if got := g.Admits(now, now, cost, Interactive); !got.Equal(due) {
					t.Fatalf("Admits = %s, want %s", fmtTime(got), fmtTime(due))
				}
				before := rawState(g)
				wantReserve(t, g, now, cost, Interactive, due.Add(-1), nil, due, false)
				if after := rawState(g); after != before {
					t.Fatalf("a refused request changed the group:\n%+v\n%+v", before, after)
				}
			}
			wantReserve(t, g, now, cost, Interactive, due, nil, due, true)
			after := c.before
			for k := range after {
				after[k] -= cost[k]
			}
			wantLevels(t, g, now, after)
		})
	}
}

// TestFirstComeFirstServed checks that a request taken early drives the
// level below zero and that later requests queue behind its debt, due
// strictly later, whenever they ask.
func TestFirstComeFirstServed(t *testing.T) {
	g := New(Settings{Limits: std, BatchShare: 0.8})
	for range 60 {
		wantReserve(t, g, t0, Amounts{1, 0, 0}, Interactive, t0, nil, t0, true)
	}
	// Each is due a second after the one before.
	for i := 1; i <= 10; i++ {
		wantReserve(t, g, t0, Amounts{1, 0, 0}, Interactive, far, nil, at(time.Duration(i)*sec), true)
	}
	wantLevels(t, g, t0, Amounts{-10, 6000, 12000})
	// Asking later changes nothing to the line: 2.5 s later the level is
	// -7.5, and the 11th is due at 11 s.
	wantReserve(t, g, at(2500*ms), Amounts{1, 0, 0}, Interactive, far, nil, at(11*sec), true)
	// A request of 3 is due when 3 more have refilled.
	wantReserve(t, g, at(3*sec), Amounts{3, 0, 0}, Interactive, far, nil, at(14*sec), true)
	// Equal token costs are spaced by their refill time: 3000 input
	// tokens take 30 s.
	h := New(Settings{Limits: std})
	for i := range 5 {
		wantReserve(t, h, t0, Amounts{0, 3000, 0}, Interactive, far, nil, at(time.Duration(max(0, i-1))*30*sec), true)
	}
	wantLevels(t, h, t0, Amounts{60, -9000, 12000})
}

// TestAllOrNone checks that a request due after latest takes nothing from
// any bucket, reports when it could be admitted, and leaves the line as if
// it had never asked.
func TestAllOrNone(t *testing.T) {
	g := New(Settings{Limits: std, BatchShare: 0.8})
	take(t, g, t0, Amounts{0, 5900, 0})
	before := g.State(t0)
	raw0 := rawState(g)
	cost := Amounts{1, 400, 200}
	// Input has 100 and needs 400: 3 s.
	r := wantReserve(t, g, t0, cost, Interactive, at(3*sec-1), nil, at(3*sec), false)
	if after := g.State(t0); after != before {
		t.Fatalf("State after a refusal:\n%+v\nwant %+v", after, before)
	}
	if raw1 := rawState(g); raw1 != raw0 {
		t.Fatalf("a refusal changed the group:\n%+v\n%+v", raw0, raw1)
	}
	// Settling or cancelling what was refused changes nothing.
	g.Settle(&r, t0, Amounts{5, 5, 5}, allKinds)
	g.Cancel(&r, t0)
	wantLevels(t, g, t0, Amounts{60, 100, 12000})
	if got := takenCounts(g); got != (Amounts{0, 5900, 0}) {
		t.Fatalf("taken = %v", got)
	}
	// A refused request also takes nothing from the buckets that had room.
	wantReserve(t, g, t0, Amounts{1, 400, 200}, Interactive, t0, nil, at(3*sec), false)
	wantLevels(t, g, t0, Amounts{60, 100, 12000})
	// Taken at latest == due.
	wantReserve(t, g, t0, cost, Interactive, at(3*sec), nil, at(3*sec), true)
	wantLevels(t, g, t0, Amounts{59, -300, 11800})
}

// TestOversize checks that a request larger than the whole bucket waits
// for a full bucket, then takes it whole and no more, so that no request
// puts a bucket more than one limit in debt, and is never refused for good.
func TestOversize(t *testing.T) {
	big := Amounts{1, 9000, 0}
	t.Run("full bucket", func(t *testing.T) {
		g := New(Settings{Limits: std})
		r := wantReserve(t, g, t0, big, Interactive, t0, nil, t0, true)
		if r.Cost() != (Amounts{1, 6000, 0}) {
			t.Fatalf("Cost = %v, want the input bucket's limit", r.Cost())
		}
		wantLevels(t, g, t0, Amounts{59, 0, 12000})
		// The next waits for a full bucket again: 6000 to refill, 60 s.
		wantReserve(t, g, at(10*sec), big, Interactive, at(60*sec-1), nil, at(60*sec), false)
		wantReserve(t, g, at(10*sec), big, Interactive, far, nil, at(60*sec), true)
		// And the next, 60 s later; never refused when it can wait.
		wantReserve(t, g, at(10*sec), big, Interactive, far, nil, at(120*sec), true)
		wantLevels(t, g, at(120*sec), Amounts{60, 0, 12000})
	})
	t.Run("partly full bucket", func(t *testing.T) {
		g := New(Settings{Limits: std})
		take(t, g, t0, Amounts{0, 3000, 0})
		if got := g.Admits(t0, t0, big, Interactive); !got.Equal(at(30 * sec)) {
			t.Fatalf("Admits = %s", fmtTime(got))
		}
		wantReserve(t, g, t0, big, Interactive, far, nil, at(30*sec), true)
		wantLevels(t, g, at(30*sec), Amounts{60, 0, 12000})
	})
	t.Run("every bucket oversize", func(t *testing.T) {
		g := New(Settings{Limits: std})
		wantReserve(t, g, t0, Amounts{100, 1e5, 1e5}, Interactive, t0, nil, t0, true)
		wantLevels(t, g, t0, Amounts{0, 0, 0})
		// Each bucket refills whole in a minute.
		wantReserve(t, g, t0, Amounts{100, 1e5, 1e5}, Interactive, far, nil, at(60*sec), true)
		wantLevels(t, g, at(60*sec), Amounts{0, 0, 0})
	})
}

// TestHugeRequestHoldsOneLimit checks that one request asking for far more
// than a bucket (a max_tokens of 1e12) leaves its group usable: it takes
// one limit, the requests after it wait at most a minute for that, and
// settling it by what it used puts exactly that in the bucket.
func TestHugeRequestHoldsOneLimit(t *testing.T) {
	g := New(Settings{Limits: std})
	huge := wantReserve(t, g, t0, Amounts{1, 100, 1e12}, Interactive, t0, nil, t0, true)
	wantLevels(t, g, t0, Amounts{59, 5900, 0})
	// Ten ordinary requests: each waits for its 200 output tokens, a
	// second apart, not for 1e12 tokens to refill.
	small := Amounts{1, 100, 200}
	var rs []Reservation
	for i := range 10 {
		rs = append(rs, wantReserve(t, g, t0, small, Interactive, at(30*sec), nil, at(time.Duration(i+1)*sec), true))
	}
	wantLevels(t, g, t0, Amounts{49, 4900, -2000})
	// The huge one used 500 output tokens: of the limit it held, the
	// bucket gets back all but those (at 5 s, when it had refilled 1000).
	g.Settle(&huge, at(5*sec), Amounts{1, 100, 500}, allKinds)
	wantLevels(t, g, at(5*sec), Amounts{54, 5400, 10500})
	for i := range rs {
		g.Settle(&rs[i], at(5*sec), small, allKinds)
	}
	wantLevels(t, g, at(5*sec), Amounts{54, 5400, 10500})
	if got := takenCounts(g); got != (Amounts{11, 1100, 2500}) {
		t.Fatalf("taken %v, want what the requests used", got)
	}
	// Batch too: its slot is spaced by the refill of one limit at most.
	g = New(Settings{Limits: std, BatchShare: 0.5})
	take(t, g, t0, Amounts{0, 0, 6000})
	var a, b Ticket
	wantReserve(t, g, t0, Amounts{1, 100, 1e12}, Batch, far, &a, at(30*sec), false)
	wantReserve(t, g, t0, small, Batch, far, &b, at(90*sec), false)
}

// TestLearningCountsOneLimitPerRequest checks that a request taken while a
// limit was unknown counts for at most the limit when a response teaches
// it: a huge request in flight does not leave the bucket in debt for ages.
func TestLearningCountsOneLimitPerRequest(t *testing.T) {
	g := New(Settings{})
	take(t, g, t0, Amounts{1, 100, 1000})
	take(t, g, t0, Amounts{1, 100, 1e12})
	r := take(t, g, at(sec), Amounts{1, 100, 1000})
	take(t, g, at(sec), Amounts{1, 100, 1e12})
	g.Observe(at(2*sec), &r, obs(Amounts{40, 9000, 15000}))
	// r's count may lack the two requests before it, still open, and the
	// one after it; each huge one counts as the limit, 20000.
	wantLevels(t, g, at(2*sec), Amounts{37, 8700, 15000 - 1000 - 20000 - 20000})
	// A request of 200 output tokens waits for 26200 to refill at 20000
	// a minute: 78.6 s, not the years that 1e12 would take.
	wantReserve(t, g, at(2*sec), Amounts{1, 100, 200}, Interactive, far, nil, at(80600*ms), true)
}

// TestUnknownLimits checks that buckets whose limit is not known admit
// everything at once, and count.
func TestUnknownLimits(t *testing.T) {
	g := New(Settings{BatchShare: 0.8})
	var tk Ticket
	for i := range 100 {
		now := at(time.Duration(i) * ms)
		wantReserve(t, g, now, Amounts{1, 1e6, 1e6}, Interactive, now, nil, now, true)
		wantReserve(t, g, now, Amounts{1, 1e6, 1e6}, Batch, now, &tk, now, true)
	}
	if got := takenCounts(g); got != (Amounts{200, 2e8, 2e8}) {
		t.Fatalf("taken = %v", got)
	}
	for _, s := range g.State(t0) {
		if s.Limit != 0 || s.Remaining != 0 || s.Configured || !s.PausedUntil.IsZero() {
			t.Fatalf("State = %+v", s)
		}
	}
	if tk != (Ticket{}) {
		t.Fatalf("ticket = %+v", tk)
	}
	// Only the buckets whose limit is configured hold requests back.
	h := New(Settings{Limits: Amounts{60, 0, 0}})
	take(t, h, t0, Amounts{60, 1e9, 1e9})
	wantReserve(t, h, t0, Amounts{1, 1e9, 1e9}, Interactive, far, nil, at(sec), true)
}

var learnAll = Observation{Has: allKinds, Limit: Amounts{50, 10000, 20000}}

// obs returns an observation of every bucket with the limits of learnAll
// and remaining.
func obs(remaining Amounts) Observation {
	o := learnAll
	o.Remaining = remaining
	return o
}

// TestObserveLearns checks that a response teaches an unknown bucket its
// limit and its level: the response's count of what remains, less what
// the group took after the request it answers.
func TestObserveLearns(t *testing.T) {
	g := New(Settings{})
	a := take(t, g, t0, Amounts{1, 100, 1000})
	take(t, g, at(sec), Amounts{1, 200, 3000})
	g.Observe(at(2*sec), &a, obs(Amounts{45, 9500, 15000}))
	wantLevels(t, g, at(2*sec), Amounts{44, 9300, 12000})
	want := [NumKinds]BucketState{
		{Kind: Requests, Limit: 50, Remaining: 44},
		{Kind: InputTokens, Limit: 10000, Remaining: 9300},
		{Kind: OutputTokens, Limit: 20000, Remaining: 12000},
	}
	if got := g.State(at(2 * sec)); got != want {
		t.Fatalf("State = %+v\nwant %+v", got, want)
	}
	// The learned limits refill: 6 s later 5 requests, 1000 input tokens
	// (capped) and 2000 output tokens.
	wantLevels(t, g, at(8*sec), Amounts{49, 10000, 14000})
	// And hold requests back: 51 requests leave -2, and one more waits
	// for 3 to refill at 50 a minute, 3.6 s.
	take(t, g, at(8*sec), Amounts{50, 0, 0})
	take(t, g, at(8*sec), Amounts{1, 0, 0})
	wantReserve(t, g, at(8*sec), Amounts{1, 0, 0}, Interactive, far, nil, at(11600*ms), true)
}

// TestObserveRange checks that a response's count only lowers a learned
// level, to the count itself: the group's own accounting is exact for its
// own traffic, and a count may not hold requests the API had not seen yet.
func TestObserveRange(t *testing.T) {
	g := New(Settings{})
	x := take(t, g, t0, Amounts{1, 0, 0})
	g.Observe(t0, &x, obs(Amounts{49, 1000, 1000})) // learns: 49 left
	wantLevels(t, g, t0, Amounts{49, 1000, 1000})
	a := take(t, g, t0, Amounts{1, 0, 0})
	b := take(t, g, t0, Amounts{1, 0, 0})
	// The API reached b first: its count lacks a, and says 48. Kept at 47.
	g.Observe(t0, &b, obs(Amounts{48, 1000, 1000}))
	wantLevels(t, g, t0, Amounts{47, 1000, 1000})
	// a's count holds b: 47. Kept, where taking the count less what was
	// taken after a would have made it 46.
	g.Observe(t0, &a, obs(Amounts{47, 1000, 1000}))
	wantLevels(t, g, t0, Amounts{47, 1000, 1000})
	c := take(t, g, t0, Amounts{1, 0, 0})
	g.Observe(t0, &c, obs(Amounts{40, 1000, 1000}))
	wantLevels(t, g, t0, Amounts{40, 1000, 1000})
	// A limit raised by 50 raises the level by as much; the count holds
	// d, and e may be in it or not: 38 + 50, under the count of 90.
	d := take(t, g, t0, Amounts{1, 0, 0})
	e := take(t, g, t0, Amounts{1, 0, 0})
	o := obs(Amounts{90, 1000, 1000})
	o.Limit[Requests] = 100
	g.Observe(t0, &d, o)
	wantLevels(t, g, t0, Amounts{88, 1000, 1000})
	if !d.seen[Requests] || e.seen[Requests] {
		t.Fatalf("seen: d %v, e %v; want d's request counted as the API counted it", d.seen, e.seen)
	}
}

// TestObserveMarks checks the mark arithmetic as a bucket learns its
// limit: the level becomes the response's remaining count less what was
// taken, net of what settled back, after the observed reservation, and
// less what earlier reservations still open took.
func TestObserveMarks(t *testing.T) {
	costs := []Amounts{{0, 100, 0}, {0, 200, 0}, {0, 400, 0}}
	const remaining = 5000
	cases := []struct {
		name     string
		observed int
		// then runs, after the three reservations, before the
		// observation
		then func(g *Group, rs []Reservation)
		want float64
	}{
		{"the first, two after it", 0, nil, remaining - 600},
		// The API may not have counted an earlier request still open.
		{"the second, one after it", 1, nil, remaining - 400 - 100},
		{"the last", 2, nil, remaining - 300},
		{"the first, a later one settled lower", 0, func(g *Group, rs []Reservation) {
			g.Settle(&rs[2], t0, Amounts{0, 50, 0}, allKinds)
		}, remaining - 250},
		{"the first, a later one settled higher", 0, func(g *Group, rs []Reservation) {
			g.Settle(&rs[1], t0, Amounts{0, 700, 0}, allKinds)
		}, remaining - 1100},
		{"the first, a later one cancelled", 0, func(g *Group, rs []Reservation) {
			g.Cancel(&rs[1], t0)
		}, remaining - 400},
		{"the second, an earlier one settled lower", 1, func(g *Group, rs []Reservation) {
			g.Settle(&rs[0], t0, Amounts{0, 40, 0}, allKinds)
		}, remaining - 400 + 60},
		{"the first, a later one settled with input unknown", 0, func(g *Group, rs []Reservation) {
			g.Settle(&rs[1], t0, Amounts{}, [NumKinds]bool{true, false, true})
		}, remaining - 600},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := New(Settings{})
			var rs []Reservation
			for _, cost := range costs {
				rs = append(rs, take(t, g, t0, cost))
			}
			if c.then != nil {
				c.then(g, rs)
			}
			o := Observation{Limit: Amounts{0, 10000, 0}, Remaining: Amounts{0, remaining, 0}}
			o.Has[InputTokens] = true
			g.Observe(t0, &rs[c.observed], o)
			wantLevels(t, g, t0, Amounts{0, c.want, 0})
			st := g.State(t0)
			if st[0].Limit != 0 || st[1].Limit != 10000 || st[2].Limit != 0 {
				t.Fatalf("State = %+v: only input learns", st)
			}
		})
	}
}

// TestObserveLimitChanges checks that a learned limit follows the API up
// and down, the level capped at the new limit, and that a learned level
// follows the API's count up as well as down.
func TestObserveLimitChanges(t *testing.T) {
	g := New(Settings{})
	input := func(limit, remaining float64) Observation {
		o := Observation{Limit: Amounts{0, limit, 0}, Remaining: Amounts{0, remaining, 0}}
		o.Has[InputTokens] = true
		return o
	}
	r := take(t, g, t0, Amounts{1, 100, 0})
	g.Observe(t0, &r, input(10000, 9000))
	wantLevels(t, g, t0, Amounts{-1, 9000, 0})
	g.Observe(t0, &r, input(20000, 19000)) // raised
	wantLevels(t, g, t0, Amounts{-1, 19000, 0})
	if got := g.State(t0)[1]; got.Limit != 20000 || got.Remaining != 19000 {
		t.Fatalf("State = %+v", got)
	}
	g.Observe(t0, &r, input(5000, 8000)) // lowered by 15000, with a count above it
	wantLevels(t, g, t0, Amounts{-1, 4000, 0})
	g.Observe(t0, &r, input(5000, 1000)) // a lower count
	wantLevels(t, g, t0, Amounts{-1, 1000, 0})
	g.Observe(t0, &r, input(5000, 4000)) // a higher count raises nothing
	wantLevels(t, g, t0, Amounts{-1, 1000, 0})
	// Refill follows the new limit: 5000 a minute.
	wantLevels(t, g, at(6*sec), Amounts{-1, 1500, 0})
	// A limit of 0 keeps the limit but still corrects the level.
	g.Observe(at(6*sec), &r, input(0, 1200))
	wantLevels(t, g, at(6*sec), Amounts{-1, 1200, 0})
	if got := g.State(at(6 * sec))[1].Limit; got != 5000 {
		t.Fatalf("limit = %v", got)
	}
	// A bucket without headers, or with a limit of 0 while unknown, is
	// left alone.
	o := input(5000, 1100)
	o.Has[OutputTokens], o.Remaining[OutputTokens] = true, 777
	g.Observe(at(6*sec), &r, o)
	wantLevels(t, g, at(6*sec), Amounts{-1, 1100, 0})
	if st := g.State(at(6 * sec)); st[0].Limit != 0 || st[2].Limit != 0 {
		t.Fatalf("State = %+v", st)
	}
}

// TestObserveConfigured checks that a configured bucket ignores the
// response's limit and only lowers its level.
func TestObserveConfigured(t *testing.T) {
	g := New(Settings{Limits: std})
	r := take(t, g, t0, Amounts{1, 100, 200})
	take(t, g, t0, Amounts{1, 50, 0})
	g.Observe(t0, &r, Observation{Has: allKinds, Limit: Amounts{1000, 1e6, 1e6}, Remaining: Amounts{10, 1e6, 500}})
	// Lowered to the count, never raised: requests min(58, 10), input
	// min(5850, 1e6), output min(11800, 500).
	wantLevels(t, g, t0, Amounts{10, 5850, 500})
	for k, s := range g.State(t0) {
		if s.Limit != std[k] || !s.Configured {
			t.Fatalf("State = %+v", s)
		}
	}
}

// TestSettle checks that settling replaces what a reservation took by what
// its request used, for the buckets known, once.
func TestSettle(t *testing.T) {
	cost := Amounts{1, 1000, 4000}
	cases := []struct {
		name  string
		used  Amounts
		known [NumKinds]bool
		want  Amounts // levels at t0 after
		cost  Amounts // Cost() after
	}{
		{"fewer output tokens", Amounts{1, 1000, 1500}, allKinds, Amounts{59, 5000, 10500}, Amounts{1, 1000, 1500}},
		{"more tokens", Amounts{1, 1200, 5000}, allKinds, Amounts{59, 4800, 7000}, Amounts{1, 1200, 5000}},
		{"only output known", Amounts{0, 0, 1500}, [NumKinds]bool{false, false, true}, Amounts{59, 5000, 10500}, Amounts{1, 1000, 1500}},
		{"nothing known", Amounts{}, [NumKinds]bool{}, Amounts{59, 5000, 8000}, cost},
		{"nothing used", Amounts{}, allKinds, std, Amounts{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := New(Settings{Limits: std})
			r := take(t, g, t0, cost)
			wantLevels(t, g, t0, Amounts{59, 5000, 8000})
			g.Settle(&r, t0, c.used, c.known)
			wantLevels(t, g, t0, c.want)
			if r.Taken() || r.Cost() != c.cost {
				t.Fatalf("after Settle: Taken %v Cost %v", r.Taken(), r.Cost())
			}
			if got := takenCounts(g); got != c.cost {
				t.Fatalf("taken = %v, want %v", got, c.cost)
			}
			// Settled once: later calls change nothing.
			g.Settle(&r, t0, Amounts{}, allKinds)
			g.Cancel(&r, t0)
			wantLevels(t, g, t0, c.want)
		})
	}
	t.Run("cancel", func(t *testing.T) {
		g := New(Settings{Limits: std})
		a := take(t, g, t0, cost)
		b := take(t, g, t0, cost)
		g.Cancel(&a, t0)
		wantLevels(t, g, t0, Amounts{59, 5000, 8000})
		if got := takenCounts(g); got != cost {
			t.Fatalf("taken = %v", got)
		}
		// Capped at the limit: 20 s later the bucket has refilled.
		g.Cancel(&b, at(20*sec))
		wantLevels(t, g, at(20*sec), std)
		if got := takenCounts(g); got != (Amounts{}) {
			t.Fatalf("taken = %v", got)
		}
		g.Cancel(&b, at(20*sec))
		wantLevels(t, g, at(20*sec), std)
	})
	// A response counts the request and its input tokens as the API
	// does: settling leaves them as the response left them, and corrects
	// only the output reserved by max_tokens.
	t.Run("after a response", func(t *testing.T) {
		for _, settings := range []Settings{{}, {Limits: Amounts{50, 10000, 20000}}} {
			g := New(settings)
			r := take(t, g, t0, cost)
			g.Observe(t0, &r, obs(Amounts{40, 8000, 15000}))
			wantLevels(t, g, t0, Amounts{40, 8000, 15000})
			g.Settle(&r, t0, Amounts{0, 900, 1500}, allKinds)
			wantLevels(t, g, t0, Amounts{40, 8000, 17500})
			if got := takenCounts(g); got != (Amounts{1, 1000, 1500}) || r.Cost() != got {
				t.Fatalf("taken = %v, Cost = %v", got, r.Cost())
			}
			// The same for a response to a request that failed, which
			// gives back its output.
			r = take(t, g, t0, cost)
			g.Observe(t0, &r, obs(Amounts{30, 7000, 10000}))
			g.Settle(&r, t0, Amounts{}, [NumKinds]bool{OutputTokens: true})
			wantLevels(t, g, t0, Amounts{30, 7000, 14000})
			if got := r.Cost(); got != (Amounts{1, 1000, 0}) {
				t.Fatalf("Cost = %v", got)
			}
		}
		// A bucket whose headers were missing settles as usual.
		g := New(Settings{})
		r := take(t, g, t0, cost)
		o := obs(Amounts{40, 8000, 15000})
		o.Has[InputTokens] = false
		g.Observe(t0, &r, o)
		g.Settle(&r, t0, Amounts{0, 900, 1500}, allKinds)
		if got := takenCounts(g); got != (Amounts{1, 900, 1500}) {
			t.Fatalf("taken = %v", got)
		}
		wantLevels(t, g, t0, Amounts{40, -900, 17500})
	})
	t.Run("settle later, refilled in between", func(t *testing.T) {
		g := New(Settings{Limits: std})
		r := take(t, g, t0, cost)
		g.Settle(&r, at(sec), Amounts{1, 1000, 3000}, allKinds)
		wantLevels(t, g, at(sec), Amounts{60, 5100, 9200})
	})
	t.Run("an unknown bucket only counts", func(t *testing.T) {
		g := New(Settings{})
		r := take(t, g, t0, cost)
		g.Settle(&r, t0, Amounts{1, 10, 10}, allKinds)
		if got := takenCounts(g); got != (Amounts{1, 10, 10}) {
			t.Fatalf("taken = %v", got)
		}
	})
}

// TestPause checks that a pause empties the buckets it names, which
// refill meanwhile but admit nothing before its end; other buckets go on.
func TestPause(t *testing.T) {
	cost := Amounts{1, 100, 200}
	until := at(11 * sec)
	named := [NumKinds]bool{true, false, false}
	g := New(Settings{Limits: std, BatchShare: 0.8})
	take(t, g, t0, cost)
	g.Pause(at(sec), named, until)
	st := g.State(at(sec))
	if st[0].Remaining != 0 || !st[0].PausedUntil.Equal(until) || st[0].Limit != 60 {
		t.Fatalf("paused bucket: %+v", st[0])
	}
	if st[1].Remaining != 6000 || !st[1].PausedUntil.IsZero() || st[2].Remaining != 12000 || !st[2].PausedUntil.IsZero() {
		t.Fatalf("unnamed buckets: %+v", st)
	}
	if got := g.PausedUntil(at(sec)); !got.Equal(until) {
		t.Fatalf("PausedUntil = %s", fmtTime(got))
	}
	wantLevels(t, g, at(sec), Amounts{0, 6000, 12000})
	// A request that asks nothing of the paused bucket waits all the same.
	wantReserve(t, g, at(2*sec), Amounts{0, 100, 0}, Interactive, until.Add(-1), nil, until, false)
	wantReserve(t, g, at(2*sec), Amounts{0, 100, 0}, Interactive, far, nil, until, true)
	// The bucket refills from the pause's start: by until it holds 10
	// requests, the 11th is due a second later.
	wantLevels(t, g, at(2*sec), Amounts{1, 5900, 12000})
	wantReserve(t, g, at(2*sec), cost, Interactive, until.Add(-1), nil, until, false)
	for range 10 {
		wantReserve(t, g, at(2*sec), cost, Interactive, until, nil, until, true)
	}
	wantReserve(t, g, at(2*sec), cost, Interactive, far, nil, at(12*sec), true)
	wantLevels(t, g, at(2*sec), Amounts{-10, 4800, 9800})
	// A batch request joins the line after the pause: the requests bucket
	// must refill its reserve of 12, one request and the debt of 10 less
	// the second refilled: 22 s after 3 s.
	var tk Ticket
	wantReserve(t, g, at(3*sec), cost, Batch, far, &tk, at(25*sec), false)
	// The unnamed buckets took and refilled meanwhile.
	wantLevels(t, g, at(10*sec), Amounts{-2, 5600, 11400})
	st = g.State(until.Add(-1))
	if st[0].Remaining != 0 || !st[0].PausedUntil.Equal(until) {
		t.Fatalf("1ns before the end: %+v", st[0])
	}
	st = g.State(until)
	if st[0].Remaining != 0 || !st[0].PausedUntil.IsZero() || !g.PausedUntil(until).IsZero() {
		t.Fatalf("at the end: %+v", st[0])
	}
	if st = g.State(at(14 * sec)); st[0].Remaining != 2 {
		t.Fatalf("at 14 s: %+v", st[0])
	}

	t.Run("debt stays", func(t *testing.T) {
		g := New(Settings{Limits: std})
		take(t, g, t0, Amounts{0, 0, 7000})
		take(t, g, t0, Amounts{0, 0, 7000})
		g.Pause(t0, [NumKinds]bool{false, false, true}, at(5*sec))
		wantLevels(t, g, t0, Amounts{60, 6000, -2000})
		// 2200 output tokens refill in 11 s, from the pause's start.
		wantReserve(t, g, t0, cost, Interactive, far, nil, at(11*sec), true)
	})
	t.Run("until not after now only empties", func(t *testing.T) {
		g := New(Settings{Limits: std})
		g.Pause(at(sec), named, at(sec))
		g.Pause(at(sec), [NumKinds]bool{false, true, false}, t0)
		wantLevels(t, g, at(sec), Amounts{0, 0, 12000})
		if st := g.State(at(sec)); !st[0].PausedUntil.IsZero() || !st[1].PausedUntil.IsZero() || !g.PausedUntil(at(sec)).IsZero() {
			t.Fatalf("State = %+v", st)
		}
		wantReserve(t, g, at(sec), cost, Interactive, far, nil, at(2*sec), true)
	})
	t.Run("pauses extend, never shorten", func(t *testing.T) {
		g := New(Settings{Limits: std})
		g.Pause(t0, named, at(10*sec))
		// A shorter pause empties the bucket again, and ends nothing.
		g.Pause(at(5*sec), named, at(6*sec))
		if got := g.PausedUntil(at(5 * sec)); !got.Equal(at(10 * sec)) {
			t.Fatalf("PausedUntil = %s", fmtTime(got))
		}
		wantLevels(t, g, at(5*sec), Amounts{0, 6000, 12000})
		wantReserve(t, g, at(6*sec), cost, Interactive, far, nil, at(10*sec), true)
		wantReserve(t, g, at(6*sec), Amounts{2, 0, 0}, Interactive, far, nil, at(10*sec), true)
		wantReserve(t, g, at(6*sec), cost, Interactive, far, nil, at(10*sec), true)
		wantReserve(t, g, at(6*sec), cost, Interactive, far, nil, at(10*sec), true)
		wantReserve(t, g, at(6*sec), cost, Interactive, far, nil, at(11*sec), true)
		g.Pause(at(7*sec), named, at(20*sec))
		if got := g.PausedUntil(at(7 * sec)); !got.Equal(at(20 * sec)) {
			t.Fatalf("PausedUntil = %s", fmtTime(got))
		}
		// The debt stays: -4 at 7 s, and 23 more take 27 s.
		wantLevels(t, g, at(7*sec), Amounts{-4, 5700, 11400})
		wantReserve(t, g, at(7*sec), cost, Interactive, far, nil, at(20*sec), true)
		wantReserve(t, g, at(7*sec), Amounts{22, 0, 0}, Interactive, far, nil, at(34*sec), true)
		// PausedUntil reports the group's last pause.
		g.Pause(at(7*sec), [NumKinds]bool{false, false, true}, at(30*sec))
		if got := g.PausedUntil(at(7 * sec)); !got.Equal(at(30 * sec)) {
			t.Fatalf("PausedUntil = %s", fmtTime(got))
		}
		if got := g.PausedUntil(at(25 * sec)); !got.Equal(at(30 * sec)) {
			t.Fatalf("PausedUntil = %s", fmtTime(got))
		}
	})
}

// TestPauseUnknownLimit checks that a paused bucket whose limit is not
// known holds every request until the pause ends, then admits at once.
func TestPauseUnknownLimit(t *testing.T) {
	g := New(Settings{BatchShare: 0.8})
	take(t, g, t0, Amounts{1, 100, 100})
	until := at(10 * sec)
	g.Pause(t0, [NumKinds]bool{false, true, false}, until)
	st := g.State(at(sec))
	if !st[1].PausedUntil.Equal(until) || st[1].Limit != 0 || !st[0].PausedUntil.IsZero() {
		t.Fatalf("State = %+v", st)
	}
	before := rawState(g)
	wantReserve(t, g, at(sec), Amounts{1, 1e6, 0}, Interactive, until.Add(-1), nil, until, false)
	if rawState(g).b[1] != before.b[1] {
		t.Fatal("a refused request changed the paused bucket")
	}
	wantReserve(t, g, at(sec), Amounts{1, 1e6, 0}, Interactive, far, nil, until, true)
	var tk Ticket
	wantReserve(t, g, at(sec), Amounts{1, 1e6, 0}, Batch, far, &tk, until, false)
	if !tk.Slot.Equal(until) {
		t.Fatalf("Slot = %s", fmtTime(tk.Slot))
	}
	wantReserve(t, g, until, Amounts{1, 1e6, 0}, Batch, far, &tk, until, true)
	wantReserve(t, g, until, Amounts{1, 1e6, 0}, Interactive, until, nil, until, true)
}

// TestObserveDuringPause checks that no response raises the level of a
// paused bucket, whether its limit is configured or learned, though it
// may lower it.
func TestObserveDuringPause(t *testing.T) {
	inputObs := func(limit, remaining float64) Observation {
		o := Observation{Limit: Amounts{0, limit, 0}, Remaining: Amounts{0, remaining, 0}}
		o.Has[InputTokens] = true
		return o
	}
	named := [NumKinds]bool{false, true, false}
	until := at(31 * sec)
	cases := []struct {
		name     string
		settings Settings
		learn    bool // learn the limit before the pause
	}{
		{"configured", Settings{Limits: Amounts{0, 6000, 0}}, false},
		{"learned", Settings{}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := New(c.settings)
			a := take(t, g, t0, Amounts{1, 100, 100})
			b := take(t, g, t0, Amounts{1, 100, 100})
			start := 5800.0
			if c.learn {
				// a is still open: the count may not hold it yet.
				g.Observe(t0, &b, inputObs(6000, 5800))
				start = 5700
			}
			wantLevels(t, g, t0, Amounts{-2, start, -200})
			g.Pause(at(sec), named, until)
			wantLevels(t, g, at(sec), Amounts{-2, 0, -200})
			// Taken during the pause: due at its end.
			wantReserve(t, g, at(2*sec), Amounts{0, 600, 0}, Interactive, far, nil, until, true)
			wantLevels(t, g, at(2*sec), Amounts{-2, -500, -200})
			g.Observe(at(3*sec), &a, inputObs(6000, 3000))
			if st := g.State(at(3 * sec))[1]; st.Limit != 6000 || st.Remaining != 0 || !st.PausedUntil.Equal(until) {
				t.Fatalf("State = %+v", st)
			}
			wantLevels(t, g, at(3*sec), Amounts{-2, -400, -200})
			// A raised limit raises no level either.
			g.Observe(at(3*sec), &a, inputObs(12000, 12000))
			wantLevels(t, g, at(3*sec), Amounts{-2, -400, -200})
			// A count lowers a level only to the count itself.
			g.Observe(at(3*sec), &a, inputObs(6000, 100))
			wantLevels(t, g, at(3*sec), Amounts{-2, -400, -200})
			if c.learn {
				if st := g.State(at(3 * sec))[1]; st.Limit != 6000 {
					t.Fatalf("State = %+v: the limit follows the response's", st)
				}
			}
			// After the pause a count above the refilled level still
			// raises nothing, learned or configured.
			g.Observe(until, &b, inputObs(6000, 5000))
			want := -400 + 28*100.0
			wantLevels(t, g, until, Amounts{-2, want, -200})
		})
	}
}

// batchSettings: 100 requests, 10000 input and 20000 output tokens a
// minute; batch requests leave 20 % of each.
var batchSettings = Settings{Limits: Amounts{100, 10000, 20000}, BatchShare: 0.8}

// batchCost takes 0.6 s to refill in every bucket of batchSettings.
var batchCost = Amounts{1, 100, 200}

// drainBatch takes 80 batch requests at t0, down to the reserve.
func drainBatch(t *testing.T, g *Group) {
	t.Helper()
	for range 80 {
		var tk Ticket
		wantReserve(t, g, t0, batchCost, Batch, t0, &tk, t0, true)
	}
	wantLevels(t, g, t0, Amounts{20, 2000, 4000})
}

// TestBatchKeepsReserve checks that batch requests take only while every
// bucket keeps its reserve, then wait in the batch line.
func TestBatchKeepsReserve(t *testing.T) {
	g := New(batchSettings)
	drainBatch(t, g)
	// The 81st waits for one request's refill: 0.6 s, and holds that Slot.
	var a Ticket
	before := rawState(g).b
	wantReserve(t, g, t0, batchCost, Batch, far, &a, at(600*ms), false)
	if !a.Slot.Equal(at(600 * ms)) {
		t.Fatalf("Slot = %s", fmtTime(a.Slot))
	}
	if rawState(g).b != before {
		t.Fatal("a batch request that waits took")
	}
	// The line spaces later batch requests by the refill time of their
	// cost, first come, first served.
	tks := []*Ticket{&a}
	for i := 2; i <= 4; i++ {
		tk := &Ticket{}
		wantReserve(t, g, t0, batchCost, Batch, far, tk, at(time.Duration(i)*600*ms), false)
		tks = append(tks, tk)
	}
	// One that cannot wait for its Slot is refused, takes no Slot, and
	// leaves the line as it was.
	var late Ticket
	wantReserve(t, g, t0, batchCost, Batch, at(3*sec-1), &late, at(3*sec), false)
	if late != (Ticket{}) {
		t.Fatalf("refused ticket = %+v", late)
	}
	var next Ticket
	wantReserve(t, g, at(100*ms), batchCost, Batch, far, &next, at(3*sec), false)
	tks = append(tks, &next)
	// Each takes at its Slot; the first is not held behind later slots.
	for i, tk := range tks {
		Slot := at(time.Duration(i+1) * 600 * ms)
		if !tk.Slot.Equal(Slot) {
			t.Fatalf("ticket %d Slot %s, want %s", i, fmtTime(tk.Slot), fmtTime(Slot))
		}
		// One nanosecond early it would rejoin the line; Admits says when.
		if got := g.Admits(Slot.Add(-1), Slot.Add(-1), batchCost, Batch); !got.After(Slot) {
			t.Fatalf("Admits 1ns before Slot %d = %s", i, fmtTime(got))
		}
		wantReserve(t, g, Slot, batchCost, Batch, Slot, tk, Slot, true)
		wantLevels(t, g, Slot, Amounts{20, 2000, 4000})
	}
}

// TestBatchAskingEarlyRejoins checks that a batch request asking before
// its Slot takes a new place at the end of the line.
func TestBatchAskingEarlyRejoins(t *testing.T) {
	g := New(batchSettings)
	drainBatch(t, g)
	var a, b Ticket
	wantReserve(t, g, t0, batchCost, Batch, far, &a, at(600*ms), false)
	wantReserve(t, g, t0, batchCost, Batch, far, &b, at(1200*ms), false)
	wantReserve(t, g, at(100*ms), batchCost, Batch, far, &a, at(1800*ms), false)
	wantReserve(t, g, at(1200*ms), batchCost, Batch, far, &b, at(1200*ms), true)
	wantReserve(t, g, at(1800*ms), batchCost, Batch, far, &a, at(1800*ms), true)
}

// TestBatchLeave checks that a batch request that gives up leaves the
// line: twenty that wait and give up, first to last, leave the next one the
// wait of its own cost, 0.6 s, not 21 s; one that leaves from the middle
// keeps the slots behind it; the last to leave takes the line's end back
// to the end of the one before it.
func TestBatchLeave(t *testing.T) {
	g := New(batchSettings)
	drainBatch(t, g)
	var tks []*Ticket
	for i := range 20 {
		tk := new(Ticket)
		wantReserve(t, g, t0, batchCost, Batch, far, tk, at(time.Duration(i+1)*600*ms), false)
		tks = append(tks, tk)
	}
	for _, tk := range tks {
		g.Leave(tk)
		if *tk != (Ticket{}) {
			t.Fatalf("ticket after Leave: %+v", *tk)
		}
	}
	g.Leave(tks[0]) // twice changes nothing
	var next Ticket
	wantReserve(t, g, t0, batchCost, Batch, far, &next, at(600*ms), false)

	// From the middle: the slot behind keeps its place, and so does the
	// line's end.
	var b, c Ticket
	wantReserve(t, g, t0, batchCost, Batch, far, &b, at(1200*ms), false)
	wantReserve(t, g, t0, batchCost, Batch, far, &c, at(1800*ms), false)
	g.Leave(&b)
	var d Ticket
	wantReserve(t, g, t0, batchCost, Batch, far, &d, at(2400*ms), false)
	// The last two leave: the line ends at next's end again.
	g.Leave(&d)
	g.Leave(&c)
	var e Ticket
	wantReserve(t, g, t0, batchCost, Batch, far, &e, at(1200*ms), false)
	// One refused when it asks at its slot leaves too.
	var f Ticket
	wantReserve(t, g, t0, batchCost, Batch, far, &f, at(1800*ms), false)
	for range 10 {
		take(t, g, at(1800*ms), batchCost) // interactive traffic
	}
	wantReserve(t, g, at(1800*ms), batchCost, Batch, at(2*sec), &f, at(6600*ms), false)
	g.Leave(&f)
	var h Ticket
	wantReserve(t, g, at(1800*ms), batchCost, Batch, far, &h, at(6600*ms), false)
	// The slots whose end has passed are gone: h's alone is left.
	if got := rawState(g).inLine; got != 1 {
		t.Fatalf("%d slots in line, want h's alone", got)
	}
}

// TestInteractiveBeforeBatch checks that interactive requests get through
// at once while batch requests wait and the buckets sit at the reserve,
// that a batch request whose Slot came while an interactive one took asks
// again when it can take, and that interactive debt holds batch back.
func TestInteractiveBeforeBatch(t *testing.T) {
	g := New(batchSettings)
	drainBatch(t, g)
	var a, b Ticket
	wantReserve(t, g, t0, batchCost, Batch, far, &a, at(600*ms), false)
	wantReserve(t, g, t0, batchCost, Batch, far, &b, at(1200*ms), false)
	for range 20 {
		wantReserve(t, g, t0, batchCost, Interactive, t0, nil, t0, true)
	}
	wantLevels(t, g, t0, Amounts{0, 0, 0})
	// The interactive requests took the reserve: the first batch request
	// must wait 20 refills more at its Slot, and keeps its turn.
	wantReserve(t, g, at(600*ms), batchCost, Batch, far, &a, at(12600*ms), false)
	if !a.Slot.Equal(at(600 * ms)) {
		t.Fatalf("Slot = %s", fmtTime(a.Slot))
	}
	// Interactive debt holds batch requests back.
	wantReserve(t, g, at(600*ms), Amounts{11, 0, 0}, Interactive, far, nil, at(6600*ms), true)
	wantLevels(t, g, at(600*ms), Amounts{-10, 100, 200})
	wantReserve(t, g, at(600*ms), batchCost, Batch, far, &a, at(600*ms+31*600*ms), false)
	wantReserve(t, g, at(1200*ms), batchCost, Batch, far, &b, at(600*ms+31*600*ms), false)
	// An interactive request is due at once still, ahead of all of them,
	// as long as it fits: the level is -9 at 1.2 s.
	wantReserve(t, g, at(1200*ms), batchCost, Interactive, far, nil, at(1200*ms+10*600*ms), true)
}

// TestBatchOversize checks that a batch request larger than its share of
// a bucket waits for a full bucket, then takes below the reserve, and one
// larger than the bucket takes it all and more.
func TestBatchOversize(t *testing.T) {
	g := New(batchSettings)
	var tk Ticket
	wantReserve(t, g, t0, Amounts{1, 9000, 0}, Batch, t0, &tk, t0, true)
	wantLevels(t, g, t0, Amounts{99, 1000, 20000})
	// The next waits for a full bucket: 9000 to refill, 54 s.
	tk = Ticket{}
	wantReserve(t, g, t0, Amounts{1, 9000, 0}, Batch, far, &tk, at(54*sec), false)
	wantReserve(t, g, at(54*sec), Amounts{1, 15000, 0}, Batch, far, &tk, at(54*sec), true)
	wantLevels(t, g, at(54*sec), Amounts{99, 0, 20000})
}

// TestBatchShareOne checks that with a share of 1 batch requests may use
// the whole bucket, but never run into debt.
func TestBatchShareOne(t *testing.T) {
	g := New(Settings{Limits: batchSettings.Limits, BatchShare: 1})
	for range 100 {
		var tk Ticket
		wantReserve(t, g, t0, batchCost, Batch, t0, &tk, t0, true)
	}
	wantLevels(t, g, t0, Amounts{0, 0, 0})
	var tk Ticket
	wantReserve(t, g, t0, batchCost, Batch, far, &tk, at(600*ms), false)
	wantReserve(t, g, at(600*ms), batchCost, Batch, far, &tk, at(600*ms), true)
	wantLevels(t, g, at(600*ms), Amounts{0, 0, 0})
}

// TestDueFindsItsTokens checks that a request asking at the due time it
// was given finds its tokens, whatever the rounding of the refill, even
// when the buckets were refilled in steps in between.
func TestDueFindsItsTokens(t *testing.T) {
	// A bucket of 50 at -5 needs 34 to hold 29: 40.8 s, where the sum of
	// the refill rounds below 29.
	g := New(Settings{Limits: Amounts{50, 0, 0}, BatchShare: 1})
	take(t, g, t0, Amounts{50, 0, 0})
	take(t, g, t0, Amounts{5, 0, 0})
	var tk Ticket
	wantReserve(t, g, t0, Amounts{29, 0, 0}, Batch, far, &tk, at(40800*ms), false)
	wantReserve(t, g, at(40800*ms), Amounts{29, 0, 0}, Batch, far, &tk, at(40800*ms), true)

	rng := rand.New(rand.NewPCG(3, 4))
	limits := []float64{7, 50, 60, 1000, 6000, 40000, 123456, 2e6}
	for i := range 20000 {
		l := limits[rng.IntN(len(limits))]
		g := New(Settings{Limits: Amounts{l, 0, 0}, BatchShare: 1})
		start := at(time.Duration(rng.Int64N(int64(time.Hour))))
		pre := float64(rng.IntN(int(2*l) + 1))
		take(t, g, start, Amounts{pre / 2, 0, 0})
		take(t, g, start, Amounts{pre / 2, 0, 0})
		cost := Amounts{float64(rng.IntN(int(l)) + 1), 0, 0}
		var tk Ticket
		_, due, taken := g.Reserve(start, cost, Batch, far, &tk)
		if taken {
			continue
		}
		// Refill in steps in between, as other calls do.
		for j := rng.IntN(4); j > 0; j-- {
			g.State(start.Add(time.Duration(rng.Int64N(int64(due.Sub(start)) + 1))))
		}
		if _, d, ok := g.Reserve(due, cost, Batch, far, &tk); !ok || !d.Equal(due) {
			t.Fatalf("case %d: limit %v, cost %v: due %s, asked again at it: due %s taken %v", i, l, cost[0], fmtTime(due), fmtTime(d), ok)
		}
	}
}

// TestAdmits checks that Admits takes nothing and agrees with the due
// time Reserve would give asked at the time given, for interactive and
// batch requests, in a variety of states.
func TestAdmits(t *testing.T) {
	setups := []struct {
		name  string
		setup func(t *testing.T) *Group
	}{
		{"full", func(t *testing.T) *Group { return New(batchSettings) }},
		{"at the reserve", func(t *testing.T) *Group { g := New(batchSettings); drainBatch(t, g); return g }},
		{"batch line", func(t *testing.T) *Group {
			g := New(batchSettings)
			drainBatch(t, g)
			for range 3 {
				var tk Ticket
				g.Reserve(t0, batchCost, Batch, far, &tk)
			}
			return g
		}},
		{"interactive debt", func(t *testing.T) *Group { g := New(batchSettings); take(t, g, t0, Amounts{110, 0, 0}); return g }},
		{"paused", func(t *testing.T) *Group {
			g := New(batchSettings)
			g.Pause(t0, [NumKinds]bool{false, true, false}, at(5*sec))
			return g
		}},
		{"unknown", func(t *testing.T) *Group { return New(Settings{BatchShare: 0.8}) }},
		{"unknown, paused", func(t *testing.T) *Group {
			g := New(Settings{BatchShare: 0.8})
			g.Pause(t0, allKinds, at(5*sec))
			return g
		}},
	}
	costs := []Amounts{{}, batchCost, {1, 3000, 0}, {1, 0, 30000}}
	for _, s := range setups {
		t.Run(s.name, func(t *testing.T) {
			for _, p := range []Priority{Interactive, Batch} {
				for _, cost := range costs {
					for _, d := range []time.Duration{0, 300 * ms, 3 * sec, 20 * sec, time.Hour} {
						g := s.setup(t)
						now, asked := at(100*ms), at(100*ms+d)
						levels(g, now)
						before := rawState(g)
						got := g.Admits(now, asked, cost, p)
						if after := rawState(g); after != before {
							t.Fatalf("Admits changed the group:\n%+v\n%+v", before, after)
						}
						var tk Ticket
						_, want, _ := clone(g).Reserve(asked, cost, p, far, &tk)
						// They work out the refill from different times:
						// the rounding may differ by a nanosecond.
						if d := got.Sub(want); d < -1 || d > 1 {
							t.Fatalf("p%d cost %v at %s: Admits = %s, Reserve's due = %s", p, cost, fmtTime(asked), fmtTime(got), fmtTime(want))
						}
					}
				}
			}
		})
	}
}

// TestClockBackwards checks that a time earlier than one already seen
// neither refills nor empties a bucket, and dates no request before the
// refill it waits for.
func TestClockBackwards(t *testing.T) {
	g := New(Settings{Limits: std})
	take(t, g, at(10*sec), Amounts{60, 0, 0})
	wantReserve(t, g, at(5*sec), Amounts{1, 0, 0}, Interactive, far, nil, at(11*sec), true)
	wantLevels(t, g, at(5*sec), Amounts{-1, 6000, 12000})
	if st := g.State(at(5 * sec)); st[0].Remaining != 0 || st[1].Remaining != 6000 {
		t.Fatalf("State = %+v", st)
	}
	wantLevels(t, g, at(12*sec), Amounts{1, 6000, 12000})
}

// guard runs f on another goroutine, and fails the test if it has not
// returned within a generous limit: the one use of real time here, as a
// deadlock guard. f must not call t's methods.
func guard(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not return: deadlock?", what)
	}
}

// TestConcurrent runs many goroutines reserving, settling, cancelling,
// observing and reading one group.
func TestConcurrent(t *testing.T) {
	// At one time, nothing refills: what the buckets lack is exactly
	// what the reservations hold. Observations report more than remains,
	// which a configured bucket ignores.
	t.Run("conservation", func(t *testing.T) {
		limits := Amounts{1000, 1e5, 2e5}
		g := New(Settings{Limits: limits, BatchShare: 0.8})
		const workers, rounds = 16, 2000
		held := make([]Amounts, workers) // what each worker's reservations hold
		var bad atomic.Int32
		guard(t, "the workers", func() {
			var wg sync.WaitGroup
			for w := range workers {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(w), 1))
					var rs []Reservation
					add := func(a Amounts, sign float64) {
						for k := range a {
							held[w][k] += sign * a[k]
						}
					}
					for range rounds {
						cost := Amounts{float64(rng.IntN(3)), float64(rng.IntN(500)), float64(rng.IntN(1000))}
						switch x := rng.IntN(10); {
						case x < 3:
							r, _, taken := g.Reserve(t0, cost, Interactive, far, nil)
							if !taken {
								bad.Add(1)
							}
							rs = append(rs, r)
							add(cost, 1)
						case x < 5:
							var tk Ticket
							r, due, taken := g.Reserve(t0, cost, Batch, t0, &tk)
							if taken {
								rs = append(rs, r)
								add(cost, 1)
							} else if !due.After(t0) || tk != (Ticket{}) {
								bad.Add(1)
							}
						case x < 7 && len(rs) > 0:
							i := rng.IntN(len(rs))
							used := Amounts{cost[0], float64(rng.IntN(2000)), float64(rng.IntN(2000))}
							known := [NumKinds]bool{rng.IntN(2) == 0, rng.IntN(2) == 0, rng.IntN(2) == 0}
							before := rs[i].Cost()
							g.Settle(&rs[i], t0, used, known)
							add(before, -1)
							add(rs[i].Cost(), 1)
							rs = append(rs[:i], rs[i+1:]...)
						case x < 8 && len(rs) > 0:
							// A bucket a response counted keeps what it took.
							i := rng.IntN(len(rs))
							before := rs[i].Cost()
							g.Cancel(&rs[i], t0)
							add(before, -1)
							add(rs[i].Cost(), 1)
							rs = append(rs[:i], rs[i+1:]...)
						case x < 9 && len(rs) > 0:
							g.Observe(t0, &rs[rng.IntN(len(rs))], Observation{Has: allKinds, Limit: Amounts{1, 1, 1}, Remaining: Amounts{1e12, 1e12, 1e12}})
						default:
							g.State(t0)
							g.Admits(t0, t0, cost, Priority(rng.IntN(2)))
							g.PausedUntil(t0)
						}
					}
				})
			}
			wg.Wait()
		})
		if n := bad.Load(); n != 0 {
			t.Fatalf("%d bad answers", n)
		}
		var total Amounts
		for _, h := range held {
			for k := range h {
				total[k] += h[k]
			}
		}
		lv, taken := levels(g, t0), takenCounts(g)
		for k := range limits {
			if taken[k] != total[k] || lv[k]+taken[k] != limits[k] {
				t.Fatalf("bucket %d: level %v, taken %v, limit %v; the reservations hold %v", k, lv[k], taken[k], limits[k], total[k])
			}
		}
		t.Logf("levels %v, taken %v", lv, taken)
	})
	// On an advancing shared clock, with limits learned and changing,
	// pauses and batch requests waiting for their slots: the race
	// detector watches, and every bucket stays within its limit.
	t.Run("learning", func(t *testing.T) {
		g := New(Settings{BatchShare: 0.8})
		var clock atomic.Int64
		tick := func() time.Time { return at(time.Duration(clock.Add(int64(5 * ms)))) }
		const workers, rounds = 16, 2000
		var bad, takes atomic.Int32
		guard(t, "the workers", func() {
			var wg sync.WaitGroup
			for w := range workers {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(w), 2))
					var rs []Reservation
					var tk Ticket
					var Slot time.Time // a waiting batch request's due time
					for range rounds {
						now := tick()
						cost := Amounts{1, float64(rng.IntN(500)), float64(rng.IntN(1000))}
						switch x := rng.IntN(20); {
						case x < 6:
							latest := now.Add(time.Duration(rng.IntN(5000)) * ms)
							r, due, taken := g.Reserve(now, cost, Interactive, latest, nil)
							if taken {
								takes.Add(1)
								rs = append(rs, r)
							}
							if due.Before(now) || taken == due.After(latest) {
								bad.Add(1)
							}
						case x < 9:
							if !Slot.IsZero() && now.Before(Slot) {
								continue
							}
							r, due, taken := g.Reserve(now, cost, Batch, now.Add(10*sec), &tk)
							switch {
							case taken:
								takes.Add(1)
								rs = append(rs, r)
								tk, Slot = Ticket{}, time.Time{}
							case due.After(now.Add(10 * sec)):
								tk, Slot = Ticket{}, time.Time{}
							default:
								Slot = due
							}
						case x < 13 && len(rs) > 0:
							i := rng.IntN(len(rs))
							g.Settle(&rs[i], now, Amounts{1, float64(rng.IntN(500)), float64(rng.IntN(1000))}, allKinds)
							rs = append(rs[:i], rs[i+1:]...)
						case x < 14 && len(rs) > 0:
							i := rng.IntN(len(rs))
							g.Cancel(&rs[i], now)
							rs = append(rs[:i], rs[i+1:]...)
						case x < 17 && len(rs) > 0:
							// Counts near the limits, as the API's are
							// when traffic stays under them.
							o := Observation{Has: [NumKinds]bool{true, rng.IntN(4) > 0, rng.IntN(4) > 0},
								Limit:     Amounts{float64(500 + rng.IntN(3)*500), float64(50000 + rng.IntN(3)*50000), 200000},
								Remaining: Amounts{float64(400 + rng.IntN(1100)), float64(40000 + rng.IntN(110000)), float64(150000 + rng.IntN(50000))}}
							g.Observe(now, &rs[rng.IntN(len(rs))], o)
						case x < 18:
							var named [NumKinds]bool
							named[rng.IntN(NumKinds)] = true
							g.Pause(now, named, now.Add(time.Duration(rng.IntN(200))*ms))
						default:
							for _, s := range g.State(now) {
								if s.Remaining > s.Limit || s.Remaining < 0 {
									bad.Add(1)
								}
							}
							g.Admits(now, now.Add(sec), cost, Priority(rng.IntN(2)))
							g.PausedUntil(now)
						}
					}
				})
			}
			wg.Wait()
		})
		if n := bad.Load(); n != 0 {
			t.Fatalf("%d bad answers", n)
		}
		g.mu.Lock()
		defer g.mu.Unlock()
		for k, b := range g.b {
			if b.limit == 0 || b.level > b.limit {
				t.Fatalf("bucket %d: %+v", k, b)
			}
		}
		// Pauses, and counts that only lower levels, keep most requests
		// out; enough get through for the run to have tested something.
		if takes.Load() < 20 {
			t.Fatalf("only %d takes", takes.Load())
		}
	})
}

// The reference model of FuzzGroup counts in exact integers: a token is
// scale units, so that a bucket of limit L refills exactly L units a
// nanosecond, and due times are whole nanoseconds rounded up.
const scale = 60 * int64(time.Second)

type mBucket struct {
	limit       int64 // whole tokens a minute; 0 while unknown
	configured  bool
	level       int64 // units
	at          time.Time
	taken       int64 // whole tokens
	pausedUntil time.Time
}

type mRes struct {
	r      *Reservation
	cost   [NumKinds]int64
	mark   [NumKinds]int64
	taken  bool
	seen   [NumKinds]bool
	seq    int             // order of the take
	open   bool            // neither observed nor settled
	taken0 [NumKinds]int64 // what it took
}

type mTicket struct {
	t    *Ticket
	cost Amounts
}

type model struct {
	b     [NumKinds]mBucket
	share float64
	line  []lineSlot // the batch line, by slot
	res   []*mRes    // every reservation taken, in order
}

func (m *model) lineEnd() time.Time {
	if n := len(m.line); n > 0 {
		return m.line[n-1].end
	}
	return time.Time{}
}

func (m *model) leave(slot time.Time) {
	m.line = slices.DeleteFunc(m.line, func(s lineSlot) bool { return s.slot.Equal(slot) })
}

func (m *model) join(now, slot, end time.Time) {
	m.line = slices.DeleteFunc(m.line, func(s lineSlot) bool { return !s.end.After(now) })
	m.line = append(m.line, lineSlot{slot, end})
}

// held is what a request of cost takes: at most each known limit.
func (m *model) held(cost [NumKinds]int64) [NumKinds]int64 {
	for k, b := range m.b {
		if b.limit > 0 {
			cost[k] = min(cost[k], b.limit)
		}
	}
	return cost
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

func (b *mBucket) advance(now time.Time) {
	if !now.After(b.at) {
		return
	}
	if b.limit > 0 && b.level < b.limit*scale {
		gap := b.limit*scale - b.level
		if d := int64(now.Sub(b.at)); d >= ceilDiv(gap, b.limit) {
			b.level = b.limit * scale
		} else {
			b.level += b.limit * d
		}
	}
	b.at = now
}

// floor is the reserve batch requests leave, in units: shares are
// quarters, so that it is exact.
func (m *model) floor(k int, p Priority) int64 {
	if p != Batch {
		return 0
	}
	return int64((1 - m.share) * float64(m.b[k].limit) * float64(scale))
}

func (m *model) due(now time.Time, cost [NumKinds]int64, p Priority) time.Time {
	due := now
	for k := range m.b {
		b := &m.b[k]
		b.advance(now)
		need := min(cost[k]*scale+m.floor(k, p), b.limit*scale)
		t := now
		if b.limit > 0 && b.level < need {
			if b.at.After(t) {
				t = b.at
			}
			t = t.Add(time.Duration(ceilDiv(need-b.level, b.limit)))
		}
		if b.pausedUntil.After(t) {
			t = b.pausedUntil
		}
		if t.After(due) {
			due = t
		}
	}
	return due
}

func (m *model) refillTime(cost [NumKinds]int64) time.Duration {
	longest := time.Duration(1)
	for k, b := range m.b {
		if b.limit > 0 {
			longest = max(longest, time.Duration(ceilDiv(min(cost[k], b.limit)*scale, b.limit)))
		}
	}
	return longest
}

func (m *model) settle(r *mRes, now time.Time, used [NumKinds]int64, known [NumKinds]bool) {
	if !r.taken {
		return
	}
	r.open = false
	for k := range m.b {
		if !known[k] || r.seen[k] {
			continue
		}
		b := &m.b[k]
		b.advance(now)
		back := r.cost[k] - used[k]
		b.taken -= back
		b.level += back * scale
		if b.limit > 0 {
			b.level = min(b.level, b.limit*scale)
		}
		r.cost[k] = used[k]
	}
	r.taken = false
}

func (m *model) observe(now time.Time, r *mRes, has [NumKinds]bool, limit, remaining [NumKinds]int64) {
	var older [NumKinds]int64
	for _, o := range m.res {
		if o.seq < r.seq && o.open {
			for k := range older {
				older[k] += o.taken0[k]
			}
		}
	}
	r.open = false
	for k := range m.b {
		if !has[k] {
			continue
		}
		b := &m.b[k]
		b.advance(now)
		level := b.level
		if !b.configured && limit[k] > 0 && limit[k] != b.limit {
			switch {
			case b.limit == 0:
				// Each open request counts for at most the limit.
				lack := b.taken - r.mark[k]
				for _, o := range m.res {
					if !o.open {
						continue
					}
					held := min(o.taken0[k], limit[k])
					if o.seq < r.seq {
						lack += held
					} else {
						lack -= o.taken0[k] - held
					}
				}
				level = (remaining[k] - lack) * scale
			case !b.pausedUntil.After(now):
				level += (limit[k] - b.limit) * scale
			}
			b.limit = limit[k]
		}
		if b.limit == 0 {
			continue
		}
		level = min(level, remaining[k]*scale, b.limit*scale)
		if level != b.level && Kind(k) != OutputTokens {
			r.seen[k] = true
		}
		b.level = level
	}
}

func (m *model) pause(now time.Time, named [NumKinds]bool, until time.Time) {
	for k := range m.b {
		if !named[k] {
			continue
		}
		b := &m.b[k]
		b.advance(now)
		b.level = min(b.level, 0)
		if until.After(b.pausedUntil) {
			b.pausedUntil = until
		}
	}
}

func toInts(a Amounts) (out [NumKinds]int64) {
	for k := range a {
		out[k] = int64(a[k])
	}
	return out
}

// Fuzz operations: each is four bytes, an operation and three arguments.
const (
	fzAdvance     = iota // the clock moves on by a duration
	fzInteractive        // an interactive request: cost a, b; latest c
	fzBatch              // a new batch request: cost a, b; latest c
	fzBatchAgain         // a waiting batch request asks again: ticket a; latest c
	fzSettle             // settle reservation a: used b; known c
	fzCancel             // cancel reservation a
	fzObserve            // observe reservation a: has and remaining b; limits c
	fzPause              // pause the buckets a until b
	fzState              // State
	fzAdmits             // Admits, asked later by a: cost b, c; priority a
	fzJump               // jump to a waiting request's Slot, a pause's end or the line's end, or 1 ns off
	fzLeave              // a waiting batch request gives up: ticket a
	fzNumOps
)

var (
	fzLimits    = []int64{0, 50, 60, 100, 1000, 6000}
	fzShares    = []float64{1, 0.75, 0.5, 0.25}
	fzLatest    = []time.Duration{0, 1, sec, 30 * sec, 10 * time.Minute, 1000 * time.Hour}
	fzUnits     = []time.Duration{1, ms, 100 * ms, sec}
	fzPauses    = []time.Duration{-sec, 0, ms, sec, 10 * sec, 61 * sec}
	fzObsLimits = func(cur int64) []int64 { return []int64{0, cur, min(2*cur, 24000), max(cur/2, 1), 60, 6000} }
)

func fzCost(a, b byte) Amounts {
	return Amounts{float64(a % 3), float64(b), float64(a/3) * 4}
}

// FuzzGroup drives a group with a sequence of operations at times that
// never go backwards and compares it with the model after every one: due
// times within rounding (a nanosecond, or a trillionth of the wait),
// levels within a millionth of a token, taken counts, limits, pauses and
// reservations exactly; the group's decisions must follow from its due
// times, and the model then follows them. It also checks, on their own,
// that no known level exceeds its limit, that a request that takes nothing
// changes nothing, and that a batch request leaves the reserve unless it
// is larger than the share.
func FuzzGroup(f *testing.F) {
	op := func(b ...byte) []byte { return b }
	seed := func(settings []byte, ops ...[]byte) {
		var data []byte
		data = append(data, settings...)
		for _, o := range ops {
			data = append(data, o...)
		}
		f.Add(data)
	}
	rep := func(n int, ops ...[]byte) []byte {
		var out []byte
		for range n {
			for _, o := range ops {
				out = append(out, o...)
			}
		}
		return out
	}
	// Configured buckets drained into debt, settled, cancelled.
	seed([]byte{2, 4, 5, 0}, rep(70, op(fzInteractive, 3, 100, 5)), op(fzSettle, 3, 1, 7), op(fzCancel, 0, 0, 0),
		op(fzAdvance, 9, 0, 3), op(fzState, 0, 0, 0), op(fzAdmits, 3, 10, 20), op(fzInteractive, 3, 200, 1))
	// Batch requests down to the reserve, waiting in line, asking again at
	// their slots and 1 ns early, with interactive requests in between.
	seed([]byte{3, 4, 5, 1}, rep(6, op(fzBatch, 3, 250, 5)), op(fzInteractive, 3, 50, 0),
		op(fzJump, 0, 1, 0), op(fzBatchAgain, 0, 0, 5), op(fzAdvance, 2, 3, 0), op(fzBatchAgain, 0, 0, 5),
		op(fzJump, 0, 0, 0), op(fzBatchAgain, 0, 0, 5), op(fzAdmits, 0, 3, 3), op(fzJump, 1, 1, 0), op(fzBatchAgain, 1, 0, 5),
		op(fzJump, 0, 1, 0), op(fzBatchAgain, 0, 0, 5), op(fzState, 0, 0, 0))
	// Unknown limits learned, raised and lowered; marks; settling after a
	// response.
	seed([]byte{0, 0, 0, 1}, op(fzInteractive, 3, 100, 5), op(fzInteractive, 4, 50, 5), op(fzInteractive, 5, 10, 5),
		op(fzObserve, 0, 0xff, 1), op(fzObserve, 1, 0x7f, 2), op(fzObserve, 2, 0x3f, 3), op(fzSettle, 0, 1, 7),
		op(fzAdvance, 3, 3, 0), op(fzInteractive, 3, 200, 5), op(fzObserve, 2, 0xaf, 0), op(fzState, 0, 0, 0))
	// Pauses of configured and unknown buckets, requests held until
	// their end, observations during them.
	seed([]byte{1, 0, 3, 2}, op(fzInteractive, 3, 100, 5), op(fzPause, 7, 4, 0), op(fzInteractive, 3, 100, 5),
		op(fzBatch, 3, 10, 5), op(fzObserve, 0, 0xff, 1), op(fzState, 0, 0, 0), op(fzJump, 0, 1, 0),
		op(fzInteractive, 3, 1, 0), op(fzJump, 0, 0, 0), op(fzInteractive, 3, 1, 0), op(fzBatchAgain, 0, 0, 5),
		op(fzPause, 2, 0, 0), op(fzPause, 1, 5, 0), op(fzAdvance, 30, 3, 0), op(fzState, 0, 0, 0))
	// Batch requests that wait in line, some giving up, first, last and
	// in the middle, others asking again.
	seed([]byte{3, 4, 5, 1}, rep(6, op(fzBatch, 3, 250, 5)), rep(4, op(fzBatch, 3, 250, 4)), op(fzLeave, 1, 0, 0),
		op(fzLeave, 8, 0, 0), op(fzBatch, 3, 250, 4), op(fzLeave, 0, 0, 0), op(fzJump, 0, 1, 0), op(fzBatchAgain, 0, 0, 5),
		op(fzLeave, 2, 0, 0), op(fzLeave, 3, 0, 0), op(fzBatch, 3, 250, 4), op(fzAdmits, 1, 3, 3), op(fzJump, 1, 1, 0),
		op(fzBatchAgain, 1, 0, 5), op(fzLeave, 1, 0, 0), op(fzBatch, 3, 250, 5))
	// Oversize requests, interactive and batch.
	seed([]byte{1, 1, 1, 0}, op(fzInteractive, 200, 255, 5), op(fzInteractive, 200, 255, 4), op(fzBatch, 200, 255, 5),
		op(fzJump, 0, 0, 0), op(fzBatchAgain, 0, 0, 5), op(fzAdmits, 9, 255, 200))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 4 {
			return
		}
		var limits Amounts
		m := &model{share: fzShares[data[3]%4]}
		for k := range NumKinds {
			l := fzLimits[data[k]%6]
			limits[k] = float64(l)
			if l > 0 {
				m.b[k] = mBucket{limit: l, configured: true, level: l * scale}
			}
		}
		g := New(Settings{Limits: limits, BatchShare: m.share})
		data = data[4:]
		var (
			res     []*mRes
			tickets []*mTicket
			now     = t0
		)
		tol := func(due time.Time) time.Duration { return 2 + time.Duration(float64(due.Sub(now))*1e-12) }
		for step := 0; step+3 < len(data) && step < 4000; step += 4 {
			o, a, b, c := data[step]%fzNumOps, data[step+1], data[step+2], data[step+3]
			what := func() string { return fmt.Sprintf("step %d (op %d %d %d %d) at %s", step/4, o, a, b, c, fmtTime(now)) }
			closeTo := func(name string, got, want time.Time) {
				if d := got.Sub(want); d < -tol(want) || d > tol(want) {
					t.Fatalf("%s: %s = %s, model %s", what(), name, fmtTime(got), fmtTime(want))
				}
			}
			switch o {
			case fzAdvance:
				now = now.Add(time.Duration(int(a)+1) * fzUnits[b%4])
			case fzInteractive, fzBatch, fzBatchAgain:
				p, cost, tk := Interactive, fzCost(a, b), (*mTicket)(nil)
				switch o {
				case fzBatch:
					p, tk = Batch, &mTicket{t: &Ticket{}, cost: cost}
				case fzBatchAgain:
					if len(tickets) == 0 {
						continue
					}
					p, tk = Batch, tickets[int(a)%len(tickets)]
					cost = tk.cost
				}
				latest := now.Add(fzLatest[c%6])
				var Slot time.Time
				var it *Ticket
				if tk != nil {
					Slot, it = tk.t.Slot, tk.t
				}
				levels(g, now)
				before := rawState(g)
				r, due, taken := g.Reserve(now, cost, p, latest, it)
				icost := toInts(cost)
				mdue := m.due(now, icost, p)
				inLine := p == Batch && (Slot.IsZero() || now.Before(Slot))
				if inLine {
					// Asking before its slot, it gives its place up.
					m.leave(Slot)
					if end := m.lineEnd(); end.After(mdue) {
						mdue = end
					}
				}
				closeTo("Reserve's due", due, mdue)
				if due.Before(now) {
					t.Fatalf("%s: due %s before now", what(), fmtTime(due))
				}
				wantTaken := !due.After(latest)
				if p == Batch {
					wantTaken = !due.After(now)
				}
				if taken != wantTaken || r.Taken() != taken {
					t.Fatalf("%s: Reserve = due %s taken %v, latest %s", what(), fmtTime(due), taken, fmtTime(latest))
				}
				if !taken {
					if r != (Reservation{}) {
						t.Fatalf("%s: refused, returned %+v", what(), r)
					}
					after := rawState(g)
					if after.b != before.b {
						t.Fatalf("%s: a request that took nothing changed the buckets:\n%+v\n%+v", what(), before.b, after.b)
					}
					if p == Batch {
						joined := inLine && !due.After(latest)
						want := Slot // not in line: it keeps its slot
						if joined {
							want = due
						} else if inLine {
							want = time.Time{} // it gave its place up and was refused
						}
						if !it.Slot.Equal(want) {
							t.Fatalf("%s: Slot %s, was %s, due %s, in line %v", what(), fmtTime(it.Slot), fmtTime(Slot), fmtTime(due), inLine)
						}
						if joined {
							closeTo("the line's end", after.batchNext, due.Add(m.refillTime(icost)))
							m.join(now, due, after.batchNext)
							if o == fzBatch && len(tickets) < 16 {
								tickets = append(tickets, tk)
							}
						} else if !inLine && after.batchNext != before.batchNext {
							t.Fatalf("%s: the line's end moved to %s without a Slot", what(), fmtTime(after.batchNext))
						}
					}
					if o == fzBatchAgain && due.After(latest) {
						tickets = slices.DeleteFunc(tickets, func(x *mTicket) bool { return x == tk })
					}
					break
				}
				if o == fzBatchAgain {
					tickets = slices.DeleteFunc(tickets, func(x *mTicket) bool { return x == tk })
				}
				icost = m.held(icost)
				if toInts(r.Cost()) != icost {
					t.Fatalf("%s: Cost = %v, model %v", what(), r.Cost(), icost)
				}
				mr := &mRes{r: &r, cost: icost, taken: true, seq: len(m.res), open: true, taken0: icost}
				m.res = append(m.res, mr)
				for k := range m.b {
					m.b[k].level -= icost[k] * scale
					m.b[k].taken += icost[k]
					mr.mark[k] = m.b[k].taken
				}
				if p == Batch {
					g.mu.Lock()
					for k, b := range g.b {
						floor := (1 - m.share) * b.limit
						if b.limit > 0 && cost[k]+floor <= b.limit && b.level < floor-1e-9*b.limit {
							t.Errorf("%s: a batch request took bucket %d below its reserve: %v < %v", what(), k, b.level, floor)
						}
					}
					g.mu.Unlock()
				}
				if len(res) < 64 {
					res = append(res, mr)
				}
			case fzSettle, fzCancel:
				if len(res) == 0 {
					continue
				}
				i := int(a) % len(res)
				mr := res[i]
				if o == fzCancel {
					g.Cancel(mr.r, now)
					m.settle(mr, now, [NumKinds]int64{}, allKinds)
				} else {
					cost := mr.r.Cost()
					used := Amounts{cost[0], float64(int64(cost[1]) * int64(b%4) / 2), float64(int64(cost[2]) * int64(b/4%4) / 2)}
					known := [NumKinds]bool{c&1 != 0, c&2 != 0, c&4 != 0}
					g.Settle(mr.r, now, used, known)
					m.settle(mr, now, toInts(used), known)
				}
				if mr.r.Taken() || toInts(mr.r.Cost()) != mr.cost {
					t.Fatalf("%s: settled reservation: taken %v cost %v; model cost %v", what(), mr.r.Taken(), mr.r.Cost(), mr.cost)
				}
				res = slices.Delete(res, i, i+1)
			case fzObserve:
				if len(res) == 0 {
					continue
				}
				mr := res[int(a)%len(res)]
				var ob Observation
				var has [NumKinds]bool
				var lim, rem [NumKinds]int64
				sel := int(c)
				for k := range m.b {
					has[k] = b&(1<<k) != 0
					cur := max(m.b[k].limit, 50)
					lim[k] = fzObsLimits(cur)[sel%6]
					sel /= 6
					rem[k] = int64(b>>3) * max(lim[k], cur) / 16
					ob.Has[k], ob.Limit[k], ob.Remaining[k] = has[k], float64(lim[k]), float64(rem[k])
				}
				g.Observe(now, mr.r, ob)
				m.observe(now, mr, has, lim, rem)
				if mr.r.seen != mr.seen {
					t.Fatalf("%s: seen %v, model %v", what(), mr.r.seen, mr.seen)
				}
			case fzPause:
				named := [NumKinds]bool{a&1 != 0, a&2 != 0, a&4 != 0}
				until := now.Add(fzPauses[b%6])
				g.Pause(now, named, until)
				m.pause(now, named, until)
			case fzState:
				st := g.State(now)
				var pausedUntil time.Time
				for k := range m.b {
					mb := &m.b[k]
					mb.advance(now)
					want := BucketState{Kind: Kind(k), Limit: float64(mb.limit), Configured: mb.configured}
					if mb.pausedUntil.After(now) {
						want.PausedUntil = mb.pausedUntil
						pausedUntil = later(pausedUntil, mb.pausedUntil)
					} else if mb.limit > 0 {
						want.Remaining = float64(max(mb.level, 0)) / float64(scale)
					}
					got := st[k]
					if math.Abs(got.Remaining-want.Remaining) > 1e-6 {
						t.Fatalf("%s: State[%d] = %+v, model %+v", what(), k, got, want)
					}
					got.Remaining = want.Remaining
					if got != want {
						t.Fatalf("%s: State[%d] = %+v, model %+v", what(), k, got, want)
					}
				}
				if got := g.PausedUntil(now); !got.Equal(pausedUntil) {
					t.Fatalf("%s: PausedUntil = %s, model %s", what(), fmtTime(got), fmtTime(pausedUntil))
				}
			case fzAdmits:
				asked := now.Add(time.Duration(a) * 100 * ms)
				p := Priority(a % 2)
				cost := fzCost(b, c)
				levels(g, now)
				before := rawState(g)
				got := g.Admits(now, asked, cost, p)
				if after := rawState(g); after != before {
					t.Fatalf("%s: Admits changed the group", what())
				}
				want := later(asked, m.due(now, toInts(cost), p))
				if p == Batch {
					want = later(want, m.lineEnd())
				}
				closeTo("Admits", got, want)
			case fzJump:
				var targets []time.Time
				for _, tk := range tickets {
					targets = append(targets, tk.t.Slot)
				}
				for _, b := range m.b {
					targets = append(targets, b.pausedUntil)
				}
				targets = append(targets, m.lineEnd())
				target := targets[int(a)%len(targets)].Add(time.Duration(int(b%3) - 1))
				if target.After(now) {
					now = target
				}
			case fzLeave:
				if len(tickets) == 0 {
					continue
				}
				tk := tickets[int(a)%len(tickets)]
				m.leave(tk.t.Slot)
				g.Leave(tk.t)
				if !tk.t.Slot.IsZero() {
					t.Fatalf("%s: Slot %s after Leave", what(), fmtTime(tk.t.Slot))
				}
				tickets = slices.DeleteFunc(tickets, func(x *mTicket) bool { return x == tk })
			}
			// The buckets and the line, with the model's.
			g.mu.Lock()
			if len(g.line) != len(m.line) || !g.lineEnd().Equal(m.lineEnd()) {
				g.mu.Unlock()
				t.Fatalf("%s: line %v, model %v", what(), g.line, m.line)
			}
			for k, b := range g.b {
				mb := m.b[k]
				lv := float64(mb.level) / float64(scale)
				if b.limit != float64(mb.limit) || b.configured != mb.configured || !b.at.Equal(mb.at) ||
					b.taken != float64(mb.taken) || !b.pausedUntil.Equal(mb.pausedUntil) ||
					math.Abs(b.level-lv) > 1e-6+1e-12*math.Abs(lv) {
					g.mu.Unlock()
					t.Fatalf("%s: bucket %d = %+v, model %+v (level %v)", what(), k, b, mb, lv)
				}
				if b.limit > 0 && b.level > b.limit {
					g.mu.Unlock()
					t.Fatalf("%s: bucket %d over its limit: %+v", what(), k, b)
				}
			}
			g.mu.Unlock()
		}
	})
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// TestFollowOthers checks the estimate of other traffic on the same limits:
// counts that the group's own traffic explains leave it at zero; a count
// below what the group's traffic leaves raises it, and the bucket refills
// the slower; a count above what it allows for lowers it again.
func TestFollowOthers(t *testing.T) {
	g := New(Settings{FollowOthers: true, BatchShare: 1})
	obs := func(remaining Amounts) Observation { // 60 requests a minute
		o := obs(remaining)
		o.Limit[Requests] = 60
		return o
	}
	r := take(t, g, t0, Amounts{1, 0, 0})
	g.Observe(t0, &r, obs(Amounts{59, 1000, 1000})) // learns 60 a minute, 59 left
	// The group's own traffic: the API reached b before a, so a's count
	// holds b, and b's count lacks a. Both are explained: no estimate.
	a := take(t, g, t0, Amounts{1, 0, 0})
	b := take(t, g, t0, Amounts{1, 0, 0})
	g.Observe(t0, &b, obs(Amounts{58, 1000, 1000}))
	g.Observe(t0, &a, obs(Amounts{57, 1000, 1000}))
	if o := g.b[Requests].others; o != 0 {
		t.Fatalf("own traffic read as others': %v a second", o)
	}
	// Another process took 3: the count is 3 below the level.
	c := take(t, g, t0, Amounts{1, 0, 0})
	g.Observe(t0, &c, obs(Amounts{53, 1000, 1000}))
	if o := g.b[Requests].others; o != min(3/othersWindow, 1) {
		t.Fatalf("others = %v a second, want %v (capped at the limit's rate)", o, min(3/othersWindow, 1))
	}
	wantLevels(t, g, t0, Amounts{53, 1000, 1000})
	// The estimate is capped at the whole limit's rate: the bucket
	// refills at a 64th of it, one request in 64 s.
	for range 55 {
		take(t, g, t0, Amounts{1, 0, 0})
	}
	wantReserve(t, g, t0, Amounts{1, 0, 0}, Interactive, far, nil, at(3*64*sec), true)
	// A count far above what the group's traffic allows for (the others
	// stopped, and the API's bucket refilled) lowers the estimate.
	d := take(t, g, at(4*sec), Amounts{1, 0, 0})
	g.Observe(at(4*sec), &d, obs(Amounts{59, 1000, 1000}))
	if o := g.b[Requests].others; o != 0 {
		t.Fatalf("others = %v a second after a full count, want 0", o)
	}
	// No estimate while paused, nor while learning.
	g.Pause(at(4*sec), [NumKinds]bool{true, false, false}, at(10*sec))
	e := take(t, g, at(5*sec), Amounts{1, 0, 0})
	g.Observe(at(5*sec), &e, obs(Amounts{0, 1000, 1000}))
	if o := g.b[Requests].others; o != 0 {
		t.Fatalf("others = %v a second from a count during a pause, want 0", o)
	}
	h := New(Settings{FollowOthers: true})
	obs = func(remaining Amounts) Observation { return learnAll }
	x := take(t, h, t0, Amounts{1, 0, 0})
	h.Observe(t0, &x, obs(Amounts{1, 1000, 1000}))
	if o := h.b[Requests].others; o != 0 {
		t.Fatalf("others = %v a second on learning, want 0", o)
	}
}
