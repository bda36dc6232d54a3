// Package fleettest checks that a [fleet.Store] keeps the contract the
// engine relies on, for every part it implements: the retry budget
// always, and the throttle, breaker, rate-limit buckets, tenants' shares
// and spend when the store implements [fleet.ThrottleStore],
// [fleet.BreakerStore], [fleet.LimitStore], [fleet.ShareStore] or
// [fleet.SpendStore] (found by type assertion, as a Damper finds them).
//
// A store's author runs it from a test:
//
//	func TestConformance(t *testing.T) {
//		fleettest.Run(t, func(t *testing.T) fleet.Store {
//			return newStore(t) // one "process" of the fleet
//		}, fleettest.Options{Shared: true})
//	}
//
// Run calls the factory once per store it needs, with the subtest's t:
// the stores made for one subtest are the processes of one fleet, and
// with [Options.Shared] they share their state (a Redis store gives them
// one Name, and a name of their own to each subtest). Every check drives
// the parts with virtual times (from a fixed instant, 2030-01-01 12:00
// UTC, aligned on every window the checks use); only a store's own
// timeouts run on real time. Each check is a subtest, so that a store
// that cannot keep one yet can skip it by name with go test -skip.
//
// Records may reach the shared state after the method that made them
// returns (a store that sends them in batches): a store with a method
// Flush(context.Context) error is flushed before one store of the fleet
// is asked what another recorded, and before a check reads back what it
// recorded. Flush also gives back what a store holds in leases.
//
// The contract, as the checks state it (where fleet's documentation says
// less, the rule here is the precise one):
//
//   - Settings a part cannot use are an error naming the field (its Go
//     name, in any case) and the value.
//   - Budget: within a window a fleet never grants more than MinTokens +
//     Ratio × the first attempts that succeeded in it, whatever the
//     goroutines and stores asking at once, successes arriving meanwhile
//     included; a fleet that asks until it is refused is granted exactly
//     that (with leases, once the stores are flushed), Ratio × successes
//     counted without a float's rounding losing a unit; only a successful
//     first attempt counts; a refusal takes nothing; windows are aligned
//     on multiples of the window since the Unix epoch, unused units do
//     not carry over, and a late caller (now in an older window) is
//     counted in the newest window; each tenant's books are apart.
//   - Throttle: starts full at MaxTokens × 1000, every Add of every store
//     counts exactly, within [0, MaxTokens × 1000].
//   - Breaker: opens when FailureRatio of at least MinAttempts verdicts in
//     the last Window failed, refuses until OpenFor has passed (RefusesAt
//     and NextProbe say when), admits one probe at a time across the
//     fleet, doubles the open period after a failed probe up to
//     MaxOpenFor, and closes after a good one; an attempt admitted before
//     a change of state counts for nothing; OnChange hears each change in
//     order; a shared breaker open in one store is open in the others, and
//     each store hears the changes it sees, whichever store made them.
//   - Rate-limit buckets: at one instant a fleet admits at most each
//     bucket's content (exactly that when it asks until refused), and the
//     refill over a time is limit × time / minute; an interactive call
//     that can wait takes from an empty bucket and is due when the bucket
//     has refilled what it owes, one that cannot takes nothing (Reserve's
//     and Admits's due times agree); a call larger than the limit takes
//     the whole bucket, no more; batch calls take only BatchShare of each
//     bucket; a settling gives back what was not used and takes what was
//     used beyond, for the buckets known, once; a pause is seen by every
//     store of the fleet and refuses until it ends; a learned limit is
//     taken from a response and a bucket is lowered to the remaining count
//     it reports. A store that leases tokens admits, after a response
//     lowers a bucket to nothing, at most Lease-1 calls per store.
//   - Shares: the arithmetic of [fleet.MemoryStore]'s, step by step, to
//     the microsecond, across the stores of a fleet; an ask that cannot
//     be used is an error naming its field, and takes nothing.
//   - Spend: counted by the UTC day holding now (whatever now's
//     location), in whole nanodollars (ten adds of 0.1 are 1 exactly),
//     exactly under concurrent adds across the fleet; each tenant's count
//     apart; a bad amount refused naming it.
//   - In a fault ([Options.Fault]): every method of every part returns
//     within [Options.MaxWait] and still decides; each store keeps to its
//     share, N being the members it counts ([fleet.MemberCounter], once
//     its records have had up to 5 s to count the fleet; 1 for a store
//     that does not count them): the budget grants no more than
//     MinTokens / N + Ratio × the store's own successes (none with
//     [Options.FailClosed]), and its buckets admit at most the limit / N
//     at one instant; a new throttle counts its own store's Adds (0 with
//     FailClosed: no retry); a breaker still admits, and opens on the
//     failures its store sees; a new tenant takes its share; a spend
//     still answers.
package fleettest

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/damper-ai/damper-go/fleet"
)

