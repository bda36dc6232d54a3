package fleet

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"time"
)

// BudgetSettings are the retry budget's values: within one Window the
// retries it authorizes are at most MinTokens + Ratio × the first attempts
// that succeeded in it.
type BudgetSettings struct {
	Ratio     float64
	Window    time.Duration
	MinTokens int
	// Tenant names the tenant whose budget it is, "" for the budget of
	// every call without one: a store keeps each tenant's books apart
	// from the others' (a name of at most 64 ASCII letters, digits, '-',
	// '_' or '.').
	Tenant string
}

// Budget returns a [WindowBudget]. It refuses a Tenant that is not a
// tenant's name, as a store that keeps the name in a key does.
func (MemoryStore) Budget(s BudgetSettings) (Budget, error) {
	if s.Tenant != "" && !tenantName(s.Tenant) {
		return nil, fieldError("BudgetSettings.Tenant", quoteName(s.Tenant), "want at most 64 ASCII letters, digits, '-', '_' or '.'")
	}
	return NewWindowBudget(s.Ratio, s.Window, s.MinTokens)
}

// Budget admits retries for every call through one Damper. The in-memory
// implementation is [NewWindowBudget]; a store shared by a fleet (Redis,
// say) makes one as its [Store.Budget], or one is given to a Damper on its
// own (damper.WithBudget). Implementations must be safe for concurrent use
// and cheap: Damper calls them on every attempt.
//
// A budget backed by a remote store may fail or time out: its methods then
// still decide (Acquire grants or refuses as the budget was built to, fail
// open or fail closed) and return the error as well, which Damper logs (at
// most one line every ten seconds, with the count of errors).
// ctx is the call's: a store should bound its own wait well within it.
type Budget interface {
	// Observe hears the end of every attempt. A logical request whose
	// first attempt succeeded grows the capacity of the window holding
	// now; a budget that debits failures counts the others.
	Observe(ctx context.Context, now time.Time, a AttemptOutcome) error
	// Acquire takes one unit for a retry, reporting whether one was
	// available. A refused retry takes nothing.
	Acquire(ctx context.Context, now time.Time) (bool, error)
	// Available returns the units still available in the window holding now.
	Available(ctx context.Context, now time.Time) (float64, error)
}

// WindowBudget is a fixed-window retry budget: within one window the
// retries it authorizes are at most minTokens + ratio × the first attempts
// that succeeded in that window. Unused units do not carry over. It is
// lock-free and safe for concurrent use.
//
// Windows are aligned on multiples of the window since the Unix epoch, as
// the wall clock read at the first call places them, and then follow the
// monotonic clock: a wall clock stepped back or forward moves no window.
// Times without a monotonic reading (a virtual clock's) are placed by their
// wall time.
type WindowBudget struct {
	ratio     float64
	minTokens float64
	window    time.Duration
	origin    atomic.Pointer[time.Time] // the first time seen: windows are counted from it
	cur       atomic.Pointer[budgetWindow]
}

type budgetWindow struct {
	id        int64 // the window's start, in windows since the Unix epoch
	successes atomic.Int64
	used      atomic.Int64
}

// NewWindowBudget returns a budget that adds ratio units per successful
// first attempt to windows of the given length, each starting with
// minTokens units. It rejects a ratio that is negative or not finite, a
// window that is not positive, and a negative minTokens, naming the value.
func NewWindowBudget(ratio float64, window time.Duration, minTokens int) (*WindowBudget, error) {
	switch {
	case math.IsNaN(ratio) || math.IsInf(ratio, 0) || ratio < 0:
		return nil, fmt.Errorf("fleet: NewWindowBudget ratio = %v: must be a finite number, at least 0", ratio)
	case window <= 0:
		return nil, fmt.Errorf("fleet: NewWindowBudget window = %v: must be positive", window)
	case minTokens < 0:
		return nil, fmt.Errorf("fleet: NewWindowBudget minTokens = %d: must be at least 0", minTokens)
	}
	return &WindowBudget{ratio: ratio, minTokens: float64(minTokens), window: window}, nil
}

