package engine

import (
	"sync"
	"sync/atomic"
)

// maxCachedOptions bounds each optionCache: well above the combinations a
// Damper records in practice (a provider by an outcome by a tenant or a
// backend), and small enough that the cache, a few hundred bytes an entry,
// stays far below what the series themselves hold in the meter.
const maxCachedOptions = 512

// optionCache keeps what a metric records with (its measurement options,
// an attribute set built, sorted and hashed) per combination of the
// values it is made of, so that a call records with sets built once
// rather than again on every value. The combinations are bounded already
// (by labelSet and seriesSet, or by the values they are made of); the
// cache keeps the first maxCachedOptions all the same, and any further one
// is built on each use, as without the cache. It is safe for concurrent
// use; a combination it holds takes no lock and allocates nothing.
type optionCache[K comparable, V any] struct {
	seen atomic.Pointer[map[K]V] // copied on write
	mu   sync.Mutex              // serializes stores
}

// load returns the value kept for k.
func (c *optionCache[K, V]) load(k K) (V, bool) {
	if m := c.seen.Load(); m != nil {
		v, ok := (*m)[k]
		return v, ok
	}
	var none V
	return none, false
}

// store keeps v for k, unless the cache is full.
func (c *optionCache[K, V]) store(k K, v V) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var seen map[K]V
	if m := c.seen.Load(); m != nil {
		seen = *m
	}
	if _, ok := seen[k]; ok || len(seen) >= maxCachedOptions {
		return
	}
	grown := make(map[K]V, len(seen)+1)
	for x, y := range seen {
		grown[x] = y
	}
	grown[k] = v
	c.seen.Store(&grown)
}
