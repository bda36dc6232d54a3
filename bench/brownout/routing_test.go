package brownout

import (
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

var routingFull = flag.Bool("routing.full", false, "run the routing scenario's tests at the published size (10 replicas, 30 minutes) rather than 2 replicas over 10 minutes")

// routingSuite is the routing scenario with 2 replicas over 10 minutes,
// whose figures that matter are shares, so that the run stays short under
// -race; with -routing.full, the published run.
var routingSuite = sync.OnceValues(func() (*RoutingSuite, error) {
	if *routingFull {
		return RunRouting(RoutingScenario(RoutingReplicas, RoutingDuration), RoutingContenders(), AffinityReplicas)
	}
	return RunRouting(RoutingScenario(2, 10*time.Minute), RoutingContenders(), []int{1})
})

func TestRoutingTargets(t *testing.T) {
	s, err := routingSuite()
	if err != nil {
		t.Fatal(err)
	}
	checks := s.Checks()
	if len(checks) != 5 {
		t.Fatalf("got %d routing checks, want 5", len(checks))
	}
	for _, c := range checks {
		if !c.Pass {
			t.Errorf("target missed: %s (%s)", c.Target, c.Detail)
		}
	}
	f := s.figures()
	o, sp := f[failoverName], f[spreadName]
	// Every contender sees the same requests.
	if o.Requests != sp.Requests || o.Requests == 0 {
		t.Fatalf("requests: failover %d, spread %d; want the same, some", o.Requests, sp.Requests)
	}
	// Spread keeps both organisations under their limits: every call
	// starts where there is room, none gets a 429, each makes one
	// attempt, and the calls split about evenly.
	if sp.Provider429 != 0 || sp.PerRequest != 1 || sp.ServedShare != 1 || sp.ByB < 0.4 || sp.ByB > 0.6 {
		t.Errorf("spread: %d 429s, %.3f attempts a request, %.3f served, %.3f by B; want none, 1, all, 0.4 to 0.6",
			sp.Provider429, sp.PerRequest, sp.ServedShare, sp.ByB)
	}
	if bound := s.Scenario.Provider.ServiceMax + time.Second; sp.P99 > bound {
		t.Errorf("spread p99 = %v, want at most a service time and a second, %v", sp.P99, bound)
	}
	// Failover fills A and waits in A's line: B takes what is left of the
	// load over A's limit, about (1.6-1)/1.6 of it, and the waits show in
	// the tail.
	if o.Provider429 == 0 || o.ByB < 0.25 || o.ByB > 0.45 || o.P99 < 10*time.Second {
		t.Errorf("failover: %d 429s, %.3f by B, p99 %v; want some, 0.25 to 0.45, at least 10 s", o.Provider429, o.ByB, o.P99)
	}
	// With many prefixes the cache's lifetime decides: some hits, some
	// writes; with a few, both organisations keep every one warm.
	for name, x := range f {
		if x.Cached == 0 || x.HitShare < 0.3 || x.HitShare > 0.9 || x.PrefixMoves == 0 {
			t.Errorf("%s: %d cached requests, %.3f hits, %d prefix moves; want some, 0.3 to 0.9, some", name, x.Cached, x.HitShare, x.PrefixMoves)
		}
	}
	// One replica's affinity table knows where every prefix went: each
	// stays where it went first, and the cache is read far more often
	// than under spread; the more replicas, the less it knows.
	counts, rows := s.affinityRows()
	if counts[0] != 1 || len(counts) < 2 {
		t.Fatalf("affinity compared at %v replicas, want 1 and more", counts)
	}
	most := counts[len(counts)-1]
	if one := rows[1]; one[1].HitShare < one[0].HitShare+0.1 || one[1].PrefixMoves*100 > one[1].Cached {
		t.Errorf("1 replica: affinity %.3f hits, %d of %d moved; spread %.3f; want a tenth more hits than spread, at most 1 %% moved",
			one[1].HitShare, one[1].PrefixMoves, one[1].Cached, one[0].HitShare)
	}
	if rows[1][1].HitShare <= rows[most][1].HitShare {
		t.Errorf("affinity's hits: %.3f with 1 replica, %.3f with %d; want fewer with more", rows[1][1].HitShare, rows[most][1].HitShare, most)
	}
	if few := s.Few.RoutingFigures(); few.Cached == 0 || few.HitShare < 0.99 {
		t.Errorf("spread with %d prefixes: %.3f hits of %d; want 0.99 at least", RoutingFewPrefixes, few.HitShare, few.Cached)
	}
	// Damper's reports and the organisations agree: under failover a
	// request answered by B had moved, and one that moved and succeeded
	// was answered by B.
	r, _ := resultOf(s.Results, failoverName)
	for i, q := range r.Requests {
		if q.OK && (q.Moved != "") != q.BySecondary {
			t.Fatalf("failover, request %d: moved %q but answered by B %v", i, q.Moved, q.BySecondary)
		}
	}

	md := s.Markdown()
	for _, want := range []string{RoutingHeading + "\n", "| " + failoverName + " | ", "| " + spreadName + " | ", "| " + affinityName + " | ",
		"#### Routing targets", "**Prompt caches.**"} {
		if !strings.Contains(md, want) {
			t.Errorf("routing report lacks %q", want)
		}
	}
	if md != s.Markdown() {
		t.Error("the routing report differs from itself")
	}
}

// TestRoutingDeterministic runs a short routing scenario twice with spread:
// the two organisations' draws, the cached prompts' draws and the caches
// must not make runs differ.
func TestRoutingDeterministic(t *testing.T) {
	sc := RoutingScenario(2, 6*time.Minute)
	c := RoutingContenders()[1]
	a, err := Run(sc, c)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Run(sc, c)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a.Requests, b.Requests) || !reflect.DeepEqual(a.Attempts, b.Attempts) ||
		!reflect.DeepEqual(a.SecondaryAttempts, b.SecondaryAttempts) {
		t.Error("two runs of the routing scenario differ")
	}
	var cached, hits int
	for _, q := range a.Requests {
		if q.Prefix > 0 {
			cached++
		}
		if q.Cache == CacheHit {
			hits++
		}
		if (q.Cache != NoCache) != (q.OK && q.Prefix > 0) {
			t.Fatalf("request with prefix %d, ok %v: cache %d; want an outcome just for a served cached request", q.Prefix, q.OK, q.Cache)
		}
	}
	if share := float64(cached) / float64(len(a.Requests)); share < 0.45 || share > 0.55 || hits == 0 {
		t.Errorf("%d of %d requests cached (want about half), %d hits (want some)", cached, len(a.Requests), hits)
	}
}

