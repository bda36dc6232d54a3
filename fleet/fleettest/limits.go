package fleettest

import (
	"context"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/damper-ai/damper-go/fleet"
)

func (e *env) limits(t *testing.T) {
	t.Run("Settings", e.limitSettings)
	t.Run("Bounds", e.limitBounds)
	t.Run("Debt", e.limitDebt)
	t.Run("Batch", e.limitBatch)
	t.Run("Settle", e.limitSettle)
	t.Run("Pause", e.limitPause)
	t.Run("Learned", e.limitLearned)
	t.Run("LeaseBound", e.limitLeaseBound)
}

// limitValues: 60 requests a minute binds; the token buckets are known
// and wide.
var limitValues = fleet.LimitSettings{
	Group:      "conformance",
	Limits:     fleet.RateLimits{RequestsPerMinute: 60, InputTokensPerMinute: 600000, OutputTokensPerMinute: 600000},
	BatchShare: 0.5,
}

var oneCall = fleet.RateAmounts{1, 10, 10}

func newBuckets(t *testing.T, s fleet.Store, set fleet.LimitSettings) fleet.LimitBuckets {
	t.Helper()
	b, err := s.(fleet.LimitStore).LimitBuckets(set)
	if err != nil || b == nil {
		t.Fatalf("LimitBuckets(%+v) = %v, %v; want buckets", set, b, err)
	}
	return b
}

func (e *env) limitSettings(t *testing.T) {
	s := e.new(t).(fleet.LimitStore)
	for _, c := range []struct {
		edit         func(*fleet.LimitSettings)
		field, value string
	}{
		{func(l *fleet.LimitSettings) { l.Limits.RequestsPerMinute = -1 }, "RequestsPerMinute", "-1"},
		{func(l *fleet.LimitSettings) { l.Limits.InputTokensPerMinute = -2 }, "InputTokensPerMinute", "-2"},
		{func(l *fleet.LimitSettings) { l.Limits.OutputTokensPerMinute = -3 }, "OutputTokensPerMinute", "-3"},
		{func(l *fleet.LimitSettings) { l.BatchShare = 0 }, "BatchShare", "0"},
		{func(l *fleet.LimitSettings) { l.BatchShare = 1.5 }, "BatchShare", "1.5"},
		{func(l *fleet.LimitSettings) { l.BatchShare = math.NaN() }, "BatchShare", "NaN"},
	} {
		set := limitValues
		c.edit(&set)
		_, err := s.LimitBuckets(set)
		wantFieldError(t, "LimitBuckets", err, c.field, c.value)
	}
}

// reserveAll has n goroutines of each of the buckets reserve one call at
// now, each asks times, sent no later than now, and returns how many took.
func reserveAll(t *testing.T, bs []fleet.LimitBuckets, goroutines, asks int, now time.Time) int {
	var taken atomic.Int64
	parallel(len(bs)*goroutines, func(i int) {
		b := bs[i%len(bs)]
		for range asks {
			r, due, err := b.Reserve(context.Background(), now, oneCall, fleet.Interactive, now, nil)
			if err != nil {
				t.Errorf("Reserve: %v", err)
				return
			}
			if r.Taken() {
				taken.Add(1)
				if !due.Equal(now) {
					t.Errorf("Reserve took, due %s; want due at now (%s)", since(due), since(now))
				}
			}
		}
	})
	return int(taken.Load())
}

// drain reserves on b until it is refused, and returns how many took.
func drain(t *testing.T, b fleet.LimitBuckets, now time.Time) int {
	t.Helper()
	n := 0
	for ; n < 10000; n++ {
		r, _, err := b.Reserve(context.Background(), now, oneCall, fleet.Interactive, now, nil)
		must(t, "Reserve", err)
		if !r.Taken() {
			return n
		}
	}
	t.Fatalf("Reserve took 10000 times at one instant from a bucket of 60")
	return n
}

