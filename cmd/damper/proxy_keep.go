package main

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/damper-ai/damper-go/fleet"
)

// A reload builds a new Damper; its state must not start again. Each of
// the proxy's backends gets a partKeeper as its store, for the life of the
// process: it hands a Damper the part it made before for equal settings,
// so that a learned rate limit, an open breaker, a budget's window and a
// throttle's count (each tenant's budget too) outlive the Damper they were
// made for. With Redis the state is there already; its parts are kept all
// the same, with their leases.

// Bounds on what a partKeeper holds.
const (
	// maxKeptParts bounds the parts of one backend made on demand as a
	// Damper is built (budgets, each tenant's among them, a throttle, a
	// breaker): one generation's are at most 1,000 tenants' and the
	// backend's own. Beyond it a part is made and not kept.
	maxKeptParts = 4096
	// maxKeptGroups bounds the rate-limit groups' parts (their buckets,
	// their tenants' shares) kept for one
	// backend, about twice what one Damper's limiter holds: beyond it, the part
	// handed out least recently is forgotten.
	maxKeptGroups = 512
)

// partKeeper is a fleet.Store that keeps every part it makes, by the
// part's settings, and hands the same one back when asked again with
// equal settings. A breaker's OnChange goes to the Damper that asked last.
// Parts come from inner when it makes them, else from fleet.MemoryStore,
// as a Damper would make them itself.
//
// The eager parts (budgets, throttle, breaker), asked for as a Damper is
// built, are dropped when a reload is applied unless the new Damper took
// them (retain); a rate-limit group's buckets, asked for at its first
// call, are kept until maxKeptGroups pushes them out.
type partKeeper struct {
	inner fleet.Store
	mu    sync.Mutex
	gen   uint64 // the generation of the Damper being built
	use   uint64 // counts hand-outs, for the buckets' order
	parts map[any]*keptPart
	// groups counts the kept groups' parts among parts.
	groups int
}

// keptPart is one part a partKeeper keeps.
type keptPart struct {
	part any
	gen  uint64 // the last generation it was handed to
	use  uint64 // when it was last handed out
}

// The keys of parts, by kind: a kind's settings, which are comparable, or
// for a breaker its settings but OnChange.
type (
	budgetKey   struct{ s fleet.BudgetSettings }
	throttleKey struct{ s fleet.ThrottleSettings }
	limitKey    struct{ s fleet.LimitSettings }
	sharesKey   struct{ s fleet.ShareSettings }
	spendKey    struct{ s fleet.SpendSettings }
	breakerKey  struct {
		failureRatio           float64
		minAttempts            int
		window, openFor        time.Duration
		maxOpenFor, probeLimit time.Duration
	}
)

func keyOfBreaker(s fleet.BreakerSettings) breakerKey {
	return breakerKey{s.FailureRatio, s.MinAttempts, s.Window, s.OpenFor, s.MaxOpenFor, s.ProbeLimit}
}

// newPartKeeper keeps the parts of inner, or of the memory when inner is
// nil. Its store is keeper.store().
func newPartKeeper(inner fleet.Store) *partKeeper {
	if inner == nil {
		inner = fleet.MemoryStore{}
	}
	return &partKeeper{inner: inner, parts: map[any]*keptPart{}}
}

// store is k as a Damper's store: one that keeps a note of each call
// when inner does.
func (k *partKeeper) store() fleet.Store {
	if _, ok := k.inner.(fleet.CallContexter); ok {
		return keptCallStore{keptStore{k}}
	}
	return keptStore{k}
}

// begin starts a generation: the parts handed out from now on are the
// next Damper's.
func (k *partKeeper) begin(gen uint64) {
	k.mu.Lock()
	k.gen = gen
	k.mu.Unlock()
}

// retain drops the eager parts the Damper of generation gen did not take.
func (k *partKeeper) retain(gen uint64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for key, p := range k.parts {
		if !lazy(key) && p.gen < gen {
			delete(k.parts, key)
		}
	}
}

// get returns the part kept under key, made by build when there is none.
// A part that fails to be made is not kept.
func (k *partKeeper) get(key any, build func() (any, error)) (*keptPart, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.use++
	if p, ok := k.parts[key]; ok {
		p.gen, p.use = k.gen, k.use
		return p, nil
	}
	part, err := build()
	if err != nil {
		return nil, err
	}
	p := &keptPart{part: part, gen: k.gen, use: k.use}
	if lazy(key) {
		if k.groups >= maxKeptGroups {
			k.forgetOldestGroup()
		}
		k.groups++
	} else if len(k.parts)-k.groups >= maxKeptParts {
		return p, nil
	}
	k.parts[key] = p
	return p, nil
}

// lazy reports whether key is a part asked for at a limit group's first
// call (its buckets, its tenants' shares), kept until maxKeptGroups pushes
// it out, rather than as a Damper is built.
func lazy(key any) bool {
	switch key.(type) {
	case limitKey, sharesKey:
		return true
	}
	return false
}

// forgetOldestGroup drops the buckets handed out least recently; it
// requires k.mu.
func (k *partKeeper) forgetOldestGroup() {
	var oldest any
	var use uint64
	for key, p := range k.parts {
		if lazy(key) && (oldest == nil || p.use < use) {
			oldest, use = key, p.use
		}
	}
	if oldest != nil {
		delete(k.parts, oldest)
		k.groups--
	}
}

