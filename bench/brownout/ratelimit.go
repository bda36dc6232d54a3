package brownout

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/damper-ai/damper-go"
)

// The rate-limit scenario: an organisation whose input-token limit, not
// its request limit, binds, as it does for long prompts, offered twice what
// that limit admits by a provider that is otherwise healthy.
const (
	// RateLimitITPM and RateLimitRPM are the organisation's limits.
	RateLimitITPM = 450_000
	RateLimitRPM  = 1_000
	// PromptTokens is the input of every request, as the provider counts
	// it (countInputTokens).
	PromptTokens = 2_000
	// RateLimitOverload is the offered load over what the limit admits.
	RateLimitOverload = 2.0
	// RateLimitDuration is how long requests arrive; RateLimitSteadyFrom
	// is when the figures begin: the bucket starts full, and the first
	// minute or so spends it.
	RateLimitDuration   = 6 * time.Minute
	RateLimitSteadyFrom = 2 * time.Minute
	// RateLimitShortWait is the MaxWait of the limiter contenders that
	// leave the attempt time to finish before the deadline.
	RateLimitShortWait = 10 * time.Second
)

// RateLimitName is the name of the rate-limit scenario with its replicas
// (for file names and the suite's results).
func RateLimitName(replicas int) string {
	return fmt.Sprintf("ratelimit-%dr", replicas)
}

// ratePrompt is a prompt of PromptTokens tokens as the provider counts
// them: plain words, so that the JSON needs no escapes.
var ratePrompt = func() string {
	n := (PromptTokens - requestOverheadToken) * bytesPerInputToken
	const words = "the quick brown fox jumps over the lazy dog while five boxing wizards jump quickly "
	return strings.Repeat(words, n/len(words)+1)[:n]
}()

// RateLimitScenario returns the rate-limit scenario with replicas client
// processes sharing the organisation's limit (the offered load does not
// grow with them: it is the organisation's).
func RateLimitScenario(replicas int) Scenario {
	admitted := AdmittedPerMinute()
	rate := RateLimitOverload * admitted / 60
	return Scenario{
		Name: RateLimitName(replicas),
		Title: fmt.Sprintf("Rate limit: %s input tokens a minute, offered %gx what it admits, %d %s",
			thousands(RateLimitITPM), RateLimitOverload, replicas, plural(replicas, "replica", "replicas")),
		Provider: Provider{
			Capacity:      Headroom * rate,
			ServiceMin:    time.Second,
			ServiceMax:    3 * time.Second,
			RejectLatency: 50 * time.Millisecond,
			RateLimit:     &RateLimit{RequestsPerMinute: RateLimitRPM, InputTokensPerMinute: RateLimitITPM},
		},
		Replicas: replicas,
		Rate:     rate,
		Duration: RateLimitDuration,
		Deadline: 30 * time.Second,
		Seed:     DefaultSeed,
		Prompt:   ratePrompt,
	}
}

// AdmittedPerMinute is what the organisation's limit admits: requests a
// minute of PromptTokens each.
func AdmittedPerMinute() float64 {
	return min(float64(RateLimitITPM)/PromptTokens, RateLimitRPM)
}

// Names of the rate-limit contenders that targets single out.
const (
	limiterLearnedName    = "damper+limiter learned"
	limiterConfiguredName = "damper+limiter configured"
)

// limiterName names a limiter contender: learned or configured, the share
// of the organisation's limit each replica is configured with (1: all of
// it) and its MaxWait (0: the default).
func limiterName(configured bool, share int, wait time.Duration) string {
	name := limiterLearnedName
	if configured {
		name = limiterConfiguredName
		if share > 1 {
			name += fmt.Sprintf(" 1/%d", share)
		}
	}
	if wait > 0 {
		name += ", wait " + secs0(wait)
	}
	return name
}

// DamperLimiter is Damper's default policy plus the rate limiter learning
// every limit from the API's headers, waiting in line at most wait (0: the
// default, 30 s).
func DamperLimiter(wait time.Duration) Contender {
	return damperContender(limiterName(false, 1, wait),
		fmt.Sprintf("real code: SDK v2 client + damper.New(damper.Policy{RateLimit: &damper.RateLimitPolicy{%s}}) middleware, the default policy plus the rate limiter learning the limits from the anthropic-ratelimit-* headers, on the virtual clock", waitField(wait)),
		func() damper.Policy { return damper.Policy{RateLimit: &damper.RateLimitPolicy{MaxWait: wait}} })
}

