package inorder

import (
	"slices"
	"sync"
	"testing"
)

// A listener hears every change once, in order, with the mutex released:
// one that makes a change of its own (and so delivers, re-entering) hears
// it after those already pending, from the outer delivery.
func TestDeliveryInOrder(t *testing.T) {
	var mu sync.Mutex
	var d Delivery[int]
	var heard []int
	var listen func(int)
	listen = func(c int) {
		heard = append(heard, c)
		if !mu.TryLock() {
			t.Fatalf("change %d heard with the mutex held", c)
		}
		if c == 1 {
			d.Add(3)
			d.UnlockAndDeliver(&mu, listen) // delivering already: queued behind 2
			return
		}
		mu.Unlock()
	}
	mu.Lock()
	d.Add(1)
	d.Add(2)
	d.UnlockAndDeliver(&mu, listen)
	if want := []int{1, 2, 3}; !slices.Equal(heard, want) {
		t.Fatalf("heard %v, want %v", heard, want)
	}
	if !mu.TryLock() {
		t.Fatal("the mutex is held after delivery")
	}
	mu.Unlock()
}

// A listener that panics leaves the mutex released and the changes still
// pending to the next delivery.
func TestDeliveryAfterPanic(t *testing.T) {
	var mu sync.Mutex
	var d Delivery[string]
	mu.Lock()
	d.Add("a")
	d.Add("b")
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("no panic")
			}
		}()
		d.UnlockAndDeliver(&mu, func(string) { panic("listener") })
	}()
	var heard []string
	mu.Lock()
	d.UnlockAndDeliver(&mu, func(c string) { heard = append(heard, c) })
	if want := []string{"b"}; !slices.Equal(heard, want) {
		t.Fatalf("heard %v after the panic, want %v", heard, want)
	}
	if !mu.TryLock() {
		t.Fatal("the mutex is held after delivery")
	}
}