// TestPromptCache checks the provider's cache: the key is the model and
// the prefix up to the last breakpoint; an organisation hits what it served
// within the lifetime, each use renewing it, and never what another served.
func TestPromptCache(t *testing.T) {
	prompts := cachedParams(2, PromptTokens)
	one, two := mustMarshal(prompts[1]), mustMarshal(prompts[2])
	for _, b := range [][]byte{one, two} {
		if got := countInputTokens(b); got != PromptTokens {
			t.Errorf("a cached prompt counts %d tokens, want %d", got, PromptTokens)
		}
	}
	k1, k2 := cachePrefix(one), cachePrefix(two)
	if k1 == "" || k2 == "" || k1 == k2 || !strings.HasPrefix(k1, "claude-sonnet-4-5\x00Document 00001. ") || strings.Contains(k1, cacheQuestion) {
		t.Errorf("keys %.40q and %.40q: want two, the model and the system prompt", k1, k2)
	}
	if k := cachePrefix(rateBody()); k != "" {
		t.Errorf("a prompt without a breakpoint has key %.40q, want none", k)
	}
	// A breakpoint on the question takes the question in.
	if k := cachePrefix([]byte(`{"model":"m","system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"text","text":"q","cache_control":{"type":"ephemeral"}}]}]}`)); k != "m\x00s\x00q" {
		t.Errorf("key with the breakpoint on the question = %q", k)
	}

	sc := RoutingScenario(1, time.Minute)
	a := newProviderState(sc.Provider, 1, 1)
	b := newProviderState(*sc.Secondary, 1, 3)
	at := func(s time.Duration) time.Time { return epoch.Add(s) }
	steps := []struct {
		p    *providerState
		at   time.Duration
		body []byte
		want CacheOutcome
	}{
		{a, 0, one, CacheWrite},
		{a, time.Minute, one, CacheHit},
		{b, 2 * time.Minute, one, CacheWrite}, // B's cache is its own
		{a, 5 * time.Minute, one, CacheHit},   // 4 minutes after A's last use
		{a, 5 * time.Minute, two, CacheWrite},
		{a, 10*time.Minute + time.Second, two, CacheWrite}, // past the lifetime
		{b, 3 * time.Minute, rateBody(), NoCache},
	}
	for i, st := range steps {
		res := st.p.attempt(at(st.at), PromptTokens, st.p.prefixOf(st.body))
		if res.status != 200 || res.cache != st.want {
			t.Errorf("step %d: %d, cache %d; want 200, %d", i, res.status, res.cache, st.want)
		}
	}
	// A refused attempt uses no cache: A's bucket holds 40 requests.
	c := newProviderState(sc.Provider, 1, 1)
	for range 40 {
		c.attempt(epoch, PromptTokens, "")
	}
	if res := c.attempt(epoch, PromptTokens, c.prefixOf(one)); res.status != 429 || res.cache != NoCache || len(c.cache) != 0 {
		t.Errorf("over the limit: %d, cache %d, %d entries; want 429, none, none", res.status, res.cache, len(c.cache))
	}
}

