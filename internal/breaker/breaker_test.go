package breaker

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Every test drives the breaker with explicit times: t0 plus durations.
// Real time appears only in guard, as a deadlock guard.

var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

const sec = time.Second

// at is t0+d.
func at(d time.Duration) time.Time { return t0.Add(d) }

// defaults are the settings under test: 1 s buckets for the 30 s window.
func defaults() Settings {
	return Settings{
		FailureRatio: 0.5,
		MinAttempts:  20,
		Window:       30 * sec,
		OpenFor:      30 * sec,
		MaxOpenFor:   300 * sec,
		ProbeLimit:   60 * sec,
	}
}

// recorder keeps the changes a breaker delivers.
type recorder struct {
	mu      sync.Mutex
	changes []Change
}

func (r *recorder) add(c Change) {
	r.mu.Lock()
	r.changes = append(r.changes, c)
	r.mu.Unlock()
}

func (r *recorder) list() []Change {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.changes)
}

// newBreaker returns a breaker with the default settings, edited by edit
// when it is not nil, whose changes go to the recorder.
func newBreaker(edit func(*Settings)) (*Breaker, *recorder) {
	r := &recorder{}
	s := defaults()
	s.OnChange = r.add
	if edit != nil {
		edit(&s)
	}
	return New(s), r
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Sub(t0).String()
}

func fmtChange(c Change) string {
	return fmt.Sprintf("%v->%v at %s next %s", c.From, c.To, fmtTime(c.At), fmtTime(c.NextProbe))
}

func fmtChanges(cs []Change) string {
	var s []string
	for _, c := range cs {
		s = append(s, fmtChange(c))
	}
	return "[" + strings.Join(s, "; ") + "]"
}

func sameChange(a, b Change) bool {
	return a.From == b.From && a.To == b.To && a.At.Equal(b.At) && a.NextProbe.Equal(b.NextProbe)
}

func wantChanges(t *testing.T, got []Change, want ...Change) {
	t.Helper()
	ok := len(got) == len(want)
	for i := 0; ok && i < len(got); i++ {
		ok = sameChange(got[i], want[i])
	}
	if !ok {
		t.Fatalf("changes:\n got %s\nwant %s", fmtChanges(got), fmtChanges(want))
	}
}

// attempt admits an attempt at now and ends it at now with v; the
// attempt must be admitted.
func attempt(t *testing.T, b *Breaker, now time.Time, v Verdict) {
	t.Helper()
	a := b.Allow(now)
	if !a.OK {
		t.Fatalf("Allow(%s) refused: state %v, next probe %s", fmtTime(now), a.State, fmtTime(a.NextProbe))
	}
	b.Done(a.Ticket, now, v)
}

func attempts(t *testing.T, b *Breaker, now time.Time, n int, v Verdict) {
	t.Helper()
	for range n {
		attempt(t, b, now, v)
	}
}

// trip opens a closed breaker at now with 20 failures.
func trip(t *testing.T, b *Breaker, now time.Time) {
	t.Helper()
	attempts(t, b, now, 20, Failure)
	wantState(t, b, now, Open)
}

// wantState checks State(now); beware that State moves an open breaker
// whose period has passed to half-open.
func wantState(t *testing.T, b *Breaker, now time.Time, want State) {
	t.Helper()
	if got := b.State(now); got != want {
		t.Fatalf("State(%s) = %v, want %v", fmtTime(now), got, want)
	}
}

// probe takes the probe's place at now; it must be free.
func probe(t *testing.T, b *Breaker, now time.Time) Ticket {
	t.Helper()
	a := b.Allow(now)
	if !a.OK || !a.Ticket.Probe || a.State != HalfOpen {
		t.Fatalf("Allow(%s) = %+v, want the probe", fmtTime(now), a)
	}
	return a.Ticket
}

// wantRefused checks that Allow(now) refuses, in state st, with next.
func wantRefused(t *testing.T, b *Breaker, now time.Time, st State, next time.Time) {
	t.Helper()
	a := b.Allow(now)
	if a.OK || a.Ticket.Probe || a.State != st || !a.NextProbe.Equal(next) {
		t.Fatalf("Allow(%s) = OK %v probe %v state %v next %s; want refused, %v, next %s",
			fmtTime(now), a.OK, a.Ticket.Probe, a.State, fmtTime(a.NextProbe), st, fmtTime(next))
	}
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
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not return: deadlock?", what)
	}
}

func TestStateString(t *testing.T) {
	for s, want := range map[State]string{0: "none", Closed: "closed", Open: "open", HalfOpen: "half_open", 9: "none"} {
		if got := s.String(); got != want {
			t.Errorf("State(%d).String() = %q, want %q", s, got, want)
		}
	}
}

// TestOpensAtMinAttempts runs sequences of verdicts, all in one bucket,
// and checks the breaker stays closed before the verdict at openAt and
// opens exactly there, for 30 s.
func TestOpensAtMinAttempts(t *testing.T) {
	r := strings.Repeat
	cases := []struct {
		name     string
		verdicts string // F failure, S success, N neutral
		openAt   int    // index of the verdict that opens it; -1: none
	}{
		{"19 failures", r("F", 19), -1},
		{"20 failures", r("F", 20), 19},
		{"9 of 20 failed, failures last", r("S", 11) + r("F", 9), -1},
		{"9 of 20 failed, failures first", r("F", 9) + r("S", 11), -1},
		{"10 of 20 failed, failures last", r("S", 10) + r("F", 10), 19},
		{"10 of 20 failed, alternating", r("SF", 10), 19},
		{"10 of 19 failed", r("F", 10) + r("S", 9), -1},
		// Only a failure opens it: a success that brings the window to
		// MinAttempts does not, the next failure does (11 of 21).
		{"10 of 20 failed, a success last", r("F", 10) + r("S", 10), -1},
		{"10 of 20 failed, a success last, then a failure", r("F", 10) + r("S", 10) + "F", 20},
		{"12 of 25 failed", r("S", 13) + r("F", 12), -1},
		{"13 of 26 failed", r("S", 13) + r("F", 13), 25},
		{"neutral never counts toward MinAttempts", r("F", 19) + r("N", 100), -1},
		{"neutral never counts toward MinAttempts, then a failure", r("F", 19) + r("N", 100) + "F", 119},
		{"neutral never dilutes the ratio", r("S", 10) + r("N", 100) + r("F", 10), 119},
		{"10 failures, 9 successes, 1 neutral", r("F", 10) + r("S", 9) + "N", -1},
		{"only neutral", r("N", 500), -1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, rec := newBreaker(nil)
			for i, ch := range c.verdicts {
				now := at(time.Duration(i) * time.Millisecond)
				v := map[rune]Verdict{'F': Failure, 'S': Success, 'N': Neutral}[ch]
				attempt(t, b, now, v)
				if c.openAt >= 0 && i >= c.openAt {
					wantState(t, b, now, Open)
					wantChanges(t, rec.list(), Change{Closed, Open, now, now.Add(30 * sec)})
					if i != len(c.verdicts)-1 {
						t.Fatalf("bad case: opened at %d of %d", i, len(c.verdicts))
					}
					return
				}
				wantState(t, b, now, Closed)
			}
			if c.openAt >= 0 {
				t.Fatal("never opened")
			}
			wantChanges(t, rec.list())
		})
	}
}

// TestFailureRatioRounding checks the ratio against counts whose product
// does not round exactly in floating point.
func TestFailureRatioRounding(t *testing.T) {
	cases := []struct {
		ratio              float64
		min                int
		successes, failing int
		want               State
	}{
		{0.07, 100, 93, 7, Open}, // 0.07*100 is 7.000000000000001
		{0.07, 100, 94, 6, Closed},
		{0.28, 25, 18, 7, Open}, // 0.28*25 is 7.000000000000001
		{0.28, 25, 19, 6, Closed},
		{0.14, 150, 129, 21, Open},
		{1, 20, 1, 19, Closed},
		{1, 20, 0, 20, Open},
		{0.5, 1, 0, 1, Open},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%v of %d, %d failed", c.ratio, c.min, c.failing), func(t *testing.T) {
			b, _ := newBreaker(func(s *Settings) { s.FailureRatio, s.MinAttempts = c.ratio, c.min })
			attempts(t, b, t0, c.successes, Success)
			attempts(t, b, t0, c.failing, Failure)
			wantState(t, b, t0, c.want)
		})
	}
}

