// Package inorder delivers, in order, the changes a part of fleet state
// makes under its mutex to a listener that runs with the mutex released.
// A store's breaker calls fleet.BreakerSettings.OnChange through it as the
// breaker in memory does: every change heard once, in order, one at a
// time, with the listener free to call back into the breaker. It is
// public so that a store in a module of its own shares this one
// implementation.
package inorder

import "sync"

// Delivery queues the changes a part makes under its mutex and delivers
// them with the mutex released, one goroutine at a time, so that a
// listener hears every change in order and may call back into the part.
// The zero value is ready for use.
type Delivery[T any] struct {
	pending    []T
	delivering bool
}

// Add queues c. Requires the part's mutex.
func (d *Delivery[T]) Add(c T) { d.pending = append(d.pending, c) }

// UnlockAndDeliver releases mu, which the caller holds, and hands the
// pending changes to f, unless another goroutine is delivering them
// already: that one delivers these too, after its own.
func (d *Delivery[T]) UnlockAndDeliver(mu *sync.Mutex, f func(T)) {
	if len(d.pending) == 0 || d.delivering {
		mu.Unlock()
		return
	}
	d.delivering = true
	done := false
	defer func() {
		if !done {
			// f panicked, with mu released: the next call delivers the
			// changes still pending.
			mu.Lock()
			d.delivering = false
			mu.Unlock()
		}
	}()
	for len(d.pending) > 0 {
		c := d.pending[0]
		d.pending = d.pending[1:]
		if len(d.pending) == 0 {
			d.pending = nil
		}
		mu.Unlock()
		f(c)
		mu.Lock()
	}
	d.delivering = false
	done = true
	mu.Unlock()
}