// Options describe the store under test to [Run].
type Options struct {
	// Shared is whether the stores the factory makes for one test share
	// their state, as the processes of one fleet do. With it false (as
	// for [fleet.MemoryStore]), each store is a fleet of its own and the
	// bounds are checked per store.
	Shared bool
	// Lease is how many budget units, or calls' worth of rate-limit
	// tokens, a store may take in one decision and hold unspent (as
	// redisstore's Options.Lease): 0 or 1 for none. With a lease the
	// bounds that hold one way only are checked that way.
	Lease int
	// Fault, when set, makes the shared state of every store the factory
	// has made for t unreachable (a Redis that stops answering) until
	// restore is called; Run calls restore at the end of each fault check
	// at the latest. Without it the fault checks are skipped.
	Fault func(t *testing.T) (restore func())
	// FailClosed is whether the budget refuses every retry during a
	// fault; by default each store's budget decides from its own books,
	// on its share when the store counts its members.
	FailClosed bool
	// MaxWait bounds the real time any method may take during a fault:
	// the store's own timeout, with room for a decision queued behind a
	// batch in flight. Default 2 s.
	MaxWait time.Duration
}

// Base is the instant the checks start from: 2030-01-01 12:00 UTC, a
// multiple of every window they use.
var Base = time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)

// Run runs the contract's checks on the stores newStore makes, each as a
// subtest of t: Budget always; Throttle, Breaker, Limits, Shares and
// Spend when the stores implement their part; Fault when o.Fault is set.
// Subtests run one after another, so that a fault stops no other check.
func Run(t *testing.T, newStore func(t *testing.T) fleet.Store, o Options) {
	if o.MaxWait <= 0 {
		o.MaxWait = 2 * time.Second
	}
	e := &env{new: newStore, o: o}
	probe := newStore(t)
	t.Run("Budget", e.budget)
	if _, ok := probe.(fleet.ThrottleStore); ok {
		t.Run("Throttle", e.throttle)
	}
	if _, ok := probe.(fleet.BreakerStore); ok {
		t.Run("Breaker", e.breaker)
	}
	if _, ok := probe.(fleet.LimitStore); ok {
		t.Run("Limits", e.limits)
	}
	if _, ok := probe.(fleet.ShareStore); ok {
		t.Run("Shares", e.shares)
	}
	if _, ok := probe.(fleet.SpendStore); ok {
		t.Run("Spend", e.spend)
	}
	t.Run("Fault", e.fault)
}

// env is one run's factory and options.
type env struct {
	new func(t *testing.T) fleet.Store
	o   Options
}

// fleetSize is the number of stores a fleet check makes.
const fleetSize = 3

// stores makes n stores for t.
func (e *env) stores(t *testing.T, n int) []fleet.Store {
	t.Helper()
	s := make([]fleet.Store, n)
	for i := range s {
		s[i] = e.new(t)
		if s[i] == nil {
			t.Fatal("the factory returned a nil store")
		}
	}
	return s
}

// groups is the number of independent books among n stores: 1 when they
// share their state, n when each keeps its own.
func (e *env) groups(n int) int {
	if e.o.Shared {
		return 1
	}
	return n
}

// leased reports whether the store takes leases.
func (e *env) leased() bool { return e.o.Lease > 1 }

// flusher is a store whose records may reach the shared state after the
// method that made them returns.
type flusher interface {
	Flush(ctx context.Context) error
}

// flush sends what each store has queued and gives back its leases.
func flush(t *testing.T, stores ...fleet.Store) {
	t.Helper()
	for _, s := range stores {
		if f, ok := s.(flusher); ok {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			err := f.Flush(ctx)
			cancel()
			if err != nil {
				t.Fatalf("Flush: %v", err)
			}
		}
	}
}

// wantFieldError fails t unless err names field (in any case) and value.
func wantFieldError(t *testing.T, what string, err error, field, value string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: no error, want one naming %s = %s", what, field, value)
		return
	}
	msg := strings.ToLower(err.Error())
	if !strings.Contains(msg, strings.ToLower(field)) || !strings.Contains(msg, strings.ToLower(value)) {
		t.Errorf("%s: error %q does not name %s and %s", what, err, field, value)
	}
}

// parallel runs f(i) for i in [0, n) on goroutines of their own, all
// released at once, and waits for them.
func parallel(n int, f func(i int)) {
	var start, done sync.WaitGroup
	start.Add(1)
	for i := range n {
		done.Go(func() {
			start.Wait()
			f(i)
		})
	}
	start.Done()
	done.Wait()
}

// near reports whether a and b are within tol of each other.
func near(a, b, tol float64) bool { return math.Abs(a-b) <= tol }

// timed fails t when f takes longer than the fault's MaxWait.
func (e *env) timed(t *testing.T, what string, f func()) {
	t.Helper()
	start := time.Now()
	f()
	if d := time.Since(start); d > e.o.MaxWait {
		t.Errorf("%s took %v during a fault, want at most %v", what, d, e.o.MaxWait)
	}
}

// must fails t on err.
func must(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func ms(d time.Duration) time.Time { return Base.Add(d) }

func since(tm time.Time) string {
	if tm.IsZero() {
		return "zero"
	}
	return fmt.Sprint(tm.Sub(Base))
}
