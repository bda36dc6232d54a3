package brownout

import (
	"fmt"
	"strings"
	"time"
)

// SaturationTraceStep is the step of the trace the report writes.
const SaturationTraceStep = 5 * time.Second

// Markdown returns the saturation part of the section: setup, contenders,
// the table, the targets, a trace and what the run shows.
func (s *SaturationSuite) Markdown() string {
	var b strings.Builder
	sc := s.Scenario
	p, u := sc.Saturating, sc.Surge
	work := (p.WorkMin + p.WorkMax).Seconds() / 2
	fmt.Fprintf(&b, "### %s\n\n", sc.Title)
	fmt.Fprintf(&b, "**Setup.** %d replicas share %.0f new logical requests a second (Poisson arrivals, each sent to a random replica) for %v, and %.0f a second (%gx) from %s to %s of the run; every request has a %v deadline. ",
		sc.Replicas, sc.Rate, sc.Duration, sc.Rate*u.Factor, u.Factor, secs0(u.Start), secs0(u.Start+u.Length), sc.Deadline)
	fmt.Fprintf(&b, "This provider is not the token bucket of the scenarios above: it serves attempts by processor sharing over %d cores. An admitted attempt needs %v–%v of one core's work; with *n* attempts held, each progresses at min(1, %d/*n*) of a core, recomputed at every arrival and departure, so up to %d attempts are served at full speed and beyond that every one of them slows alike: with twice as many held, each takes twice its work. ",
		p.Cores, p.WorkMin, p.WorkMax, p.Cores, p.Cores)
	fmt.Fprintf(&b, "The cores are sized as the capacity of the scenarios above is, %.0f %% headroom over the normal load at the mean work of %g s (%d cores serve %.1f attempts a second); the surge asks for %.0f, %.2fx what it serves. ",
		100*(Headroom-1), work, p.Cores, float64(p.Cores)/work, sc.Rate*u.Factor, sc.Rate*u.Factor*work/float64(p.Cores))
	fmt.Fprintf(&b, "It holds at most %d attempts (%d times its cores, where an attempt takes %d times its work, %v–%v, around the deadline); one that arrives when it holds that many gets 529 `overloaded_error` after %v, taking no work. An attempt whose caller gives up (the deadline, an attempt timeout) leaves at once, and the work done on it is lost. ",
		p.Depth, p.Depth/p.Cores, p.Depth/p.Cores, time.Duration(p.Depth/p.Cores)*p.WorkMin, time.Duration(p.Depth/p.Cores)*p.WorkMax, p.RejectLatency)
	b.WriteString("So a provider held past its cores answers every attempt later, and once its answers come after the callers' deadlines its work is spent on attempts nobody waits for: the collapse that a limit on the attempts in flight is meant to prevent. The model's parameters are in `bench/brownout/saturation.go`.\n\n")

	b.WriteString("| contender | configuration and code path |\n|---|---|\n")
	for _, r := range s.Results {
		fmt.Fprintf(&b, "| %s | %s |\n", r.Contender, saturationPath(r.Contender, sc.Replicas))
	}
	fmt.Fprintf(&b, "\n**Contenders.** *damper+breaker* is `damper.RecommendedPolicy()`, as in the tables above; the others add Damper's concurrency limit to it, each replica's Damper with a limit of its own on the attempts it has in flight. An attempt that finds no slot waits in line for one, up to `MaxWait` (%s) and not past the caller's deadline, and the call then fails with `damper.ErrConcurrencyLimited`, having sent nothing. *damper+breaker+fixed-limit* is given the provider's capacity: its %d cores shared among the %d replicas, %d each. *damper+breaker+adaptive* is given nothing: its limit follows the latency of its own attempts, growing while they take less than `Tolerance` (%g) times their best, shrinking when they take longer; *damper+breaker+adaptive-%g* is the same with a `Tolerance` of %g, for a provider whose attempts' times spread as little as this one's.\n\n",
		secs0(defaults.Concurrency.MaxWait), p.Cores, sc.Replicas, SaturationFixedLimit(sc.Replicas), defaults.Concurrency.Tolerance, SaturationTolerance, SaturationTolerance)
	writeFailsafeLimiter(&b)

	b.WriteString("**Figures** are over every request of the run: *successful* requests, with *goodput* the requests issued during the surge that succeeded, a second of the surge; the latency of the successful requests, from issue to the end of the call, and of its 99th percentile what came before the request's last attempt reached the provider (*before*: the wait for a slot, backoffs, attempts that failed) and what that attempt took there (*at the provider*), each its own percentile; the shares of the requests refused by the concurrency limit (`damper.ErrConcurrencyLimited`), refused by an open breaker (`damper.ErrCircuitOpen`), ended by the deadline, and failed otherwise (529s that the retries did not get past); the provider's attempts, in all and per request, and its 529s; and the most attempts it held at once.\n\n")
	b.WriteString("| contender | successful | goodput /s, surge | p50 | p95 | p99 | p99 before | p99 at the provider | limited | breaker | timed out | other failures | provider attempts | per request | 529s | peak held |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range s.Results {
		f := r.SaturationFigures()
		fmt.Fprintf(&b, "| %s | %d of %d | %.2f | %s | %s | %s | %s | %s | %.1f %% | %.1f %% | %.1f %% | %.1f %% | %d | %.3fx | %d | %d |\n",
			r.Contender, f.OK, f.Requests, f.SurgeGoodput, secs(f.P50), secs(f.P95), secs(f.P99), secs(f.P99Before), secs(f.P99Provider),
			100*f.Limited, 100*f.CircuitOpen, 100*f.TimedOut, 100*f.Failed, f.Attempts, f.PerRequest, f.Rejected, f.PeakHeld)
	}
	b.WriteString("\n")

	checks := s.Checks()
	writeChecks(&b, "#### Saturation targets", checks)
	b.WriteString("\n")
	s.writeTrace(&b)
	s.writeSaturationWhy(&b, checks)
	return b.String()
}