// keptStore is a partKeeper as a fleet.Store.
type keptStore struct{ k *partKeeper }

// keptCallStore is a keptStore whose inner store keeps a note of each
// call.
type keptCallStore struct{ keptStore }

var (
	_ fleet.BreakerStore  = keptStore{}
	_ fleet.ThrottleStore = keptStore{}
	_ fleet.LimitStore    = keptStore{}
	_ fleet.ShareStore    = keptStore{}
	_ fleet.SpendStore    = keptStore{}
	_ fleet.CallContexter = keptCallStore{}
)

func (s keptCallStore) CallContext(ctx context.Context) context.Context {
	return s.k.inner.(fleet.CallContexter).CallContext(ctx)
}

func (s keptStore) Budget(st fleet.BudgetSettings) (fleet.Budget, error) {
	p, err := s.k.get(budgetKey{st}, func() (any, error) {
		b, err := s.k.inner.Budget(st)
		if err == nil && b == nil {
			b, err = fleet.MemoryStore{}.Budget(st)
		}
		return b, err
	})
	if err != nil {
		return nil, err
	}
	return p.part.(fleet.Budget), nil
}

func (s keptStore) Throttle(st fleet.ThrottleSettings) (fleet.Throttle, error) {
	p, err := s.k.get(throttleKey{st}, func() (any, error) {
		var t fleet.Throttle
		var err error
		if ts, ok := s.k.inner.(fleet.ThrottleStore); ok {
			t, err = ts.Throttle(st)
		}
		if err == nil && t == nil {
			t, err = fleet.MemoryStore{}.Throttle(st)
		}
		return t, err
	})
	if err != nil {
		return nil, err
	}
	return p.part.(fleet.Throttle), nil
}

func (s keptStore) LimitBuckets(st fleet.LimitSettings) (fleet.LimitBuckets, error) {
	p, err := s.k.get(limitKey{st}, func() (any, error) {
		var b fleet.LimitBuckets
		var err error
		if ls, ok := s.k.inner.(fleet.LimitStore); ok {
			b, err = ls.LimitBuckets(st)
		}
		if err == nil && b == nil {
			b, err = fleet.MemoryStore{}.LimitBuckets(st)
		}
		return b, err
	})
	if err != nil {
		return nil, err
	}
	return p.part.(fleet.LimitBuckets), nil
}

// keptBreaker is a breaker and where its changes go: the OnChange of
// the last Damper given it.
type keptBreaker struct {
	b  fleet.Breaker
	to *atomic.Pointer[func(fleet.CircuitChange)]
}

// Breaker hands out the breaker made for equal settings, its changes
// told from now on to st.OnChange.
func (s keptStore) Breaker(st fleet.BreakerSettings) (fleet.Breaker, error) {
	onChange := st.OnChange
	p, err := s.k.get(keyOfBreaker(st), func() (any, error) {
		to := new(atomic.Pointer[func(fleet.CircuitChange)])
		st.OnChange = func(c fleet.CircuitChange) {
			if f := to.Load(); f != nil {
				(*f)(c)
			}
		}
		var b fleet.Breaker
		var err error
		if bs, ok := s.k.inner.(fleet.BreakerStore); ok {
			b, err = bs.Breaker(st)
		}
		if err == nil && b == nil {
			b, err = fleet.MemoryStore{}.Breaker(st)
		}
		return keptBreaker{b, to}, err
	})
	if err != nil {
		return nil, err
	}
	kb := p.part.(keptBreaker)
	if onChange != nil {
		kb.to.Store(&onChange)
	} else {
		kb.to.Store(nil)
	}
	return kb.b, nil
}

// LimitShares hands out the tenants' shares of a limit group made for
// equal settings, so that a reload keeps each tenant's bucket.
func (s keptStore) LimitShares(st fleet.ShareSettings) (fleet.LimitShares, error) {
	p, err := s.k.get(sharesKey{st}, func() (any, error) {
		var sh fleet.LimitShares
		var err error
		if ss, ok := s.k.inner.(fleet.ShareStore); ok {
			sh, err = ss.LimitShares(st)
		}
		if err == nil && sh == nil {
			sh, err = fleet.MemoryStore{}.LimitShares(st)
		}
		return sh, err
	})
	if err != nil {
		return nil, err
	}
	return p.part.(fleet.LimitShares), nil
}

// Spend hands out a tenant's spend made for equal settings, so that a
// reload keeps what the tenant spent today.
func (s keptStore) Spend(st fleet.SpendSettings) (fleet.Spend, error) {
	p, err := s.k.get(spendKey{st}, func() (any, error) {
		var sp fleet.Spend
		var err error
		if ss, ok := s.k.inner.(fleet.SpendStore); ok {
			sp, err = ss.Spend(st)
		}
		if err == nil && sp == nil {
			sp, err = fleet.MemoryStore{}.Spend(st)
		}
		return sp, err
	})
	if err != nil {
		return nil, err
	}
	return p.part.(fleet.Spend), nil
}
