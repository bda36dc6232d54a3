package ratelimit

import (
	"context"
	"fmt"
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/conf"
	"github.com/damper-ai/damper-go/internal/core"
	"github.com/damper-ai/damper-go/internal/core/coretest"
)

// refuseLater is an attempt gate that admits every attempt now and would
// refuse any attempt from a later time: an open breaker, as seen before
// a wait.
type refuseLater struct{}

var errRefusedLater = &core.Denial{Gate: &core.Gate{Outcome: "later_refused"}}

func (refuseLater) AdmitAttempt(core.Call, core.Attempt, time.Time) core.Admission {
	return core.Admission{}
}

func (refuseLater) RefusesAt(_ core.Call, now, at time.Time) *core.Denial {
	if at.After(now) {
		return errRefusedLater
	}
	return nil
}

// testLimiter is a limiter of policy p, filled in, on the wall clock (the
// bubble's, in a synctest), whose state is in memory.
func testLimiter(t testing.TB, p Policy) *Limiter {
	t.Helper()
	if err := conf.Fill(&p); err != nil {
		t.Fatal(err)
	}
	l := newLimiter(&p, coretest.RealClock{}, nil)
	l.env = coretest.Env(coretest.RealClock{})
	return l
}

// limiterCall is a call of model claude-sonnet-4-6, as the engine would
// show it to the limiter.
func limiterCall(ctx context.Context) *coretest.Call {
	return &coretest.Call{Ctx: ctx, M: "claude-sonnet-4-6", Input: 100, Max: 1024, Clock: coretest.RealClock{}}
}

// rateOf is the limiter's state of c's route.
func rateOf(c *coretest.Call) *callRate { return c.State.(*callRate) }

// No wait in line is started for an attempt that a later gate would refuse
// once the wait is over, and the refused attempt takes nothing.
func TestRateLimitWaitAsksLaterGatesFirst(t *testing.T) {
	l := testLimiter(t, Policy{MaxWait: 2 * time.Minute,
		Limits: map[string]fleet.RateLimits{"claude-sonnet-4": {RequestsPerMinute: 1}}})
	first := l.AdmitAttempt(limiterCall(context.Background()), core.Attempt{N: 1}, time.Now())
	if first.Refused != nil {
		t.Fatalf("first attempt refused: %+v", first.Refused)
	}
	first.Pass.Settle(time.Now(), core.Event{Outcome: fleet.AttemptOutcome{Success: true}})

	c := limiterCall(context.Background())
	c.Later = []core.AttemptGate{refuseLater{}}
	start := time.Now()
	adm := l.AdmitAttempt(c, core.Attempt{N: 1}, time.Now())
	refused, canceled, queued := adm.Refused, adm.Canceled, adm.Queued
	if refused != errRefusedLater || canceled || queued > time.Second || time.Since(start) > time.Second {
		t.Fatalf("refused %+v, canceled %v, queued %v after %v; want the later gate's refusal at once", refused, canceled, queued, time.Since(start))
	}
	if s := l.State(time.Now())[0]; s.Bucket != "requests" || s.Remaining > 0.01 {
		t.Fatalf("requests bucket %+v", s)
	}
	// The bucket holds nothing, and no debt: the next request is due in a
	// minute at most (a debt would have made it two).
	if due, _ := l.group("claude-sonnet-4-6").g.Admits(context.Background(), time.Now(), time.Now(), fleet.RateAmounts{1, 0, 0}, 0); due.Sub(time.Now()) > time.Minute {
		t.Fatalf("next request due in %v: the refused attempt kept its request", due.Sub(time.Now()))
	}
}