// TestOpenToHalfOpenAtOpenUntil checks that each method moves an open
// breaker to half-open exactly at openUntil, not 1 ns before, and delivers
// the change.
func TestOpenToHalfOpenAtOpenUntil(t *testing.T) {
	openedAt := at(5 * sec)
	until := openedAt.Add(30 * sec)
	before := until.Add(-1)
	cases := []struct {
		name string
		// call calls the method at now; held is a ticket admitted before
		// the breaker opened. It checks what the method answers while
		// open (halfOpen false) or once half-open.
		call func(t *testing.T, b *Breaker, held Ticket, now time.Time, halfOpen bool)
	}{
		{"State", func(t *testing.T, b *Breaker, _ Ticket, now time.Time, halfOpen bool) {
			want := Open
			if halfOpen {
				want = HalfOpen
			}
			wantState(t, b, now, want)
		}},
		{"Allow", func(t *testing.T, b *Breaker, _ Ticket, now time.Time, halfOpen bool) {
			if halfOpen {
				probe(t, b, now)
			} else {
				wantRefused(t, b, now, Open, until)
			}
		}},
		{"RefusesAt", func(t *testing.T, b *Breaker, _ Ticket, now time.Time, halfOpen bool) {
			refused, next := b.RefusesAt(now, now)
			if refused == halfOpen || (!halfOpen && !next.Equal(until)) {
				t.Fatalf("RefusesAt(%s) = %v, %s", fmtTime(now), refused, fmtTime(next))
			}
		}},
		{"Done of a stale ticket", func(t *testing.T, b *Breaker, held Ticket, now time.Time, _ bool) {
			b.Done(held, now, Failure)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, rec := newBreaker(nil)
			held := b.Allow(t0).Ticket
			held2 := b.Allow(t0).Ticket
			trip(t, b, openedAt)
			opened := Change{Closed, Open, openedAt, until}
			c.call(t, b, held, before, false)
			wantChanges(t, rec.list(), opened)
			c.call(t, b, held2, until, true)
			// The change is delivered before the call returns.
			wantChanges(t, rec.list(), opened, Change{From: Open, To: HalfOpen, At: until})
			wantState(t, b, until, HalfOpen)
		})
	}
}

// TestProbeBackoff checks that each failed probe doubles the open period,
// up to MaxOpenFor, counted from the failure; that a neutral probe changes
// nothing; and that a probe that succeeds resets the period to OpenFor.
func TestProbeBackoff(t *testing.T) {
	b, rec := newBreaker(nil)
	trip(t, b, t0)
	want := []Change{{Closed, Open, t0, at(30 * sec)}}
	until := at(30 * sec)
	for _, period := range []time.Duration{60 * sec, 120 * sec, 240 * sec, 300 * sec, 300 * sec} {
		wantRefused(t, b, until.Add(-1), Open, until)
		p := probe(t, b, until)
		// A neutral probe frees the place without changing the period.
		b.Done(p, until.Add(sec), Neutral)
		wantState(t, b, until.Add(sec), HalfOpen)
		p = probe(t, b, until.Add(2*sec))
		end := until.Add(7 * sec) // the probe took 5 s: the period counts from its end
		b.Done(p, end, Failure)
		want = append(want,
			Change{From: Open, To: HalfOpen, At: until},
			Change{HalfOpen, Open, end, end.Add(period)})
		wantChanges(t, rec.list(), want...)
		until = end.Add(period)
		wantRefused(t, b, until.Add(-1), Open, until)
		if refused, next := b.RefusesAt(end, until.Add(-1)); !refused || !next.Equal(until) {
			t.Fatalf("RefusesAt(%s, until-1ns) = %v, %s; want refused until %s", fmtTime(end), refused, fmtTime(next), fmtTime(until))
		}
	}
	p := probe(t, b, until)
	b.Done(p, until.Add(sec), Success)
	want = append(want,
		Change{From: Open, To: HalfOpen, At: until},
		Change{From: HalfOpen, To: Closed, At: until.Add(sec)})
	wantChanges(t, rec.list(), want...)
	wantState(t, b, until.Add(sec), Closed)

	// Closed again, it opens for OpenFor, and a failed probe doubles that.
	again := until.Add(100 * sec)
	trip(t, b, again)
	p = probe(t, b, again.Add(30*sec))
	b.Done(p, again.Add(30*sec), Failure)
	want = append(want,
		Change{Closed, Open, again, again.Add(30 * sec)},
		Change{From: Open, To: HalfOpen, At: again.Add(30 * sec)},
		Change{HalfOpen, Open, again.Add(30 * sec), again.Add(90 * sec)})
	wantChanges(t, rec.list(), want...)
}

// TestMaxOpenForCapsFirstDoubling checks the cap when twice OpenFor is
// already past it.
func TestMaxOpenForCapsFirstDoubling(t *testing.T) {
	b, rec := newBreaker(func(s *Settings) { s.OpenFor, s.MaxOpenFor = 30*sec, 45*sec })
	trip(t, b, t0)
	p := probe(t, b, at(30*sec))
	b.Done(p, at(30*sec), Failure)
	got := rec.list()
	if last := got[len(got)-1]; last.To != Open || last.NextProbe.Sub(last.At) != 45*sec {
		t.Fatalf("changes %s: want the last open for 45s", fmtChanges(got))
	}
}

type batch struct {
	at time.Duration // from the base time
	n  int
	v  Verdict
}

// run admits and ends each batch's attempts at base+at; every attempt
// must be admitted.
func run(t *testing.T, b *Breaker, base time.Time, batches []batch) {
	t.Helper()
	for _, bt := range batches {
		attempts(t, b, base.Add(bt.at), bt.n, bt.v)
	}
}

type windowCase struct {
	name    string
	batches []batch
	want    State // after the last batch; Open means it opened on the last attempt
}

func runWindowCases(t *testing.T, base time.Time, cases []windowCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, rec := newBreaker(nil)
			run(t, b, base, c.batches)
			end := base.Add(c.batches[len(c.batches)-1].at)
			if c.want == Open {
				wantChanges(t, rec.list(), Change{Closed, Open, end, end.Add(30 * sec)})
			} else {
				wantChanges(t, rec.list())
			}
			wantState(t, b, end, c.want)
		})
	}
}

// spread returns n batches of one attempt with v, every step from start.
func spread(start, step time.Duration, n int, v Verdict) []batch {
	var bs []batch
	for i := range n {
		bs = append(bs, batch{start + time.Duration(i)*step, 1, v})
	}
	return bs
}

