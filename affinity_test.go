package damper_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// cachedParams is a call of about 1,000 input tokens whose system prompt,
// system, is a cached prefix (a breakpoint on its block).
func cachedParams(system string) anthropic.MessageNewParams {
	p := spreadParams
	p.System = []anthropic.TextBlockParam{{Text: system, CacheControl: anthropic.NewCacheControlEphemeralParam()}}
	return p
}

// affinityRig is a spreadRig whose meter's readings can be read.
type affinityRig struct {
	*spreadRig
	reader *sdkmetric.ManualReader
}

func newAffinityRig(t *testing.T, p damper.Policy, limits [2]dampertest.RateLimits) *affinityRig {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	return &affinityRig{newSpreadRig(t, p, limits, 0, damper.WithMeterProvider(mp)), reader}
}

// affinity returns damper.routing.affinity's values by result.
func (r *affinityRig) affinity(t *testing.T) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "damper.routing.affinity" {
				continue
			}
			for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
				v, _ := p.Attributes.Value("damper.routing.result")
				out[v.AsString()] = p.Value
			}
		}
	}
	return out
}

// affinityLoad is what a run of cached calls did.
type affinityLoad struct {
	answered map[string]int // calls by the backend that answered
	results  map[string]int // calls by Report.CacheAffinity
	errs     int
	moves    []int // the calls, from 1, that moved
}

// run makes n calls of params, one every gap on the virtual clock, until
// one moves when stop.
func (r *affinityRig) run(t *testing.T, n int, gap time.Duration, params func(i int) anthropic.MessageNewParams, stop bool) affinityLoad {
	t.Helper()
	l := affinityLoad{answered: map[string]int{}, results: map[string]int{}}
	for i := range n {
		var rep damper.Report
		if _, err := r.client.Messages.New(context.Background(), params(i), damper.ReportInto(&rep)); err != nil {
			l.errs++
		} else {
			l.answered[rep.Backend]++
		}
		l.results[rep.CacheAffinity]++
		r.clk.Advance(gap)
		if rep.CacheAffinity == "moved" {
			l.moves = append(l.moves, i+1)
			if stop {
				break
			}
		}
	}
	return l
}

// counts returns how many requests each fake organisation has received.
func (r *affinityRig) counts() [2]int { return [2]int{r.primary.Count(""), r.second.Count("")} }

// noLimited fails t when either organisation sent a 429.
func (r *affinityRig) noLimited(t *testing.T, phase string) {
	t.Helper()
	if a, b := r.primary.RateLimitStats().Limited, r.second.RateLimitStats().Limited; a+b != 0 {
		t.Fatalf("%s: %d and %d 429s; want none", phase, a, b)
	}
}

