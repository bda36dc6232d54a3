package redisstore

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/damper-ai/damper-go/fleet"
	"github.com/redis/go-redis/v9"
)

// Store keeps every part of a Damper's state in Redis: a [fleet.Store],
// given with [damper.WithStore]. Every process that gives the same
// [Options.Name] shares one retry budget, one retry throttle, one circuit
// breaker, one set of rate-limit buckets per limit group, and each
// tenant's spend of the day.
//
// The parts take their values from the Damper's Policy: give every process
// of the fleet the same Policy. The parts share one way to Redis and one
// queue of records (see the package documentation): they fall back
// together when it fails, and come back together (see [Store.State]).
type Store struct {
	link     *link
	lease    int
	leaseFor time.Duration
	leases   *limitLeases // the rate limiter's

	mu      sync.Mutex
	budgets []*Budget // whose leases Flush gives back
}

// New returns a store that keeps a Damper's state in Redis through client,
// a *redis.Client, *redis.ClusterClient or *redis.Ring (every key of one
// Name lands on one Cluster slot). It contacts no server: a Redis that is
// down when the process starts is a fallback like any other. It returns an
// error naming the field and its value when o holds one that cannot be
// used.
func New(client redis.UniversalClient, o Options) (*Store, error) {
	if client == nil {
		return nil, errors.New("redisstore: New: client is nil: a Redis client is required")
	}
	if err := checkOptions(o); err != nil {
		return nil, err
	}
	return &Store{link: newLink(client, o, "fleet state", "store"), lease: o.Lease, leaseFor: o.LeaseFor, leases: newLimitLeases(o)}, nil
}

// Budget implements [fleet.Store]: a [*Budget] with settings' values, on
// the store's way to Redis, taking leases as [Options.Lease] says.
func (s *Store) Budget(settings fleet.BudgetSettings) (fleet.Budget, error) {
	b, err := newBudget(s.link, settings, s.lease, s.leaseFor)
	if err != nil {
		return nil, err
	}
	if s.lease > 1 {
		s.mu.Lock()
		s.budgets = append(s.budgets, b)
		s.mu.Unlock()
	}
	return b, nil
}

// CallContext implements [fleet.CallContexter]: it returns ctx with a note
// of its own, for one call. Once one operation given that context (or one
// made from it) has failed or timed out, the call's other operations
// decide without asking Redis, so that a call waits out at most one
// timeout. Damper gives it every call's context; a caller of the parts
// themselves may give one for each unit of work.
func (s *Store) CallContext(ctx context.Context) context.Context { return s.link.callContext(ctx) }

// Flush sends the records queued (see the package documentation) and
// waits until Redis has answered them, or until ctx ends: for tests that
// read Redis, or another process's view of it, right after a call, and
// for a clean stop. It gives back the budget's leased units and the rate
// limiter's leased tokens first (see [Options.Lease]), so that they go in
// the same batch. The store's writer goroutine ends by itself once the
// queue is empty.
func (s *Store) Flush(ctx context.Context) error {
	s.mu.Lock()
	budgets := s.budgets
	s.mu.Unlock()
	for _, b := range budgets {
		b.giveBack(false)
	}
	s.leases.giveBack(ctx)
	return s.link.flush(ctx)
}

// State returns where the store's decisions come from now.
func (s *Store) State() State { return s.link.state() }

// Stats returns the store's state and counters, every part's operations
// together.
func (s *Store) Stats() Stats { return s.link.stats() }

var (
	_ fleet.Store         = (*Store)(nil)
	_ fleet.ThrottleStore = (*Store)(nil)
	_ fleet.BreakerStore  = (*Store)(nil)
	_ fleet.LimitStore    = (*Store)(nil)
	_ fleet.SpendStore    = (*Store)(nil)
	_ fleet.CallContexter = (*Store)(nil)
)
