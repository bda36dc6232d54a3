package brownout

import "time"

// Defaults of the published run. Each replica sends 5 logical requests a
// second, a modest service; the provider has 25 % headroom over the
// offered load, and each call takes 1 to 3 s, like a short Messages call.
const (
	DefaultReplicas        = 10
	RatePerReplica         = 5.0
	Headroom               = 1.25
	DefaultSeed     uint64 = 20261125
)

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
	const start = 90 * time.Second // mid-window: no flattering alignment
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