func TestRoutingNeeds(t *testing.T) {
	sc := RoutingScenario(1, time.Minute)
	sc.Secondary = nil
	if _, err := RunRouting(sc, RoutingContenders(), nil); err == nil || !strings.Contains(err.Error(), "Secondary") {
		t.Errorf("RunRouting without a secondary: err = %v, want one naming Secondary", err)
	}
	sc = RoutingScenario(1, time.Minute)
	sc.Cached = &CachedPrompts{Share: 1.5, Prefixes: 4}
	if _, err := Run(sc, RoutingContenders()[0]); err == nil || !strings.Contains(err.Error(), "Share: 1.5") {
		t.Errorf("Run with a share of 1.5: err = %v, want one naming Share", err)
	}
	sc.Cached = &CachedPrompts{Share: 0.5, Prefixes: maxPrefixes + 1}
	if _, err := Run(sc, RoutingContenders()[0]); err == nil || !strings.Contains(err.Error(), "Prefixes: 10001") {
		t.Errorf("Run with %d prefixes: err = %v, want one naming Prefixes", maxPrefixes+1, err)
	}
	sc.Cached = nil
	if _, err := Run(sc, RoutingContenders()[1]); err == nil || !strings.Contains(err.Error(), "Cached") {
		t.Errorf("Run of spread without cached prompts: err = %v, want one naming Cached", err)
	}
}

// TestUpdateSubsection rewrites one "###" part of a section, and nothing
// else; a part not there yet is an error.
func TestUpdateSubsection(t *testing.T) {
	path := filepath.Join(t.TempDir(), "B.md")
	doc := "# B\n\n## Sim\n\n### One\n\nold one\n\n### Two\n\nold two\n#### Two targets\n\nrows\n\n### Three\n\nthree\n\n## Next\n\nnext\n"
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := UpdateSubsection(path, "### Two", "### Two\n\nnew two\n"); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(path)
	want := "# B\n\n## Sim\n\n### One\n\nold one\n\n### Two\n\nnew two\n\n### Three\n\nthree\n\n## Next\n\nnext\n"
	if string(got) != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if err := UpdateSubsection(path, "### Three", "### Three\n\nnew three"); err != nil {
		t.Fatal(err)
	}
	got, _ = os.ReadFile(path)
	if want = strings.Replace(want, "three\n\n## Next", "new three\n\n## Next", 1); string(got) != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if err := UpdateSubsection(path, "### Four", "x"); err == nil || !strings.Contains(err.Error(), `"### Four"`) {
		t.Errorf("a part not there: err = %v, want one naming it", err)
	}
}
