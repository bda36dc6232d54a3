package damper_test

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// spreadRig is a Damper on a virtual clock with two first-party backends,
// two fake organisations: the client's own, "primary", and "second".
type spreadRig struct {
	clk             *dampertest.Clock
	primary, second *dampertest.Server
	down            [2]atomic.Bool // the primary's, the second's: answer 529
	d               *damper.Damper
	client          anthropic.Client
}

// newSpreadRig makes a spreadRig whose organisations enforce limits[0]
// (the primary) and limits[1] (the second), sending their
// anthropic-ratelimit-* headers, with the second backend's weight.
func newSpreadRig(t *testing.T, p damper.Policy, limits [2]dampertest.RateLimits, weight int, settings ...damper.Setting) *spreadRig {
	t.Helper()
	r := &spreadRig{clk: dampertest.NewClock(time.Now().Truncate(time.Minute).Add(time.Minute))}
	step := func(i int) dampertest.ServerOption {
		return dampertest.WithStepFunc(func(dampertest.Request) dampertest.Step {
			if r.down[i].Load() {
				return dampertest.Status(529)
			}
			return dampertest.OK()
		})
	}
	r.primary = dampertest.NewServer(dampertest.WithClock(r.clk), dampertest.WithRateLimits(limits[0]), step(0))
	r.second = dampertest.NewServer(dampertest.WithClock(r.clk), dampertest.WithRateLimits(limits[1]), step(1), dampertest.InMemory())
	t.Cleanup(r.primary.Close)
	t.Cleanup(r.second.Close)
	b := damper.Backend{Name: "second", Provider: damper.ProviderAnthropic, Weight: weight, Options: []option.RequestOption{
		option.WithBaseURL(dampertest.MemoryURL), option.WithAPIKey("second-key"),
		option.WithHTTPClient(&http.Client{Transport: dampertest.Transport(r.second.Handler())}),
	}}
	d, err := damper.New(p, append([]damper.Setting{damper.WithClock(r.clk), damper.WithRand(half), damper.WithBackends(b)}, settings...)...)
	if err != nil {
		t.Fatal(err)
	}
	r.d = d
	r.client = anthropic.NewClient(append([]option.RequestOption{d.Option()}, r.primary.Options()...)...)
	return r
}

// load is what a run of calls did.
type load struct {
	first    map[string]int // calls by the backend they started on
	answered map[string]int // calls by the backend that answered
	errs     int
	probes   int           // calls whose first attempt was a breaker's probe
	waited   time.Duration // in the rate limiters' lines
}

// run makes n calls, one every gap on the virtual clock.
func (r *spreadRig) run(t *testing.T, n int, gap time.Duration) load {
	t.Helper()
	l := load{first: map[string]int{}, answered: map[string]int{}}
	for i := range n {
		var rep damper.Report
		_, err := r.client.Messages.New(context.Background(), spreadParams, damper.ReportInto(&rep))
		if err != nil {
			if l.errs == 0 {
				t.Logf("first error, of call %d: %v", i+1, err)
			}
			l.errs++
		} else {
			l.answered[rep.Backend]++
		}
		if len(rep.AttemptLog) > 0 {
			l.first[rep.AttemptLog[0].Backend]++
			if rep.AttemptLog[0].Probe {
				l.probes++
			}
		}
		l.waited += rep.RateLimitWait

		r.clk.Advance(gap)
	}
	return l
}

// spreadParams is a call of about 1,000 input tokens.
var spreadParams = anthropic.MessageNewParams{
	Model:     "claude-sonnet-4-5",
	MaxTokens: 64,
	Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(strings.Repeat("Explain retry storms. ", 180)))},
}

func spreadPolicy() damper.Policy {
	return damper.Policy{
		RateLimit: &damper.RateLimitPolicy{},
		Breaker:   &damper.BreakerPolicy{MinAttempts: 4, OpenFor: 10 * time.Second},
		Fallback:  &damper.FallbackPolicy{Routing: "spread"},
	}
}

// within reports whether got/want is within 10 %.
func within(got, want float64) bool { return got >= want*0.9 && got <= want*1.1 }