// saturationPath is the configuration and code path of the saturation
// contender called name.
func saturationPath(name string, replicas int) string {
	for _, c := range SaturationContenders(replicas) {
		if c.Name == name {
			return c.Path
		}
	}
	return ""
}

// writeTrace writes, every SaturationTraceStep from a little before the
// surge until the provider is back to its normal load, the most attempts
// the provider held, its 529s and the goodput of each contender.
func (s *SaturationSuite) writeTrace(b *strings.Builder) {
	u := s.Scenario.Surge
	from, to := u.Start-2*SaturationTraceStep, u.Start+u.Length+s.Scenario.Deadline+4*SaturationTraceStep
	fmt.Fprintf(b, "**Over time.** Every %s from %s to %s: the most attempts the provider held in that time, its 529s and the requests that succeeded, for each contender (*held / 529s / successful*); for a contender with a concurrency limit, the sum of the replicas' limits at the start of the %s, as each Damper's gauge `damper.concurrency.limit` reports it, and the lowest and highest of them (*limits: sum, lowest–highest*).\n\n",
		secs0(SaturationTraceStep), secs0(from), secs0(to), secs0(SaturationTraceStep))
	b.WriteString("| from |")
	for _, r := range s.Results {
		fmt.Fprintf(b, " %s |", r.Contender)
	}
	b.WriteString("\n|---:|")
	for range s.Results {
		b.WriteString("---:|")
	}
	b.WriteString("\n")
	traces := make([][]SaturationSecond, len(s.Results))
	for i, r := range s.Results {
		traces[i] = r.Trace(from, to)
	}
	step := int(SaturationTraceStep / time.Second)
	for i := 0; i < len(traces[0]); i += step {
		fmt.Fprintf(b, "| %s |", secs0(time.Duration(traces[0][i].Second)*time.Second))
		for _, tr := range traces {
			held, rejected, ok := 0, 0, 0
			for _, x := range tr[i:min(i+step, len(tr))] {
				held, rejected, ok = max(held, x.Held), rejected+x.Rejected, ok+x.Goodput
			}
			fmt.Fprintf(b, " %d / %d / %d", held, rejected, ok)
			if sum, lo, hi, ok := limitSpread(tr[i].LimitByReplica); ok {
				fmt.Fprintf(b, "; limits: %d, %d–%d", sum, lo, hi)
			}
			b.WriteString(" |")
		}
		b.WriteString("\n")
	}
	b.WriteString("\n")
}

