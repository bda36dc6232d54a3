package brownout

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/fleet"
)

// The fallback scenario: the full outage of the provider, now the
// primary, with a second provider, healthy and as large as the primary is
// when healthy, that a Damper with a backend for it can fall back to.

// SecondaryBackend is the name of the backend that reaches the secondary
// provider.
const SecondaryBackend = "secondary"

// FallbackAfter is the time after the outage's end over which the return
// of the traffic to the primary is measured.
const FallbackAfter = time.Minute

// FallbackScenario returns the fallback scenario with replicas: the
// published full outage (the primary's every attempt gets 529 for 120 s),
// and a secondary provider with the primary's healthy capacity and
// service times, and no incident.
func FallbackScenario(replicas int) Scenario {
	var sc Scenario
	for _, x := range Scenarios(replicas) {
		if x.Name == "outage" {
			sc = x
		}
	}
	sc.Name = "fallback"
	sc.Title = "Fallback: the primary provider in a full outage (every attempt gets 529) for 120 s, a second provider healthy"
	second := sc.Provider
	second.Incident = Incident{}
	sc.Secondary = &second
	return sc
}

// Names of the fallback contenders that targets single out.
const (
	sdkName               = "sdk-default"
	fallbackName          = "damper+breaker+fallback"
	fallbackNoBreakerName = "damper+fallback"
)

// FallbackContenders returns the contenders of the fallback scenario: the
// SDK's own loop, which can only retry the primary; the recommended
// policy without a backend to fall back to; the recommended policy with
// the secondary as its backend; and the default policy, which has no
// breaker, with the same backend.
func FallbackContenders() []Contender {
	return []Contender{SDKDefault(), DamperRecommended(), DamperFallback(), DamperFallbackNoBreaker()}
}

// DamperFallback is damper.RecommendedPolicy() with the secondary provider
// as a backend (damper.WithBackends).
func DamperFallback() Contender {
	return fallbackContender(fallbackName,
		"real code: SDK v2 client + damper.New(damper.RecommendedPolicy(), damper.WithBackends(secondary)) middleware: the recommended policy, and a backend of Provider damper.ProviderAnthropic reached through the SDK options option.WithBaseURL and option.WithHTTPClient over the simulated secondary provider, with its own budget, throttle and breaker, on the virtual clock",
		damper.RecommendedPolicy)
}

// DamperFallbackNoBreaker is Damper's default policy, damper.Policy{},
// which has no breaker, with the secondary provider as a backend.
func DamperFallbackNoBreaker() Contender {
	return fallbackContender(fallbackNoBreakerName,
		"real code: SDK v2 client + damper.New(damper.Policy{}, damper.WithBackends(secondary)) middleware: the default policy (no breaker, no throttle) with the same backend, on the virtual clock",
		func() damper.Policy { return damper.Policy{} })
}

// fallbackContender is damperContender with the secondary provider as a
// backend.
func fallbackContender(name, path string, policy func() damper.Policy) Contender {
	return Contender{
		Name: name,
		Path: path,
		newReplica: func(env replicaEnv) (call, error) {
			if env.secondary == nil {
				return nil, errors.New("the scenario has no Secondary provider to fall back to")
			}
			d, err := newDamper(env, policy(), damper.WithBackends(damper.Backend{
				Name:     SecondaryBackend,
				Provider: damper.ProviderAnthropic,
				Options: []option.RequestOption{
					option.WithBaseURL("http://secondary.sim/"),
					option.WithAPIKey("sim-key-secondary"),
					option.WithHTTPClient(&http.Client{Transport: env.secondary}),
				},
			}))
			if err != nil {
				return nil, err
			}
			client := newSDKClient(env.transport, d.Option())
			return func(ctx context.Context) error {
				var rep damper.Report
				_, err := client.Messages.New(ctx, env.params, damper.ReportInto(&rep))
				if len(rep.Fallbacks) > 0 {
					env.moved(rep.Fallbacks[0].Reason)
				}
				return err
			}, nil
		},
	}
}