// TestRollingWindow checks that counts expire with their bucket: the
// window is 30 buckets of 1 s, the first at the first time counted (t0
// here), so a count in [t0+k s, t0+(k+1) s) counts until t0+(k+30) s,
// exclusive.
func TestRollingWindow(t *testing.T) {
	ns := time.Nanosecond
	runWindowCases(t, t0, []windowCase{
		{"15 old failures still count at 29s", []batch{{0, 15, Failure}, {29 * sec, 5, Failure}}, Open},
		{"15 old failures still count 1ns before 30s", []batch{{0, 15, Failure}, {30*sec - ns, 5, Failure}}, Open},
		{"15 old failures expire at 30s", []batch{{0, 15, Failure}, {30 * sec, 5, Failure}}, Closed},
		{"15 old failures expired at 45s", []batch{{0, 15, Failure}, {45 * sec, 5, Failure}}, Closed},
		{"15 old failures and 15 successes", []batch{{0, 15, Failure}, {10 * sec, 15, Success}, {30 * sec, 5, Failure}}, Closed},
		{"15 old failures and 15 successes, still in the window", []batch{{0, 15, Failure}, {10 * sec, 15, Success}, {29 * sec, 1, Failure}}, Open},
		// Bucket edges: a count late in a bucket expires with it.
		{"a bucket's last nanosecond counts until 30s", []batch{{0, 1, Success}, {sec - ns, 14, Failure}, {30*sec - ns, 5, Failure}}, Open},
		{"a bucket's last nanosecond expires at 30s", []batch{{0, 1, Success}, {sec - ns, 14, Failure}, {30 * sec, 5, Failure}}, Closed},
		{"the second bucket counts until 31s", []batch{{0, 1, Success}, {sec, 15, Failure}, {31*sec - ns, 5, Failure}}, Open},
		{"the second bucket expires at 31s", []batch{{0, 1, Success}, {sec, 15, Failure}, {31 * sec, 5, Failure}}, Closed},
		// The window slides.
		{"10 failures then 10 successes", []batch{{0, 10, Failure}, {20 * sec, 10, Success}, {20 * sec, 1, Failure}}, Open},
		{"10 failures then 10 successes too late", []batch{{0, 10, Failure}, {30 * sec, 10, Success}, {30 * sec, 1, Failure}}, Closed},
		{"the window slides past the failures", []batch{{0, 10, Failure}, {20 * sec, 9, Success}, {31 * sec, 10, Failure}}, Closed},
		{"the window slides onto new failures", []batch{{0, 10, Failure}, {20 * sec, 9, Success}, {31 * sec, 11, Failure}}, Open},
		// Bucket 0 is reused for t0+30s: its old counts go.
		{"a reused bucket forgets", []batch{{0, 15, Failure}, {30 * sec, 5, Failure}, {31 * sec, 14, Failure}}, Closed},
		{"a reused bucket counts anew", []batch{{0, 15, Failure}, {30 * sec, 5, Failure}, {31 * sec, 15, Failure}}, Open},
		{"a long quiet period", []batch{{0, 19, Failure}, {time.Hour, 1, Failure}}, Closed},
		{"one failure a second", spread(0, sec, 20, Failure), Open},
		{"one failure every 2s never reaches 20 in 30s", spread(0, 2*sec, 60, Failure), Closed},
		{"neutral keeps nothing alive", append([]batch{{0, 15, Failure}}, append(spread(sec, sec, 40, Neutral), batch{40 * sec, 5, Failure})...), Closed},
	})
}

// TestWindowClearedOnClose checks that a probe that closes the breaker
// forgets the counts that opened it.
func TestWindowClearedOnClose(t *testing.T) {
	b, rec := newBreaker(func(s *Settings) { s.OpenFor = 10 * sec })
	trip(t, b, t0) // 20 failures in bucket 0, still in the window at 11s
	b.Done(probe(t, b, at(10*sec)), at(10*sec), Success)
	attempts(t, b, at(11*sec), 19, Failure)
	wantState(t, b, at(11*sec), Closed)
	attempt(t, b, at(11*sec), Failure)
	wantChanges(t, rec.list(),
		Change{Closed, Open, t0, at(10 * sec)},
		Change{From: Open, To: HalfOpen, At: at(10 * sec)},
		Change{From: HalfOpen, To: Closed, At: at(10 * sec)},
		Change{Closed, Open, at(11 * sec), at(21 * sec)})
}

// TestOneProbeAtATime checks that half-open, the breaker admits one probe,
// refuses the rest until it ends, and admits another once a probe ends
// neutral.
func TestOneProbeAtATime(t *testing.T) {
	b, rec := newBreaker(nil)
	trip(t, b, t0)
	start := at(37 * sec) // the first call after openUntil (30s)
	p := probe(t, b, start)
	// The probe is due within ProbeLimit (60s): a refusal tells of that,
	// bounded by the open period (30s).
	for i := range 100 {
		now := start.Add(time.Duration(i) * 100 * time.Millisecond)
		wantRefused(t, b, now, HalfOpen, now.Add(30*sec))
	}
	wantRefused(t, b, start.Add(30*sec), HalfOpen, start.Add(60*sec))
	wantRefused(t, b, start.Add(59*sec), HalfOpen, start.Add(60*sec))
	// The place stays taken until the probe ends, even past ProbeLimit;
	// a refusal then tells of OverdueWait.
	wantRefused(t, b, start.Add(60*sec), HalfOpen, start.Add(60*sec+OverdueWait))
	wantRefused(t, b, start.Add(10*time.Minute), HalfOpen, start.Add(10*time.Minute+OverdueWait))
	if refused, next := b.RefusesAt(start.Add(sec), start.Add(sec)); !refused || !next.Equal(start.Add(31*sec)) {
		t.Fatalf("RefusesAt with a probe in flight = %v, %s; want refused, next in the open period", refused, fmtTime(next))
	}
	if refused, next := b.RefusesAt(start.Add(sec), start.Add(59*sec)); !refused || !next.Equal(start.Add(31*sec)) {
		t.Fatalf("RefusesAt before the probe's limit = %v, %s; want refused until the probe's limit, next in the open period", refused, fmtTime(next))
	}
	if refused, _ := b.RefusesAt(start.Add(sec), start.Add(60*sec)); refused {
		t.Fatal("RefusesAt refuses past the probe's limit")
	}
	wantState(t, b, start.Add(10*time.Minute), HalfOpen)

	// A neutral end frees the place: the next call is the probe.
	b.Done(p, start.Add(10*time.Minute), Neutral)
	next := start.Add(11 * time.Minute)
	p = probe(t, b, next)
	for i := range 10 {
		now := next.Add(time.Duration(i) * sec)
		wantRefused(t, b, now, HalfOpen, now.Add(30*sec))
	}
	b.Done(p, next.Add(sec), Success)
	a := b.Allow(next.Add(sec))
	if !a.OK || a.Ticket.Probe || a.State != Closed {
		t.Fatalf("Allow after the probe succeeded = %+v, want admitted, closed, no probe", a)
	}
	wantChanges(t, rec.list(),
		Change{Closed, Open, t0, at(30 * sec)},
		Change{From: Open, To: HalfOpen, At: start},
		Change{From: HalfOpen, To: Closed, At: next.Add(sec)})
}

// TestStaleTicketDoesNotExtendOpen checks that a ticket admitted while
// closed, ending after the breaker opened, changes nothing.
func TestStaleTicketDoesNotExtendOpen(t *testing.T) {
	b, rec := newBreaker(nil)
	held := []Ticket{b.Allow(t0).Ticket, b.Allow(t0).Ticket, b.Allow(t0).Ticket}
	trip(t, b, t0)
	b.Done(held[0], at(10*sec), Failure)
	b.Done(held[1], at(11*sec), Success)
	wantRefused(t, b, at(30*sec-1), Open, at(30*sec))
	wantChanges(t, rec.list(), Change{Closed, Open, t0, at(30 * sec)})
	// Nor, once half-open, is it taken for the probe.
	b.Done(held[2], at(30*sec), Failure)
	wantState(t, b, at(30*sec), HalfOpen)
	probe(t, b, at(30*sec))
	wantChanges(t, rec.list(), Change{Closed, Open, t0, at(30 * sec)}, Change{From: Open, To: HalfOpen, At: at(30 * sec)})
}

// TestStaleDoneDeliversHalfOpen checks that a Done of a stale ticket that
// moves the breaker to half-open delivers that change before it returns.
func TestStaleDoneDeliversHalfOpen(t *testing.T) {
	b, rec := newBreaker(nil)
	held := b.Allow(t0).Ticket
	trip(t, b, t0)
	b.Done(held, at(31*sec), Failure)
	wantChanges(t, rec.list(), Change{Closed, Open, t0, at(30 * sec)}, Change{From: Open, To: HalfOpen, At: at(31 * sec)})
}

