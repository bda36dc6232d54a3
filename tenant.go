package damper

import (
	"context"
	"time"

	"github.com/damper-ai/damper-go/fleet"
)

// tenant is what a Proxy keeps of one of its tenants for the calls made
// for it: its name, its priority and weight, its own retry budget on
// each of the Damper's backends, and its spend of the day when it has a
// daily cost ceiling.
type tenant struct {
	name     string
	priority TenantPriority
	weight   int
	ceiling  float64                   // DailyCostUSD; 0: none
	budgets  map[*backend]fleet.Budget // its own, one per backend
	spend    fleet.Spend               // with a ceiling: from the primary's store
}

// partSpend is a tenant's spend, a part of the primary backend's store.
var partSpend = newStorePart("spend", "damper: tenant spend store error")

// newTenant makes the parts of t, filled in, from d's backends' stores.
func (d *Damper) newTenant(t Tenant) (*tenant, error) {
	ten := &tenant{name: t.Name, priority: t.Priority, weight: t.Weight, ceiling: t.DailyCostUSD,
		budgets: make(map[*backend]fleet.Budget, 1+len(d.fallbacks))}
	settings := fleet.BudgetSettings{Ratio: d.policy.RetryBudgetRatio, Window: d.policy.RetryBudgetWindow,
		MinTokens: d.policy.RetryBudgetMinTokens, Tenant: t.Name}
	if rb := t.RetryBudget; rb != nil {
		settings.Ratio, settings.MinTokens = rb.Ratio, rb.MinTokens
	}
	for _, b := range append([]*backend{d.primary}, d.fallbacks...) {
		budget, err := fromStore("Budget", b.store, fleet.Store.Budget, fleet.MemoryStore.Budget, settings)
		if err != nil {
			return nil, err
		}
		ten.budgets[b] = budget
	}
	if ten.ceiling > 0 {
		spend, err := fromStore("Spend", d.primary.store, fleet.SpendStore.Spend, fleet.MemoryStore.Spend, fleet.SpendSettings{Tenant: t.Name})
		if err != nil {
			return nil, err
		}
		ten.spend = spend
	}
	return ten, nil
}

// hasCeiling reports whether t has a daily cost ceiling.
func (t *tenant) hasCeiling() bool { return t != nil && t.spend != nil }

// ceilingReached returns, for t with a ceiling, the dollars t has spent
// in the UTC day holding now, whether they reach its ceiling, and the
// store's error, if any (the spend still answered).
func (t *tenant) ceilingReached(ctx context.Context, now time.Time) (spent float64, reached bool, err error) {
	spent, err = t.spend.Spent(ctx, now)
	return spent, spent >= t.ceiling, err
}

// nextUTCDay is the start of the UTC day after the one holding now: when
// a daily cost ceiling resets.
func nextUTCDay(now time.Time) time.Time {
	y, m, d := now.UTC().Date()
	return time.Date(y, m, d+1, 0, 0, 0, 0, time.UTC)
}

// nameOf is t's name, or "" for no tenant.
func (t *tenant) nameOf() string {
	if t == nil {
		return ""
	}
	return t.name
}

// callContext is ctx for a call made for t: with t's priority, when it
// sets one.
func (t *tenant) callContext(ctx context.Context) context.Context {
	if t == nil {
		return ctx
	}
	switch t.priority {
	case TenantInteractive:
		return ContextWithPriority(ctx, Interactive)
	case TenantBatch:
		return ContextWithPriority(ctx, Batch)
	}
	return ctx
}

// budget is the retry budget of a call for t on backend b: t's own, or
// b's when the call has no tenant.
func (t *tenant) budget(b *backend) fleet.Budget {
	if t == nil {
		return b.budget
	}
	return t.budgets[b]
}