// limitSpread is the sum, the lowest and the highest of the replicas'
// limits; ok is false when they have none.
func limitSpread(limits []int) (sum, lo, hi int, ok bool) {
	for i, v := range limits {
		if v < 0 {
			return 0, 0, 0, false
		}
		sum += v
		if i == 0 || v < lo {
			lo = v
		}
		hi = max(hi, v)
	}
	return sum, lo, hi, len(limits) > 0
}

// limitSum is the sum of r's replicas' limits at second sec, or -1.
func limitSum(r *Result, sec int) int {
	sum := 0
	for _, by := range r.Limit {
		if sec >= len(by) || by[sec] < 0 {
			return -1
		}
		sum += by[sec]
	}
	return sum
}

// adaptiveCourse is how the adaptive limit went through the surge.
type adaptiveCourse struct {
	// AtStart is the sum of the replicas' limits when the surge began;
	// Cut is the first second, from the surge's start, at which that sum
	// was a tenth or more lower, CutTo the sum then; Cut is -1 if that
	// never happened during the surge.
	AtStart, CutTo int
	Cut            time.Duration
	// After is the sum of the limits at the end of the run's arrivals.
	After int
	// PeakBefore is the most attempts held from the surge's start to the
	// cut; Settled the mean sum of the limits and HeldSettled the mean of
	// the most held each second, from 5 s after the cut to the surge's
	// end.
	PeakBefore           int
	Settled, HeldSettled float64
}

// course follows r's limits through the surge.
func (s *SaturationSuite) course(r *Result) adaptiveCourse {
	u := s.Scenario.Surge
	start, end := int(u.Start/time.Second), int((u.Start+u.Length)/time.Second)
	c := adaptiveCourse{AtStart: limitSum(r, start), Cut: -1, After: limitSum(r, int(s.Scenario.Duration/time.Second))}
	cut := end
	for sec := start + 1; sec < end && c.AtStart >= 0; sec++ {
		if sum := limitSum(r, sec); sum >= 0 && sum <= c.AtStart*9/10 {
			c.Cut, c.CutTo, cut = time.Duration(sec)*time.Second-u.Start, limitSum(r, sec), sec
			break
		}
	}
	for sec := start; sec < min(cut, len(r.Held)); sec++ {
		c.PeakBefore = max(c.PeakBefore, r.Held[sec])
	}
	n := 0
	for sec := cut + 5; sec < end && sec < len(r.Held); sec++ {
		c.Settled += float64(limitSum(r, sec))
		c.HeldSettled += float64(r.Held[sec])
		n++
	}
	if n > 0 {
		c.Settled /= float64(n)
		c.HeldSettled /= float64(n)
	}
	return c
}

