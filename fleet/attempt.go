package fleet

// AttemptOutcome is what a part hears of one attempt's end.
type AttemptOutcome struct {
	// First is whether the attempt was its logical request's first.
	First bool
	// Success is whether the attempt was answered with a usable response.
	Success bool
	// Signal is whose health a failure speaks of; NoSignal for a success.
	Signal Signal
}

// Signal says whose health a failure speaks of. A circuit breaker listens
// to provider signals only; a rate limiter to caller traffic.
type Signal int

const (
	// NoSignal: the failure says nothing about load (a bad request, a
	// cancelled context).
	NoSignal Signal = iota
	// ProviderHealth: 5xx, 529 and transport failures.
	ProviderHealth
	// CallerTraffic: 429, the caller's own rate or spend.
	CallerTraffic
)

// String returns "provider_health", "caller_traffic" or "none".
func (s Signal) String() string {
	switch s {
	case ProviderHealth:
		return "provider_health"
	case CallerTraffic:
		return "caller_traffic"
	}
	return "none"
}