// DamperLimiterConfigured is Damper's default policy plus the rate limiter
// configured with 1/share of the organisation's limits (share 1: the true
// limits), waiting in line at most wait (0: the default, 30 s).
func DamperLimiterConfigured(share int, wait time.Duration) Contender {
	// The limit group of messageParams' model, claude-sonnet-4-5: a model
	// family and major version (see damper.RateLimitPolicy).
	const group = "claude-sonnet-4"
	limits := damper.RateLimits{RequestsPerMinute: RateLimitRPM / share, InputTokensPerMinute: RateLimitITPM / share}
	what := "the organisation's limits"
	if share > 1 {
		what = fmt.Sprintf("1/%d of the organisation's limits in each replica", share)
	}
	fields := fmt.Sprintf("Limits: {%q: {RequestsPerMinute: %d, InputTokensPerMinute: %d}}", group, limits.RequestsPerMinute, limits.InputTokensPerMinute)
	if w := waitField(wait); w != "" {
		fields += ", " + w
	}
	return damperContender(limiterName(true, share, wait),
		fmt.Sprintf("real code: SDK v2 client + damper.New(damper.Policy{RateLimit: &damper.RateLimitPolicy{%s}}) middleware, the default policy plus the rate limiter configured with %s (output tokens learned), on the virtual clock", fields, what),
		func() damper.Policy {
			return damper.Policy{RateLimit: &damper.RateLimitPolicy{MaxWait: wait, Limits: map[string]damper.RateLimits{group: limits}}}
		})
}

func waitField(wait time.Duration) string {
	if wait == 0 {
		return ""
	}
	return fmt.Sprintf("MaxWait: %d * time.Second", int(wait/time.Second))
}

// LimiterContenders returns Damper's rate-limit contenders for replicas:
// the limiter learned and configured with its defaults, the same two with
// the short wait, and, with more than one replica, the limiter configured
// with each replica's share of the limit and the short wait.
func LimiterContenders(replicas int) []Contender {
	cs := []Contender{
		DamperLimiter(0), DamperLimiterConfigured(1, 0),
		DamperLimiter(RateLimitShortWait), DamperLimiterConfigured(1, RateLimitShortWait),
	}
	if replicas > 1 {
		cs = append(cs, DamperLimiterConfigured(replicas, RateLimitShortWait))
	}
	return cs
}

// RateLimitContenders returns the contenders of the rate-limit scenario
// with replicas: every contender but failsafe-go, whose wait for a
// Retry-After is a wall-clock timer (see the docs), then Damper's rate
// limiter contenders.
func RateLimitContenders(replicas int) []Contender {
	var cs []Contender
	for _, c := range Contenders() {
		if c.Name != "failsafe-go" {
			cs = append(cs, c)
		}
	}
	return append(cs, LimiterContenders(replicas)...)
}

// RateFigures are the numbers of one contender in the rate-limit
// scenario, over the logical requests issued from RateLimitSteadyFrom to
// the end of arrivals, and the provider attempts that arrived meanwhile.
type RateFigures struct {
	Requests int
	// Provider429 is the attempts the provider refused for the rate limit;
	// Attempts all those that reached it.
	Provider429, Attempts int
	// Goodput is successful requests a minute; GoodputShare that over what
	// the limit admits.
	Goodput, GoodputShare float64
	// SuccessShare, LimiterShare and TimedOut are the shares of the
	// requests that succeeded, that Damper's rate limiter refused
	// (damper.ErrRateLimited) and that their deadline ended.
	SuccessShare, LimiterShare, TimedOut float64
	// P50 and P99 are the latency of the successful requests.
	P50, P99 time.Duration
}