// TestTicketsFromBeforeCloseDoNotCount checks that attempts admitted
// before the breaker opened, ending after a probe closed it, are not
// counted in the new window.
func TestTicketsFromBeforeCloseDoNotCount(t *testing.T) {
	b, rec := newBreaker(nil)
	var held []Ticket
	for range 20 {
		held = append(held, b.Allow(t0).Ticket)
	}
	trip(t, b, t0)
	p := probe(t, b, at(30*sec))
	refusedWhileHalfOpen := b.Allow(at(30 * sec)).Ticket
	b.Done(p, at(30*sec), Success)
	for _, tk := range held {
		b.Done(tk, at(31*sec), Failure)
	}
	b.Done(refusedWhileHalfOpen, at(31*sec), Failure)
	b.Done(p, at(31*sec), Failure) // the probe, again
	wantState(t, b, at(31*sec), Closed)
	// New attempts count from zero: 19 failures leave it closed.
	attempts(t, b, at(31*sec), 19, Failure)
	wantState(t, b, at(31*sec), Closed)
	attempt(t, b, at(31*sec), Failure)
	wantChanges(t, rec.list(),
		Change{Closed, Open, t0, at(30 * sec)},
		Change{From: Open, To: HalfOpen, At: at(30 * sec)},
		Change{From: HalfOpen, To: Closed, At: at(30 * sec)},
		Change{Closed, Open, at(31 * sec), at(61 * sec)})
}

// TestNonProbeCannotEndHalfOpen checks that only the probe's end changes
// a half-open breaker.
func TestNonProbeCannotEndHalfOpen(t *testing.T) {
	b, rec := newBreaker(nil)
	closedTicket := b.Allow(t0).Ticket
	trip(t, b, t0)
	p := probe(t, b, at(30*sec))
	refused := b.Allow(at(31 * sec))
	if refused.OK || refused.Ticket.Probe {
		t.Fatalf("second Allow while half-open = %+v", refused)
	}
	for _, v := range []Verdict{Success, Failure, Neutral} {
		b.Done(refused.Ticket, at(32*sec), v)
		b.Done(closedTicket, at(32*sec), v)
		wantState(t, b, at(32*sec), HalfOpen)
		// The probe's place is still taken.
		wantRefused(t, b, at(33*sec), HalfOpen, at(63*sec))
	}
	wantChanges(t, rec.list(), Change{Closed, Open, t0, at(30 * sec)}, Change{From: Open, To: HalfOpen, At: at(30 * sec)})
	b.Done(p, at(34*sec), Success)
	wantState(t, b, at(34*sec), Closed)
}

// TestRefusesAt checks RefusesAt in each state, and that it admits
// nothing.
func TestRefusesAt(t *testing.T) {
	type setup int
	const (
		closed        setup = iota
		open                // opened at t0, until 30s
		halfOpenIdle        // half-open since 30s, no probe
		halfOpenProbe       // half-open, a probe in flight since 30s
	)
	cases := []struct {
		name    string
		setup   setup
		now, at time.Duration
		refused bool
	}{
		{"open, now", open, sec, sec, true},
		{"open, 1ns before openUntil", open, sec, 30*sec - 1, true},
		{"open, at openUntil", open, sec, 30 * sec, false},
		{"open, after openUntil", open, sec, time.Hour, false},
		{"open, at before now", open, 29 * sec, 10 * sec, true},
		{"open, now at openUntil", open, 30 * sec, 30 * sec, false},
		{"closed", closed, sec, sec, false},
		{"closed, later", closed, sec, time.Hour, false},
		{"half-open", halfOpenIdle, 31 * sec, 31 * sec, false},
		{"half-open with a probe in flight", halfOpenProbe, 31 * sec, 31 * sec, true},
		{"half-open, 1ns before the probe's limit", halfOpenProbe, 31 * sec, 90*sec - 1, true},
		{"half-open, at the probe's limit", halfOpenProbe, 31 * sec, 90 * sec, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, rec := newBreaker(nil)
			if c.setup != closed {
				trip(t, b, t0)
			}
			switch c.setup {
			case halfOpenIdle:
				wantState(t, b, at(30*sec), HalfOpen)
			case halfOpenProbe:
				probe(t, b, at(30*sec))
			}
			before := len(rec.list())
			refused, next := b.RefusesAt(at(c.now), at(c.at))
			wantNext := at(30 * sec) // openUntil
			if c.setup == halfOpenProbe {
				// The probe is due at 90s (its start plus ProbeLimit):
				// ask again no later than the open period (30s) from now.
				wantNext = at(min(90*sec, c.now+30*sec))
			}
			if refused != c.refused || (refused && !next.Equal(wantNext)) {
				t.Fatalf("RefusesAt(%v, %v) = %v, %s; want %v", c.now, c.at, refused, fmtTime(next), c.refused)
			}
			if c.setup == open && c.now < 30*sec && len(rec.list()) != before {
				t.Fatalf("RefusesAt before openUntil changed the state: %s", fmtChanges(rec.list()))
			}
			// It admitted nothing: the probe's place is as it was.
			now := at(max(c.now, 30*sec))
			switch c.setup {
			case closed:
				attempt(t, b, now, Success)
			case halfOpenProbe:
				wantRefused(t, b, now, HalfOpen, now.Add(30*sec))
			default:
				probe(t, b, now)
			}
		})
	}
}

// TestOnChangeCycle checks the changes of a full cycle.
func TestOnChangeCycle(t *testing.T) {
	b, rec := newBreaker(nil)
	trip(t, b, t0)
	wantState(t, b, at(30*sec), HalfOpen)
	p := probe(t, b, at(31*sec))
	b.Done(p, at(32*sec), Failure)
	p = probe(t, b, at(92*sec))
	b.Done(p, at(93*sec), Success)
	trip(t, b, at(100*sec))
	p = probe(t, b, at(130*sec))
	b.Done(p, at(131*sec), Neutral)
	p = probe(t, b, at(132*sec))
	b.Done(p, at(133*sec), Failure)
	wantChanges(t, rec.list(),
		Change{Closed, Open, t0, at(30 * sec)},
		Change{From: Open, To: HalfOpen, At: at(30 * sec)},
		Change{HalfOpen, Open, at(32 * sec), at(92 * sec)},
		Change{From: Open, To: HalfOpen, At: at(92 * sec)},
		Change{From: HalfOpen, To: Closed, At: at(93 * sec)},
		Change{Closed, Open, at(100 * sec), at(130 * sec)},
		Change{From: Open, To: HalfOpen, At: at(130 * sec)},
		Change{HalfOpen, Open, at(133 * sec), at(193 * sec)})
}

// TestOnChangeWithoutLock calls the breaker from OnChange, which would
// deadlock if OnChange ran with the breaker's lock held.
func TestOnChangeWithoutLock(t *testing.T) {
	var b *Breaker
	var log []string // written by OnChange, on the guarded goroutine
	s := defaults()
	s.OnChange = func(c Change) {
		st := b.State(c.At)
		refused, next := b.RefusesAt(c.At, c.At)
		entry := fmt.Sprintf("%s: state %v, refused %v until %s", fmtChange(c), st, refused, fmtTime(next))
		if c.To == Closed {
			a := b.Allow(c.At)
			b.Done(a.Ticket, c.At, Neutral)
			entry += fmt.Sprintf(", admitted %v", a.OK)
		}
		log = append(log, entry)
	}
	b = New(s)
	guard(t, "a cycle whose OnChange calls the breaker", func() {
		for range 20 {
			a := b.Allow(t0)
			b.Done(a.Ticket, t0, Failure)
		}
		a := b.Allow(at(30 * sec))
		b.Done(a.Ticket, at(30*sec), Success)
	})
	want := []string{
		"closed->open at 0s next 30s: state open, refused true until 30s",
		// Delivered once Allow has taken the probe's place: refused until
		// the probe's limit, told to ask again in an open period.
		"open->half_open at 30s next -: state half_open, refused true until 1m0s",
		"half_open->closed at 30s next -: state closed, refused false until -, admitted true",
	}
	if !slices.Equal(log, want) {
		t.Fatalf("OnChange heard:\n%s\nwant:\n%s", strings.Join(log, "\n"), strings.Join(want, "\n"))
	}
}

