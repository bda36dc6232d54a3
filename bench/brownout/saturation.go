package brownout

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/damper-ai/damper-go"
)

// The saturation scenario: a provider whose service time grows with the
// attempts it holds (a SaturatingProvider), and a surge of the offered
// load past what it serves.
//
// Its parameters, in one place. The provider's cores are sized as the
// other scenarios' capacity is, Headroom over the normal load: a mean
// work of 2 s at 50 requests a second keeps 100 cores busy, so 125 cores
// serve 62.5 a second. The surge doubles the load to 100 a second, 1.6
// times that, for a minute. The provider holds up to DepthFactor times its
// cores, where an attempt's time is DepthFactor times its work: 5 to 15 s,
// the mean of which is the caller's deadline, so that a provider filled to
// its depth answers most attempts after their caller has given up.
const (
	SaturationWorkMin       = time.Second      // an attempt's least work
	SaturationWorkMax       = 3 * time.Second  // and its most, as the other scenarios' service time
	SaturationDepthFactor   = 5                // the provider's depth, in times its cores
	SaturationSurgeStart    = PublishedStart   // when the surge begins, as the other incidents do
	SaturationSurgeLength   = 60 * time.Second // how long it lasts
	SaturationSurgeFactor   = 2.0              // the load during the surge, in times the normal load
	SaturationDeadline      = 10 * time.Second // every request's deadline
	SaturationDuration      = 240 * time.Second
	SaturationRejectLatency = 50 * time.Millisecond // a 529's, as the other scenarios'
)

// SaturationCores is the cores of the saturation scenario's provider for
// replicas: Headroom over the normal load of the replicas, at the mean
// work.
func SaturationCores(replicas int) int {
	mean := (SaturationWorkMin + SaturationWorkMax).Seconds() / 2
	return int(math.Round(Headroom * RatePerReplica * float64(replicas) * mean))
}

// SaturationScenario returns the saturation scenario with replicas.
func SaturationScenario(replicas int) Scenario {
	cores := SaturationCores(replicas)
	return Scenario{
		Name: "saturation",
		Title: fmt.Sprintf("Saturation: the load surges to %gx for %s from %s, against a provider that slows with the attempts it holds; %s deadline",
			SaturationSurgeFactor, secs0(SaturationSurgeLength), secs0(SaturationSurgeStart), secs0(SaturationDeadline)),
		Saturating: &SaturatingProvider{
			Cores:         cores,
			Depth:         SaturationDepthFactor * cores,
			WorkMin:       SaturationWorkMin,
			WorkMax:       SaturationWorkMax,
			RejectLatency: SaturationRejectLatency,
		},
		Surge:    &Surge{Start: SaturationSurgeStart, Length: SaturationSurgeLength, Factor: SaturationSurgeFactor},
		Replicas: replicas,
		Rate:     RatePerReplica * float64(replicas),
		Duration: SaturationDuration,
		Deadline: SaturationDeadline,
		Seed:     DefaultSeed,
	}
}

// SaturationContenders returns the contenders of the saturation scenario
// with replicas: the recommended policy, with no concurrency limit, with a
// fixed limit that knows the provider's cores, and with the adaptive
// limit.
func SaturationContenders(replicas int) []Contender {
	return []Contender{DamperRecommended(), DamperFixedLimit(SaturationFixedLimit(replicas)), DamperAdaptiveLimit(), DamperAdaptiveLimitTolerance(SaturationTolerance)}
}

// SaturationFixedLimit is the fixed limit of each of replicas that knows
// the saturation scenario's provider: its cores shared among the replicas,
// rounded.
func SaturationFixedLimit(replicas int) int {
	return int(math.Round(float64(SaturationCores(replicas)) / float64(replicas)))
}

// DamperFixedLimit is damper.RecommendedPolicy() with a fixed concurrency
// limit of limit attempts in flight per replica.
func DamperFixedLimit(limit int) Contender {
	return damperContender(fixedLimitName,
		fmt.Sprintf("real code: SDK v2 client + damper.New(p) middleware, p := damper.RecommendedPolicy() with p.Concurrency = &damper.ConcurrencyPolicy{Max: %d}: a fixed limit of %d attempts in flight per replica, the provider's cores shared among the replicas (a limit that knows the capacity), the wait for a slot at its default (%v), on the virtual clock", limit, limit, defaults.Concurrency.MaxWait),
		func() damper.Policy {
			p := damper.RecommendedPolicy()
			p.Concurrency = &damper.ConcurrencyPolicy{Max: limit}
			return p
		})
}

