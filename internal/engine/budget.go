package engine

import "github.com/damper-ai/damper-go/internal/gates/budget"

// The retry budget's names (package internal/gates/budget).

// OutcomeBudgetExhausted: the retry budget had no unit left.
const OutcomeBudgetExhausted = budget.OutcomeBudgetExhausted

// ErrRetryBudgetExhausted: the shared retry budget had no unit left.
var ErrRetryBudgetExhausted = budget.ErrRetryBudgetExhausted

// partBudget is the budget's part of a store.
var partBudget = budget.StorePart

// budgetPolicy is the budget's part of p: fields of the Policy itself.
func budgetPolicy(p *Policy) *budget.Policy {
	return &budget.Policy{Ratio: p.RetryBudgetRatio, Window: p.RetryBudgetWindow, MinTokens: p.RetryBudgetMinTokens,
		Passthrough: p.OnBudgetExhausted == PassthroughBudgetExhausted}
}
