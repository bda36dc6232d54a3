package damper

import (
	"context"
	"fmt"
	"time"
)

// Fleet state. By default a Damper keeps the state of its gates in memory:
// its retry budget, retry throttle, circuit breaker and the rate limiter's
// buckets. Every replica of a service then has its own, so that 50 replicas
// allow 50 budgets of retries and each learns the organisation's rate limit
// on its own. A Store keeps that state where every replica shares it (the
// redisstore module keeps it in Redis), so the fleet has one budget, one
// view of the provider's health and one view of the API's limits.
//
// The parts a Store makes are called on every attempt, from many goroutines
// at once. A part backed by a remote store may fail or time out: its
// methods then still decide (from state kept in memory, or refusing, as the
// store was built to) and return the error as well, which Damper logs at
// most once every ten seconds per part, with the count of errors. The
// context given to them is the call's, or, for what must be recorded
// whatever becomes of the call, one without its cancellation: a store
// bounds its own waits.

// Store makes the parts of a Damper's state that a fleet shares. [New] asks
// it, once, for each part its Policy configures (the budget always), with
// the Policy's values, defaults filled in; LimitBuckets is asked for each
// limit group at the group's first call. A method that returns nil keeps
// that part in memory; an error from New's questions fails New, and one
// from LimitBuckets keeps that group in memory and is logged.
//
// [MemoryStore] is the store Damper uses when none is given.
type Store interface {
	Budget(BudgetSettings) (Budget, error)
	Throttle(ThrottlePolicy) (Throttle, error)
	Breaker(BreakerSettings) (Breaker, error)
	LimitBuckets(LimitSettings) (LimitBuckets, error)
}

// CallContexter is implemented by a [Store], or a [Budget] given to
// [WithBudget], that keeps a note of each call: Damper gives each call's
// context to CallContext once, as the call begins, and the context it
// returns (or one made from it) to every method of the parts for that
// call. A store across a network uses it so that a call waits out at most
// one of its timeouts: once one operation of the call has failed, the
// call's others decide without asking.
type CallContexter interface {
	CallContext(ctx context.Context) context.Context
}

// WithStore keeps the Damper's budget, throttle, breaker and rate-limit
// buckets in s, such as Redis shared by a fleet. [WithBudget] given as
// well overrides s for the budget.
func WithStore(s Store) Setting {
	return func(d *Damper) error {
		if s == nil {
			return fmt.Errorf("damper: WithStore(nil): a store is required (MemoryStore{} keeps the state in memory)")
		}
		d.store = s
		return nil
	}
}

// BudgetSettings are the retry budget's values: within one Window the
// retries it authorizes are at most MinTokens + Ratio × the first attempts
// that succeeded in it.
type BudgetSettings struct {
	Ratio     float64
	Window    time.Duration
	MinTokens int
}

// Throttle holds the retry throttle's count of tokens, in thousandths of a
// token. Damper keeps the throttle's rule (see [ThrottlePolicy]); a
// Throttle keeps the count within [0, MaxTokens×1000], starting full.
type Throttle interface {
	// Add adds delta thousandths of a token (a negative delta takes),
	// keeping the count within its bounds.
	Add(ctx context.Context, delta int64) error
	// Tokens returns the count, in thousandths of a token.
	Tokens(ctx context.Context) (int64, error)
}

// BreakerSettings are a circuit breaker's values.
type BreakerSettings struct {
	// BreakerPolicy holds the breaker's thresholds, defaults filled in;
	// its OnStateChange is nil: changes go to OnChange.
	BreakerPolicy
	// ProbeLimit is the longest an attempt, and so a probe, can take:
	// while one probe is out, the next may start no later than its start
	// plus ProbeLimit.
	ProbeLimit time.Duration
	// OnChange hears every change of state the breaker sees, in order,
	// one at a time, with no lock held. A shared breaker tells each
	// replica the changes it sees, whichever replica caused them.
	OnChange func(CircuitChange)
}

// Breaker is a circuit breaker's state machine, driven by the time Damper
// gives it. Damper tells it, for every attempt it admitted, how the
// attempt ended, with the ticket Allow gave.
type Breaker interface {
	// Allow admits an attempt at now, or refuses it.
	Allow(ctx context.Context, now time.Time) (CircuitAdmission, error)
	// RefusesAt reports, admitting nothing, whether an attempt at the
	// later time at would be refused, as far as can be told at now, and
	// when a probe is due if so.
	RefusesAt(ctx context.Context, now, at time.Time) (refused bool, nextProbe time.Time, err error)
	// Done records the end of the attempt admitted with t.
	Done(ctx context.Context, t CircuitTicket, now time.Time, v CircuitVerdict) error
	// State returns the state at now.
	State(ctx context.Context, now time.Time) (CircuitState, error)
}

// CircuitAdmission is a [Breaker]'s answer to Allow.
type CircuitAdmission struct {
	// OK is whether the attempt may go.
	OK bool
	// Ticket goes back to Done when the attempt ends.
	Ticket CircuitTicket
	// State is the breaker's state when it answered.
	State CircuitState
	// NextProbe is, for a refusal, the earliest time a probe may be
	// admitted.
	NextProbe time.Time
}