// TestOnChangeOrderWhenCallbackChanges checks that a change caused from
// inside OnChange is delivered after the change being delivered, not
// nested in it.
func TestOnChangeOrderWhenCallbackChanges(t *testing.T) {
	var b *Breaker
	var order []string
	depth, maxDepth := 0, 0
	s := defaults()
	s.OnChange = func(c Change) {
		depth++
		maxDepth = max(maxDepth, depth)
		order = append(order, "begin "+fmtChange(c))
		if c.To == Open {
			// Past openUntil: this moves the breaker to half-open.
			order = append(order, "State: "+b.State(c.NextProbe).String())
		}
		order = append(order, "end "+fmtChange(c))
		depth--
	}
	b = New(s)
	var afterTrip []string
	guard(t, "a trip whose OnChange changes the state", func() {
		for range 20 {
			a := b.Allow(t0)
			b.Done(a.Ticket, t0, Failure)
		}
		afterTrip = slices.Clone(order)
	})
	want := []string{
		"begin closed->open at 0s next 30s",
		"State: half_open",
		"end closed->open at 0s next 30s",
		"begin open->half_open at 30s next -",
		"end open->half_open at 30s next -",
	}
	// Both were delivered by the Done that tripped it, before it returned.
	if !slices.Equal(afterTrip, want) || maxDepth != 1 {
		t.Fatalf("OnChange (max depth %d):\n%s\nwant:\n%s", maxDepth, strings.Join(afterTrip, "\n"), strings.Join(want, "\n"))
	}
}

// TestOnChangeOneAtATime checks that while one goroutine is in OnChange,
// another goroutine's change neither blocks it nor is delivered
// concurrently, and is delivered after it.
func TestOnChangeOneAtATime(t *testing.T) {
	heard := make(chan Change, 10)
	release := make(chan struct{})
	var b *Breaker
	s := defaults()
	s.OnChange = func(c Change) {
		heard <- c
		if c.To == Open {
			<-release
		}
	}
	b = New(s)
	tripped := make(chan struct{})
	go func() {
		defer close(tripped)
		for range 20 {
			a := b.Allow(t0)
			b.Done(a.Ticket, t0, Failure)
		}
	}()
	var first Change
	guard(t, "the first change", func() { first = <-heard })
	var st State
	guard(t, "State while another goroutine is in OnChange", func() { st = b.State(at(30 * sec)) })
	if st != HalfOpen {
		t.Fatalf("State = %v, want half_open", st)
	}
	select {
	case c := <-heard:
		t.Fatalf("%s delivered while OnChange was busy", fmtChange(c))
	default:
	}
	close(release)
	guard(t, "the trip", func() { <-tripped })
	var second Change
	select {
	case second = <-heard: // delivered by the tripping goroutine before its Done returned
	default:
		t.Fatal("the change to half-open was not delivered")
	}
	wantChanges(t, []Change{first, second}, Change{Closed, Open, t0, at(30 * sec)}, Change{From: Open, To: HalfOpen, At: at(30 * sec)})
}

// TestOnChangePanic checks that a panic in OnChange does not stop the
// delivery of later changes.
func TestOnChangePanic(t *testing.T) {
	rec := &recorder{}
	s := defaults()
	s.OnChange = func(c Change) {
		rec.add(c)
		if c.To == Open {
			panic("boom")
		}
	}
	b := New(s)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the panic of OnChange did not reach the caller")
			}
		}()
		attempts(t, b, t0, 20, Failure)
	}()
	guard(t, "State after OnChange panicked", func() { b.State(at(30 * sec)) })
	b.Done(probe(t, b, at(30*sec)), at(30*sec), Success)
	wantChanges(t, rec.list(),
		Change{Closed, Open, t0, at(30 * sec)},
		Change{From: Open, To: HalfOpen, At: at(30 * sec)},
		Change{From: HalfOpen, To: Closed, At: at(30 * sec)})
}

// TestNoOnChange runs a cycle with no OnChange.
func TestNoOnChange(t *testing.T) {
	b := New(defaults())
	trip(t, b, t0)
	p := probe(t, b, at(30*sec))
	b.Done(p, at(30*sec), Failure)
	wantRefused(t, b, at(89*sec), Open, at(90*sec))
	b.Done(probe(t, b, at(90*sec)), at(90*sec), Success)
	wantState(t, b, at(90*sec), Closed)
}

// TestConcurrent runs many goroutines calling Allow and Done at times
// read from a shared, advancing virtual clock (so that the times reach
// the breaker slightly out of order), and checks that at most one probe
// was ever in flight and that the changes were delivered one at a time,
// each from the state the previous one went to.
func TestConcurrent(t *testing.T) {
	var (
		mu                   sync.Mutex
		changes              []Change
		inOnChange, overlaps atomic.Int32
	)
	s := defaults()
	// Short open periods, for many cycles in the run.
	s.OpenFor, s.MaxOpenFor, s.ProbeLimit = sec, 8*sec, 2*sec
	s.OnChange = func(c Change) {
		if inOnChange.Add(1) != 1 {
			overlaps.Add(1)
		}
		mu.Lock()
		changes = append(changes, c)
		mu.Unlock()
		inOnChange.Add(-1)
	}
	b := New(s)
	var clock atomic.Int64 // nanoseconds past t0
	tick := func() time.Time { return at(time.Duration(clock.Add(int64(20 * time.Millisecond)))) }
	var inFlight, tooMany, probes, refusals atomic.Int32
	const workers, rounds = 16, 3000
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for range rounds {
				a := b.Allow(tick())
				if !a.OK {
					if a.State != Open && a.State != HalfOpen || a.NextProbe.IsZero() {
						tooMany.Add(1000) // a refusal must say when to come back
					}
					refusals.Add(1)
					continue
				}
				if a.Ticket.Probe {
					probes.Add(1)
					if inFlight.Add(1) > 1 {
						tooMany.Add(1)
					}
				}
				v := Failure
				switch x := rng.IntN(10); {
				case x == 0:
					v = Neutral
				case a.Ticket.Probe && x < 6, !a.Ticket.Probe && x < 4:
					v = Success
				}
				end := tick()
				if a.Ticket.Probe {
					inFlight.Add(-1) // before Done, which frees the place
				}
				b.Done(a.Ticket, end, v)
			}
		})
	}
	wg.Wait()
	if n := tooMany.Load(); n != 0 {
		t.Fatalf("%d violations: more than one probe in flight, or a bad refusal", n)
	}
	if n := overlaps.Load(); n != 0 {
		t.Fatalf("OnChange ran %d times while another call of it was running", n)
	}
	final := b.State(at(time.Duration(clock.Load())))
	mu.Lock()
	defer mu.Unlock()
	opens, closes := 0, 0
	prev := Closed
	for i, c := range changes {
		if c.From != prev || !validTransition(c.From, c.To) {
			t.Fatalf("change %d %s after a change to %v", i, fmtChange(c), prev)
		}
		if c.To == Open {
			opens++
			if d := c.NextProbe.Sub(c.At); d < s.OpenFor || d > s.MaxOpenFor {
				t.Fatalf("change %d %s: open for %v", i, fmtChange(c), d)
			}
		}
		if c.To == Closed {
			closes++
		}
		prev = c.To
	}
	if prev != final {
		t.Fatalf("State = %v, but the last change went to %v", final, prev)
	}
	// The run must have exercised the transitions.
	if opens < 20 || closes < 10 || probes.Load() < 30 || refusals.Load() == 0 {
		t.Fatalf("too little happened: %d opens, %d closes, %d probes, %d refusals", opens, closes, probes.Load(), refusals.Load())
	}
	t.Logf("%d changes, %d opens, %d closes, %d probes, %d refusals", len(changes), opens, closes, probes.Load(), refusals.Load())
}

