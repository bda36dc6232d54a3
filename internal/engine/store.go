package engine

import (
	"fmt"

	"github.com/damper-ai/damper-go/fleet"
)

// WithStore keeps the Damper's state in s, such as Redis shared by a
// fleet: the retry budget, and each other part (throttle, breaker,
// rate-limit buckets) whose interface s implements ([fleet.ThrottleStore],
// [fleet.BreakerStore], [fleet.LimitStore]); the others stay in memory.
// [WithBudget] given as well overrides s for the budget.
func WithStore(s fleet.Store) Setting {
	return func(d *Damper) error {
		if s == nil {
			return fmt.Errorf("damper: WithStore(nil): a store is required (fleet.MemoryStore{} keeps the state in memory)")
		}
		d.store = s
		return nil
	}
}