// DamperAdaptiveLimit is damper.RecommendedPolicy() with the adaptive
// concurrency limit at its defaults.
func DamperAdaptiveLimit() Contender {
	c := defaults.Concurrency
	return damperContender(adaptiveLimitName,
		fmt.Sprintf("real code: SDK v2 client + damper.New(p) middleware, p := damper.RecommendedPolicy() with p.Concurrency = &damper.ConcurrencyPolicy{Adaptive: true}: the adaptive limit at its defaults (from %d, between %d and %d, tolerance %g, the wait for a slot %v), per replica, on the virtual clock", c.Initial, c.Min, c.Max, c.Tolerance, c.MaxWait),
		func() damper.Policy {
			p := damper.RecommendedPolicy()
			p.Concurrency = &damper.ConcurrencyPolicy{Adaptive: true}
			return p
		})
}

// SaturationTolerance is the adaptive limit's Tolerance for a provider
// whose attempts' times spread as little as this one's (1 s to 3 s of
// work): the latency held closer to the best than the default allows.
const SaturationTolerance = 1.3

// DamperAdaptiveLimitTolerance is damper.RecommendedPolicy() with the
// adaptive concurrency limit at its defaults but for its Tolerance.
func DamperAdaptiveLimitTolerance(tolerance float64) Contender {
	c := defaults.Concurrency
	return damperContender(fmt.Sprintf("%s-%g", adaptiveLimitName, tolerance),
		fmt.Sprintf("real code: as damper+breaker+adaptive, with p.Concurrency = &damper.ConcurrencyPolicy{Adaptive: true, Tolerance: %g}: the latency held within %g times its best (the default, %g, holds against heavy-tailed answer times)", tolerance, tolerance, c.Tolerance),
		func() damper.Policy {
			p := damper.RecommendedPolicy()
			p.Concurrency = &damper.ConcurrencyPolicy{Adaptive: true, Tolerance: tolerance}
			return p
		})
}

// SaturationFigures are the numbers of one contender in the saturation
// scenario.
type SaturationFigures struct {
	// Requests were issued in the whole run, OK of them succeeded;
	// Limited is the share refused by Damper's concurrency limit,
	// CircuitOpen the share refused by an open breaker, TimedOut the share
	// ended by the deadline, Failed the share that failed otherwise.
	Requests, OK                           int
	Limited, CircuitOpen, TimedOut, Failed float64
	// SurgeRequests were issued during the surge, SurgeOK of them
	// succeeded: SurgeGoodput a second of the surge.
	SurgeRequests, SurgeOK int
	SurgeGoodput           float64
	// P50, P95 and P99 are the latency of the successful requests of the
	// run, from issue to the end of the call. Of that, P99Before is the
	// 99th percentile of the time before the last attempt reached the
	// provider (waits for a slot, backoffs, attempts that failed), and
	// P99Provider of the time that attempt took.
	P50, P95, P99          time.Duration
	P99Before, P99Provider time.Duration
	// Attempts reached the provider in the run, PerRequest of them a
	// request; Rejected of them got 529. PeakHeld is the most attempts
	// the provider held at once.
	Attempts, Rejected int
	PerRequest         float64
	PeakHeld           int
}

// SaturationFigures computes the saturation figures of r.
func (r *Result) SaturationFigures() SaturationFigures {
	var f SaturationFigures
	u := r.Scenario.Surge
	var limited, open, timedOut, failed int
	var lat, before, provider []time.Duration
	for _, q := range r.Requests {
		f.Requests++
		surge := u != nil && q.Issued >= u.Start && q.Issued < u.Start+u.Length
		if surge {
			f.SurgeRequests++
		}
		switch {
		case q.OK:
			f.OK++
			lat = append(lat, q.Ended-q.Issued)
			before, provider = append(before, q.LastSent-q.Issued), append(provider, q.Ended-q.LastSent)
			if surge {
				f.SurgeOK++
			}
		case q.TimedOut:
			timedOut++
		case q.ConcurrencyLimited:
			limited++
		case q.CircuitOpen:
			open++
		default:
			failed++
		}
	}
	if f.Requests > 0 {
		n := float64(f.Requests)
		f.Limited, f.CircuitOpen = float64(limited)/n, float64(open)/n
		f.TimedOut, f.Failed = float64(timedOut)/n, float64(failed)/n
	}
	if u != nil {
		f.SurgeGoodput = float64(f.SurgeOK) / u.Length.Seconds()
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		f.P50, f.P95, f.P99 = quantile(lat, 0.50), quantile(lat, 0.95), quantile(lat, 0.99)
		slices.Sort(before)
		slices.Sort(provider)
		f.P99Before, f.P99Provider = quantile(before, 0.99), quantile(provider, 0.99)
	}
	f.Attempts = len(r.Attempts)
	for _, a := range r.Attempts {
		if a.Status == 529 {
			f.Rejected++
		}
	}
	if f.Requests > 0 {
		f.PerRequest = float64(f.Attempts) / float64(f.Requests)
	}
	for _, n := range r.Held {
		f.PeakHeld = max(f.PeakHeld, n)
	}
	return f
}

