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
//
// Give it a client with retries off (MaxRetries: -1; go-redis's default
// is 3): the store is the one layer that handles Redis's failures, by its
// fallback and probes, and go-redis sends a pipeline whose replies a
// reset or an EOF cut again, so that the records of a batch Redis had run
// are applied twice. A *redis.Client, *redis.ClusterClient or *redis.Ring
// with retries gets a warning on [Options.Logger].
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

// Probe asks Redis now, by a PING bounded by [Options.Timeout], whatever
// the traffic; when this process's membership is due for a refresh (see
// [Store.Members]) the refresh goes instead of the PING, in the same one
// round trip, so that a process that is idle but probes at least every
// few seconds stays counted among the members. In a fallback it is the probe (one at a time, and none
// sooner than [Options.ProbeInterval] after the last one ended, as a
// decision's; otherwise it returns an error matching [ErrUnavailable] at
// once), and Redis's answer switches the store back to [StateShared].
// With the store shared, a failure counts against Redis as any
// operation's does, and may switch it to the fallback.
//
// Only decisions probe, and records are not queued in a fallback: a
// process whose traffic makes few decisions (a Policy with a retry budget
// alone, whose decisions are retries) calls Probe on a timer to come back
// to Redis without waiting for one, or to find at start that Redis cannot
// be reached and decide in memory at once. A timer of a few seconds, well
// under [MemberFor], also keeps an idle process among the members, so
// that the others' share in a fault counts it.
func (s *Store) Probe(ctx context.Context) error { return s.link.probe(ctx) }

// Members implements [fleet.MemberCounter]: how many processes share the
// store's Name, as last heard from Redis, at least 1 (1 until Redis has
// answered). Each store refreshes its membership in [MembersKey] with its
// traffic: a record of its own at most every [MemberFor]/40, in a batch of
// its queue, which carries its attempts' records (or a decision joining
// it) anyway, so no call waits for it, or in [Store.Probe]'s round trip;
// a store not heard from for [MemberFor] leaves the count. While Redis fails the count is the last one heard, and each
// part limits this process to its share of the fleet's (see the package
// documentation, "A share in a fault").
func (s *Store) Members() int { return s.link.membersKnown() }

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
	_ fleet.MemberCounter = (*Store)(nil)
)
