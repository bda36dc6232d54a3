package brownout

import (
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestCountInputTokens checks the provider's count: the rate-limit prompt
// is PromptTokens, "hello" the 12 that okBody reports, and Damper's
// estimate of the rate-limit body is a little above the count.
func TestCountInputTokens(t *testing.T) {
	if got := countInputTokens(rateBody()); got != PromptTokens {
		t.Errorf("rate-limit prompt counts %d tokens, want %d", got, PromptTokens)
	}
	hello, err := json.Marshal(messageParams)
	if err != nil {
		t.Fatal(err)
	}
	var ok struct {
		Usage struct {
			InputTokens int `json:"input_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal([]byte(okBody), &ok); err != nil {
		t.Fatal(err)
	}
	if got := countInputTokens(hello); got != ok.Usage.InputTokens {
		t.Errorf(`"hello" counts %d tokens, okBody reports %d`, got, ok.Usage.InputTokens)
	}
	if got := okBodyWith(ok.Usage.InputTokens); got != okBody {
		t.Errorf("okBodyWith(%d) = %s, want okBody", ok.Usage.InputTokens, got)
	}
	if est := damperEstimate(rateBody()); est < PromptTokens || est > PromptTokens*102/100 {
		t.Errorf("Damper's estimate of the rate-limit body = %d, want within 2 %% above %d", est, PromptTokens)
	}
	if got := countInputTokens([]byte(`{"system":"12345678","messages":[{"role":"user","content":"1234"},{"role":"assistant","content":[{"type":"text","text":"12345"}]}]}`)); got != 10+2+1+2 {
		t.Errorf("count of system, string and block content = %d, want 15", got)
	}
}

// TestProviderRateLimit checks the provider's buckets and headers: full at
// the start, a 429 with retry-after and no take when out of room, the
// remaining count after the take, a refill of the limit a minute.
func TestProviderRateLimit(t *testing.T) {
	p := &providerState{
		Provider: Provider{Capacity: 1000, ServiceMin: time.Second, ServiceMax: time.Second, RejectLatency: 50 * time.Millisecond,
			RateLimit: &RateLimit{RequestsPerMinute: 100, InputTokensPerMinute: 6000}},
		start: epoch, last: epoch, left: 1000, rng: rand.New(rand.NewPCG(1, 1)),
		requests: newRateBucket(100, epoch), inputTokens: newRateBucket(6000, epoch),
	}
	header := func(r response) http.Header {
		req, _ := http.NewRequest("POST", "http://provider.sim/v1/messages", nil)
		return httpResponse(req, r).Header
	}
	r := p.attempt(epoch, 2500, "")
	h := header(r)
	if r.status != 200 || h.Get("anthropic-ratelimit-input-tokens-remaining") != "3500" || h.Get("anthropic-ratelimit-requests-remaining") != "99" ||
		h.Get("anthropic-ratelimit-input-tokens-limit") != "6000" || h.Get("retry-after") != "" {
		t.Fatalf("first attempt: %d, headers %v", r.status, h)
	}
	// 2,500 of 6,000 taken: full again in 25 s.
	if got := h.Get("anthropic-ratelimit-input-tokens-reset"); got != epoch.Add(25*time.Second).Format(time.RFC3339) {
		t.Errorf("reset = %s, want 25 s on", got)
	}
	p.attempt(epoch, 2500, "")
	// 1,000 left; 2,500 needs 1,500 more: 15 s at 100 a second.
	r = p.attempt(epoch.Add(100*time.Millisecond), 2500, "")
	h = header(r)
	if r.status != 429 || r.errType != "rate_limit_error" || r.latency != 50*time.Millisecond || h.Get("retry-after") != "15" ||
		h.Get("anthropic-ratelimit-input-tokens-remaining") != "1010" {
		t.Fatalf("attempt out of room: %d %s after %v, headers %v", r.status, r.errType, r.latency, h)
	}
	if r = p.attempt(epoch.Add(15*time.Second), 2500, ""); r.status != 200 {
		t.Errorf("attempt after retry-after: %d, want 200", r.status)
	}
	if got := okBodyWith(2500); !strings.Contains(got, `"input_tokens":2500,`) {
		t.Errorf("answer body %s", got)
	}
}

// TestRateLimitDeterministic runs a short rate-limit scenario twice with
// the learned limiter: the provider's count and headers must not make
// runs differ.
func TestRateLimitDeterministic(t *testing.T) {
	sc := RateLimitScenario(2)
	sc.Duration = 90 * time.Second
	c := DamperLimiter(RateLimitShortWait)
	a, err := Run(sc, c)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Run(sc, c)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a.Requests, b.Requests) || !reflect.DeepEqual(a.Attempts, b.Attempts) {
		t.Error("two runs of the rate-limit scenario differ")
	}
	// The provider is healthy: only the rate limit refuses.
	for _, x := range a.Attempts {
		if x.Status != 200 && x.Status != 429 {
			t.Fatalf("attempt at %v: status %d, want 200 or 429", x.At, x.Status)
		}
	}
}

// fastRateContenders are the contenders the rate-limit targets need.
func fastRateContenders(replicas int) []Contender {
	return append([]Contender{Damper()}, LimiterContenders(replicas)...)
}

var rateSuite = sync.OnceValues(func() (*RateSuite, error) {
	return RunRateLimit([]int{1, DefaultReplicas}, fastRateContenders)
})

// knownRateMisses are the rate-limit targets the published run misses,
// each with the reason it must still show (see the docs): with 10 replicas
// and the default wait, the limiter's estimate of the other replicas'
// traffic lags, and a residue of 429s remains, between 5 % and 10 % of
// damper's.
var knownRateMisses = map[string]func(f, damper RateFigures) bool{
	rateTarget(RateLimitScenario(DefaultReplicas), limiterLearnedName, rateTarget429):    estimateLag,
	rateTarget(RateLimitScenario(DefaultReplicas), limiterConfiguredName, rateTarget429): estimateLag,
}

func estimateLag(f, d RateFigures) bool {
	return float64(f.Provider429) > 0.05*float64(d.Provider429) && float64(f.Provider429) < 0.1*float64(d.Provider429)
}

func TestRateLimitTargets(t *testing.T) {
	s, err := rateSuite()
	if err != nil {
		t.Fatal(err)
	}
	checks := s.Checks()
	// Per replica count, two targets for each limiter contender: four
	// with one replica, five with more.
	if want := 2 * (4 + 5); len(checks) != want {
		t.Fatalf("got %d rate-limit checks, want %d", len(checks), want)
	}
	figures := map[string]RateFigures{}
	damperOf := map[string]RateFigures{}
	for _, sc := range s.Scenarios {
		f := s.figures(sc.Name)
		for name, x := range f {
			for _, target := range []string{rateTarget429, rateTargetGoodput} {
				figures[rateTarget(sc, name, target)] = x
				damperOf[rateTarget(sc, name, target)] = f[damperName]
			}
		}
	}
	for _, c := range checks {
		reason, known := knownRateMisses[c.Target]
		switch {
		case known && c.Pass:
			t.Errorf("target %q now passes (%s): take it out of knownRateMisses, and its explanation out of the docs", c.Target, c.Detail)
		case known && !reason(figures[c.Target], damperOf[c.Target]):
			t.Errorf("target %q missed for another reason than the known one: %s", c.Target, c.Detail)
		case !known && !c.Pass:
			t.Errorf("target missed: %s (%s)", c.Target, c.Detail)
		}
	}
	// The limiter refuses what it cannot admit; damper without one sends
	// it all and collects the 429s.
	for _, sc := range s.Scenarios {
		f := s.figures(sc.Name)
		if d := f[damperName]; d.Provider429 < 500 || d.LimiterShare != 0 {
			t.Errorf("%s: damper %d 429s, %.3f refused by a limiter; want hundreds, none", sc.Name, d.Provider429, d.LimiterShare)
		}
		if l := f[limiterName(false, 1, RateLimitShortWait)]; sc.Replicas == 1 && (l.LimiterShare < 0.4 || l.P50 < RateLimitShortWait/2) {
			t.Errorf("%s: learned limiter refused %.3f, p50 %v; want about half refused, and a wait in line", sc.Name, l.LimiterShare, l.P50)
		}
	}

	md := s.Markdown()
	for _, want := range []string{RateLimitHeading + "\n", "#### 1 replica", "#### 10 replicas", "| damper+limiter learned | ",
		"| damper+limiter configured 1/10, wait 10 s | ", "#### Rate-limit targets",
		"failsafe-go and `Retry-After`"} {
		if !strings.Contains(md, want) {
			t.Errorf("rate-limit report lacks %q", want)
		}
	}
}

func TestRateLimitContenders(t *testing.T) {
	want := map[int]string{
		1:               "no-retry, sdk-default, naive-3x, grpc-throttle, damper, damper+throttle, damper+breaker, damper+limiter learned, damper+limiter configured, damper+limiter learned, wait 10 s, damper+limiter configured, wait 10 s",
		DefaultReplicas: "no-retry, sdk-default, naive-3x, grpc-throttle, damper, damper+throttle, damper+breaker, damper+limiter learned, damper+limiter configured, damper+limiter learned, wait 10 s, damper+limiter configured, wait 10 s, damper+limiter configured 1/10, wait 10 s",
	}
	for n, w := range want {
		var names []string
		for _, c := range RateLimitContenders(n) {
			names = append(names, c.Name)
		}
		if got := strings.Join(names, ", "); got != w {
			t.Errorf("RateLimitContenders(%d) = %s, want %s", n, got, w)
		}
	}
}
