package damper

import (
	"context"

	"github.com/damper-ai/damper-go/fleet"
)

// tenant is what a Proxy keeps of one of its tenants for the calls made
// for it: its name, its priority and weight, and its own retry budget on
// each of the Damper's backends.
type tenant struct {
	name     string
	priority TenantPriority
	weight   int
	ceiling  float64                   // DailyCostUSD; 0: none
	budgets  map[*backend]fleet.Budget // its own, one per backend

	// shares: its calls take its weighted share of each limit group's
	// rate limit (see takeShare); set when its Proxy has other tenants
	// to share with.
	shares bool
}

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
	return ten, nil
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
