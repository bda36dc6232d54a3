// Package fleet is what a store of a Damper's state is written against:
// the parts of that state a fleet of replicas may share, their settings
// and the values they trade with the engine, and [MemoryStore], the parts
// in the memory of one process.
//
// By default a Damper keeps the state of its gates in memory: its retry
// budget, retry throttle, circuit breaker and the rate limiter's buckets.
// Every replica of a service then has its own, so that 50 replicas allow
// 50 budgets of retries and each learns the organisation's rate limit on
// its own. A [Store] keeps that state where every replica shares it (the
// redisstore module keeps it in Redis), so the fleet has one budget, one
// view of the provider's health and one view of the API's limits.
//
// A Store shares the retry budget; each other part is an interface of its
// own that a store may implement ([ThrottleStore], [BreakerStore],
// [LimitStore]). The Damper asks a store for each part its Policy
// configures, and keeps in memory every part the store does not
// implement, or for which it returns nil.
//
// The parts a Store makes are called on every attempt, from many
// goroutines at once. A part backed by a remote store may fail or time
// out: its methods then still decide (from state kept in memory, or
// refusing, as the store was built to) and return the error as well,
// which Damper logs at most once every ten seconds per part, with the
// count of errors. The context given to them is the call's, or, for what
// must be recorded whatever becomes of the call, one without its
// cancellation: a store bounds its own waits.
//
// The settings a Damper gives a store hold its Policy's values with every
// default filled in; [MemoryStore] refuses a value that cannot be used,
// naming the field and the value.
//
// Package fleettest states the contract a store keeps, part by part, as
// checks a store's tests run (MemoryStore passes them).
package fleet

import "context"

// Store makes the parts of a Damper's state that a fleet shares: the
// retry budget, and every other part whose interface it implements
// ([ThrottleStore], [BreakerStore], [LimitStore]). A Damper asks it once,
// as it is made, for each part its Policy configures (the budget always),
// and [LimitStore.LimitBuckets] for each limit group at the group's first
// call. A method that returns nil keeps that part in memory; an error
// from the questions asked as the Damper is made fails it, and one from
// LimitBuckets keeps that group in memory and is logged.
type Store interface {
	// Budget makes the retry budget.
	Budget(BudgetSettings) (Budget, error)
}

// CallContexter is implemented by a [Store], or a [Budget] given to a
// Damper on its own, that keeps a note of each call: Damper gives each
// call's context to CallContext once, as the call begins, and the context
// it returns (or one made from it) to every method of the parts for that
// call. A store across a network uses it so that a call waits out at most
// one of its timeouts: once one operation of the call has failed, the
// call's others decide without asking.
type CallContexter interface {
	CallContext(ctx context.Context) context.Context
}

// MemberCounter is implemented by a [Store] that knows how many processes
// share it, and that limits each to its share of the fleet's limits while
// the shared state cannot be reached: 1/Members of each rate-limit bucket,
// MinTokens/Members of the retry budget (package fleettest checks those
// bounds in a fault).
type MemberCounter interface {
	// Members returns how many processes share the store, as last known:
	// at least 1.
	Members() int
}

// MemoryStore keeps a Damper's state in the memory of its process: the
// [Store] a Damper uses when none is given, and for every part a store
// does not share. A store shared by a fleet can fall back on it when the
// fleet's store cannot be reached. Each part it makes is new and its own;
// its parts never fail.
type MemoryStore struct{}

var _ Store = MemoryStore{}

// InMemory reports whether part is one that [MemoryStore] made, or a
// [WindowBudget] (a type that embeds one included): a part whose state
// lives and dies with its process, so that nothing it is asked to record
// outlives a call that ends first, and which needs no context that does.
func InMemory(part any) bool {
	_, ok := part.(inMemory)
	return ok
}

// inMemory is implemented by every part MemoryStore makes.
type inMemory interface{ inMemory() }