// windowAt returns the window holding now, starting a new one when now has
// moved past the current one. A late caller whose now is in an older window
// is counted in the current one.
func (b *WindowBudget) windowAt(now time.Time) *budgetWindow {
	id := b.windowID(now)
	for {
		w := b.cur.Load()
		if w != nil && w.id >= id {
			return w
		}
		next := &budgetWindow{id: id}
		if b.cur.CompareAndSwap(w, next) {
			return next
		}
	}
}

// windowID numbers the window holding now. The distance from the origin is
// monotonic when both times carry a monotonic reading, and the origin's
// wall time anchors it to the epoch.
func (b *WindowBudget) windowID(now time.Time) int64 {
	origin := b.origin.Load()
	if origin == nil {
		first := now // allocated once, not on every call
		b.origin.CompareAndSwap(nil, &first)
		origin = b.origin.Load()
	}
	w := int64(b.window)
	start, offset := origin.UnixNano()/w, origin.UnixNano()%w
	if offset < 0 {
		start, offset = start-1, offset+w
	}
	since := now.Sub(*origin) + time.Duration(offset)
	id := start + int64(since/b.window)
	if since < 0 && since%b.window != 0 {
		id-- // floor, for a time before the origin
	}
	return id
}

// share is the number of retries the window may authorize, for one of n
// budgets that split one: MinTokens / n and Ratio × this budget's own
// successes. The small epsilon keeps 0.1 × 10 from falling a hair short
// of 1.
func (b *WindowBudget) share(w *budgetWindow, n int) float64 {
	return b.minTokens/float64(max(n, 1)) + b.ratio*float64(w.successes.Load()) + 1e-9
}

// FirstAttemptSucceeded records a logical request whose first attempt
// succeeded: it grows the capacity of the window holding now.
func (b *WindowBudget) FirstAttemptSucceeded(now time.Time) {
	b.windowAt(now).successes.Add(1)
}

// TryAcquire takes one unit for a retry, reporting whether one was
// available. A refused retry takes nothing.
func (b *WindowBudget) TryAcquire(now time.Time) bool { return b.TryAcquireShare(now, 1) }

// TryAcquireShare is TryAcquire for one of n processes that split one
// budget, each counting its own successes and units: the window's capacity
// is MinTokens / n + Ratio × this budget's successes, so that the n
// together grant at most MinTokens + Ratio × all their successes. A store
// shared by n processes decides so while the shared books cannot be
// reached. An n below 1 counts as 1.
func (b *WindowBudget) TryAcquireShare(now time.Time, n int) bool {
	w := b.windowAt(now)
	for {
		used := w.used.Load()
		if float64(used+1) > b.share(w, n) {
			return false
		}
		if w.used.CompareAndSwap(used, used+1) {
			return true
		}
	}
}

// Balance returns the units still available in the window holding now.
func (b *WindowBudget) Balance(now time.Time) float64 { return b.BalanceShare(now, 1) }

// BalanceShare is Balance for one of n processes that split one budget
// (see TryAcquireShare).
func (b *WindowBudget) BalanceShare(now time.Time, n int) float64 {
	w := b.windowAt(now)
	return math.Max(0, math.Floor((b.share(w, n)-float64(w.used.Load()))*1e6)/1e6)
}

func (*WindowBudget) inMemory() {}

// KnownBalance implements [KnownBalancer]: the budget is its own store.
func (b *WindowBudget) KnownBalance(now time.Time) float64 { return b.Balance(now) }

// Observe implements [Budget]: only a successful first attempt counts.
func (b *WindowBudget) Observe(_ context.Context, now time.Time, a AttemptOutcome) error {
	if a.First && a.Success {
		b.FirstAttemptSucceeded(now)
	}
	return nil
}

// Acquire implements [Budget]; it never fails.
func (b *WindowBudget) Acquire(_ context.Context, now time.Time) (bool, error) {
	return b.TryAcquire(now), nil
}

// Available implements [Budget]; it never fails.
func (b *WindowBudget) Available(_ context.Context, now time.Time) (float64, error) {
	return b.Balance(now), nil
}

// KnownBalancer is implemented by a [Budget] that knows its balance
// without asking its store, as last heard from it: Damper reads the
// balance of a call's report, and of its gauge, from KnownBalance when the
// budget implements it, at no cost, rather than from Available.
type KnownBalancer interface {
	// KnownBalance returns the units available in the window holding now,
	// as far as the budget knows without asking its store.
	KnownBalance(now time.Time) float64
}
