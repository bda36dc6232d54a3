package damper_test

import (
	"sync"
	"testing"
	"time"
)

// lagMeter measures how late this process runs on a real clock: a
// goroutine asks to wake every tick and keeps each wake-up that came late.
// A loaded machine delays every wake-up, Damper's among them, so a test on
// real time judges a late return against the lag the machine showed while
// it happened, not against a fixed allowance.
type lagMeter struct {
	tick time.Duration
	stop chan struct{}
	done chan struct{}

	mu   sync.Mutex
	late []lateWake // in order of due
}

// lateWake is one wake-up that came later than due.
type lateWake struct{ due, woke time.Time }

func newLagMeter(tick time.Duration) *lagMeter {
	m := &lagMeter{tick: tick, stop: make(chan struct{}), done: make(chan struct{})}
	go m.run()
	return m
}

func (m *lagMeter) run() {
	defer close(m.done)
	for {
		select {
		case <-m.stop:
			return
		default:
		}
		due := time.Now().Add(m.tick)
		time.Sleep(m.tick)
		// A wake-up more than a tick late is lag; less is the timer's own
		// grain.
		if woke := time.Now(); woke.Sub(due) > m.tick {
			m.mu.Lock()
			m.late = append(m.late, lateWake{due, woke})
			m.mu.Unlock()
		}
	}
}

// Stop ends the measure; it returns once the last wake-up is recorded.
func (m *lagMeter) Stop() {
	close(m.stop)
	<-m.done
}

// Max is the longest lag of a wake-up that was due or late within
// [from, to].
func (m *lagMeter) Max(from, to time.Time) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	var most time.Duration
	for _, w := range m.late {
		if w.woke.Before(from) || w.due.After(to) {
			continue
		}
		most = max(most, w.woke.Sub(w.due))
	}
	return most
}

// TestLoopbackAllowance: a call that overruns its limit by more than the
// quiet machine's slack fails the loopback soak unless the process itself
// ran late while the call was over its limit; lag before or after that
// time excuses nothing.
func TestLoopbackAllowance(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	plans := []reqPlan{{deadline: 400 * time.Millisecond}}
	late := func(lag *lagMeter, elapsed time.Duration) []string {
		ck := &checker{}
		results := []soakResult{{start: t0, elapsed: elapsed}}
		checkDeadlines(ck, plans, results, loopbackAllowance(plans, results, lag))
		return ck.errs
	}
	cases := []struct {
		name    string
		late    []lateWake
		elapsed time.Duration
		fails   bool
	}{
		{"quiet, within the slack", nil, 400*time.Millisecond + loopbackSlack, false},
		{"quiet, past the slack", nil, 400*time.Millisecond + loopbackSlack + time.Millisecond, true},
		{"quiet, a hang", nil, 10 * time.Second, true},
		{"busy while over", []lateWake{{at(500), at(1000)}}, 400*time.Millisecond + loopbackSlack + loopbackLagFactor*500*time.Millisecond, false},
		{"busy while over, later still", []lateWake{{at(500), at(1000)}}, 400*time.Millisecond + loopbackSlack + loopbackLagFactor*500*time.Millisecond + time.Millisecond, true},
		{"busy before the limit only", []lateWake{{at(0), at(300)}}, 2 * time.Second, true},
		{"busy after the return only", []lateWake{{at(3000), at(3900)}}, 2 * time.Second, true},
	}
	for _, c := range cases {
		lag := &lagMeter{late: c.late}
		if errs := late(lag, c.elapsed); (len(errs) > 0) != c.fails {
			t.Errorf("%s: returned after %v: violations %q, want failing %v", c.name, c.elapsed, errs, c.fails)
		}
	}
}
