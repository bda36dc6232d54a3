package breaker

import "sync"

// Delivery queues the changes a breaker makes under its mutex and
// delivers them with the mutex released, one goroutine at a time, so that
// a listener hears every change in order and may call back into the
// breaker. The zero value is ready for use.
type Delivery[T any] struct {
	pending    []T
	delivering bool
}

// Add queues c. Requires the breaker's mutex.
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