// 100 calls sharing one cached prefix, spread over two organisations
// whose limits (3:1) the Damper has learned, all go to one while it has
// headroom. When its headroom falls below a tenth, the prefix moves, once,
// and stays on the other at a load that one carries.
func TestAffinityKeepsAPrefix(t *testing.T) {
	r := newAffinityRig(t, spreadPolicy(), [2]dampertest.RateLimits{{InputTokensPerMinute: 300_000}, {InputTokensPerMinute: 100_000}})
	same := func(int) anthropic.MessageNewParams { return cachedParams("You are the retry storm expert.") }
	// Learn both organisations' limits with calls that have no cached
	// prefix.
	plain := r.run(t, 4, time.Second, func(int) anthropic.MessageNewParams { return spreadParams }, false)
	if plain.answered["primary"] != 3 || plain.answered["second"] != 1 || plain.results[""] != 4 {
		t.Fatalf("plain calls: answered %v, affinity %v; want 3 and 1, no affinity", plain.answered, plain.results)
	}

	// 50 calls a minute: either organisation carries them alone with
	// most of its limits left. The first goes where spread sends it, the
	// others follow.
	before := r.counts()
	kept := r.run(t, 100, time.Minute/50, same, false)
	got := r.counts()
	t.Logf("one prefix: answered %v, affinity %v; requests %v", kept.answered, kept.results, [2]int{got[0] - before[0], got[1] - before[1]})
	home, other, at := "primary", "second", 0
	if kept.answered["second"] > 0 {
		home, other, at = "second", "primary", 1
	}
	if kept.errs != 0 || kept.answered[home] != 100 || kept.results["new"] != 1 || kept.results["hit"] != 99 {
		t.Fatalf("one prefix: answered %v, %d errors, affinity %v; want one organisation to answer all 100, 1 new then 99 hits", kept.answered, kept.errs, kept.results)
	}
	if got[at]-before[at] != 100 || got[1-at] != before[1-at] {
		t.Fatalf("one prefix: the organisations got %d and %d requests; want 100 on the %s, none on the %s", got[0]-before[0], got[1]-before[1], home, other)
	}
	if m := r.affinity(t); m["hit"] != 99 || m["new"] != 1 || m["moved"] != 0 {
		t.Fatalf("damper.routing.affinity %v; want 99 hits, 1 new, no move", m)
	}
	r.noLimited(t, "one prefix")

	// 600 calls a minute, twice the primary's limit and six times the
	// second's: the headroom of the prefix's organisation falls below a
	// tenth, and the prefix moves to the other.
	before = r.counts()
	burst := r.run(t, 1000, time.Minute/600, same, true)
	got = r.counts()
	t.Logf("burst: answered %v, affinity %v, moved at call %v; requests %v", burst.answered, burst.results, burst.moves, [2]int{got[0] - before[0], got[1] - before[1]})
	if len(burst.moves) != 1 || burst.errs != 0 || burst.answered[other] != 1 || burst.results["hit"] != burst.moves[0]-1 {
		t.Fatalf("burst: answered %v, %d errors, affinity %v; want hits on the %s until one call moves to the %s", burst.answered, burst.errs, burst.results, home, other)
	}
	if n := burst.moves[0]; home != wantHome || n != wantBurstMove || got[at]-before[at] != n-1 || got[1-at]-before[1-at] != 1 {
		t.Fatalf("burst: the prefix on the %s moved at call %d, the organisations got %d and %d requests; want the %s, the move at call %d, one request on the other",
			home, n, got[0]-before[0], got[1]-before[1], wantHome, wantBurstMove)
	}
	r.noLimited(t, "burst")

	// 50 calls a minute: the prefix stays on its new organisation.
	before = r.counts()
	stay := r.run(t, 100, time.Minute/50, same, false)
	got = r.counts()
	t.Logf("after the move: answered %v, affinity %v; requests %v", stay.answered, stay.results, [2]int{got[0] - before[0], got[1] - before[1]})
	if stay.errs != 0 || stay.answered[other] != 100 || stay.results["hit"] != 100 || got[at] != before[at] || got[1-at]-before[1-at] != 100 {
		t.Fatalf("after the move: answered %v, affinity %v, %d errors; the organisations got %d and %d requests; want 100 hits on the %s", stay.answered, stay.results, stay.errs, got[0]-before[0], got[1]-before[1], other)
	}
	if m := r.affinity(t); m["moved"] != 1 {
		t.Fatalf("damper.routing.affinity %v; want one move", m)
	}
	r.noLimited(t, "after the move")
}

// In TestAffinityKeepsAPrefix the prefix's first call goes to the second
// organisation (the plain calls left both all their headroom, and the
// round robin's turn was the second's), and
// the 104th call of the burst moves: each call of about 1,000 input
// tokens takes about 830 more than 0.1 s refills of its 100,000 a
// minute, and after 103 of them less than a tenth is left.
const (
	wantHome      = "second"
	wantBurstMove = 104
)