// Two organisations whose headers teach request limits of 3:1 share a
// steady load of 80 % of their sum 3:1, with no 429 and no wait; when one
// goes down, its breaker opens and the other takes every call, and once
// it is back the calls spread 3:1 again.
func TestSpreadByLearnedHeadroom(t *testing.T) {
	r := newSpreadRig(t, spreadPolicy(), [2]dampertest.RateLimits{{InputTokensPerMinute: 300_000}, {InputTokensPerMinute: 100_000}}, 0)
	gap := time.Minute / 320 // 320 calls a minute, 80 % of what the limits take
	steady := r.run(t, 640, gap)
	t.Logf("steady: first %v, answered %v, errors %d, waited %v", steady.first, steady.answered, steady.errs, steady.waited)
	if steady.errs != 0 || steady.waited != 0 {
		t.Fatalf("steady: %d errors, %v waited in line; want none", steady.errs, steady.waited)
	}
	if ratio := float64(steady.answered["primary"]) / float64(steady.answered["second"]); !within(ratio, 3) {
		t.Fatalf("steady: answered %v, a ratio of %.3f; want 3 ± 10 %%", steady.answered, ratio)
	}
	noLimited := func(phase string) {
		t.Helper()
		for name, s := range map[string]*dampertest.Server{"primary": r.primary, "second": r.second} {
			if st := s.RateLimitStats(); st.Limited != 0 {
				t.Fatalf("%s: %s sent %d 429s; want none", phase, name, st.Limited)
			}
		}
	}
	noLimited("steady")

	// The second organisation goes down: its 529s open its breaker, and
	// every call is answered by the primary, at a load it carries alone.
	r.down[1].Store(true)
	before := r.second.Count("")
	out := r.run(t, 200, time.Minute/200)
	t.Logf("second down: first %v, answered %v, errors %d; the second got %d attempts", out.first, out.answered, out.errs, r.second.Count("")-before)
	if out.errs != 0 || out.answered["primary"] != 200 {
		t.Fatalf("second down: answered %v, %d errors; want the primary to answer all 200", out.answered, out.errs)
	}
	// Five calls start there and use their three attempts, two more their
	// retry budget there, then its breaker opens: the calls start on the
	// primary, but for the breaker's probe once each open period (10 s,
	// then 20 s).
	if n := r.second.Count("") - before; n != 5*3+2+1+2 || out.first["second"] != 5+2+1+2 || out.probes != 2 {
		t.Fatalf("second down: it got %d attempts, %d calls started there, %d of them probes; want 20, 10, 2", n, out.first["second"], out.probes)
	}

	// It comes back: once its open period is over, a probe finds it, and
	// the calls spread 3:1 again.
	r.down[1].Store(false)
	r.clk.Advance(time.Minute)
	back := r.run(t, 640, gap)
	t.Logf("back: first %v, answered %v, errors %d, waited %v", back.first, back.answered, back.errs, back.waited)
	if back.errs != 0 || back.waited != 0 {
		t.Fatalf("back: %d errors, %v waited in line; want none", back.errs, back.waited)
	}
	if ratio := float64(back.answered["primary"]) / float64(back.answered["second"]); !within(ratio, 3) {
		t.Fatalf("back: answered %v, a ratio of %.3f; want 3 ± 10 %%", back.answered, ratio)
	}
	noLimited("back")
}

// With nothing learned (no rate limiter), weights of 3:1 share the calls
// 3:1 exactly, in a smooth order.
func TestSpreadByWeights(t *testing.T) {
	p := spreadPolicy()
	p.RateLimit = nil
	p.Fallback.PrimaryWeight = 3
	r := newSpreadRig(t, p, [2]dampertest.RateLimits{}, 1)
	var order []string
	for range 8 {
		var rep damper.Report
		if _, err := r.client.Messages.New(context.Background(), params("claude-sonnet-4-5"), damper.ReportInto(&rep)); err != nil {
			t.Fatal(err)
		}
		if len(rep.Fallbacks) != 0 || backends(rep) != rep.Backend {
			t.Fatalf("attempts on %s, fallbacks %+v: want one attempt, no move", backends(rep), rep.Fallbacks)
		}
		order = append(order, rep.Backend)
	}
	want := "primary,primary,second,primary,primary,primary,second,primary"
	if got := strings.Join(order, ","); got != want {
		t.Fatalf("backends %s, want %s", got, want)
	}
}