func validTransition(from, to State) bool {
	switch {
	case from == Closed && to == Open,
		from == Open && to == HalfOpen,
		from == HalfOpen && (to == Open || to == Closed):
		return true
	}
	return false
}

// TestClockBackwardsWindow checks what a time earlier than the newest
// counted does while closed: it counts in the newest bucket, so that it
// neither evicts nor hides newer counts, nor outlives them.
func TestClockBackwardsWindow(t *testing.T) {
	ms := time.Millisecond
	runWindowCases(t, t0, []windowCase{
		// Two callers read the clock in one order and lock in the other,
		// across a bucket edge: the late one still sees the newer counts.
		{"a late reader across a bucket edge", []batch{{0, 1, Success}, {1500 * ms, 18, Failure}, {900 * ms, 1, Failure}}, Open},
		{"a time a window back does not evict newer counts", []batch{{0, 1, Success}, {100 * sec, 10, Failure}, {50 * sec, 10, Failure}}, Open},
		{"a time before the first counted", []batch{{0, 1, Success}, {100 * sec, 10, Failure}, {-50 * sec, 10, Failure}}, Open},
		{"a time before the first counted, from the start", []batch{{10 * sec, 10, Failure}, {-time.Hour, 10, Failure}}, Open},
		{"backwards counts expire with the newest bucket", []batch{{100 * sec, 10, Failure}, {50 * sec, 9, Failure}, {130 * sec, 1, Failure}}, Closed},
		{"backwards counts live as long as the newest bucket", []batch{{100 * sec, 10, Failure}, {50 * sec, 9, Failure}, {130*sec - 1, 1, Failure}}, Open},
	})
}

// TestClockBackwardsOpen checks that times earlier than those seen, while
// open or half-open, neither panic nor move the breaker on: the open
// period and the probe's limit hold, and a refusal tells of no wait longer
// than the open period.
func TestClockBackwardsOpen(t *testing.T) {
	b, rec := newBreaker(nil)
	trip(t, b, at(100*sec))
	wantState(t, b, t0, Open)
	wantRefused(t, b, at(-time.Hour), Open, at(-time.Hour+30*sec))
	wantRefused(t, b, at(90*sec), Open, at(120*sec))
	wantRefused(t, b, at(110*sec), Open, at(130*sec))
	if refused, next := b.RefusesAt(at(0), at(0)); !refused || !next.Equal(at(30*sec)) {
		t.Fatalf("RefusesAt(0, 0) = %v, %s", refused, fmtTime(next))
	}
	p := probe(t, b, at(130*sec))
	wantRefused(t, b, at(50*sec), HalfOpen, at(80*sec))
	wantRefused(t, b, at(170*sec), HalfOpen, at(190*sec))
	wantState(t, b, at(50*sec), HalfOpen)
	// A probe that ends at an earlier time than it began opens the
	// breaker for the period counted from the time given to Done.
	b.Done(p, at(120*sec), Failure)
	wantChanges(t, rec.list(),
		Change{Closed, Open, at(100 * sec), at(130 * sec)},
		Change{From: Open, To: HalfOpen, At: at(130 * sec)},
		Change{HalfOpen, Open, at(120 * sec), at(180 * sec)})
	wantRefused(t, b, at(180*sec-1), Open, at(180*sec))
	wantState(t, b, at(180*sec), HalfOpen)
}

// TestZeroTimeClock checks a virtual clock that starts at the zero time:
// counts at the zero time expire 30 s later like any other.
func TestZeroTimeClock(t *testing.T) {
	runWindowCases(t, time.Time{}, []windowCase{
		{"still counted at 29s", []batch{{0, 15, Failure}, {29 * sec, 5, Failure}}, Open},
		{"expired at 30s", []batch{{0, 15, Failure}, {30 * sec, 5, Failure}}, Closed},
		{"expired at 30s, with a gap", []batch{{0, 10, Failure}, {10 * sec, 5, Failure}, {30 * sec, 5, Failure}}, Closed},
	})
}

// TestLargeTimeJumps checks jumps of centuries: counts from before the
// jump have expired; counts after it expire 30 s later as usual; an open
// breaker has long passed its period.
func TestLargeTimeJumps(t *testing.T) {
	far := t0.AddDate(1000, 0, 0) // past what a time.Duration spans
	t.Run("closed", func(t *testing.T) {
		b, rec := newBreaker(nil)
		attempts(t, b, t0, 19, Failure)
		attempts(t, b, far, 1, Failure)
		wantState(t, b, far, Closed)
		attempts(t, b, far, 18, Failure)
		// The 19 at far expire 30 s later...
		attempts(t, b, far.Add(30*sec), 19, Failure)
		wantState(t, b, far.Add(30*sec), Closed)
		// ...and the 19 at far+30s count with one more.
		attempts(t, b, far.Add(59*sec), 1, Failure)
		wantChanges(t, rec.list(), Change{Closed, Open, far.Add(59 * sec), far.Add(89 * sec)})
	})
	t.Run("open", func(t *testing.T) {
		b, rec := newBreaker(nil)
		trip(t, b, t0)
		p := probe(t, b, far)
		b.Done(p, far, Failure)
		wantRefused(t, b, far.Add(60*sec-1), Open, far.Add(60*sec))
		wantChanges(t, rec.list(),
			Change{Closed, Open, t0, at(30 * sec)},
			Change{From: Open, To: HalfOpen, At: far},
			Change{HalfOpen, Open, far, far.Add(60 * sec)})
	})
	t.Run("backwards by centuries", func(t *testing.T) {
		b, rec := newBreaker(nil)
		attempts(t, b, far, 10, Failure)
		attempts(t, b, t0, 10, Failure) // counted with the newest
		wantChanges(t, rec.list(), Change{Closed, Open, t0, at(30 * sec)})
	})
	// Past about 146 years from the first count, the breaker moves its
	// origin forward; buckets still in the window keep their edges, which
	// are whole seconds from t0 here.
	r := time.Duration(1 << 62)
	runWindowCases(t, t0, []windowCase{
		{"across the origin's move, in the window", []batch{{0, 1, Success}, {r - 5*sec, 10, Failure}, {r + 24*sec, 10, Failure}}, Open},
		// r-5s is 4611686013.43s: its bucket expires at 4611686043s, r+24.57s.
		{"across the origin's move, the bucket's last ns", []batch{{0, 1, Success}, {r - 5*sec, 10, Failure}, {(r - 5*sec).Truncate(sec) + 30*sec - 1, 10, Failure}}, Open},
		{"across the origin's move, expired at the bucket's edge", []batch{{0, 1, Success}, {r - 5*sec, 10, Failure}, {(r - 5*sec).Truncate(sec) + 30*sec, 10, Failure}}, Closed},
	})
	// Twice as far, with nothing counted in between, the counts from the
	// first move have expired, and the buckets start anew at the first
	// count.
	t.Run("across two moves of the origin", func(t *testing.T) {
		b, rec := newBreaker(nil)
		run(t, b, t0, []batch{{0, 1, Success}, {r - 5*sec, 5, Failure}, {r + 10*sec, 5, Failure}})
		farther := t0.Add(r).Add(r)
		run(t, b, farther, []batch{{10 * sec, 10, Failure}, {40 * sec, 10, Failure}})
		wantState(t, b, farther.Add(40*sec), Closed)
		run(t, b, farther, []batch{{59 * sec, 10, Failure}})
		wantChanges(t, rec.list(), Change{Closed, Open, farther.Add(59 * sec), farther.Add(89 * sec)})
	})
}