// When the backend of a prefix fails, its calls move on as in failover,
// and the backend that answers them serves the prefix from then on, even
// once the first is back; a call that fails everywhere records nothing.
func TestAffinityMovesOnFailure(t *testing.T) {
	p := spreadPolicy()
	p.RateLimit = nil
	r := newAffinityRig(t, p, [2]dampertest.RateLimits{})
	same := func(int) anthropic.MessageNewParams { return cachedParams("You are the retry storm expert.") }
	first := r.run(t, 10, time.Second, same, false)
	if first.answered["primary"] != 10 || first.results["new"] != 1 || first.results["hit"] != 9 {
		t.Fatalf("before: answered %v, affinity %v; want 10 on the primary, 1 new, 9 hits", first.answered, first.results)
	}
	r.down[0].Store(true)
	before := r.counts()
	out := r.run(t, 10, time.Second, same, false)
	got := r.counts()
	t.Logf("primary down: answered %v, affinity %v; requests %v", out.answered, out.results, [2]int{got[0] - before[0], got[1] - before[1]})
	// The first call tries the primary (its three attempts), moves on
	// and is answered by the second, which serves the prefix from then on.
	if out.errs != 0 || out.answered["second"] != 10 || out.results["hit"] != 10 || got[0]-before[0] != 3 || got[1]-before[1] != 10 {
		t.Fatalf("primary down: answered %v, affinity %v, %d errors; the organisations got %d and %d requests; want 3 on the primary, then 10 answered by the second, all hits",
			out.answered, out.results, out.errs, got[0]-before[0], got[1]-before[1])
	}
	r.down[0].Store(false)
	r.clk.Advance(time.Minute)
	back := r.run(t, 10, time.Second, same, false)
	if back.answered["second"] != 10 || back.results["hit"] != 10 {
		t.Fatalf("primary back: answered %v, affinity %v; want the prefix to stay on the second", back.answered, back.results)
	}
	// Both down: a call fails on the second, then on the primary, and
	// records nothing: the prefix stays on the second.
	r.down[0].Store(true)
	r.down[1].Store(true)
	before = r.counts()
	failed := r.run(t, 1, time.Second, same, false)
	got = r.counts()
	if failed.errs != 1 || failed.results["hit"] != 1 || got[0]-before[0] != 3 || got[1]-before[1] != 3 {
		t.Fatalf("both down: %d errors, affinity %v; the organisations got %d and %d requests; want a hit on the second that fails there and on the primary, 3 attempts each",
			failed.errs, failed.results, got[0]-before[0], got[1]-before[1])
	}
	r.down[0].Store(false)
	r.down[1].Store(false)
	r.clk.Advance(time.Minute)
	again := r.run(t, 5, time.Second, same, false)
	if again.answered["second"] != 5 || again.results["hit"] != 5 {
		t.Fatalf("both back: answered %v, affinity %v; want the prefix still on the second", again.answered, again.results)
	}
	if m := r.affinity(t); m["moved"] != 0 || m["hit"] != 35 || m["new"] != 1 {
		t.Fatalf("damper.routing.affinity %v; want 35 hits, 1 new", m)
	}
}

