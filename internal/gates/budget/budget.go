// Package budget is the retry budget's gate: the Damper's
// RetryBudgetRatio, RetryBudgetWindow, RetryBudgetMinTokens and
// OnBudgetExhausted, over a [fleet.Budget] from the backend's store (or
// one given to the backend), and a budget of its own for each tenant of
// a Proxy. Before a retry or a hedge it spends a unit, after every other
// gate: a unit spent is not given back. It hears every attempt's end.
package budget

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"

	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/core"
)

// OutcomeBudgetExhausted: the retry budget had no unit left.
const OutcomeBudgetExhausted core.Outcome = "budget_exhausted"

// ErrRetryBudgetExhausted: the shared retry budget had no unit left.
var ErrRetryBudgetExhausted = errors.New("damper: retry budget exhausted")

// StorePart is the budget's part of a store.
var StorePart = core.NewStorePart("budget", "damper: retry budget error")

// Gate moves a call on: another backend has a budget of its own.
var Gate = &core.Gate{
	Outcome: OutcomeBudgetExhausted, Reason: ErrRetryBudgetExhausted, Moves: true,
	Instruments: gauge,
}

// metricBalance is the budget's gauge.
const metricBalance = "damper.retry_budget.balance"

// Policy is what the budget reads of a Damper's Policy.
type Policy struct {
	Ratio     float64
	Window    time.Duration
	MinTokens int
	// Passthrough: a refused caller gets the last provider error as it is.
	Passthrough bool
}

// budgetGate is a backend's retry budget as a gate, with its tenants'.
type budgetGate struct {
	b       fleet.Budget
	p       Policy
	store   fleet.Store
	env     *core.Env
	tenants sync.Map // *core.Tenant → fleet.Budget
}

// Part makes backend b's budget from its store, unless it was given one.
func Part(p *Policy, b *core.Backend, env *core.Env) (core.Hooks, error) {
	if b.Budget == nil {
		settings := fleet.BudgetSettings{Ratio: p.Ratio, Window: p.Window, MinTokens: p.MinTokens}
		var err error
		if b.Budget, err = core.FromStore("Budget", b.Store, fleet.Store.Budget, fleet.MemoryStore.Budget, settings); err != nil {
			return core.Hooks{}, err
		}
	}
	g := &budgetGate{b: b.Budget, p: *p, store: b.Store, env: env}
	return core.Hooks{Spend: g, Observe: g, Tenant: g}, nil
}

// AddTenant makes t's own budget on the backend, from its store.
func (g *budgetGate) AddTenant(t *core.Tenant) error {
	settings := fleet.BudgetSettings{Ratio: g.p.Ratio, Window: g.p.Window, MinTokens: g.p.MinTokens, Tenant: t.Name}
	if rb := t.RetryBudget; rb.Set {
		settings.Ratio, settings.MinTokens = rb.Ratio, rb.MinTokens
	}
	b, err := core.FromStore("Budget", g.store, fleet.Store.Budget, fleet.MemoryStore.Budget, settings)
	if err != nil {
		return err
	}
	g.tenants.Store(t, b)
	return nil
}

// budget is the retry budget of a call for t: t's own, or the backend's
// when the call has no tenant.
func (g *budgetGate) budget(t *core.Tenant) fleet.Budget {
	if t == nil {
		return g.b
	}
	b, _ := g.tenants.Load(t)
	return b.(fleet.Budget)
}

// TenantBudget is t's budget among a backend's parts, or the backend's
// for no tenant; nil when the parts have no budget.
func TenantBudget(parts []core.Hooks, t *core.Tenant) fleet.Budget {
	for _, h := range parts {
		if g, ok := h.Spend.(*budgetGate); ok {
			return g.budget(t)
		}
	}
	return nil
}

// Spend takes a unit for a retry or a hedge, from the budget of the
// call's tenant when it has one.
func (g *budgetGate) Spend(c core.Call, now time.Time) *core.Denial {
	granted, err := g.budget(c.Tenant()).Acquire(c.Context(), now)
	c.StoreError(StorePart, "acquire", err)
	if !granted {
		return &core.Denial{Gate: Gate, AsIs: g.p.Passthrough}
	}
	return nil
}

func (g *budgetGate) ObserveAttempt(ctx context.Context, now time.Time, e core.Event) {
	// The budget's books are kept whatever becomes of the caller.
	b := g.budget(e.Tenant)
	if err := b.Observe(core.KeepGoing(ctx, b), now, e.Outcome); err != nil {
		g.env.LogStoreError(ctx, StorePart, "observe", err)
	}
}

// gauge registers the gauge of the primary backend's budget (parts[0]).
// Its callback holds the budget and the clock, not the Damper, so that a
// Damper nobody uses any more can be collected; its cleanup then
// unregisters the callback, unless Damper.Close did first.
func gauge(meter metric.Meter, env *core.Env, parts []core.Hooks, keep func(metric.Registration)) any {
	g, ok := parts[0].Spend.(*budgetGate)
	if !ok {
		return nil
	}
	gauge, err := meter.Float64ObservableGauge(metricBalance, metric.WithUnit("{retry}"),
		metric.WithDescription("Retries the retry budget can still authorize in its current window."))
	if err != nil {
		otel.Handle(err)
		return nil
	}
	budget, clock, with := g.b, env.Clock, env.With()
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
	keep(reg)
	return nil
}
