package brownout

import (
	"fmt"
	"time"
)

// Defaults of the published run. Each replica sends 5 logical requests a
// second, a modest service; the provider has 25 % headroom over the
// offered load, and each call takes 1 to 3 s, like a short Messages call.
const (
	DefaultReplicas        = 10
	RatePerReplica         = 5.0
	Headroom               = 1.25
	DefaultSeed     uint64 = 20261125
)

// PublishedStart is when the incident of every published scenario begins:
// half way through a budget window, so that no scenario is flattered by
// an incident that begins with a fresh window.
const PublishedStart = 90 * time.Second

// OutageStarts returns the incident starts at which the outage is run to
// find each contender's worst case. Damper's budget windows are fixed, 60 s
// long and aligned to the minute, so the outage's effect on it depends on
// the phase of its start within a window; these starts cover one whole
// window every 5 s, and its last second.
func OutageStarts() []time.Duration {
	var starts []time.Duration
	for s := 60; s < 120; s += 5 {
		starts = append(starts, time.Duration(s)*time.Second)
	}
	return append(starts, 119*time.Second)
}

// OutageAt returns the scenario sc with its incident moved to start and
// its name marked with the start; at sc's own start, it returns sc.
func OutageAt(sc Scenario, start time.Duration) Scenario {
	if start != sc.Provider.Incident.Start {
		sc.Name = fmt.Sprintf("%s-at-%ds", sc.Name, int(start/time.Second))
		sc.Provider.Incident.Start = start
	}
	return sc
}

// Scenarios returns the scenarios of the benchmark for the given number of
// replicas (the offered load grows with it; per-replica figures do not).
func Scenarios(replicas int) []Scenario {
	rate := RatePerReplica * float64(replicas)
	provider := func(inc Incident, rejectCost float64) Provider {
		return Provider{
			Capacity:      Headroom * rate,
			RejectCost:    rejectCost,
			ServiceMin:    time.Second,
			ServiceMax:    3 * time.Second,
			RejectLatency: 50 * time.Millisecond,
			Incident:      inc,
		}
	}
	base := func(name, title string, p Provider) Scenario {
		return Scenario{
			Name:     name,
			Title:    title,
			Provider: p,
			Replicas: replicas,
			Rate:     rate,
			Duration: 360 * time.Second,
			Deadline: 30 * time.Second,
			Seed:     DefaultSeed,
		}
	}
	const start = PublishedStart
	return []Scenario{
		base("outage", "Full outage: every attempt gets 529 for 120 s",
			provider(Incident{Kind: Outage, Start: start, Length: 120 * time.Second}, 0)),
		base("brownout", "Brownout: 10 % of attempts fail with 500 for 120 s",
			provider(Incident{Kind: Brownout, Start: start, Length: 120 * time.Second, FailShare: 0.10}, 0)),
		base("capacity-drop", "Capacity drop to 50 % of the offered load for 60 s; rejections free",
			provider(Incident{Kind: CapacityDrop, Start: start, Length: 60 * time.Second, Capacity: 0.5 * rate}, 0)),
		base("capacity-drop-costly", "Capacity drop to 50 % of the offered load for 60 s; a rejection costs half a served attempt",
			provider(Incident{Kind: CapacityDrop, Start: start, Length: 60 * time.Second, Capacity: 0.5 * rate}, 0.5)),
	}
}