// Calls with different cached prefixes still spread: each new prefix goes
// where spread sends it (3:1 by learned headroom), and each repeated one
// where it went first.
func TestAffinityDifferentPrefixesSpread(t *testing.T) {
	r := newAffinityRig(t, spreadPolicy(), [2]dampertest.RateLimits{{InputTokensPerMinute: 300_000}, {InputTokensPerMinute: 100_000}})
	distinct := r.run(t, 640, time.Minute/320, func(i int) anthropic.MessageNewParams {
		return cachedParams(fmt.Sprintf("You are expert number %d.", i))
	}, false)
	t.Logf("distinct prefixes: answered %v, affinity %v", distinct.answered, distinct.results)
	if distinct.errs != 0 || distinct.results["new"] != 640 {
		t.Fatalf("distinct prefixes: %d errors, affinity %v; want 640 new", distinct.errs, distinct.results)
	}
	if ratio := float64(distinct.answered["primary"]) / float64(distinct.answered["second"]); !within(ratio, 3) {
		t.Fatalf("distinct prefixes: answered %v, a ratio of %.3f; want 3 ± 10 %%", distinct.answered, ratio)
	}
	r.noLimited(t, "distinct prefixes")

	// Without a rate limiter the weights send 8 new prefixes by turns;
	// three more rounds of them go where each went first.
	p := spreadPolicy()
	p.RateLimit = nil
	w := newAffinityRig(t, p, [2]dampertest.RateLimits{})
	var where [8]string
	for round := range 4 {
		for i := range where {
			var rep damper.Report
			if _, err := w.client.Messages.New(context.Background(), cachedParams(fmt.Sprintf("Prefix %d.", i)), damper.ReportInto(&rep)); err != nil {
				t.Fatal(err)
			}
			want := "hit"
			if round == 0 {
				where[i], want = rep.Backend, "new"
			}
			if rep.Backend != where[i] || rep.CacheAffinity != want {
				t.Fatalf("round %d, prefix %d: answered by %s (%s); want %s (%s)", round, i, rep.Backend, rep.CacheAffinity, where[i], want)
			}
		}
	}
	if got := strings.Join(where[:], ","); got != "primary,second,primary,second,primary,second,primary,second" {
		t.Fatalf("new prefixes went to %s; want the weights' turns", got)
	}
}

// Calls without a breakpoint, and cached calls with cache affinity off,
// are spread exactly as before: by turns, with no affinity said.
func TestAffinityOnlyForCachedPrefixes(t *testing.T) {
	uncached := spreadParams
	uncached.System = []anthropic.TextBlockParam{{Text: "You are the retry storm expert."}}
	for _, tc := range []struct {
		name     string
		affinity int
		params   anthropic.MessageNewParams
	}{
		{"no breakpoint", 0, spreadParams},
		{"a system block with no breakpoint", 0, uncached},
		{"affinity off", damper.None, cachedParams("You are the retry storm expert.")},
	} {
		p := spreadPolicy()
		p.RateLimit = nil
		p.Fallback.PrimaryWeight = 3
		p.Fallback.CacheAffinity = tc.affinity
		r := newAffinityRig(t, p, [2]dampertest.RateLimits{})
		var order []string
		for range 8 {
			var rep damper.Report
			if _, err := r.client.Messages.New(context.Background(), tc.params, damper.ReportInto(&rep)); err != nil {
				t.Fatal(err)
			}
			if rep.CacheAffinity != "" {
				t.Fatalf("%s: Report.CacheAffinity %q; want none", tc.name, rep.CacheAffinity)
			}
			order = append(order, rep.Backend)
		}
		if got, want := strings.Join(order, ","), "primary,primary,second,primary,primary,primary,second,primary"; got != want {
			t.Fatalf("%s: backends %s, want %s", tc.name, got, want)
		}
		if m := r.affinity(t); len(m) != 0 {
			t.Fatalf("%s: damper.routing.affinity %v; want nothing", tc.name, m)
		}
	}
}

// Automatic caching (a top-level cache_control) keys a conversation by its
// first message: its turns stay on one backend.
func TestAffinityAutomaticCaching(t *testing.T) {
	p := spreadPolicy()
	p.RateLimit = nil
	r := newAffinityRig(t, p, [2]dampertest.RateLimits{})
	var order []string
	for conv := range 2 {
		msgs := []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(fmt.Sprintf("Conversation %d begins.", conv)))}
		for range 3 {
			params := spreadParams
			params.Messages = msgs
			params.CacheControl = anthropic.NewCacheControlEphemeralParam()
			var rep damper.Report
			if _, err := r.client.Messages.New(context.Background(), params, damper.ReportInto(&rep)); err != nil {
				t.Fatal(err)
			}
			order = append(order, rep.Backend+":"+rep.CacheAffinity)
			msgs = append(msgs, anthropic.NewAssistantMessage(anthropic.NewTextBlock("ok")), anthropic.NewUserMessage(anthropic.NewTextBlock("and then?")))
		}
	}
	if got, want := strings.Join(order, ","), "primary:new,primary:hit,primary:hit,second:new,second:hit,second:hit"; got != want {
		t.Fatalf("turns went to %s; want %s", got, want)
	}
}

