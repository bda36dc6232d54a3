package dampertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

func TestClockAdvanceFiresInDeadlineOrder(t *testing.T) {
	tests := []struct {
		name     string
		timers   []time.Duration // registered in this order, named a, b, c...
		advances []time.Duration
		want     []string // per advance: the timers fired, "name@offset"
	}{
		{
			name:     "one timer, exact deadline",
			timers:   []time.Duration{time.Second},
			advances: []time.Duration{999 * time.Millisecond, time.Millisecond},
			want:     []string{"", "a@1s"},
		},
		{
			name:     "deadline order, not registration order",
			timers:   []time.Duration{3 * time.Second, time.Second, 2 * time.Second},
			advances: []time.Duration{5 * time.Second},
			want:     []string{"b@1s c@2s a@3s"},
		},
		{
			name:     "ties in registration order",
			timers:   []time.Duration{2 * time.Second, time.Second, 2 * time.Second, time.Second},
			advances: []time.Duration{2 * time.Second},
			want:     []string{"b@1s d@1s a@2s c@2s"},
		},
		{
			name:     "spread over advances",
			timers:   []time.Duration{time.Second, 3 * time.Second, 10 * time.Second},
			advances: []time.Duration{2 * time.Second, 0, time.Second, 6 * time.Second, -time.Hour},
			want:     []string{"a@1s", "", "b@3s", "", ""},
		},
		{
			name:     "nothing due",
			timers:   []time.Duration{time.Hour},
			advances: []time.Duration{59 * time.Minute},
			want:     []string{""},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := NewClock(t0)
			var fired []string
			for i, d := range tt.timers {
				name := string(rune('a' + i))
				c.AfterFunc(d, func() {
					// Now reads the timer's own deadline while it runs.
					fired = append(fired, fmt.Sprintf("%s@%v", name, c.Now().Sub(t0)))
				})
			}
			var total time.Duration
			for i, d := range tt.advances {
				fired = nil
				c.Advance(d)
				total += max(d, 0)
				if got := strings.Join(fired, " "); got != tt.want[i] {
					t.Errorf("advance %d (%v): fired %q, want %q", i, d, got, tt.want[i])
				}
				if got := c.Now(); !got.Equal(t0.Add(total)) {
					t.Errorf("advance %d: Now = %v, want %v", i, got.Sub(t0), total)
				}
			}
		})
	}
}

func TestClockStop(t *testing.T) {
	tests := []struct {
		name      string
		advance   time.Duration // before stopping
		wantStop  bool
		wantFired bool
	}{
		{"before deadline", 999 * time.Millisecond, true, false},
		{"after deadline", time.Second, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := NewClock(t0)
			fired := false
			stop := c.AfterFunc(time.Second, func() { fired = true })
			if c.Pending() != 1 {
				t.Fatalf("Pending = %d, want 1", c.Pending())
			}
			c.Advance(tt.advance)
			if got := stop(); got != tt.wantStop {
				t.Errorf("stop() = %v, want %v", got, tt.wantStop)
			}
			if stop() {
				t.Error("second stop() = true")
			}
			c.Advance(time.Hour)
			if fired != tt.wantFired {
				t.Errorf("fired = %v, want %v", fired, tt.wantFired)
			}
			if c.Pending() != 0 {
				t.Errorf("Pending = %d, want 0", c.Pending())
			}
		})
	}
}

func TestClockCallbackUsesClock(t *testing.T) {
	c := NewClock(t0)
	var got []string
	// A callback may register timers; one due within the same Advance fires in it.
	c.AfterFunc(time.Second, func() {
		got = append(got, "first")
		c.AfterFunc(time.Second, func() { got = append(got, "chained@"+c.Now().Sub(t0).String()) })
		c.AfterFunc(time.Hour, func() { got = append(got, "late") })
	})
	var stopOther func() bool
	c.AfterFunc(1500*time.Millisecond, func() { got = append(got, "stopper"); stopOther() })
	stopOther = c.AfterFunc(1700*time.Millisecond, func() { got = append(got, "stopped") })

	c.Advance(3 * time.Second)
	want := []string{"first", "stopper", "chained@2s"}
	if !slices.Equal(got, want) {
		t.Errorf("fired %q, want %q", got, want)
	}
	if c.Pending() != 1 {
		t.Errorf("Pending = %d, want 1 (the late timer)", c.Pending())
	}
}

