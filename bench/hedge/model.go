// Package hedge measures hedging against a provider whose time to first
// content has a long tail: the bare SDK, Damper with and without its
// HedgePolicy, and failsafe-go's hedge policy, each over the same provider
// and the same arrivals, in virtual time (testing/synctest).
//
// Run it with `go test ./hedge` from the bench module; with
// -hedge.docs=../../docs/BENCHMARKS.md the test rewrites its section of
// the benchmark docs.
package hedge

import (
	"time"
)

// Model is the provider's latency: each attempt independently waits a
// time drawn from a mixture of two uniform ranges before its first content,
// fast with probability FastShare and slow otherwise.
type Model struct {
	FastShare        float64
	FastMin, FastMax time.Duration
	SlowMin, SlowMax time.Duration
	// HeadersMin and HeadersMax bound the time to the response headers
	// when they come before the first content (Scenario.AfterHeaders).
	HeadersMin, HeadersMax time.Duration
	// Seed picks the draws: a run with the same seed is the same run.
	Seed uint64
}

// DefaultModel is the scenario's provider: 96 % of attempts answer in
// 0.8–1.2 s, the other 4 % in 7–11 s. One attempt's p50 is 1.0 s and its
// p99 10.0 s, ten times as long; its p95, 1.2 s, falls in the fast range,
// so that a hedge at the 95th percentile can catch the slow ones.
var DefaultModel = Model{
	FastShare: 0.96,
	FastMin:   800 * time.Millisecond,
	FastMax:   1200 * time.Millisecond,
	SlowMin:   7 * time.Second,
	SlowMax:   11 * time.Second,

	HeadersMin: 20 * time.Millisecond,
	HeadersMax: 80 * time.Millisecond,

	Seed: 20261201,
}

// Latency returns the wait before the first content of the attempt-th
// attempt (from 1) of request req. It is a pure function of its arguments,
// so that a run does not depend on the order in which goroutines happen to
// send their attempts.
func (m Model) Latency(req, attempt int) time.Duration {
	h := m.hash(req, attempt)
	if unit(h) < m.FastShare {
		return lerp(m.FastMin, m.FastMax, unit(mix(h)))
	}
	return lerp(m.SlowMin, m.SlowMax, unit(mix(h)))
}

// Headers returns the time to the response headers of an attempt whose
// headers come before its first content, drawn apart from its Latency.
func (m Model) Headers(req, attempt int) time.Duration {
	return lerp(m.HeadersMin, m.HeadersMax, unit(mix(mix(m.hash(req, attempt)))))
}

func (m Model) hash(req, attempt int) uint64 {
	return mix(mix(m.Seed+uint64(req)) + uint64(attempt))
}

// Quantile returns the q-quantile of one attempt's latency.
func (m Model) Quantile(q float64) time.Duration {
	if q <= m.FastShare {
		return lerp(m.FastMin, m.FastMax, q/m.FastShare)
	}
	return lerp(m.SlowMin, m.SlowMax, (q-m.FastShare)/(1-m.FastShare))
}

func lerp(lo, hi time.Duration, u float64) time.Duration {
	return lo + time.Duration(u*float64(hi-lo))
}

// mix is splitmix64's finalizer: a bijection that scatters nearby inputs.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// unit maps h to [0, 1).
func unit(h uint64) float64 {
	return float64(h>>11) / (1 << 53)
}