// TestExtremeTimes calls every method at far-apart, unordered times,
// checking only that nothing panics and that the state stays one of the
// three.
func TestExtremeTimes(t *testing.T) {
	times := []time.Time{
		{}, t0, t0.AddDate(100000, 0, 0), t0.AddDate(-1000, 0, 0), time.Time{}.Add(-time.Hour),
		time.Unix(1<<40, 0), time.Unix(-(1 << 40), 0), t0.Add(1<<63 - 1), t0,
	}
	b, rec := newBreaker(func(s *Settings) { s.MinAttempts = 3 })
	var tickets []Ticket
	for round := range 3 {
		for i, now := range times {
			a := b.Allow(now)
			if a.OK {
				tickets = append(tickets, a.Ticket)
			}
			if len(tickets) > 0 && (i+round)%2 == 0 {
				b.Done(tickets[0], now, Verdict((i+round)%3))
				tickets = tickets[1:]
			}
			b.RefusesAt(now, times[(i+1)%len(times)])
			if s := b.State(now); s != Closed && s != Open && s != HalfOpen {
				t.Fatalf("State = %d", s)
			}
		}
	}
	prev := Closed
	for _, c := range rec.list() {
		if c.From != prev || !validTransition(c.From, c.To) {
			t.Fatalf("change %s after %v", fmtChange(c), prev)
		}
		prev = c.To
	}
}

// model is a plain reference of the breaker's behaviour, for times that
// never go backwards and a FailureRatio of 0.5: it keeps every counted
// verdict of the closed period in a list.
type model struct {
	s         Settings
	state     State
	gen       uint64
	openFor   time.Duration
	openUntil time.Time
	probing   bool
	probeDue  time.Time
	counted   bool
	origin    time.Time
	events    []modelEvent
	changes   []Change
}

type modelEvent struct {
	slice  int64
	failed bool
}

func (m *model) change(to State, now time.Time) {
	c := Change{From: m.state, To: to, At: now}
	if to == Open {
		c.NextProbe = m.openUntil
	}
	if to == Closed {
		m.openFor, m.events = m.s.OpenFor, nil
	}
	m.state, m.probing = to, false
	m.gen++
	m.changes = append(m.changes, c)
}

func (m *model) tick(now time.Time) {
	if m.state == Open && !now.Before(m.openUntil) {
		m.change(HalfOpen, now)
	}
}

func (m *model) open(now time.Time, d time.Duration) {
	m.openFor, m.openUntil = d, now.Add(d)
	m.change(Open, now)
}

func (m *model) allow(now, deadline time.Time) (ok, probe bool, next time.Time) {
	m.tick(now)
	switch {
	case m.state == Closed:
		return true, false, time.Time{}
	case m.state == Open || m.probing:
		return false, false, m.next(now)
	}
	m.probing, m.probeDue = true, now.Add(m.s.ProbeLimit)
	if !deadline.IsZero() && deadline.Before(m.probeDue) {
		m.probeDue = deadline
	}
	return true, true, time.Time{}
}

// next is when a refusal at now tells to ask again.
func (m *model) next(now time.Time) time.Time {
	next := m.openUntil
	if m.state == HalfOpen {
		next = m.probeDue
		if !next.After(now) {
			next = now.Add(OverdueWait)
		}
	}
	return minTime(next, now.Add(m.openFor))
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func (m *model) done(gen uint64, probe bool, now time.Time, v Verdict) {
	m.tick(now)
	if gen != m.gen {
		return
	}
	switch m.state {
	case Closed:
		if v == Neutral {
			return
		}
		if !m.counted {
			m.origin, m.counted = now, true
		}
		i := int64(now.Sub(m.origin) / (m.s.Window / Buckets))
		m.events = append(m.events, modelEvent{i, v == Failure})
		total, failures := 0, 0
		var live []modelEvent
		for _, e := range m.events {
			if e.slice > i-Buckets {
				live = append(live, e)
				total++
				if e.failed {
					failures++
				}
			}
		}
		m.events = live
		if v == Failure && total >= m.s.MinAttempts && 2*failures >= total {
			m.open(now, m.s.OpenFor)
		}
	case HalfOpen:
		if !probe {
			return
		}
		m.probing = false
		switch v {
		case Success:
			m.change(Closed, now)
		case Failure:
			m.open(now, min(2*m.openFor, m.s.MaxOpenFor))
		}
	}
}

// Fuzz operations: each is two bytes, an operation and its argument.
const (
	opAdvance   = iota // advance the clock by a duration the argument encodes
	opJump             // jump to the next probe's time, or 1 ns before it
	opAllow            // Allow, keeping the ticket if admitted; arg > 0: with a deadline (arg-1)×250ms on
	opAllowKeep        // Allow, keeping the ticket even if refused
	opDone             // Done of a kept ticket: verdict arg%3, the newest but arg/3
	opDone2            // the same
	opState            // State
	opRefusesAt        // RefusesAt(now, now+arg s)
	numOps
)

// FuzzBreaker drives a breaker with a sequence of operations at times that
// never go backwards, compares every answer and change with the model, and
// checks the invariants: never more than one probe in flight; a refusal's
// wait is positive and no longer than the current open period; each change
// goes from the state the previous one went to, along a valid transition;
// State is never 0; every open period is within [OpenFor, MaxOpenFor]
// (OpenFor from closed, twice the previous one capped from half-open).
func FuzzBreaker(f *testing.F) {
	seed := func(minAttempts byte, ops ...[]byte) {
		f.Add(slices.Concat(append([][]byte{{minAttempts}}, ops...)...))
	}
	ops := func(b ...byte) []byte { return b }
	// One failure opens (MinAttempts 1); probes fail, a kept refusal
	// ends, a probe succeeds.
	seed(0, ops(opAllow, 0, opDone, 2, opJump, 0, opAllow, 0, opAllowKeep, 0, opDone, 5, opDone, 2, opJump, 0, opAllow, 0, opDone, 1))
	// 20 failures open; the clock jumps to 1 ns before openUntil, then to
	// it; a probe fails, a neutral probe, a probe succeeds.
	seed(19, slices.Repeat(ops(opAllow, 0, opDone, 2), 20),
		ops(opJump, 1, opState, 0, opJump, 0, opAllow, 0, opDone, 2, opJump, 0, opAllow, 0, opDone, 0, opAllow, 0, opDone, 1))
	// Attempts in flight across changes; RefusesAt.
	seed(2, ops(opAllow, 0, opAllow, 0, opAllow, 0, opDone, 2, opDone, 2, opAdvance, 2+4*40, opDone, 2, opState, 0,
		opRefusesAt, 10, opJump, 1, opRefusesAt, 0, opJump, 0, opAllow, 0, opAllowKeep, 0, opDone, 1, opDone, 3))
	// Counts expiring from the window.
	seed(4, ops(opAllow, 0, opDone, 2, opAdvance, 2+4*31, opAllow, 0, opDone, 1, opAllow, 0, opDone, 2, opAllow, 0, opDone, 2,
		opAllow, 0, opDone, 2, opAdvance, 3+4*63, opAllow, 0, opDone, 2))
	// Probes failing until the period is capped.
	seed(0, ops(opAllow, 0, opDone, 2), slices.Repeat(ops(opJump, 0, opAllow, 0, opDone, 2), 8))
	// Probes with deadlines before and after ProbeLimit, refusals and
	// RefusesAt while they are in flight, and past their due time.
	seed(0, ops(opAllow, 0, opDone, 2, opJump, 0, opAllow, 9, opAllow, 0, opRefusesAt, 1, opAdvance, 1+4*50, opAllowKeep, 0,
		opJump, 0, opAllow, 0, opRefusesAt, 0, opDone, 5, opJump, 0, opAllow, 255, opAdvance, 2+4*20, opAllow, 0, opRefusesAt, 100, opDone, 2))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		s := defaults()
		s.MinAttempts = 1 + int(data[0]%20)
		data = data[1:]
		var changes []Change
		s.OnChange = func(c Change) { changes = append(changes, c) }
		b := New(s)
		m := &model{s: s, state: Closed, openFor: s.OpenFor}
		type kept struct {
			t     Ticket
			gen   uint64
			probe bool
		}
		var tickets []kept
		probesInFlight := 0
		now := t0
		period := time.Duration(0) // the last open period
		checked := 0               // the changes checked
		for step := 0; step+1 < len(data) && step < 4000; step += 2 {
			op, arg := data[step]%numOps, data[step+1]
			before := now
			what := func() string { return fmt.Sprintf("step %d (op %d, arg %d) at %s", step/2, op, arg, fmtTime(before)) }
			switch op {
			case opAdvance:
				unit := []time.Duration{1, 10 * time.Millisecond, sec, 10 * sec}[arg&3]
				now = now.Add(time.Duration(arg>>2) * unit)
			case opJump:
				var target time.Time
				switch {
				case m.state == Open:
					target = m.openUntil
				case m.state == HalfOpen && m.probing:
					target = m.probeDue
				default:
					target = now.Add(time.Duration(arg) * sec)
				}
				if arg%2 == 1 {
					target = target.Add(-1)
				}
				if target.After(now) {
					now = target
				}
			case opAllow, opAllowKeep:
				var deadline time.Time
				if op == opAllow && arg > 0 {
					deadline = now.Add(time.Duration(arg-1) * 250 * time.Millisecond)
				}
				a := b.AllowUntil(now, deadline)
				ok, isProbe, next := m.allow(now, deadline)
				if a.OK != ok || a.Ticket.Probe != isProbe || a.State != m.state || !a.NextProbe.Equal(next) {
					t.Fatalf("%s: Allow = OK %v probe %v %v next %s; model OK %v probe %v %v next %s",
						what(), a.OK, a.Ticket.Probe, a.State, fmtTime(a.NextProbe), ok, isProbe, m.state, fmtTime(next))
				}
				if w := a.NextProbe.Sub(now); !a.OK && (w <= 0 || w > m.openFor) {
					t.Fatalf("%s: Allow refused with a wait of %v; want one in (0, %v]", what(), w, m.openFor)
				}
				if a.Ticket.Probe != (a.OK && a.State == HalfOpen) {
					t.Fatalf("%s: Allow = %+v: want a probe exactly when admitted half-open", what(), a)
				}
				if a.Ticket.Probe {
					if probesInFlight++; probesInFlight > 1 {
						t.Fatalf("%s: %d probes in flight", what(), probesInFlight)
					}
				}
				// A probe not kept is lost: it stays in flight for good.
				if (a.OK || op == opAllowKeep) && len(tickets) < 64 {
					tickets = append(tickets, kept{a.Ticket, m.gen, isProbe})
				}
			case opDone, opDone2:
				if len(tickets) == 0 {
					continue
				}
				i := len(tickets) - 1 - int(arg/3)%len(tickets)
				k := tickets[i]
				tickets = slices.Delete(tickets, i, i+1)
				v := Verdict(arg % 3)
				if k.probe {
					probesInFlight--
				}
				b.Done(k.t, now, v)
				m.done(k.gen, k.probe, now, v)
			case opState:
				got := b.State(now)
				m.tick(now)
				if got != m.state || got == 0 {
					t.Fatalf("%s: State = %v, model %v", what(), got, m.state)
				}
			case opRefusesAt:
				later := now.Add(time.Duration(arg) * sec)
				refused, next := b.RefusesAt(now, later)
				m.tick(now)
				want := m.state == Open && m.openUntil.After(later) || m.state == HalfOpen && m.probing && m.probeDue.After(later)
				var wantNext time.Time
				if m.state == Open || m.probing {
					wantNext = m.next(now)
				}
				if refused != want || !next.Equal(wantNext) {
					t.Fatalf("%s: RefusesAt(+%ds) = %v %s; model %v %s", what(), arg, refused, fmtTime(next), want, fmtTime(wantNext))
				}
			}
			if len(changes) != len(m.changes) {
				t.Fatalf("%s: changes %s; model %s", what(), fmtChanges(changes), fmtChanges(m.changes))
			}
			for i := range changes {
				if !sameChange(changes[i], m.changes[i]) {
					t.Fatalf("%s: changes %s; model %s", what(), fmtChanges(changes), fmtChanges(m.changes))
				}
			}
			// The invariants, on their own, for the new changes.
			for ; checked < len(changes); checked++ {
				c, prev := changes[checked], Closed
				if checked > 0 {
					prev = changes[checked-1].To
				}
				if c.From != prev || !validTransition(c.From, c.To) {
					t.Fatalf("%s: change %s after a change to %v", what(), fmtChange(c), prev)
				}
				if c.To == Open {
					d := c.NextProbe.Sub(c.At)
					want := s.OpenFor
					if c.From == HalfOpen {
						want = min(2*period, s.MaxOpenFor)
					}
					if d != want || d < s.OpenFor || d > s.MaxOpenFor {
						t.Fatalf("%s: change %s opens for %v, want %v", what(), fmtChange(c), d, want)
					}
					period = d
				}
			}
		}
	})
}