// limitBounds: at one instant the fleet admits what the bucket holds, and
// over 30 s what it refills, never more.
func (e *env) limitBounds(t *testing.T) {
	stores := e.stores(t, fleetSize)
	bs := make([]fleet.LimitBuckets, len(stores))
	for i, s := range stores {
		bs[i] = newBuckets(t, s, limitValues)
	}
	groups := e.groups(len(stores))
	for _, step := range []struct {
		at   time.Duration
		want int // per group
	}{{0, 60}, {30 * time.Second, 30}} {
		now := ms(step.at)
		got := reserveAll(t, bs, 6, 15, now)
		bound := step.want * groups
		if got > bound {
			t.Fatalf("at %v the fleet admitted %d calls, more than the %d its buckets hold", step.at, got, bound)
		}
		if e.leased() {
			flush(t, stores...)
			for _, b := range bs {
				got += drain(t, b, now)
			}
		}
		if got != bound {
			t.Fatalf("at %v the fleet admitted %d calls asking until refused, want exactly %d", step.at, got, bound)
		}
	}
	// Empty: the next call is due when one request has refilled (1 s).
	flush(t, stores...)
	now := ms(30 * time.Second)
	r, due, err := bs[0].Reserve(context.Background(), now, oneCall, fleet.Interactive, now, nil)
	must(t, "Reserve", err)
	if r.Taken() || due.Sub(ms(31*time.Second)).Abs() > time.Millisecond {
		t.Errorf("Reserve at 30s on an empty bucket = taken %v, due %s; want refused, due 31s", r.Taken(), since(due))
	}
	at, err := bs[0].Admits(context.Background(), now, now, oneCall, fleet.Interactive)
	if err != nil || at.Sub(ms(31*time.Second)).Abs() > time.Millisecond {
		t.Errorf("Admits at 30s on an empty bucket = %s, %v; want 31s", since(at), err)
	}
	if at, err := bs[0].Admits(context.Background(), now, ms(32*time.Second), oneCall, fleet.Interactive); err != nil || !at.Equal(ms(32*time.Second)) {
		t.Errorf("Admits at 30s of a call at 32s = %s, %v; want 32s: a request refills by then", since(at), err)
	}
}

// limitDebt: an interactive call that can wait takes from an empty bucket
// and is due when the bucket has refilled what it owes; one that cannot
// wait that long takes nothing. A call larger than the limit takes the
// whole bucket, no more.
func (e *env) limitDebt(t *testing.T) {
	s := e.new(t)
	b := newBuckets(t, s, limitValues)
	ctx := context.Background()
	large := fleet.RateAmounts{100, 10, 10}
	r, due, err := b.Reserve(ctx, Base, large, fleet.Interactive, Base, nil)
	must(t, "Reserve", err)
	if !r.Taken() || !due.Equal(Base) {
		t.Fatalf("Reserve of 100 requests from a full bucket of 60 = taken %v, due %s; want taken, due now", r.Taken(), since(due))
	}
	latest := ms(3500 * time.Millisecond)
	for i := 1; i <= 4; i++ {
		r, due, err := b.Reserve(ctx, Base, oneCall, fleet.Interactive, latest, nil)
		must(t, "Reserve", err)
		want := ms(time.Duration(i) * time.Second)
		if i == 4 {
			if r.Taken() || due.Sub(want).Abs() > time.Millisecond {
				t.Errorf("Reserve %d on an empty bucket, latest 3.5s = taken %v, due %s; want refused, due 4s", i, r.Taken(), since(due))
			}
			continue
		}
		if !r.Taken() || due.Sub(want).Abs() > time.Millisecond {
			t.Errorf("Reserve %d on an empty bucket, latest 3.5s = taken %v, due %s; want taken, due %ds", i, r.Taken(), since(due), i)
		}
	}
}