// RateFigures computes the rate-limit figures of r.
func (r *Result) RateFigures() RateFigures {
	from, to := RateLimitSteadyFrom, r.Scenario.Duration
	var f RateFigures
	var ok, limited, timedOut int
	var lat []time.Duration
	for _, q := range r.Requests {
		if q.Issued < from || q.Issued >= to {
			continue
		}
		f.Requests++
		switch {
		case q.OK:
			ok++
			lat = append(lat, q.Ended-q.Issued)
		case q.RateLimited:
			limited++
		case q.TimedOut:
			timedOut++
		}
	}
	for _, a := range r.Attempts {
		if a.At < from || a.At >= to {
			continue
		}
		f.Attempts++
		if a.Status == 429 {
			f.Provider429++
		}
	}
	f.Goodput = float64(ok) / (to - from).Minutes()
	f.GoodputShare = f.Goodput / AdmittedPerMinute()
	if f.Requests > 0 {
		n := float64(f.Requests)
		f.SuccessShare, f.LimiterShare, f.TimedOut = float64(ok)/n, float64(limited)/n, float64(timedOut)/n
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		f.P50, f.P99 = quantile(lat, 0.50), quantile(lat, 0.99)
	}
	return f
}

// RateSuite is the rate-limit scenario at each replica count, with the
// results of its contenders.
type RateSuite struct {
	Scenarios []Scenario
	Results   map[string][]*Result // by scenario name, in contender order
}

// RunRateLimit runs the rate-limit scenario at each replica count with
// the contenders that contenders returns for it.
func RunRateLimit(replicas []int, contenders func(replicas int) []Contender) (*RateSuite, error) {
	s := &RateSuite{Results: map[string][]*Result{}}
	var scenarios []Scenario
	var cs []Contender
	var at []int // the index of each scenario's first run
	for _, n := range replicas {
		sc := RateLimitScenario(n)
		s.Scenarios = append(s.Scenarios, sc)
		at = append(at, len(cs))
		for _, c := range contenders(n) {
			scenarios, cs = append(scenarios, sc), append(cs, c)
		}
	}
	results, err := runPairs(scenarios, cs)
	if err != nil {
		return nil, err
	}
	at = append(at, len(cs))
	for i, sc := range s.Scenarios {
		s.Results[sc.Name] = results[at[i]:at[i+1]]
	}
	return s, nil
}

func (s *RateSuite) figures(scenario string) map[string]RateFigures {
	out := map[string]RateFigures{}
	for _, r := range s.Results[scenario] {
		out[r.Contender] = r.RateFigures()
	}
	return out
}

// The rate limiter's targets, for each replica count and each of Damper's
// limiter contenders.
const (
	rateTarget429     = "provider 429s at least 95 % fewer than damper's (no limiter)"
	rateTargetGoodput = "goodput within 5 % of what the limit admits"
)

// rateTarget is the target name of a limiter contender in a scenario.
func rateTarget(sc Scenario, contender, target string) string {
	return fmt.Sprintf("rate limit, %d %s: %s: %s", sc.Replicas, plural(sc.Replicas, "replica", "replicas"), contender, target)
}

// Checks evaluates the rate limiter's targets: for each replica count and
// each of Damper's limiter contenders run, the provider's 429s against
// Damper's without a limiter, and goodput against what the limit admits.
func (s *RateSuite) Checks() []Check {
	var checks []Check
	admitted := AdmittedPerMinute()
	for _, sc := range s.Scenarios {
		f := s.figures(sc.Name)
		d, hasDamper := f[damperName]
		for _, r := range s.Results[sc.Name] {
			if !strings.HasPrefix(r.Contender, "damper+limiter") {
				continue
			}
			l := f[r.Contender]
			checks = append(checks,
				Check{
					Target: rateTarget(sc, r.Contender, rateTarget429),
					Pass:   hasDamper && d.Provider429 > 0 && float64(l.Provider429) <= 0.05*float64(d.Provider429),
					Detail: fmt.Sprintf("%d against %d (%s)", l.Provider429, d.Provider429, fewerText(l.Provider429, d.Provider429)),
				},
				Check{
					Target: rateTarget(sc, r.Contender, rateTargetGoodput),
					Pass:   l.Goodput >= 0.95*admitted && l.Goodput <= 1.05*admitted,
					Detail: fmt.Sprintf("%.1f/min of %.1f/min (%.1f %%); %.1f %% of requests timed out", l.Goodput, admitted, 100*l.GoodputShare, 100*l.TimedOut),
				})
		}
	}
	return checks
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// thousands writes n with commas between its thousands.
func thousands(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
