package damper

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"

	"github.com/damper-ai/damper-go/fleet"
)

// The retry budget's gate: the Policy's RetryBudgetRatio,
// RetryBudgetWindow, RetryBudgetMinTokens and OnBudgetExhausted, over a
// [fleet.Budget] from the backend's store (or [WithBudget]'s, for the primary).
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
	b   *backend
	tel *telemetry
}

// newBudgetGate makes backend b's budget from its store, unless it was
// given one.
func newBudgetGate(d *Damper, b *backend) (hooks, error) {
	if b.budget == nil {
		p := &d.policy
		settings := fleet.BudgetSettings{Ratio: p.RetryBudgetRatio, Window: p.RetryBudgetWindow, MinTokens: p.RetryBudgetMinTokens}
		var err error
		if b.budget, err = fromStore("Budget", b.store, fleet.Store.Budget, fleet.MemoryStore.Budget, settings); err != nil {
			return hooks{}, err
		}
	}
	g := budgetGate{b: b, tel: d.tel}
	return hooks{spend: g, observe: g}, nil
}

// spend takes a unit for a retry or a hedge, from the budget of the
// call's tenant when it has one.
func (g budgetGate) spend(c *call, now time.Time) *denial {
	granted, err := c.tenant.budget(g.b).Acquire(c.ctx, now)
	c.storeError(partBudget, "acquire", err)
	if !granted {
		return &denial{gate: gateBudget, asIs: c.d.policy.OnBudgetExhausted == PassthroughBudgetExhausted}
	}
	return nil
}

func (g budgetGate) observeAttempt(ctx context.Context, now time.Time, e attemptEvent) {
	// The budget's books are kept whatever becomes of the caller.
	b := e.tenant.budget(g.b)
	if err := b.Observe(keepGoing(ctx, b), now, e.outcome); err != nil {
		g.tel.logStoreError(ctx, partBudget, "observe", err)
	}
}

// budgetGauge registers the gauge of the primary backend's budget. Its
// callback holds the budget and the clock, not the Damper, so that a
// Damper nobody uses any more can be collected; its cleanup then
// unregisters the callback, unless Damper.Close did first.
func budgetGauge(meter metric.Meter, d *Damper) any {
	gauge, err := meter.Float64ObservableGauge(metricBudgetBalance, metric.WithUnit("{retry}"),
		metric.WithDescription("Retries the retry budget can still authorize in its current window."))
	if err != nil {
		otel.Handle(err)
		return nil
	}
	budget, clock, with := d.primary.budget, d.clock, d.tel.m.with()
	reg, err := meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		if kb, ok := budget.(fleet.KnownBalancer); ok {
			// No round trip per collection: the balance as last heard.
			o.ObserveFloat64(gauge, kb.KnownBalance(clock.Now()), with...)
			return nil
		}
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
	d.tel.keepGauges(d, reg)
	return nil
}