// writeSaturationWhy says what the run shows, how the fixed limit
// compares, and why a target was missed.
func (s *SaturationSuite) writeSaturationWhy(b *strings.Builder, checks []Check) {
	f := s.figures()
	sc := s.Scenario
	p := sc.Saturating
	rec, okRec := f[recommendedName]
	fx, okFx := f[fixedLimitName]
	a, okA := f[adaptiveLimitName]
	if okRec {
		fmt.Fprintf(b, "**Without a limit.** damper+breaker sends every request's attempt, and the surge's excess piles up at the provider: it holds up to %d attempts, its depth, where each takes %d times its work; %.1f %% of the requests end by their deadline, their work lost, and %d attempts get 529. It answers %.2f requests a second during the surge, against the %.1f its cores serve when no work is lost, and the latency of its successes runs up to the deadline (p99 %s).\n\n",
			rec.PeakHeld, rec.PeakHeld/p.Cores, 100*rec.TimedOut, rec.Rejected, rec.SurgeGoodput, float64(p.Cores)/((p.WorkMin+p.WorkMax).Seconds()/2), secs(rec.P99))
	}
	if okFx {
		fmt.Fprintf(b, "**A fixed limit that knows the capacity.** With %d attempts in flight per replica, %d in all against %d cores, the provider holds at most %d and serves each attempt at full speed or nearly (p99 at the provider %s); the surge's excess is refused in the replicas after waiting up to %s for a slot (%.1f %% of the run's requests), nothing times out, and goodput during the surge is %.2f a second. Its p99 is %s, of which up to %s is the wait for a slot. ",
			SaturationFixedLimit(sc.Replicas), SaturationFixedLimit(sc.Replicas)*sc.Replicas, p.Cores, fx.PeakHeld, secs(fx.P99Provider), secs0(defaults.Concurrency.MaxWait), 100*fx.Limited, fx.SurgeGoodput, secs(fx.P99), secs(fx.P99Before))
		if okRec && rec.P99 > 0 {
			fmt.Fprintf(b, "Against damper+breaker, that is %.1f %% lower latency at the 99th percentile, %+d successful requests and %+d provider attempts. ",
				100*(1-fx.P99.Seconds()/rec.P99.Seconds()), fx.OK-rec.OK, fx.Attempts-rec.Attempts)
		}
		b.WriteString("Such a limit needs the provider's capacity and the number of replicas, both of which change.\n\n")
	}
	r, ok := s.result(adaptiveLimitName)
	if !okA || !ok {
		return
	}
	c := s.course(r)
	fmt.Fprintf(b, "**The adaptive limit.** Each replica's limit starts at %d and grows while attempts take less than the tolerance (%g) times their best and an attempt finds it full: before the surge, at about %.0f attempts in flight per replica on average and more at the peaks of its arrivals, the replicas' limits grew to %d in all, %.1fx the cores. ",
		defaults.Concurrency.Initial, defaults.Concurrency.Tolerance, sc.Rate*(p.WorkMin+p.WorkMax).Seconds()/2/float64(sc.Replicas), c.AtStart, float64(c.AtStart)/float64(p.Cores))
	if c.Cut >= 0 {
		fmt.Fprintf(b, "The surge fills them: the provider holds up to %d, and attempts take %.1fx their work, until the replicas' limits are cut, each once a cohort of %d attempts sent at that load has ended; by %s into the surge they are down by a tenth or more, to %d in all. ",
			c.PeakBefore, float64(c.PeakBefore)/float64(p.Cores), 20, secs0(c.Cut), c.CutTo)
		fmt.Fprintf(b, "For the rest of the surge they stay near %.0f in all (the provider holding %.0f, %.2fx its cores), where attempts take up to the tolerance (%g) times their best: p99 at the provider %s, against %s with the fixed limit. ",
			c.Settled, c.HeldSettled, c.HeldSettled/float64(p.Cores), defaults.Concurrency.Tolerance, secs(a.P99Provider), secs(fx.P99Provider))
	}
	fmt.Fprintf(b, "Nothing times out and the provider sends no 529: goodput during the surge is %.2f a second, %d requests succeed in the run, and the provider gets %d attempts. ",
		a.SurgeGoodput, a.OK, a.Attempts)
	if okFx && a.OK == fx.OK {
		b.WriteString("That is the fixed limit's count exactly, though not the same requests: both limits keep the provider's cores busy through the surge and lose no work, and the provider draws the work of its n-th attempt alike in every run. ")
	}
	if c.After >= 0 {
		fmt.Fprintf(b, "Once the surge is over, the limits grow again as the peaks of the load find them full: %d in all at the end of the run, %.1fx the cores, which the next surge would find.", c.After, float64(c.After)/float64(p.Cores))
	}
	b.WriteString("\n\n")
	for _, ch := range checks {
		if ch.Target == saturationTargetP99 && !ch.Pass && okRec {
			fmt.Fprintf(b, "**Why the latency target is missed.** Half of damper+breaker's p99 is %s, and the adaptive limit's is %s. Three things add up. The limit keeps the provider's latency within its tolerance, %g times the best: by design it settles where the provider holds about that many times its cores, so attempts take up to half as long again as they need (p99 at the provider %s). It grew before the surge to the peaks of the normal load, so the surge first found %.1fx the cores' worth of slots and the provider slowed to match, until a cohort of %d attempts at that load had ended. And a request that waits for a slot waits up to %s (p99 before its attempt: %s), which is latency too.",
				secs(rec.P99/2), secs(a.P99), defaults.Concurrency.Tolerance, secs(a.P99Provider), float64(c.AtStart)/float64(p.Cores), 20, secs0(defaults.Concurrency.MaxWait), secs(a.P99Before))
			if t, ok := f[fmt.Sprintf("%s-%g", adaptiveLimitName, SaturationTolerance)]; ok && rec.P99 > 0 {
				fmt.Fprintf(b, " With a tolerance of %g the limits settle closer to the cores: p99 %s (%.1f %% lower than damper+breaker's), p99 at the provider %s, %d successful requests, %.2f a second during the surge, %d provider attempts. The default stays %g because this provider's work spreads little (1 s to 3 s): against the heavy tail of a model's answer times (log-normal, the slowest in a hundred 6 times the median), a tolerance of %g takes noise for load and cuts the limit to nothing at times, where %g holds it near the capacity (`TestConcurrencyLimitWithHeavyTails`).",
					SaturationTolerance, secs(t.P99), 100*(1-t.P99.Seconds()/rec.P99.Seconds()), secs(t.P99Provider), t.OK, t.SurgeGoodput, t.Attempts, defaults.Concurrency.Tolerance, SaturationTolerance, defaults.Concurrency.Tolerance)
			}
			b.WriteString("\n\n")
		}
		if ch.Target == saturationTargetGoodput && !ch.Pass {
			b.WriteString("**Why the goodput target is missed.** The adaptive limit's successful requests or its goodput during the surge fall short of damper+breaker's: see the table and the trace above.\n\n")
		}
		if ch.Target == saturationTargetAttempts && !ch.Pass {
			b.WriteString("**Why the attempts target is missed.** The adaptive limit sends the provider more attempts than damper+breaker: see the table above.\n\n")
		}
	}
}

// writeFailsafeLimiter says why failsafe-go's adaptive limiter is not a
// contender.
func writeFailsafeLimiter(b *strings.Builder) {
	b.WriteString("**failsafe-go's adaptive limiter** cannot run in virtual time, on two counts. It measures each execution on the wall clock: `adaptiveLimiter.newPermit` (`adaptivelimiter/adaptivelimiter.go`) gives every permit `util.WallClock` as its clock and `time.Now()` as its start, `recordingPermit.Record` takes the latency sample from them, and `adaptiveLimiter.record` compares that clock's time against `nextUpdateTime`, itself set from `time.Now()` in `config.Build`; in the simulation, every sample would be the microseconds of wall-clock time that computing an attempt takes, not its seconds of virtual time, so the limit would follow nothing the provider does. ")
	b.WriteString("And a full limiter blocks where the scheduler cannot see it: `DynamicSemaphore.AcquireWithMaxWait` (`internal/util/semaphore.go`), behind `AcquirePermitWithMaxWait`, waits in a `select` on a channel, the context and a `time.NewTimer`, so the one process the scheduler is running would stop without handing control back, and the simulation with it. It is therefore left out of this scenario.\n\n")
}
