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
	fmt.Fprintf(&b, "The provider is another model than the scenarios' above: it serves attempts by processor sharing over %d cores. An admitted attempt needs %v–%v of one core's work; with *n* attempts held, each progresses at min(1, %d/*n*) of a core, recomputed at every arrival and departure, so up to %d attempts are served at full speed and beyond that every one of them slows alike: with twice as many held, each takes twice its work. ",
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
	b.WriteString("\n")
	writeFailsafeLimiter(&b)

	b.WriteString("**Figures** are over every request of the run: *successful* requests, with *goodput* the requests issued during the surge that succeeded, a second of the surge; the latency of the successful requests, from issue to the end of the call; the shares of the requests refused by the concurrency limit (`damper.ErrConcurrencyLimited`), refused by an open breaker (`damper.ErrCircuitOpen`), ended by the deadline, and failed otherwise (529s that the retries did not get past); the provider's attempts, in all and per request, and its 529s; and the most attempts it held at once.\n\n")
	b.WriteString("| contender | successful | goodput /s, surge | p50 | p95 | p99 | limited | breaker | timed out | other failures | provider attempts | per request | 529s | peak held |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range s.Results {
		f := r.SaturationFigures()
		fmt.Fprintf(&b, "| %s | %d of %d | %.2f | %s | %s | %s | %.1f %% | %.1f %% | %.1f %% | %.1f %% | %d | %.3fx | %d | %d |\n",
			r.Contender, f.OK, f.Requests, f.SurgeGoodput, secs(f.P50), secs(f.P95), secs(f.P99),
			100*f.Limited, 100*f.CircuitOpen, 100*f.TimedOut, 100*f.Failed, f.Attempts, f.PerRequest, f.Rejected, f.PeakHeld)
	}
	b.WriteString("\n")

	writeChecks(&b, "#### Saturation targets", s.Checks())
	b.WriteString("\n")
	s.writeTrace(&b)
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
	fmt.Fprintf(b, "**Over time.** Every %s from %s to %s: the most attempts the provider held in that time, its 529s and the requests that succeeded, for each contender (*held / 529s / successful*).\n\n",
		secs0(SaturationTraceStep), secs0(from), secs0(to))
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
			fmt.Fprintf(b, " %d / %d / %d |", held, rejected, ok)
		}
		b.WriteString("\n")
	}
	b.WriteString("\n")
}

// writeFailsafeLimiter says why failsafe-go's adaptive limiter is not a
// contender.
func writeFailsafeLimiter(b *strings.Builder) {
	b.WriteString("**failsafe-go's adaptive limiter** cannot run in virtual time, on two counts. It measures each execution on the wall clock: `adaptiveLimiter.newPermit` (`adaptivelimiter/adaptivelimiter.go`) gives every permit `util.WallClock` as its clock and `time.Now()` as its start, `recordingPermit.Record` takes the latency sample from them, and `adaptiveLimiter.record` compares that clock's time against `nextUpdateTime`, itself set from `time.Now()` in `config.Build`; in the simulation, every sample would be the microseconds of wall-clock time that computing an attempt takes, not its seconds of virtual time, so the limit would follow nothing the provider does. ")
	b.WriteString("And a full limiter blocks where the scheduler cannot see it: `DynamicSemaphore.AcquireWithMaxWait` (`internal/util/semaphore.go`), behind `AcquirePermitWithMaxWait`, waits in a `select` on a channel, the context and a `time.NewTimer`, so the one process the scheduler is running would stop without handing control back, and the simulation with it. It is therefore left out of this scenario.\n\n")
}