// BenchmarkRateLimitAdmission is the limiter's cost per attempt: the
// gate's admission, reading the answer's headers and settling by usage.
func BenchmarkRateLimitAdmission(b *testing.B) {
	// Limits far above what the benchmark spends, so that it never waits:
	// the limiter counts its own traffic, whatever the headers say remains.
	// Each call settles one token of each kind, so that even the largest
	// limits a policy accepts (1e9 a minute) refill faster than any
	// benchtime spends them.
	h := http.Header{}
	h.Set("anthropic-ratelimit-requests-limit", "1000000000")
	h.Set("anthropic-ratelimit-requests-remaining", "999999999")
	h.Set("anthropic-ratelimit-input-tokens-limit", "100000000000")
	h.Set("anthropic-ratelimit-input-tokens-remaining", "99999999000")
	h.Set("anthropic-ratelimit-output-tokens-limit", "100000000000")
	h.Set("anthropic-ratelimit-output-tokens-remaining", "99999999000")
	ev := core.Event{Outcome: fleet.AttemptOutcome{First: true, Success: true}, Header: h,
		Usage: core.Usage{InputTokens: 1, OutputTokens: 1, Known: true}}
	// The largest limits a policy accepts.
	configured := &Policy{Limits: map[string]fleet.RateLimits{"claude-sonnet-4": {
		RequestsPerMinute: 1e9, InputTokensPerMinute: 1e9, OutputTokensPerMinute: 1e9}}}
	for _, bc := range []struct {
		name   string
		policy *Policy
		tenant bool // each call for a tenant, taking its share
	}{
		{"learned", &Policy{}, false},
		{"configured", configured, false},
		{"configured/tenant_share", configured, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			l := testLimiter(b, *bc.policy)
			ctx := context.Background()
			var ten *core.Tenant
			if bc.tenant {
				ten = &core.Tenant{Name: "alpha", Weight: 1, Shares: true}
			}
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				c := limiterCall(ctx)
				c.T = ten
				for pb.Next() {
					c.State = nil // each call finds its group and cost
					adm := l.AdmitAttempt(c, core.Attempt{N: 1}, time.Now())
					if adm.Pass == nil {
						b.Fatalf("refused: %+v", adm.Refused.Err())
					}
					adm.Pass.Settle(time.Now(), ev)
				}
			})
		})
	}
}

// FuzzHeaderFloat: a rate-limit header's number reads as ParseFloat reads
// it, and never as NaN, an infinity, or from a value it does not parse.
func FuzzHeaderFloat(f *testing.F) {
	for _, s := range []string{"3999", " 42 ", "0", "1e3", "12.5", "-3", "NaN", "+Inf", "", "abc", "999999999999999", "9999999999999999", "007"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		h := http.Header{"X": {v}}
		got, ok := headerFloat(h, "X")
		want, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		valid := err == nil && !math.IsNaN(want) && !math.IsInf(want, 0)
		if ok != valid || ok && got != want {
			t.Fatalf("headerFloat(%q) = %v, %v; ParseFloat says %v, %v", v, got, ok, want, err)
		}
	})
}

// FuzzRateHeaders: the headers of any response give an observation with
// no negative, NaN or infinite count, and a bucket only with a positive
// limit.
func FuzzRateHeaders(f *testing.F) {
	f.Add("4000", "3999", "-5", "1e400")
	f.Add("", "0", "NaN", "12")
	f.Fuzz(func(t *testing.T, reqLimit, reqRem, inLimit, inRem string) {
		h := http.Header{}
		h.Set("anthropic-ratelimit-requests-limit", reqLimit)
		h.Set("anthropic-ratelimit-requests-remaining", reqRem)
		h.Set("anthropic-ratelimit-input-tokens-limit", inLimit)
		h.Set("anthropic-ratelimit-input-tokens-remaining", inRem)
		o, _ := rateHeaders(h)
		for k := range o.Has {
			if !o.Has[k] {
				continue
			}
			if !(o.Limit[k] > 0) || !(o.Remaining[k] >= 0) || math.IsInf(o.Limit[k], 0) || math.IsInf(o.Remaining[k], 0) {
				t.Fatalf("bucket %d: limit %v remaining %v", k, o.Limit[k], o.Remaining[k])
			}
		}
	})
}