// The damper.request span says what cache affinity did, and the basis of
// a hit is affinity.
func TestTelemetryAffinity(t *testing.T) {
	second := dampertest.NewServer(dampertest.InMemory())
	t.Cleanup(second.Close)
	backend := damper.Backend{Name: "second", Provider: damper.ProviderAnthropic, Options: []option.RequestOption{
		option.WithBaseURL(dampertest.MemoryURL), option.WithAPIKey("second-key"),
		option.WithHTTPClient(&http.Client{Transport: dampertest.Transport(second.Handler())}),
	}}
	r := newTelRig(t, damper.Policy{Fallback: &damper.FallbackPolicy{Routing: "spread"}}, []damper.Setting{damper.WithBackends(backend)})
	for range 2 {
		if _, err := r.client.Messages.New(context.Background(), cachedParams("You are terse.")); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for _, s := range r.spans.GetSpans() {
		if s.Name != "damper.request" {
			continue
		}
		a := attribute.NewSet(s.Attributes...)
		basis, _ := a.Value("damper.routing.basis")
		affinity, _ := a.Value("damper.routing.affinity")
		got = append(got, basis.AsString()+"/"+affinity.AsString())
	}
	if strings.Join(got, ",") != "weights/new,affinity/hit" {
		t.Fatalf("request spans: basis/affinity %v; want weights/new, affinity/hit", got)
	}
	m := r.metricValues(t)
	for key, want := range map[string]float64{
		"damper.routing.affinity{damper.routing.result=new}":                           1,
		"damper.routing.affinity{damper.routing.result=hit}":                           1,
		"damper.routing.choices{damper.backend=primary,damper.routing.basis=affinity}": 1,
	} {
		if m[key] != want {
			t.Errorf("%s = %v, want %v; have %v", key, m[key], want, strings.Join(keysWith(m, "routing"), " "))
		}
	}
}

// Bad table sizes are refused, naming the field or key and the value; 0
// in a file and None in Go turn affinity off; the default is 4096.
func TestAffinityConfig(t *testing.T) {
	for _, tc := range []struct {
		size int
		want string
	}{
		{1_000_001, `Policy.Fallback.CacheAffinity = 1000001: must be at most 1000000`},
		{-2, `Policy.Fallback.CacheAffinity = -2`},
	} {
		_, err := damper.New(damper.Policy{Fallback: &damper.FallbackPolicy{Routing: "spread", CacheAffinity: tc.size}})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CacheAffinity %d: err %v; want it to say %s", tc.size, err, tc.want)
		}
	}
	for _, file := range []string{"fallback: {cache_affinity: -1}", "fallback: {cache_affinity: 2000000}", "fallback: {cache_affinity: lots}"} {
		_, err := damper.ParsePolicyYAML([]byte(file))
		if err == nil || !strings.Contains(err.Error(), "fallback.cache_affinity") {
			t.Errorf("%s: err %v; want it to name fallback.cache_affinity", file, err)
		}
	}
	for file, want := range map[string]int{
		"fallback: {routing: spread}":                     4096,
		"fallback: {routing: spread, cache_affinity: 0}":  0,
		"fallback: {routing: spread, cache_affinity: 16}": 16,
	} {
		p, err := damper.ParsePolicyYAML([]byte(file))
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		d, err := damper.New(p)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if got := d.Policy().Fallback.CacheAffinity; got != want {
			t.Errorf("%s: CacheAffinity %d; want %d", file, got, want)
		}
	}
}