// TestRefusalWaitBoundedByOpenPeriod checks the wait a refusal tells of:
// open, until the open period ends; with a probe in flight, until its
// answer is due (ProbeLimit after it started, or the deadline it was
// admitted with if sooner), or OverdueWait once that has passed; and never
// longer than the current open period, doubled after a failed probe.
func TestRefusalWaitBoundedByOpenPeriod(t *testing.T) {
	ms := time.Millisecond
	b, _ := newBreaker(func(s *Settings) { s.OpenFor, s.MaxOpenFor, s.ProbeLimit = 2*sec, 10*sec, 60*sec })
	trip(t, b, t0)
	wantRefused(t, b, at(500*ms), Open, at(2*sec))

	// A probe that may take 60 s: come back within the open period.
	p := probe(t, b, at(2*sec))
	wantRefused(t, b, at(2*sec), HalfOpen, at(4*sec))
	wantRefused(t, b, at(30*sec), HalfOpen, at(32*sec))
	wantRefused(t, b, at(60500*ms), HalfOpen, at(62*sec)) // 1.5 s left
	wantRefused(t, b, at(62*sec), HalfOpen, at(62*sec+OverdueWait))
	if refused, next := b.RefusesAt(at(3*sec), at(10*sec)); !refused || !next.Equal(at(5*sec)) {
		t.Fatalf("RefusesAt(3s, 10s) = %v, %s; want refused (the probe is due at 62s), next at 5s", refused, fmtTime(next))
	}

	// It fails: open for 4 s, the bound of the waits until it closes.
	b.Done(p, at(63*sec), Failure)
	wantRefused(t, b, at(63*sec), Open, at(67*sec))
	p = probe(t, b, at(67*sec))
	wantRefused(t, b, at(67*sec), HalfOpen, at(71*sec))

	// A probe whose caller's deadline comes first: its remainder.
	b.Done(p, at(68*sec), Neutral)
	p = b.AllowUntil(at(68*sec), at(69500*ms)).Ticket
	if !p.Probe {
		t.Fatal("AllowUntil did not admit the probe")
	}
	wantRefused(t, b, at(68*sec), HalfOpen, at(69500*ms))
	wantRefused(t, b, at(69*sec), HalfOpen, at(69500*ms))
	wantRefused(t, b, at(69500*ms), HalfOpen, at(69600*ms))
	if refused, next := b.RefusesAt(at(68*sec), at(69500*ms)); refused || !next.Equal(at(69500*ms)) {
		t.Fatalf("RefusesAt(68s, 69.5s) = %v, %s; want not refused at the probe's deadline", refused, fmtTime(next))
	}

	// A deadline past ProbeLimit changes nothing.
	b.Done(p, at(70*sec), Neutral)
	probe := b.AllowUntil(at(70*sec), at(time.Hour))
	if !probe.OK || !probe.Ticket.Probe {
		t.Fatal("AllowUntil did not admit the probe")
	}
	wantRefused(t, b, at(127*sec), HalfOpen, at(130*sec))

	// An open period shorter than OverdueWait bounds it too.
	b2, _ := newBreaker(func(s *Settings) { s.OpenFor, s.ProbeLimit = 50*ms, 0 })
	trip(t, b2, t0)
	_ = b2.Allow(at(50 * ms))
	wantRefused(t, b2, at(50*ms), HalfOpen, at(100*ms))
}