// The room left before a deadline follows the group's attempts: their
// smoothed mean plus four mean deviations, and never less than core.MinAttempt.
func TestAttemptTimesRoom(t *testing.T) {
	var a attemptTimes
	if got := a.room(); got != core.MinAttempt {
		t.Fatalf("no attempt yet: room %v, want %v", got, core.MinAttempt)
	}
	a.add(2 * time.Second)
	if got := a.room(); got != 6*time.Second {
		t.Fatalf("one 2 s attempt: room %v, want 2s + 4 × 1s", got)
	}
	for range 200 {
		a.add(2 * time.Second)
	}
	if got := a.room(); got < 2*time.Second || got > 2*time.Second+10*time.Millisecond {
		t.Fatalf("steady 2 s attempts: room %v, want about 2s", got)
	}
	a.add(10 * time.Second) // a slow one widens it at once
	if got := a.room(); got < 9*time.Second {
		t.Fatalf("after a 10 s attempt: room %v, want above 9s", got)
	}
	var fast attemptTimes
	for range 50 {
		fast.add(10 * time.Millisecond)
	}
	if got := fast.room(); got != core.MinAttempt {
		t.Fatalf("fast attempts: room %v, want the floor %v", got, core.MinAttempt)
	}
}

// An attempt waiting in line with its reservation taken is held by a pause
// that begins during its wait, until the pause ends.
func TestRateLimitWaiterHeldByPause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := testLimiter(t, Policy{MaxWait: time.Minute,
			Limits: map[string]fleet.RateLimits{"claude-sonnet-4": {RequestsPerMinute: 60}}})
		ctx := context.Background()
		for range 60 {
			adm := l.AdmitAttempt(limiterCall(ctx), core.Attempt{N: 1}, time.Now())
			adm.Pass.Settle(time.Now(), core.Event{Outcome: fleet.AttemptOutcome{Success: true}})
		}
		start := time.Now()
		done := make(chan core.Admission, 1)
		go func() { done <- l.AdmitAttempt(limiterCall(ctx), core.Attempt{N: 1}, time.Now()) }()
		time.Sleep(500 * time.Millisecond) // it is due at +1 s
		l.group("claude-sonnet-4-6").g.Pause(context.Background(), time.Now(), [3]bool{true, false, false}, start.Add(20*time.Second))
		adm := <-done
		if adm.Pass == nil || time.Since(start) != 20*time.Second || adm.Queued != 20*time.Second {
			t.Fatalf("admitted %v after %v, queued %v; want admitted when the pause ends, at 20s", adm.Pass != nil, time.Since(start), adm.Queued)
		}
	})
}

// modelCall is a call of model, as the engine would show it to the
// limiter.
func modelCall(ctx context.Context, model string) *coretest.Call {
	c := limiterCall(ctx)
	c.M = model
	return c
}