// FallbackFigures are the numbers of one contender in the fallback
// scenario.
type FallbackFigures struct {
	// Requests were issued during the outage; SuccessShare of them
	// succeeded, BySecondary were answered by the secondary provider. P50
	// and P99 are their latency, successes and failures alike.
	Requests, BySecondary int
	SuccessShare          float64
	P50, P99              time.Duration
	// Skipped of them sent no attempt to the primary; Moves counts them by
	// the reason of their first move to the secondary, as Damper's report
	// gives it.
	Skipped int
	Moves   map[string]int
	// AllRequests were issued in the whole run; AllSuccessShare of them
	// succeeded, AllBySecondary were answered by the secondary.
	AllRequests, AllBySecondary int
	AllSuccessShare             float64
	// PrimaryAttempts arrived at the primary during the outage,
	// PrimaryRate a second; SecondaryAttempts arrived at the secondary in
	// the whole run.
	PrimaryAttempts, SecondaryAttempts int
	PrimaryRate                        float64
	// AllOpen is when, from the outage's start, the last replica's
	// breaker first opened during the outage (AllOpened false: some
	// replica's never did); OpenRate is the primary's attempts a second
	// from then to the outage's end.
	AllOpen   time.Duration
	AllOpened bool
	OpenRate  float64
	// AfterRequests were issued in the FallbackAfter after the outage;
	// AfterByPrimary is the share of them the primary answered.
	AfterRequests  int
	AfterByPrimary float64
	// Back is the time from the outage's end until every request issued
	// from then on, to the end of arrivals, is answered by the primary;
	// Returned is false if that never happens.
	Back     time.Duration
	Returned bool
}

// FallbackFigures computes the fallback figures of r.
func (r *Result) FallbackFigures() FallbackFigures {
	inc := r.Scenario.Provider.Incident
	from, to := inc.Start, inc.Start+inc.Length
	f := FallbackFigures{Moves: map[string]int{}}
	var ok, allOK, afterPrimary int
	var lat []time.Duration
	for _, q := range r.Requests {
		f.AllRequests++
		if q.OK {
			allOK++
		}
		if q.OK && q.BySecondary {
			f.AllBySecondary++
		}
		switch {
		case q.Issued >= from && q.Issued < to:
			f.Requests++
			lat = append(lat, q.Ended-q.Issued)
			if q.OK {
				ok++
			}
			if q.OK && q.BySecondary {
				f.BySecondary++
			}
			if q.Attempts == q.Secondary {
				f.Skipped++
			}
			if q.Moved != "" {
				f.Moves[q.Moved]++
			}
		case q.Issued >= to && q.Issued < to+FallbackAfter:
			f.AfterRequests++
			if q.OK && !q.BySecondary {
				afterPrimary++
			}
		}
	}
	if f.Requests > 0 {
		f.SuccessShare = float64(ok) / float64(f.Requests)
		slices.Sort(lat)
		f.P50, f.P99 = quantile(lat, 0.50), quantile(lat, 0.99)
	}
	if f.AllRequests > 0 {
		f.AllSuccessShare = float64(allOK) / float64(f.AllRequests)
	}
	if f.AfterRequests > 0 {
		f.AfterByPrimary = float64(afterPrimary) / float64(f.AfterRequests)
	}
	f.SecondaryAttempts = len(r.SecondaryAttempts)

	opened := map[int]time.Duration{}
	for _, e := range r.Circuit {
		if _, seen := opened[e.Replica]; !seen && e.To == fleet.CircuitOpen && e.Backend == damper.PrimaryBackend && e.At >= from && e.At < to {
			opened[e.Replica] = e.At
		}
	}
	if len(opened) == r.Scenario.Replicas {
		f.AllOpened = true
		for _, at := range opened {
			f.AllOpen = max(f.AllOpen, at-from)
		}
	}
	var afterOpen int
	for _, a := range r.Attempts {
		if a.At < from || a.At >= to {
			continue
		}
		f.PrimaryAttempts++
		if f.AllOpened && a.At >= from+f.AllOpen {
			afterOpen++
		}
	}
	f.PrimaryRate = float64(f.PrimaryAttempts) / inc.Length.Seconds()
	if f.AllOpened && f.AllOpen < inc.Length {
		f.OpenRate = float64(afterOpen) / (inc.Length - f.AllOpen).Seconds()
	}
	f.Back, f.Returned = r.back(to)
	return f
}

// back finds the first whole second at or after end from which every
// request issued, to the end of arrivals, was answered by the primary.
func (r *Result) back(end time.Duration) (time.Duration, bool) {
	seconds := int(r.Scenario.Duration / time.Second)
	away := make([]bool, seconds) // a request issued in the second was not the primary's
	for _, q := range r.Requests {
		if sec := int(q.Issued / time.Second); sec < seconds && (!q.OK || q.BySecondary) {
			away[sec] = true
		}
	}
	first := int((end + time.Second - 1) / time.Second)
	back := seconds
	for sec := seconds - 1; sec >= first && !away[sec]; sec-- {
		back = sec
	}
	if back >= seconds {
		return 0, false
	}
	return time.Duration(back)*time.Second - end, true
}

// FallbackSuite is the fallback scenario with the results of its
// contenders.
type FallbackSuite struct {
	Scenario Scenario
	Results  []*Result // in contender order
}

// RunFallback runs sc with every contender.
func RunFallback(sc Scenario, contenders []Contender) (*FallbackSuite, error) {
	if sc.Secondary == nil {
		return nil, fmt.Errorf("brownout: scenario %q: Secondary is nil: the fallback scenario needs a second provider", sc.Name)
	}
	results, err := runEach(sc, contenders)
	if err != nil {
		return nil, err
	}
	return &FallbackSuite{Scenario: sc, Results: results}, nil
}

