package engine

import (
	"context"
	"time"

	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/core"
)

// Tenant is a client of a [Proxy] in key mode: a name, and the keys its
// clients present, as SHA-256 hashes. A file never holds a key itself:
// the damper command's proxy adds the hashes of the keys held in the
// environment variables its key_env lists. A tenant has at most 16 keys,
// enough to rotate one (the new key added, clients moved, the old one
// removed), and a client key has at most 256 bytes.
type Tenant struct {
	// Name names the tenant in the request's log line, its call's
	// [Report].Tenant and its damper.tenant span and metric attribute: 1
	// to 64 ASCII letters, digits, '-', '_' or '.', unique among the
	// tenants.
	Name string `key:"name"`
	// KeySHA256 are the hashes of the tenant's keys: each the SHA-256 of
	// the key, 64 hexadecimal digits ([ClientKeyHash]). A hash names one
	// tenant only.
	KeySHA256 []string `key:"key_sha256" max:"16" unit:"keys"`
	// Priority is its calls' place in the rate limiter's and the
	// concurrency limit's lines; the zero value ("policy", the default)
	// leaves the Policy's.
	Priority TenantPriority `key:"priority" enum:"policy:unset,interactive:TenantInteractive,batch:TenantBatch"`
	// Weight is its share, under contention, of each limit group's rate
	// limit and of the concurrency slots: each tenant with calls waiting
	// gets at least its weight over the summed weights of the tenants
	// active, and what an idle tenant leaves is lent to the others.
	// Default 1.
	Weight int `key:"weight" default:"1" min:"1" max:"1000"`
	// RetryBudget sets the numbers of its retry budget. Every tenant has
	// a budget of its own on each backend, whose books its calls alone
	// keep, so that one tenant's retries never spend another's; nil takes
	// the Policy's RetryBudgetRatio and RetryBudgetMinTokens.
	RetryBudget *TenantRetryBudget `key:"retry_budget"`
	// DailyCostUSD is its ceiling on the cost of its calls in one day
	// (UTC, on the Damper's clock). Each call is priced once, as it ends,
	// from its answer's usage ([Report].Usage) by the Policy's price table
	// (cache writes at 1.25× and cache reads at 0.1× the input price); a
	// model the table does not price counts nothing. The spend is counted
	// by the primary backend's store ([fleet.SpendStore]: fleet-wide with
	// redisstore), else in memory. Once it reaches the ceiling, each of
	// the tenant's requests, on any path, gets 429 rate_limit_error naming
	// the ceiling and the reset, with retry-after until 00:00 UTC, and
	// nothing is sent. Calls under way finish: the spend may pass the
	// ceiling by what they cost. 0: no ceiling.
	DailyCostUSD float64 `key:"daily_cost_usd" min:"0" max:"1e6" unit:"dollars" zero:"no ceiling"`
}

// TenantRetryBudget is a tenant's retry budget: within the Policy's
// RetryBudgetWindow, the tenant's retries are at most MinTokens + Ratio ×
// its first attempts that succeeded.
type TenantRetryBudget struct {
	Ratio     float64 `key:"ratio" default:"0.1" none:"means 0" min:"0" max:"1000"`
	MinTokens int     `key:"min_tokens" default:"10" none:"means 0" min:"0" max:"1000000"`
}

// TenantPriority is a tenant's priority: its calls' own, or the Policy's.
type TenantPriority uint8

const (
	// TenantPriorityPolicy leaves the priority the Policy gives.
	TenantPriorityPolicy TenantPriority = iota
	// TenantInteractive makes the tenant's calls [Interactive].
	TenantInteractive
	// TenantBatch makes the tenant's calls [Batch].
	TenantBatch
)

// ProxyTenant is what a Proxy keeps of one of its tenants for the calls made
// for it: its name, its priority and weight, its own retry budget on
// each of the Damper's backends, and its spend of the day when it has a
// daily cost ceiling.
type ProxyTenant struct {
	Name     string
	priority TenantPriority
	weight   int
	Ceiling  float64     // DailyCostUSD; 0: none
	spend    fleet.Spend // with a ceiling: from the primary's store

	// gate is the tenant as the gates see it; its parts of its own (a
	// retry budget on each backend) are theirs. gate.Shares: its calls
	// take its weighted share of each limit group's rate limit.
	Gate core.Tenant
}

// PartSpend is a tenant's spend, a part of the primary backend's store.
var PartSpend = core.NewStorePart("spend", "damper: tenant spend store error")

// NewTenant makes the parts of t, filled in, from d's backends' stores.
func (d *Damper) NewTenant(t Tenant) (*ProxyTenant, error) {
	ten := &ProxyTenant{Name: t.Name, priority: t.Priority, weight: t.Weight, Ceiling: t.DailyCostUSD}
	ten.Gate = core.Tenant{Name: t.Name, Weight: t.Weight}
	if rb := t.RetryBudget; rb != nil {
		ten.Gate.RetryBudget.Set, ten.Gate.RetryBudget.Ratio, ten.Gate.RetryBudget.MinTokens = true, rb.Ratio, rb.MinTokens
	}
	for _, b := range append([]*backend{d.primary}, d.fallbacks...) {
		for _, h := range b.parts {
			if h.Tenant != nil {
				if err := h.Tenant.AddTenant(&ten.Gate); err != nil {
					return nil, err
				}
			}
		}
	}
	if ten.Ceiling > 0 {
		spend, err := core.FromStore("Spend", d.primary.store, fleet.SpendStore.Spend, fleet.MemoryStore.Spend, fleet.SpendSettings{Tenant: t.Name})
		if err != nil {
			return nil, err
		}
		ten.spend = spend
	}
	return ten, nil
}

// HasCeiling reports whether t has a daily cost ceiling.
func (t *ProxyTenant) HasCeiling() bool { return t != nil && t.spend != nil }

// CeilingReached returns, for t with a ceiling, the dollars t has spent
// in the UTC day holding now, whether they reach its ceiling, and the
// store's error, if any (the spend still answered).
func (t *ProxyTenant) CeilingReached(ctx context.Context, now time.Time) (spent float64, reached bool, err error) {
	spent, err = t.spend.Spent(ctx, now)
	return spent, spent >= t.Ceiling, err
}

// NextUTCDay is the start of the UTC day after the one holding now: when
// a daily cost ceiling resets.
func NextUTCDay(now time.Time) time.Time {
	y, m, d := now.UTC().Date()
	return time.Date(y, m, d+1, 0, 0, 0, 0, time.UTC)
}

// nameOf is t's name, or "" for no tenant.
func (t *ProxyTenant) nameOf() string {
	if t == nil {
		return ""
	}
	return t.Name
}

// CallContext is ctx for a call made for t: with t's priority, when it
// sets one.
func (t *ProxyTenant) CallContext(ctx context.Context) context.Context {
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

// forGates is t as the gates see it; nil for no tenant.
func (t *ProxyTenant) forGates() *core.Tenant {
	if t == nil {
		return nil
	}
	return &t.Gate
}
