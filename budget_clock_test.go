package damper_test

import (
	"testing"
	"time"
	"unsafe"
)

// wallStepped returns t with its wall reading moved by step and its
// monotonic reading kept: what time.Now returns after the system clock is
// stepped. No exported function builds such a time, so this one edits the
// wall seconds of time.Time's representation, and checks that it did.
func wallStepped(t *testing.T, tm time.Time, step time.Duration) time.Time {
	t.Helper()
	if step%time.Second != 0 {
		t.Fatalf("wallStepped(%v): whole seconds only", step)
	}
	const hasMonotonic = 1 << 63
	type timeRepr struct {
		wall uint64
		ext  int64
		loc  *time.Location
	}
	out := tm
	r := (*timeRepr)(unsafe.Pointer(&out))
	if r.wall&hasMonotonic == 0 {
		t.Fatal("wallStepped: the time has no monotonic reading")
	}
	r.wall = uint64(int64(r.wall) + int64(step/time.Second)<<30)
	if out.Sub(tm) != 0 || out.Round(0).Sub(tm.Round(0)) != step {
		t.Fatalf("wallStepped: time.Time's representation changed; got mono %v, wall %v", out.Sub(tm), out.Round(0).Sub(tm.Round(0)))
	}
	return out
}

// A wall clock stepped back an hour does not bring an exhausted window
// back: windows follow monotonic time, so the next one opens one window
// after the first, as measured by the monotonic clock.
func TestWindowBudgetFollowsMonotonicTime(t *testing.T) {
	const window = 10 * time.Second
	b := mustBudget(t, 0.1, window, 2)
	// The first window starts at a multiple of the window since the epoch;
	// t0, its first instant, keeps time.Now's monotonic reading.
	now := time.Now()
	t0 := now.Add(window - time.Duration(now.UnixNano()%int64(window)))
	if !b.TryAcquire(t0) || !b.TryAcquire(t0) || b.TryAcquire(t0) {
		t.Fatal("want exactly two units in the first window")
	}
	back := wallStepped(t, t0.Add(time.Second), -time.Hour)
	if b.TryAcquire(back) {
		t.Error("a unit was taken from the exhausted window after the wall clock stepped back")
	}
	if got := b.Balance(back); got != 0 {
		t.Errorf("balance after the wall step = %v, want 0 (the same window)", got)
	}
	next := wallStepped(t, t0.Add(10*time.Second), -time.Hour)
	if !b.TryAcquire(next) {
		t.Error("the next window, ten monotonic seconds on, has no unit")
	}
	ahead := wallStepped(t, t0.Add(11*time.Second), 24*time.Hour)
	if got := b.Balance(ahead); got != 1 {
		t.Errorf("balance after the wall clock jumped a day ahead = %v, want 1 (the window of the unit just taken)", got)
	}
}