// limitBatch: batch calls take only the BatchShare of each bucket, and
// leave the rest to interactive calls.
func (e *env) limitBatch(t *testing.T) {
	s := e.new(t)
	b := newBuckets(t, s, limitValues)
	ctx := context.Background()
	batch := 0
	for ; batch < 100; batch++ {
		var tk fleet.RateTicket
		r, _, err := b.Reserve(ctx, Base, oneCall, fleet.Batch, Base, &tk)
		must(t, "Reserve", err)
		if !r.Taken() {
			must(t, "Leave", b.Leave(ctx, Base, &tk))
			if !tk.Slot.IsZero() {
				t.Errorf("Leave kept the ticket's slot, %s", since(tk.Slot))
			}
			break
		}
	}
	flush(t, s)
	interactive := drain(t, b, Base)
	if batch != 30 || interactive != 30 {
		t.Errorf("at one instant, %d batch calls then %d interactive ones took; want 30 each (BatchShare 0.5 of 60)", batch, interactive)
	}
}

// state reads the buckets after a flush.
func state(t *testing.T, s fleet.Store, b fleet.LimitBuckets, now time.Time) [3]fleet.RateLimitState {
	t.Helper()
	flush(t, s)
	st, err := b.State(context.Background(), now)
	must(t, "State", err)
	return st
}

// limitSettle: a settling gives back what was not used, takes what was
// used beyond, and counts once.
func (e *env) limitSettle(t *testing.T) {
	s := e.new(t)
	b := newBuckets(t, s, limitValues)
	ctx := context.Background()
	now := Base
	known := [3]bool{true, true, true}
	reserve := func() fleet.RateReservation {
		t.Helper()
		r, _, err := b.Reserve(ctx, now, oneCall, fleet.Interactive, now, nil)
		if err != nil || !r.Taken() {
			t.Fatalf("Reserve = taken %v, %v; want taken", r.Taken(), err)
		}
		return r
	}
	r := reserve()
	must(t, "Settle", b.Settle(ctx, now, r, fleet.RateAmounts{}, known))
	if r.Taken() {
		t.Errorf("a settled reservation reports Taken")
	}
	want := fleet.RateAmounts{60, 600000, 600000}
	check := func(what string) {
		t.Helper()
		st := state(t, s, b, now)
		for k := range 3 {
			if !near(st[k].Remaining, want[k], 1e-6) || st[k].Limit != amounts(limitValues.Limits)[k] || st[k].Learned {
				t.Errorf("%s: bucket %s = %+v; want remaining %v of a configured %v", what, st[k].Bucket, st[k], want[k], amounts(limitValues.Limits)[k])
			}
		}
	}
	check("settled with nothing used")
	r = reserve()
	used := fleet.RateAmounts{1, 40, 5}
	must(t, "Settle", b.Settle(ctx, now, r, used, known))
	must(t, "Settle again", b.Settle(ctx, now, r, fleet.RateAmounts{}, known))
	want = fleet.RateAmounts{59, 600000 - 40, 600000 - 5}
	check("settled with {1, 40, 5} used, then settled again")
	// A bucket not known keeps what was taken.
	r = reserve()
	must(t, "Settle", b.Settle(ctx, now, r, fleet.RateAmounts{}, [3]bool{true, false, true}))
	want[1] -= 10
	check("settled with nothing used, the input tokens not known")
}

// limitPause: a pause is seen by every store of the fleet, refuses until
// it ends, and is over at its end.
func (e *env) limitPause(t *testing.T) {
	stores := e.stores(t, 2)
	bs := []fleet.LimitBuckets{newBuckets(t, stores[0], limitValues), newBuckets(t, stores[1], limitValues)}
	ctx := context.Background()
	until := ms(10 * time.Second)
	must(t, "Pause", bs[0].Pause(ctx, Base, [3]bool{true, true, true}, until))
	flush(t, stores...)
	seen := bs[:1]
	if e.o.Shared {
		seen = bs
	}
	for i, b := range seen {
		if got, err := b.PausedUntil(ctx, ms(time.Second)); err != nil || got.Sub(until).Abs() > time.Millisecond {
			t.Errorf("store %d: PausedUntil at 1s = %s, %v; want 10s", i, since(got), err)
		}
		r, due, err := b.Reserve(ctx, ms(time.Second), oneCall, fleet.Interactive, ms(time.Second), nil)
		must(t, "Reserve", err)
		if r.Taken() || due.Before(until.Add(-time.Millisecond)) {
			t.Errorf("store %d: Reserve at 1s in a pause until 10s = taken %v, due %s; want refused, due 10s or later", i, r.Taken(), since(due))
		}
		if got, err := b.PausedUntil(ctx, ms(11*time.Second)); err != nil || !got.IsZero() {
			t.Errorf("store %d: PausedUntil at 11s = %s, %v; want zero, the pause over", i, since(got), err)
		}
	}
}

