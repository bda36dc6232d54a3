package main

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/damper-ai/damper-go/fleet"
)

func keepBreakerSettings(onChange func(fleet.CircuitChange)) fleet.BreakerSettings {
	return fleet.BreakerSettings{FailureRatio: 0.5, MinAttempts: 2, Window: time.Minute, OpenFor: time.Minute,
		MaxOpenFor: time.Minute, ProbeLimit: time.Minute, OnChange: onChange}
}

// A partKeeper hands back the part it made for equal settings, and a new
// one for other settings; each part is MemoryStore's own, in memory.
func TestPartKeeperHandsBackEqualParts(t *testing.T) {
	k := newPartKeeper(nil)
	s := k.store()
	if _, ok := s.(fleet.CallContexter); ok {
		t.Error("over the memory, the keeper's store keeps a note of each call: it would cost every call for nothing")
	}
	budget := fleet.BudgetSettings{Ratio: 0.1, Window: time.Minute, MinTokens: 10}
	b1, _ := s.Budget(budget)
	b2, _ := s.Budget(budget)
	tenant := budget
	tenant.Tenant = "svc"
	b3, _ := s.Budget(tenant)
	if b1 != b2 || b1 == b3 || !fleet.InMemory(b1) {
		t.Errorf("budgets: the same settings gave %p and %p, a tenant's %p; want the first two one, the tenant's its own, in memory", b1, b2, b3)
	}
	th := fleet.ThrottleSettings{MaxTokens: 10, TokenRatio: 0.1}
	t1, _ := s.(fleet.ThrottleStore).Throttle(th)
	t2, _ := s.(fleet.ThrottleStore).Throttle(th)
	th.MaxTokens = 20
	t3, _ := s.(fleet.ThrottleStore).Throttle(th)
	if t1 != t2 || t1 == t3 {
		t.Error("throttles: want the one made for equal settings, and a new one for others")
	}
	ls := fleet.LimitSettings{Group: "claude-sonnet-4", BatchShare: 0.8}
	l1, _ := s.(fleet.LimitStore).LimitBuckets(ls)
	l2, _ := s.(fleet.LimitStore).LimitBuckets(ls)
	ls.Limits.RequestsPerMinute = 100
	l3, _ := s.(fleet.LimitStore).LimitBuckets(ls)
	if l1 != l2 || l1 == l3 {
		t.Error("buckets: want the ones made for equal settings, and new ones for a configured limit")
	}
	if _, err := s.Budget(fleet.BudgetSettings{Ratio: -1, Window: time.Minute}); err == nil {
		t.Error("a budget MemoryStore refuses: no error")
	}
}

// A kept breaker tells its changes to the Damper that asked for it last.
func TestPartKeeperBreakerChangesGoToTheLastDamper(t *testing.T) {
	k := newPartKeeper(nil)
	var first, second []fleet.CircuitState
	b1, err := k.store().(fleet.BreakerStore).Breaker(keepBreakerSettings(func(c fleet.CircuitChange) { first = append(first, c.To) }))
	if err != nil {
		t.Fatal(err)
	}
	b2, _ := k.store().(fleet.BreakerStore).Breaker(keepBreakerSettings(func(c fleet.CircuitChange) { second = append(second, c.To) }))
	if b1 != b2 {
		t.Fatal("a breaker of equal settings but OnChange is a new one")
	}
	now := time.Unix(1e9, 0)
	ctx := context.Background()
	for range 2 {
		a, _ := b1.Allow(ctx, now)
		_ = b1.Done(ctx, a.Ticket, now, fleet.CircuitFailure)
	}
	if st, _ := b2.State(ctx, now); st != fleet.CircuitOpen || len(first) != 0 || fmt.Sprint(second) != "[open]" {
		t.Errorf("state %v; the first Damper heard %v, the second %v; want open, told to the second alone", st, first, second)
	}
}

// The settings of a breaker that make it another one are all of its
// fields but OnChange.
func TestPartKeeperBreakerKeyHasEveryField(t *testing.T) {
	if got, want := reflect.TypeFor[breakerKey]().NumField(), reflect.TypeFor[fleet.BreakerSettings]().NumField()-1; got != want {
		t.Errorf("breakerKey has %d fields, BreakerSettings %d besides OnChange: a new field must be in the key", got, want)
	}
}

// retain drops the eager parts the new Damper did not take, and keeps the
// buckets, which a Damper asks for at a group's first call.
func TestPartKeeperRetain(t *testing.T) {
	k := newPartKeeper(nil)
	s := k.store()
	k.begin(1)
	old, _ := s.Budget(fleet.BudgetSettings{Ratio: 0.1, Window: time.Minute})
	kept, _ := s.Budget(fleet.BudgetSettings{Ratio: 0.2, Window: time.Minute})
	buckets, _ := s.(fleet.LimitStore).LimitBuckets(fleet.LimitSettings{Group: "g", BatchShare: 0.8})
	k.begin(2)
	if again, _ := s.Budget(fleet.BudgetSettings{Ratio: 0.2, Window: time.Minute}); again != kept {
		t.Fatal("the second generation did not get the budget")
	}
	k.retain(2)
	if again, _ := s.Budget(fleet.BudgetSettings{Ratio: 0.1, Window: time.Minute}); again == old {
		t.Error("a budget the new Damper did not take was kept")
	}
	if again, _ := s.(fleet.LimitStore).LimitBuckets(fleet.LimitSettings{Group: "g", BatchShare: 0.8}); again != buckets {
		t.Error("the buckets were dropped at the reload")
	}
}

// A keeper holds at most maxKeptGroups groups' buckets, forgetting the
// one handed out least recently, and at most maxKeptParts other parts.
func TestPartKeeperBounds(t *testing.T) {
	k := newPartKeeper(nil)
	ls := k.store().(fleet.LimitStore)
	group := func(i int) fleet.LimitBuckets {
		b, err := ls.LimitBuckets(fleet.LimitSettings{Group: fmt.Sprint("g", i), BatchShare: 0.8})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	first := group(0)
	second := group(1)
	for i := 2; i < maxKeptGroups; i++ {
		group(i)
	}
	group(0) // now the most recent
	group(maxKeptGroups)
	if len(k.parts) != maxKeptGroups || k.groups != maxKeptGroups {
		t.Errorf("%d parts, %d groups kept; want %d", len(k.parts), k.groups, maxKeptGroups)
	}
	if group(0) != first {
		t.Error("the group handed out most recently was forgotten")
	}
	if group(1) == second {
		t.Error("the group handed out least recently was kept")
	}
	for i := range maxKeptParts + 10 {
		if _, err := k.store().Budget(fleet.BudgetSettings{Ratio: 0.1, Window: time.Minute, Tenant: fmt.Sprint("t", i)}); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(k.parts) - k.groups; n != maxKeptParts {
		t.Errorf("%d parts kept, want %d", n, maxKeptParts)
	}
}

// noteStore is a store that keeps a note of each call.
type noteStore struct{ fleet.MemoryStore }

type noteKey struct{}

func (noteStore) CallContext(ctx context.Context) context.Context {
	return context.WithValue(ctx, noteKey{}, true)
}

// Over a store that keeps a note of each call, the keeper's store does
// too, by the inner store's CallContext.
func TestPartKeeperPassesCallContext(t *testing.T) {
	s, ok := newPartKeeper(noteStore{}).store().(fleet.CallContexter)
	if !ok || s.CallContext(context.Background()).Value(noteKey{}) != true {
		t.Error("the keeper's store hides its inner store's CallContext")
	}
}