func (s *FallbackSuite) figures() map[string]FallbackFigures {
	out := map[string]FallbackFigures{}
	for _, r := range s.Results {
		out[r.Contender] = r.FallbackFigures()
	}
	return out
}

func (s *FallbackSuite) result(contender string) (*Result, bool) {
	return resultOf(s.Results, contender)
}

// FallbackSuccessShare is the share of requests that the recommended
// policy with a backend must answer, during the outage and over the run.
const FallbackSuccessShare = 0.99

// The fallback targets.
const (
	fallbackTargetOutage    = "fallback: damper+breaker+fallback answers at least 99 % of the requests issued during the primary's outage"
	fallbackTargetAll       = "fallback: damper+breaker+fallback answers at least 99 % of all the requests of the run"
	fallbackTargetProbes    = "fallback: the primary's load bounded by the breakers: once a replica's breaker has opened, at most one of its attempts per open period reaches the primary while the outage lasts"
	fallbackTargetBack      = "fallback: traffic returns to the primary: every request issued from the breaker's longest open period, a service time and a second after the outage's end is answered by the primary"
	fallbackTargetNoBreaker = "fallback: without a breaker (damper+fallback) the requests are answered too, but every one of them tries the primary first"
)

// BackWithin is the bound of the return target: a breaker open when the
// outage ends stays open at most its longest open period, then its probe
// takes at most a service time; and a second, as the probe is its
// replica's next call and the figure counts whole seconds.
func (s *FallbackSuite) BackWithin() time.Duration {
	return recommended.Breaker.MaxOpenFor + s.Scenario.Provider.ServiceMax + time.Second
}

// Checks evaluates the fallback targets.
func (s *FallbackSuite) Checks() []Check {
	var checks []Check
	add := func(target string, pass bool, detail string, args ...any) {
		checks = append(checks, Check{Target: target, Pass: pass, Detail: fmt.Sprintf(detail, args...)})
	}
	f := s.figures()
	c, ok := f[fallbackName]
	add(fallbackTargetOutage, ok && c.Requests > 0 && c.SuccessShare >= FallbackSuccessShare,
		"%.2f %% of %d; %d answered by the secondary", 100*c.SuccessShare, c.Requests, c.BySecondary)
	add(fallbackTargetAll, ok && c.AllRequests > 0 && c.AllSuccessShare >= FallbackSuccessShare,
		"%.2f %% of %d; %d answered by the secondary", 100*c.AllSuccessShare, c.AllRequests, c.AllBySecondary)

	var tallies []ProbeTally
	if r, ok := s.result(fallbackName); ok {
		tallies = r.ProbeTallies()
	}
	var worst ProbeTally
	for i, t := range tallies {
		if i == 0 || t.Attempts-t.OpenPeriods > worst.Attempts-worst.OpenPeriods {
			worst = t
		}
	}
	sdk := f[sdkName]
	within := true
	for _, t := range tallies {
		within = within && t.Attempts <= t.OpenPeriods
	}
	add(fallbackTargetProbes, ok && len(tallies) == s.Scenario.Replicas && within,
		"%d of %d replicas' breakers opened, the last %s into the outage; worst replica: %d attempts in %d open periods; the primary got %d attempts during the outage (%.2f/s; %.2f/s once every breaker had opened), against %d (%.2f/s) from %s",
		len(tallies), s.Scenario.Replicas, secs(c.AllOpen), worst.Attempts, worst.OpenPeriods,
		c.PrimaryAttempts, c.PrimaryRate, c.OpenRate, sdk.PrimaryAttempts, sdk.PrimaryRate, sdkName)

	bound := s.BackWithin()
	add(fallbackTargetBack, ok && c.Returned && c.Back <= bound,
		"every request answered by the primary from %s after the end (bound %s); in the minute after, %.1f %% of %d", backText(c), secs0(bound), 100*c.AfterByPrimary, c.AfterRequests)

	n, ok := f[fallbackNoBreakerName]
	add(fallbackTargetNoBreaker, ok && n.Requests > 0 && n.SuccessShare >= FallbackSuccessShare && n.Skipped == 0,
		"%.2f %% of %d answered, %d without an attempt at the primary (damper+breaker+fallback: %d); the primary got %d attempts during the outage (%.2f/s), against %d from damper+breaker+fallback",
		100*n.SuccessShare, n.Requests, n.Skipped, c.Skipped, n.PrimaryAttempts, n.PrimaryRate, c.PrimaryAttempts)
	return checks
}

func backText(f FallbackFigures) string {
	if !f.Returned {
		return "never, within the run"
	}
	return f.Back.Round(time.Second).String()
}