// limitLearned: a bucket not configured admits everything until a
// response gives its limit; a response's remaining count lowers it.
func (e *env) limitLearned(t *testing.T) {
	s := e.new(t)
	set := limitValues
	set.Limits = fleet.RateLimits{}
	b := newBuckets(t, s, set)
	ctx := context.Background()
	now := Base
	var r fleet.RateReservation
	for range 100 {
		var err error
		r, _, err = b.Reserve(ctx, now, oneCall, fleet.Interactive, now, nil)
		if err != nil || !r.Taken() {
			t.Fatalf("Reserve with no limit known = taken %v, %v; want taken", r.Taken(), err)
		}
	}
	o := fleet.RateObservation{Has: [3]bool{true, true, true}, Limit: fleet.RateAmounts{50, 5000, 5000}, Remaining: fleet.RateAmounts{10, 4000, 4000}}
	must(t, "Observe", b.Observe(ctx, now, r, o))
	must(t, "Settle", b.Settle(ctx, now, r, oneCall, [3]bool{true, true, true}))
	st := state(t, s, b, now)
	for k := range 3 {
		if st[k].Limit != o.Limit[k] || !st[k].Learned || st[k].Remaining > o.Remaining[k]+1e-6 {
			t.Errorf("bucket %s = %+v; want limit %v learned, at most %v remaining", st[k].Bucket, st[k], o.Limit[k], o.Remaining[k])
		}
	}
	if n := drain(t, b, now); n > 10 {
		t.Errorf("%d calls admitted after a response said 10 requests remain", n)
	}
}

// limitLeaseBound: with leases, after a response lowers the bucket to
// nothing, the fleet admits at most the leases outstanding: Lease-1 calls
// per store.
func (e *env) limitLeaseBound(t *testing.T) {
	if !e.leased() || !e.o.Shared {
		t.Skip("the stores lease no tokens of a shared bucket")
	}
	stores := e.stores(t, fleetSize)
	bs := make([]fleet.LimitBuckets, len(stores))
	ctx := context.Background()
	var r fleet.RateReservation
	for i, s := range stores {
		bs[i] = newBuckets(t, s, limitValues)
		var err error
		r, _, err = bs[i].Reserve(ctx, Base, oneCall, fleet.Interactive, Base, nil)
		if err != nil || !r.Taken() {
			t.Fatalf("store %d: Reserve = taken %v, %v; want taken", i, r.Taken(), err)
		}
	}
	last := stores[len(stores)-1]
	o := fleet.RateObservation{Has: [3]bool{true, true, true}, Limit: fleet.RateAmounts{60, 600000, 600000}, Remaining: fleet.RateAmounts{0, 600000, 600000}}
	must(t, "Observe", bs[len(bs)-1].Observe(ctx, Base, r, o))
	must(t, "Settle", bs[len(bs)-1].Settle(ctx, Base, r, oneCall, [3]bool{true, true, true}))
	flush(t, last)
	got := reserveAll(t, bs, 4, 10, Base)
	if bound := (e.o.Lease - 1) * len(stores); got > bound {
		t.Errorf("the fleet admitted %d calls after a response said none remain, more than the leases outstanding, (Lease-1) × %d stores = %d", got, len(stores), bound)
	}
}

// amounts are l's limits in the order of [fleet.RateAmounts].
func amounts(l fleet.RateLimits) fleet.RateAmounts {
	return fleet.RateAmounts{float64(l.RequestsPerMinute), float64(l.InputTokensPerMinute), float64(l.OutputTokensPerMinute)}
}