func TestClockAfterFuncNotPositive(t *testing.T) {
	for _, d := range []time.Duration{0, -time.Second} {
		c := NewClock(t0)
		done := make(chan struct{})
		stop := c.AfterFunc(d, func() { close(done) })
		<-done // runs on its own goroutine, with no Advance
		if stop() {
			t.Errorf("AfterFunc(%v): stop() after firing = true", d)
		}
		if !c.Now().Equal(t0) {
			t.Errorf("AfterFunc(%v) moved the clock", d)
		}
	}
}

func TestClockSleep(t *testing.T) {
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name    string
		ctx     context.Context
		d       time.Duration
		wantErr error
		wantNow time.Duration
	}{
		{"advances", context.Background(), 90 * time.Second, nil, 90 * time.Second},
		{"zero", context.Background(), 0, nil, 0},
		{"negative", context.Background(), -time.Second, nil, 0},
		{"context done", canceled, time.Minute, context.Canceled, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := NewClock(t0)
			if err := c.Sleep(tt.ctx, tt.d); !errors.Is(err, tt.wantErr) {
				t.Errorf("Sleep = %v, want %v", err, tt.wantErr)
			}
			if got := c.Now().Sub(t0); got != tt.wantNow {
				t.Errorf("clock moved %v, want %v", got, tt.wantNow)
			}
			if got := c.Sleeps(); !slices.Equal(got, []time.Duration{tt.d}) {
				t.Errorf("Sleeps = %v, want [%v]", got, tt.d)
			}
		})
	}
}

func TestClockSleepCutShortByTimer(t *testing.T) {
	c := NewClock(t0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fired := 0
	c.AfterFunc(10*time.Second, cancel) // a deadline on the fake clock
	c.AfterFunc(20*time.Second, func() { fired++ })

	err := c.Sleep(ctx, time.Minute)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Sleep = %v, want context.Canceled", err)
	}
	if got := c.Now().Sub(t0); got != 10*time.Second {
		t.Errorf("clock at %v, want 10s: a cut-short sleep stops at the deadline", got)
	}
	if fired != 0 {
		t.Error("a timer after the deadline fired")
	}
	if got := c.Sleeps(); !slices.Equal(got, []time.Duration{time.Minute}) {
		t.Errorf("Sleeps = %v", got)
	}
}

func TestClockSleepsIsACopy(t *testing.T) {
	c := NewClock(t0)
	c.Sleep(context.Background(), time.Second)
	c.Sleep(context.Background(), 2*time.Second)
	s := c.Sleeps()
	s[0] = time.Hour
	if got := c.Sleeps(); !slices.Equal(got, []time.Duration{time.Second, 2 * time.Second}) {
		t.Errorf("Sleeps = %v", got)
	}
}

// TestClockConcurrent is for the race detector: every method at once, and
// every timer accounted for exactly once.
func TestClockConcurrent(t *testing.T) {
	c := NewClock(t0)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		fired   int
		stopped int
	)
	for g := range 8 {
		wg.Go(func() {
			for i := range 100 {
				stop := c.AfterFunc(time.Duration(i%7+1)*time.Millisecond, func() {
					mu.Lock()
					fired++
					mu.Unlock()
				})
				if (g+i)%3 == 0 && stop() {
					mu.Lock()
					stopped++
					mu.Unlock()
				}
				c.Advance(time.Millisecond)
				c.Sleep(context.Background(), time.Millisecond)
				_ = c.Now()
			}
		})
	}
	wg.Wait()
	c.Advance(time.Hour)
	if fired+stopped != 800 {
		t.Errorf("fired %d + stopped %d = %d, want 800", fired, stopped, fired+stopped)
	}
	if len(c.Sleeps()) != 800 || c.Pending() != 0 {
		t.Errorf("Sleeps %d, Pending %d", len(c.Sleeps()), c.Pending())
	}
}
