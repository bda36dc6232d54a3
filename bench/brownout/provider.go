package brownout

import (
	"math/rand/v2"
	"time"
)

// Provider is the simulated Messages API: a service of finite capacity that
// every contender's attempts share.
//
// Capacity is work per virtual second, kept as a token bucket that refills
// at Capacity and holds at most one second of it (so that ordinary bursts
// of arrivals are absorbed): a served attempt costs one unit, and an
// attempt that arrives when less than one unit is left is turned away at
// once with 529 overloaded_error. Turning an attempt away may itself cost
// work (RejectCost units: the TLS handshake, authentication, parsing and
// routing of the prompt that happen before a front end can refuse it);
// that cost is taken from the capacity still to come, at most one second
// ahead.
// When rejections cost work, retries of rejected attempts eat the capacity
// that fresh requests need, which is how a retry storm outlives its cause.
type Provider struct {
	// Capacity is the work per second the provider can do when healthy.
	Capacity float64
	// RejectCost is the work one rejected attempt costs, in units of a
	// served attempt.
	RejectCost float64
	// ServiceMin and ServiceMax bound the time a served attempt takes
	// (uniform).
	ServiceMin, ServiceMax time.Duration
	// RejectLatency is the time a rejection or an outage error takes.
	RejectLatency time.Duration
	// Incident is what goes wrong, and when.
	Incident Incident
}

// IncidentKind names what goes wrong during an incident.
type IncidentKind int

const (
	// Outage: every attempt fails at once with 529.
	Outage IncidentKind = iota + 1
	// Brownout: a fraction of the served attempts fail with 500 api_error
	// after doing their work.
	Brownout
	// CapacityDrop: capacity falls to a fraction of the offered load.
	CapacityDrop
)

// Incident is a degradation of the provider over [Start, Start+Length).
type Incident struct {
	Kind   IncidentKind
	Start  time.Duration // from the start of the run
	Length time.Duration
	// FailShare is, for a Brownout, the share of attempts that fail.
	FailShare float64
	// Capacity is, for a CapacityDrop, the capacity during the incident,
	// in work per second.
	Capacity float64
}

// providerState is a Provider during one run.
type providerState struct {
	Provider
	start time.Time
	rng   *rand.Rand
	last  time.Time // when left was last brought up to date
	left  float64   // work available now; negative is debt
}

// response is what one attempt gets back, after latency.
type response struct {
	status  int
	errType string
	latency time.Duration
}

func (p *providerState) capacityAt(now time.Time) float64 {
	if p.inIncident(now) && p.Incident.Kind == CapacityDrop {
		return p.Incident.Capacity
	}
	return p.Capacity
}

func (p *providerState) inIncident(now time.Time) bool {
	t := now.Sub(p.start)
	return p.Incident.Kind != 0 && t >= p.Incident.Start && t < p.Incident.Start+p.Incident.Length
}

// attempt decides the fate of an attempt arriving at now.
func (p *providerState) attempt(now time.Time) response {
	if p.inIncident(now) && p.Incident.Kind == Outage {
		return response{status: 529, errType: "overloaded_error", latency: p.RejectLatency}
	}
	capacity := p.capacityAt(now)
	p.left = min(p.left+capacity*now.Sub(p.last).Seconds(), capacity)
	p.last = now
	if p.left < 1 {
		p.left = max(p.left-p.RejectCost, -capacity)
		return response{status: 529, errType: "overloaded_error", latency: p.RejectLatency}
	}
	p.left--
	latency := p.ServiceMin + time.Duration(p.rng.Float64()*float64(p.ServiceMax-p.ServiceMin))
	if p.inIncident(now) && p.Incident.Kind == Brownout && p.rng.Float64() < p.Incident.FailShare {
		return response{status: 500, errType: "api_error", latency: latency}
	}
	return response{status: 200, latency: latency}
}
