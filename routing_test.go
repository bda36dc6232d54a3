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
	"go.opentelemetry.io/otel/attribute"

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

// Failover routing, the default, starts every call on the primary,
// whatever the weights.
func TestRoutingFailoverIgnoresWeights(t *testing.T) {
	for _, routing := range []string{"", "failover"} {
		p := spreadPolicy()
		p.RateLimit = nil
		p.Fallback.Routing = routing
		r := newSpreadRig(t, p, [2]dampertest.RateLimits{}, 1000)
		l := r.run(t, 10, time.Second)
		if l.errs != 0 || l.first["primary"] != 10 {
			t.Fatalf("routing %q: calls started on %v, %d errors; want all 10 on the primary", routing, l.first, l.errs)
		}
		if got := r.d.Policy().Fallback.Routing; got != "failover" {
			t.Fatalf("routing %q: the Damper's Policy says %q; want failover", routing, got)
		}
	}
}

// A backend whose concurrency limit is full is passed over: the second
// call starts on the second backend while the first, a stream on the
// primary, holds the primary's one slot, whatever the weights say.
func TestSpreadSkipsFullConcurrency(t *testing.T) {
	p := spreadPolicy()
	p.RateLimit = nil
	p.Concurrency = &damper.ConcurrencyPolicy{Max: 1, MaxWait: damper.None}
	p.Fallback.PrimaryWeight = 1000
	r := newSpreadRig(t, p, [2]dampertest.RateLimits{}, 1)
	var held damper.Report
	stream := r.client.Messages.NewStreaming(context.Background(), spreadParams, damper.ReportInto(&held))
	if !stream.Next() {
		t.Fatalf("stream: %v", stream.Err())
	}
	var rep damper.Report
	if _, err := r.client.Messages.New(context.Background(), spreadParams, damper.ReportInto(&rep)); err != nil {
		t.Fatal(err)
	}
	if held.Backend != "primary" || backends(rep) != "second" || len(rep.Fallbacks) != 0 {
		t.Fatalf("stream on %q; then attempts on %s, fallbacks %+v: want the stream on the primary, then the second alone, no move", held.Backend, backends(rep), rep.Fallbacks)
	}
	for stream.Next() {
	}
	if err := stream.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.client.Messages.New(context.Background(), spreadParams, damper.ReportInto(&rep)); err != nil || backends(rep) != "primary" {
		t.Fatalf("after the stream: %v, attempts on %s; want the primary again", err, backends(rep))
	}
}

// Bad routing values and weights are refused, each naming its field or
// key and the value.
func TestRoutingConfigErrors(t *testing.T) {
	second := func(weight int) damper.Setting {
		return damper.WithBackends(damper.Backend{Name: "second", Provider: damper.ProviderAnthropic, Weight: weight})
	}
	for _, tc := range []struct {
		p      damper.FallbackPolicy
		weight int
		want   string
	}{
		{damper.FallbackPolicy{Routing: "round-robin"}, 1, `damper: Policy.Fallback.Routing = "round-robin": must be "failover" or "spread"`},
		{damper.FallbackPolicy{Routing: "Spread"}, 1, `Policy.Fallback.Routing = "Spread": must be "failover" or "spread"`},
		{damper.FallbackPolicy{Routing: "spread", PrimaryWeight: 1001}, 1, `Policy.Fallback.PrimaryWeight = 1001: must be at most 1000`},
		{damper.FallbackPolicy{Routing: "spread", PrimaryWeight: -1}, 1, `Policy.Fallback.PrimaryWeight = -1`},
		{damper.FallbackPolicy{Routing: "spread"}, 1001, `WithBackends: backend 1 ("second"): Weight 1001: must be 1 to 1000 (0 means 1)`},
		{damper.FallbackPolicy{Routing: "spread"}, -2, `WithBackends: backend 1 ("second"): Weight -2: must be 1 to 1000 (0 means 1)`},
	} {
		_, err := damper.New(damper.Policy{Fallback: &tc.p}, second(tc.weight))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v, weight %d: err %v; want it to say %s", tc.p, tc.weight, err, tc.want)
		}
	}
	for file, want := range map[string]string{
		"fallback: {routing: roundrobin}":  `fallback.routing`,
		"fallback: {primary_weight: 1001}": `fallback.primary_weight`,
		"fallback: {primary_weight: 0}":    `fallback.primary_weight`,
	} {
		_, err := damper.ParsePolicyYAML([]byte(file))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err %v; want it to name %s", file, err, want)
		}
	}
	p, err := damper.ParsePolicyYAML([]byte("fallback: {routing: spread, primary_weight: 3}"))
	if err != nil || p.Fallback.Routing != "spread" || p.Fallback.PrimaryWeight != 3 {
		t.Fatalf("routing spread, primary_weight 3: %+v, %v", p.Fallback, err)
	}
}

// A spread call says on its damper.request span that it was spread and
// why it started where it did; damper.routing.choices counts the calls by
// the backend they started on. Failover calls carry neither.
func TestTelemetrySpread(t *testing.T) {
	second := dampertest.NewServer(dampertest.InMemory())
	t.Cleanup(second.Close)
	backend := damper.Backend{Name: "second", Provider: damper.ProviderAnthropic, Options: []option.RequestOption{
		option.WithBaseURL(dampertest.MemoryURL), option.WithAPIKey("second-key"),
		option.WithHTTPClient(&http.Client{Transport: dampertest.Transport(second.Handler())}),
	}}
	r := newTelRig(t, damper.Policy{Fallback: &damper.FallbackPolicy{Routing: "spread"}}, []damper.Setting{damper.WithBackends(backend)})
	var answered []string
	for range 3 {
		rep, err := r.call(t, "spread", "claude-sonnet-4-5", dampertest.OK())
		if err != nil {
			t.Fatal(err)
		}
		answered = append(answered, rep.Backend)
	}
	if got := strings.Join(answered, ","); got != "primary,second,primary" {
		t.Fatalf("answered by %s; want primary,second,primary", got)
	}
	m := r.metricValues(t)
	for key, want := range map[string]float64{
		"damper.routing.choices{damper.backend=primary,damper.routing.basis=weights}": 2,
		"damper.routing.choices{damper.backend=second,damper.routing.basis=weights}":  1,
		"damper.attempts{damper.backend=second,damper.provider=anthropic}":            1,
	} {
		if m[key] != want {
			t.Errorf("%s = %v, want %v; have %v", key, m[key], want, strings.Join(keysWith(m, "routing"), " "))
		}
	}
	for _, s := range r.spans.GetSpans() {
		if s.Name != "damper.request" {
			continue
		}
		a := attribute.NewSet(s.Attributes...)
		routing, _ := a.Value("damper.routing")
		basis, _ := a.Value("damper.routing.basis")
		if routing.AsString() != "spread" || basis.AsString() != "weights" {
			t.Errorf("request span: damper.routing %q, damper.routing.basis %q; want spread, weights", routing.AsString(), basis.AsString())
		}
	}

	f := newTelRig(t, damper.Policy{}, []damper.Setting{damper.WithBackends(backend)})
	if _, err := f.call(t, "failover", "claude-sonnet-4-5", dampertest.OK()); err != nil {
		t.Fatal(err)
	}
	if keys := keysWith(f.metricValues(t), "routing"); len(keys) != 0 {
		t.Errorf("failover: %v; want no routing metric", keys)
	}
	for _, s := range f.spans.GetSpans() {
		if a := attribute.NewSet(s.Attributes...); a.HasValue("damper.routing") {
			t.Errorf("failover: span %s has damper.routing", s.Name)
		}
	}
}