// The limiter holds a bounded number of groups, however many models its
// callers name, and drops the groups no attempt has used for groupIdle on
// the Damper's clock, but not one an attempt still holds: 5,000 distinct
// models leave 256 groups and the shared one, and once idle, none but the
// group of a call still open.
func TestRateLimitGroupsBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := testLimiter(t, Policy{
			Limits: map[string]fleet.RateLimits{"claude-opus-4": {RequestsPerMinute: 1000}}})
		ctx := context.Background()
		admit := func(model string) *limitPass {
			t.Helper()
			adm := l.AdmitAttempt(modelCall(ctx, model), core.Attempt{N: 1}, time.Now())
			if adm.Pass == nil {
				t.Fatalf("%s refused: %+v", model, adm.Refused)
			}
			return adm.Pass.(*limitPass)
		}
		answered := core.Event{Outcome: fleet.AttemptOutcome{Success: true}}
		groups := func() []string {
			l.mu.Lock()
			defer l.mu.Unlock()
			return slices.Sorted(maps.Keys(l.groups))
		}
		held := admit("held-model") // its answer has not come
		for i := range 5000 {
			admit(fmt.Sprintf("model-%d", i)).Settle(time.Now(), answered)
		}
		if got := groups(); len(got) != maxLimitGroups+1 || !slices.Contains(got, otherGroup) || !slices.Contains(got, "held-model") {
			t.Fatalf("%d groups after 5000 models, want %d and %q", len(got), maxLimitGroups+1, otherGroup)
		}
		if n := l.byModelCount.Load(); n > maxResolved {
			t.Fatalf("%d models remembered, want at most %d", n, maxResolved)
		}
		// A configured group has its own group beyond the bound.
		admit("claude-opus-4-1").Settle(time.Now(), answered)
		if got := groups(); len(got) != maxLimitGroups+2 || !slices.Contains(got, "claude-opus-4") {
			t.Fatalf("configured group: %d groups, want %d with claude-opus-4", len(got), maxLimitGroups+2)
		}

		// A minute short of groupIdle, nothing is dropped.
		time.Sleep(groupIdle - time.Minute)
		admit("model-0").Settle(time.Now(), answered)
		if n := len(groups()); n != maxLimitGroups+2 {
			t.Fatalf("%d groups before groupIdle, want %d", n, maxLimitGroups+2)
		}
		time.Sleep(time.Minute)
		admit("late-model").Settle(time.Now(), answered)
		if got := groups(); !slices.Equal(got, []string{"held-model", "late-model", "model-0"}) {
			t.Fatalf("groups after groupIdle: %v, want the one held, the one just used and the new one", got)
		}
		if n := l.byModelCount.Load(); n != 3 {
			t.Fatalf("%d models remembered, want the three of the groups left", n)
		}
		if n := len(l.State(time.Now())); n != 3*3 {
			t.Fatalf("RateLimits: %d buckets, want 3 groups' worth", n)
		}
		// Once answered, the held group goes too; one used again comes
		// back as a new group.
		held.Settle(time.Now(), answered)
		time.Sleep(groupIdle)
		admit("held-model").Settle(time.Now(), answered)
		if got := groups(); !slices.Equal(got, []string{"held-model"}) {
			t.Fatalf("groups: %v, want held-model alone, new", got)
		}
	})
}

// A call whose group was dropped while it was between attempts finds the
// group anew at its next attempt, and takes from that one.
func TestRateLimitCallOutlivesItsGroup(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := testLimiter(t, Policy{
			Limits: map[string]fleet.RateLimits{"claude-sonnet-4": {RequestsPerMinute: 10}}})
		c := limiterCall(context.Background())
		answered := core.Event{Outcome: fleet.AttemptOutcome{Success: true}}
		l.AdmitAttempt(c, core.Attempt{N: 1}, time.Now()).Pass.Settle(time.Now(), answered)
		old := rateOf(c).group
		time.Sleep(groupIdle) // its backoff, say
		l.maybeSweep(time.Now())
		if old.users.Load() >= 0 {
			t.Fatal("the idle group was not dropped")
		}
		adm := l.AdmitAttempt(c, core.Attempt{N: 2}, time.Now())
		g := rateOf(c).group
		if adm.Pass == nil || g == old || g.users.Load() != 1 {
			t.Fatalf("second attempt: pass %v, same group %v, users %d", adm.Pass != nil, g == old, g.users.Load())
		}
		if s := l.State(time.Now()); len(s) != 3 || s[0].Group != "claude-sonnet-4" || s[0].Remaining != 9 {
			t.Fatalf("buckets %+v, want the new group's, its first request taken", s)
		}
		adm.Pass.Settle(time.Now(), answered)
		if g.users.Load() != 0 {
			t.Fatalf("users %d after settling", g.users.Load())
		}
	})
}