// CircuitTicket is an admitted attempt, as its breaker knows it.
type CircuitTicket struct {
	// Generation is the breaker's generation when it admitted the attempt:
	// every change of state starts a new one, and an attempt admitted in
	// an older generation counts for nothing when it ends.
	Generation uint64
	// Probe is true for the one attempt admitted while half-open.
	Probe bool
}

// CircuitVerdict is what an ended attempt says of the provider's health.
type CircuitVerdict uint8

const (
	// CircuitNeutral: nothing (a 4xx, a rate limit, the caller's
	// cancellation, an attempt never sent).
	CircuitNeutral CircuitVerdict = iota
	// CircuitSuccess: the provider answered.
	CircuitSuccess
	// CircuitFailure: a 5xx, a 529, a transport failure or an attempt
	// timeout.
	CircuitFailure
)

// LimitSettings are one limit group's values. A Damper drops a group it
// has not used for a while (see [RateLimitPolicy]) and asks for its
// buckets again at its next call: a store that keeps a group's state
// apart from the LimitBuckets it returned must let it expire on its own.
type LimitSettings struct {
	// Group is the group's name (see [LimitGroup]).
	Group string
	// Limits are its configured limits; a zero field is learned.
	Limits RateLimits
	// BatchShare is the share of each bucket batch calls may use.
	BatchShare float64
}

// RateAmounts holds one number per bucket of a limit group: requests,
// input tokens and output tokens, in that order.
type RateAmounts [3]float64

// LimitBuckets are one limit group's three buckets: requests, input tokens
// and output tokens per minute, each of limit L holding at most L and
// refilling at L a minute, driven by the time Damper gives them. An
// interactive request takes from all three at once, or from none, and may
// drive a bucket below zero (it is then due when the bucket has refilled);
// a batch request takes only while every bucket keeps the share of its
// limit that BatchShare leaves to interactive requests. A bucket whose
// limit is neither configured nor learned yet admits everything.
type LimitBuckets interface {
	// Reserve asks for cost at now, for a request that can be sent no
	// later than latest. It either takes (r.Taken()) and the request may
	// be sent at due, no earlier than now and no earlier than the end of
	// a pause under way; or takes nothing and the request can be admitted
	// no sooner than due: after latest, it is refused; else its caller
	// waits until due and asks again, with the same ticket (nil for an
	// interactive request; a batch request's place in the batch line).
	Reserve(ctx context.Context, now time.Time, cost RateAmounts, p Priority, latest time.Time, t *RateTicket) (r RateReservation, due time.Time, err error)
	// Admits returns, taking nothing, when a request of cost at priority
	// p asked at the later time at could take, as far as can be told at
	// now.
	Admits(ctx context.Context, now, at time.Time, cost RateAmounts, p Priority) (time.Time, error)
	// Observe corrects the buckets from the headers of the response to the
	// request of r, before r is settled: a bucket not configured takes the
	// response's limit, and a count of what remains lowers a bucket that
	// holds more (it never raises one).
	Observe(ctx context.Context, now time.Time, r RateReservation, o RateObservation) error
	// Settle replaces what r took, for each bucket known marks, by what
	// its request used; the difference goes back to the bucket, or comes
	// out of it. r is settled once; settling it with nothing used and
	// every bucket known gives back all it took.
	Settle(ctx context.Context, now time.Time, r RateReservation, used RateAmounts, known [3]bool) error
	// PausedUntil is when the group's last pause ends, or the zero time
	// when none is under way at now.
	PausedUntil(ctx context.Context, now time.Time) (time.Time, error)
	// Pause empties the buckets named and admits nothing from them before
	// until: a 429 for a rate limit, whose delay every request waits out.
	Pause(ctx context.Context, now time.Time, named [3]bool, until time.Time) error
	// State returns the three buckets at now, Group left empty.
	State(ctx context.Context, now time.Time) ([3]RateLimitState, error)
	// Leave takes a batch request that gives up (refused, cancelled, past
	// its deadline, or its reservation given back) out of the batch line,
	// so that no request behind it waits for its turn; it leaves t as a
	// request that has not joined the line. A ticket with no slot changes
	// nothing.
	Leave(ctx context.Context, now time.Time, t *RateTicket) error
}

// RateReservation is what one request took from a group's buckets: a value
// of the LimitBuckets that made it, given back to it by Observe and Settle.
type RateReservation interface {
	// Taken reports whether it took and is not settled yet.
	Taken() bool
}

// RateTicket is a batch request's place in the batch line, kept between
// its asks; the zero value is a request that has not joined it.
type RateTicket struct {
	// Slot is when the request may take its turn.
	Slot time.Time
}

// RateObservation is what one response's anthropic-ratelimit-* headers say
// of a group's buckets, in the order of [RateAmounts].
type RateObservation struct {
	Has       [3]bool // the response carried the bucket's headers
	Limit     RateAmounts
	Remaining RateAmounts
}