// SaturationSecond is one second of a saturation run.
type SaturationSecond struct {
	Second int
	// Held is the most attempts the provider held in the second; Rejected
	// its 529s; Goodput the requests that succeeded in the second.
	Held, Rejected, Goodput int
	// HeldByReplica is the most attempts each replica had at the provider
	// in the second, and LimitByReplica each replica's concurrency limit
	// at its start (-1: none).
	HeldByReplica, LimitByReplica []int
}

// Trace returns the seconds of r from from to to (excluded).
func (r *Result) Trace(from, to time.Duration) []SaturationSecond {
	first, last := int(from/time.Second), min(int(to/time.Second), len(r.Held))
	out := make([]SaturationSecond, 0, max(last-first, 0))
	for sec := first; sec < last; sec++ {
		x := SaturationSecond{Second: sec, Held: r.Held[sec], Goodput: r.GoodputPerSecond[sec]}
		for _, by := range r.HeldByReplica {
			x.HeldByReplica = append(x.HeldByReplica, by[sec])
		}
		for _, by := range r.Limit {
			x.LimitByReplica = append(x.LimitByReplica, by[sec])
		}
		out = append(out, x)
	}
	for _, a := range r.Attempts {
		if sec := int(a.At / time.Second); a.Status == 529 && sec >= first && sec < last {
			out[sec-first].Rejected++
		}
	}
	return out
}

// SaturationSuite is the saturation scenario with the results of its
// contenders.
type SaturationSuite struct {
	Scenario Scenario
	Results  []*Result // in contender order
}

// RunSaturation runs sc with every contender.
func RunSaturation(sc Scenario, contenders []Contender) (*SaturationSuite, error) {
	if sc.Saturating == nil {
		return nil, fmt.Errorf("brownout: scenario %q: Saturating is nil: the saturation scenario needs a saturating provider", sc.Name)
	}
	results, err := runEach(sc, contenders)
	if err != nil {
		return nil, err
	}
	return &SaturationSuite{Scenario: sc, Results: results}, nil
}

func (s *SaturationSuite) figures() map[string]SaturationFigures {
	out := map[string]SaturationFigures{}
	for _, r := range s.Results {
		out[r.Contender] = r.SaturationFigures()
	}
	return out
}

func (s *SaturationSuite) result(contender string) (*Result, bool) {
	return resultOf(s.Results, contender)
}

// Names of the saturation contenders that targets single out.
const (
	fixedLimitName    = "damper+breaker+fixed-limit"
	adaptiveLimitName = "damper+breaker+adaptive"
)

// The saturation targets.
const (
	saturationTargetP99      = "saturation: the adaptive limit's p99 latency of successful requests at least 50 % lower than damper+breaker's"
	saturationTargetGoodput  = "saturation: the adaptive limit's goodput at least as high as damper+breaker's, over the run and during the surge"
	saturationTargetAttempts = "saturation: the adaptive limit sends the provider no more attempts than damper+breaker"
)

// Checks evaluates the saturation targets; a contender that did not run
// shows none of them.
func (s *SaturationSuite) Checks() []Check {
	var checks []Check
	add := func(target string, pass bool, detail string, args ...any) {
		checks = append(checks, Check{Target: target, Pass: pass, Detail: fmt.Sprintf(detail, args...)})
	}
	f := s.figures()
	rec, okRec := f[recommendedName]
	a, okA := f[adaptiveLimitName]
	ran := okRec && okA
	missing := ""
	if !ran {
		missing = fmt.Sprintf(" (%s did not run)", adaptiveLimitName)
	}
	add(saturationTargetP99, ran && rec.OK > 0 && a.OK > 0 && a.P99 <= rec.P99/2,
		"%s %s, %s %s (%.1f %% lower)%s", adaptiveLimitName, secs(a.P99), recommendedName, secs(rec.P99), 100*(1-a.P99.Seconds()/max(rec.P99.Seconds(), 1e-9)), missing)
	add(saturationTargetGoodput, ran && a.OK >= rec.OK && a.SurgeGoodput >= rec.SurgeGoodput,
		"%s %d successful requests, %.2f/s during the surge; %s %d, %.2f/s%s", adaptiveLimitName, a.OK, a.SurgeGoodput, recommendedName, rec.OK, rec.SurgeGoodput, missing)
	add(saturationTargetAttempts, ran && a.Attempts <= rec.Attempts,
		"%s %d (%.3f a request), %s %d (%.3f a request)%s", adaptiveLimitName, a.Attempts, a.PerRequest, recommendedName, rec.Attempts, rec.PerRequest, missing)
	return checks
}

// concurrencyLimited reports whether err is a refusal of Damper's
// concurrency limit.
func concurrencyLimited(err error) bool {
	return errors.Is(err, damper.ErrConcurrencyLimited)
}
