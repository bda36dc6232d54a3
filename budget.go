package damper

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
)

// The retry budget's gate: the Policy's RetryBudgetRatio,
// RetryBudgetWindow, RetryBudgetMinTokens and OnBudgetExhausted, over a
// [Budget] from the backend's store (or [WithBudget]'s, for the primary).
// Before a retry or a hedge it spends a unit, after every other gate: a
// unit spent is not given back. It hears every attempt's end.

// OutcomeBudgetExhausted: the retry budget had no unit left.
const OutcomeBudgetExhausted Outcome = "budget_exhausted"

// ErrRetryBudgetExhausted: the shared retry budget had no unit left.
var ErrRetryBudgetExhausted = errors.New("damper: retry budget exhausted")

// partBudget is the budget's part of a store.
var partBudget = newStorePart("budget", "damper: retry budget error")

// gateBudget moves a call on: another backend has a budget of its own.
var gateBudget = &gate{
	outcome: OutcomeBudgetExhausted, reason: ErrRetryBudgetExhausted, moves: true,
	part: newBudgetGate, instruments: budgetGauge,
}

// metricBudgetBalance is the budget's gauge.
const metricBudgetBalance = "damper.retry_budget.balance"

// budgetGate is a backend's retry budget as a gate.
type budgetGate struct {
	b   Budget
	tel *telemetry
}

// newBudgetGate makes backend b's budget from its store, unless it was
// given one.
func newBudgetGate(d *Damper, b *backend) (any, error) {
	if b.budget == nil {
		p := &d.policy
		settings := BudgetSettings{Ratio: p.RetryBudgetRatio, Window: p.RetryBudgetWindow, MinTokens: p.RetryBudgetMinTokens}
		var err error
		if b.budget, err = fromStore("Budget", b.store.Budget, MemoryStore.Budget, settings); err != nil {
			return nil, err
		}
	}
	return budgetGate{b: b.budget, tel: d.tel}, nil
}

// spend takes a unit for a retry or a hedge.
func (g budgetGate) spend(c *call, now time.Time) *denial {
	granted, err := g.b.Acquire(c.ctx, now)
	c.storeError(partBudget, "acquire", err)
	if !granted {
		return &denial{gate: gateBudget, asIs: c.d.policy.OnBudgetExhausted == PassthroughBudgetExhausted}
	}
	return nil
}

func (g budgetGate) observeAttempt(ctx context.Context, now time.Time, e attemptEvent) {
	// The budget's books are kept whatever becomes of the caller.
	if err := g.b.Observe(keepGoing(ctx, g.b), now, e.outcome); err != nil {
		g.tel.logStoreError(ctx, partBudget, "observe", err)
	}
}

// budgetGauge registers the gauge of the primary backend's budget. Its
// callback holds the budget and the clock, not the Damper, so that a
// Damper nobody uses any more can be collected; its cleanup then
// unregisters the callback.
func budgetGauge(meter metric.Meter, d *Damper) any {
	gauge, err := meter.Float64ObservableGauge(metricBudgetBalance, metric.WithUnit("{retry}"),
		metric.WithDescription("Retries the retry budget can still authorize in its current window."))
	if err != nil {
		otel.Handle(err)
		return nil
	}
	budget, clock, with := d.primary.budget, d.clock, d.tel.m.with()
	reg, err := meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		balance, err := budget.Available(ctx, clock.Now())
		if err != nil {
			return err // the SDK reports it; no value is better than a wrong one
		}
		o.ObserveFloat64(gauge, balance, with...)
		return nil
	}, gauge)
	if err != nil {
		otel.Handle(err)
		return nil
	}
	runtime.AddCleanup(d, func(r metric.Registration) { _ = r.Unregister() }, reg)
	return nil
}

// Budget admits retries for every call through one Damper. The in-memory
// implementation is [NewWindowBudget]; a store shared by a fleet (Redis,
// say) can implement the same interface and be given with [WithBudget].
// Implementations must be safe for concurrent use and cheap: Damper calls
// them on every attempt.
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

// AttemptOutcome is what a [Budget] hears of one attempt.
type AttemptOutcome struct {
	// First is whether the attempt was its logical request's first.
	First bool
	// Success is whether the attempt was answered with a usable response.
	Success bool
	// Signal is whose health a failure speaks of; NoSignal for a success.
	Signal Signal
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
		return nil, fmt.Errorf("damper: NewWindowBudget ratio = %v: must be a finite number, at least 0", ratio)
	case window <= 0:
		return nil, fmt.Errorf("damper: NewWindowBudget window = %v: must be positive", window)
	case minTokens < 0:
		return nil, fmt.Errorf("damper: NewWindowBudget minTokens = %d: must be at least 0", minTokens)
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

// capacity is the number of retries the window may authorize. The small
// epsilon keeps 0.1 × 10 from falling a hair short of 1.
func (b *WindowBudget) capacity(w *budgetWindow) float64 {
	return b.minTokens + b.ratio*float64(w.successes.Load()) + 1e-9
}

// FirstAttemptSucceeded records a logical request whose first attempt
// succeeded: it grows the capacity of the window holding now.
func (b *WindowBudget) FirstAttemptSucceeded(now time.Time) {
	b.windowAt(now).successes.Add(1)
}

// TryAcquire takes one unit for a retry, reporting whether one was
// available. A refused retry takes nothing.
func (b *WindowBudget) TryAcquire(now time.Time) bool {
	w := b.windowAt(now)
	for {
		used := w.used.Load()
		if float64(used+1) > b.capacity(w) {
			return false
		}
		if w.used.CompareAndSwap(used, used+1) {
			return true
		}
	}
}

// Balance returns the units still available in the window holding now.
func (b *WindowBudget) Balance(now time.Time) float64 {
	w := b.windowAt(now)
	return math.Max(0, math.Floor((b.capacity(w)-float64(w.used.Load()))*1e6)/1e6)
}

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
