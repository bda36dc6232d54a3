package redisstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/fleet"
	"github.com/redis/go-redis/v9"
)

// DefaultTimeout bounds each operation's wait for Redis when
// [Options.Timeout] is zero.
const DefaultTimeout = 50 * time.Millisecond

// ErrUnavailable marks an operation decided without asking Redis: Redis
// failed recently and the operation is not the probe, or an earlier
// operation of the same call failed. The error also wraps that failure.
var ErrUnavailable = errors.New("redisstore: Redis unavailable, not asked")

// Options configure a [Store]: where its state lives in Redis, and how it
// waits for Redis. The parts' values come from the Damper's Policy: give
// every process of the fleet the same.
type Options struct {
	// Name is the namespace in Redis: every process that gives the same
	// Name shares one budget, throttle, breaker and set of rate-limit
	// buckets. Usually the name given to
	// damper.WithName. 1 to 64 printable ASCII characters, without spaces
	// or braces, since it becomes the keys' hash tag.
	Name string

	// Timeout bounds each operation's wait for Redis, whatever the client's
	// own timeouts (see the package documentation for ContextTimeoutEnabled).
	// Default [DefaultTimeout].
	Timeout time.Duration
	// ProbeInterval is, while Redis fails, the least time between the end
	// of one probe (the one operation that asks Redis again) and the start
	// of the next; the others decide at once without it. Default: Timeout,
	// so that shared decisions resume within a Timeout and a ProbeInterval
	// of Redis coming back.
	ProbeInterval time.Duration
	// FailClosed makes the budget (and a Store's throttle) refuse every
	// retry while Redis fails. By default a local fleet.WindowBudget with
	// the same parameters, which has heard this process's attempts all
	// along, decides instead, on this process's share of one budget split
	// among the store's members (see [Budget]), and a local throttle. The
	// breaker and the rate limiter always fall back on state kept in
	// memory (the rate limiter on this process's share).
	FailClosed bool
	// Logger, when set, hears each switch between Redis and the fallback:
	// one line per switch, not one per operation.
	Logger *slog.Logger

	// Lease, when above 1, lets each process take up to Lease budget units,
	// or Lease calls' worth of rate-limit tokens, from Redis in one decision
	// and spend them without a round trip until they run out, their window
	// ends or LeaseFor passes (what is left then goes back in a record).
	// 0 or 1: every decision asks Redis, as without leases. At most 1,000.
	Lease int
	// LeaseFor bounds how long a process keeps leased units or tokens
	// unspent before it gives them back. Default 1 s; at most 1 minute.
	LeaseFor time.Duration
}

// The lease's default time and largest size: see Options.
const (
	defaultLeaseFor = time.Second
	maxLease        = 1000
)

// State is where a [Budget]'s decisions come from.
type State int32

const (
	// StateShared: Redis answers, and the fleet's books decide.
	StateShared State = iota
	// StateFallback: Redis failed; the local budget decides (or, with
	// FailClosed, every retry is refused) until a probe finds it again.
	StateFallback
)

func (s State) String() string {
	switch s {
	case StateShared:
		return "shared"
	case StateFallback:
		return "fallback"
	}
	return fmt.Sprintf("State(%d)", int32(s))
}

// Stats are a Budget's state and its counters since it was built, for
// metrics: the counters only grow.
type Stats struct {
	// State is the budget's state now.
	State State
	// Fallbacks counts the switches from Redis to the fallback.
	Fallbacks uint64
	// Recoveries counts the switches back to Redis.
	Recoveries uint64
	// Failures counts the operations that Redis failed or did not answer
	// within the timeout, whether or not they switched to the fallback.
	Failures uint64
	// Unasked counts the operations decided without asking Redis: during
	// a fallback, between probes, and after an earlier operation of the
	// same call failed.
	Unasked uint64
	// Dropped counts the records dropped because the queue held
	// [QueueLimit] records already.
	Dropped uint64
}

// Budget is a [fleet.Budget] whose books are kept in Redis, so that every
// process given the same [Options.Name] draws on one fleet-wide budget with
// the arithmetic of [fleet.WindowBudget]: the budget of a [Store], with the
// values of the Damper's Policy. Each operation is a Lua script bounded by
// the timeout: Acquire and Available are a round trip each, and Observe is
// queued, for the store's next batch (see the package documentation).
// With [Options.Lease] above 1, Acquire takes several units in one round
// trip and spends them without one (see the package documentation,
// Leases).
// While Redis fails, the budget decides as [Options.FailClosed] says and
// returns the error as well. It is safe for concurrent use.
//
// A share in a fault. Failing open, the local budget decides as one of N
// budgets that split one, N the store's members last heard
// ([Store.Members]; 1 for a process alone, or one that never heard
// Redis): a window's capacity is MinTokens / N + Ratio × this process's
// own successes in it, its own units of the window (those Redis granted
// it included) counted against it ([fleet.WindowBudget.TryAcquireShare]).
// So a window the fault spans whole grants the fleet at most the sum of
// each process's ⌊MinTokens / N + Ratio × s_i⌋, at most MinTokens + Ratio
// × the fleet's successes: one budget. When Redis answers again, each
// process charges the books of the fault's window with the successes
// Redis never heard and the units its fallback granted, before its next
// operation on them. So a window the fault splits grants one budget once
// every process has charged; a process that asks Redis before another
// has charged can be granted that other's fault units again, so the
// bound, with processes that come back late or never, is twice the
// budget.
//
// It keeps the books of the newest window it has heard of, from every
// script's reply: [Budget.KnownBalance] answers from them, without a round
// trip.
type Budget struct {
	link      *link
	keys      []string
	ratio     float64
	minTokens float64
	window    time.Duration
	ttl       int64  // the key's time to live, in milliseconds
	minArg    string // minTokens and ratio as the scripts read them
	ratioArg  string

	// local keeps this process's share of the books at all times, so that a
	// fallback in the middle of a window starts from what this process has
	// earned and spent in it.
	local *fleet.WindowBudget

	mu    sync.Mutex
	heard books // the newest window's books heard from Redis
	lease lease // units taken from Redis and not spent yet (see budget_lease.go)
	owed  owed  // what the fallback counted and Redis has not heard
}

// owed is what a fallback counted in one window, for Redis's books: the
// successes Redis was never asked to count, and the units the fallback
// granted.
type owed struct {
	window          int64
	successes, used int64
}

var (
	_ fleet.Budget        = (*Budget)(nil)
	_ fleet.KnownBalancer = (*Budget)(nil)
	_ fleet.CallContexter = (*Budget)(nil)
)

// newBudget returns the budget of s on l, taking leases of size units
// kept for at most leaseFor when size is above 1.
func newBudget(l *link, s fleet.BudgetSettings, size int, leaseFor time.Duration) (*Budget, error) {
	local, err := fleet.NewWindowBudget(s.Ratio, s.Window, s.MinTokens)
	if err != nil {
		return nil, err
	}
	if err := checkTenant(s.Tenant); err != nil {
		return nil, err
	}
	// A few windows, and at least a second: the books of a window only
	// matter while it lasts, and a late caller's shortly after.
	ttl := time.Duration(math.MaxInt64)
	if s.Window < ttl/3 {
		ttl = max(3*s.Window, time.Second)
	}
	return &Budget{
		link:      l,
		keys:      []string{TenantKey(l.name, s.Tenant)},
		ratio:     s.Ratio,
		minTokens: float64(s.MinTokens),
		window:    s.Window,
		ttl:       ttl.Milliseconds(),
		minArg:    strconv.Itoa(s.MinTokens),
		ratioArg:  strconv.FormatFloat(s.Ratio, 'g', -1, 64),
		local:     local,
		lease:     lease{size: size, keepFor: orDefault(leaseFor, defaultLeaseFor)},
	}, nil
}

// Key returns the Redis key that holds the books of the budget named name:
// damper:{name}:budget. The braces make name the key's hash tag, so that
// every key of one Damper lands on one Cluster slot.
func Key(name string) string { return "damper:{" + name + "}:budget" }

// TenantKey returns the Redis key that holds the books of tenant's budget
// in the Damper named name: damper:{name}:budget:tenant:<tenant>, or
// Key(name) for the tenant "".
func TenantKey(name, tenant string) string {
	if tenant == "" {
		return Key(name)
	}
	return Key(name) + ":tenant:" + tenant
}

// checkTenant checks a tenant's name as a key holds it.
func checkTenant(tenant string) error {
	ok := len(tenant) <= 64
	for i := 0; ok && i < len(tenant); i++ {
		c := tenant[i]
		ok = 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.'
	}
	if !ok {
		return fmt.Errorf("redisstore: BudgetSettings.Tenant = %q: want at most 64 ASCII letters, digits, '-', '_' or '.'", tenant)
	}
	return nil
}

// checkOptions checks the options every constructor uses.
func checkOptions(o Options) error {
	if err := checkName(o.Name); err != nil {
		return err
	}
	switch {
	case o.Timeout < 0:
		return fmt.Errorf("redisstore: Options.Timeout = %v: must be positive (0 means the default, %v)", o.Timeout, DefaultTimeout)
	case o.ProbeInterval < 0:
		return fmt.Errorf("redisstore: Options.ProbeInterval = %v: must be positive (0 means the timeout)", o.ProbeInterval)
	case o.Lease < 0 || o.Lease > maxLease:
		return fmt.Errorf("redisstore: Options.Lease = %d: must be 0 to %d (0 or 1: no lease)", o.Lease, maxLease)
	case o.LeaseFor < 0 || o.LeaseFor > time.Minute:
		return fmt.Errorf("redisstore: Options.LeaseFor = %v: must be 0 to 1m0s (0 means the default, %v)", o.LeaseFor, defaultLeaseFor)
	}
	return nil
}

func checkName(name string) error {
	if len(name) == 0 || len(name) > 64 {
		return fmt.Errorf("redisstore: Options.Name = %q: must be 1 to 64 characters", name)
	}
	for _, r := range name {
		if r < 0x21 || r > 0x7e || r == '{' || r == '}' {
			return fmt.Errorf("redisstore: Options.Name = %q: must be printable ASCII without spaces or braces", name)
		}
	}
	return nil
}

// orDefault returns def for zero, 0 for damper.None, and v otherwise.
func orDefault[T int | float64 | time.Duration](v, def T) T {
	switch v {
	case 0:
		return def
	case damper.None:
		return 0
	}
	return v
}

// Observe implements [fleet.Budget]. Only a successful first attempt
// counts, as in fleet.WindowBudget; the others cost no round trip. While
// Redis fails, the success is counted locally only.
func (b *Budget) Observe(ctx context.Context, now time.Time, a fleet.AttemptOutcome) error {
	if !a.First || !a.Success {
		return nil
	}
	b.local.FirstAttemptSucceeded(now)
	id := windowNumber(now, b.window)
	_ = b.charge(ctx, false)
	err := b.link.record(ctx, "observe", observeScript, b.keys, b.args(id), nil, func(v any, err error) {
		if err == nil {
			_, _ = b.read("observe", id, v)
		} else if errors.Is(err, ErrUnavailable) {
			b.owe(id, 1, 0) // dropped from its batch unsent
		}
	})
	if errors.Is(err, ErrUnavailable) {
		// Never sent: Redis hears of it with the fallback's charge.
		b.owe(id, 1, 0)
	}
	return err
}

// owe keeps successes and units the fallback counted in window id, for
// Redis's books; those of an older window are dropped, as it is over.
func (b *Budget) owe(id, successes, used int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch o := &b.owed; {
	case id == o.window:
		o.successes += successes
		o.used += used
	case id > o.window:
		*o = owed{id, successes, used}
	}
}

// charge charges Redis's books with what the fallback counted, once Redis
// answers, before this process's next operation on them: for a decision
// (wait), one decision of its own, once after a fallback, which may be
// the probe; for a record, a record queued ahead of it. So the fallback's
// units count against the window in Redis, as the rate limiter's fault
// admissions do against its buckets, and a window a fault splits grants
// one budget, not one before, one in and one after the fault. A charge
// that failed after Redis was asked is kept for its units only: a success
// counted twice would grant more than the budget, a unit counted twice
// fewer. So while Redis fails, when the charge is the probe, it carries
// the units only, and the successes follow in a record once the probe is
// answered: a probe that fails may have reached Redis or not, and every
// probe of a fault would otherwise take the successes owed with it.
//
// A decision's charge returns the error of a charge Redis did not answer,
// whether or not it was asked: the decision is then the fallback's, since
// asking Redis itself, as the probe, would decide on books without the
// charge.
func (b *Budget) charge(ctx context.Context, wait bool) error {
	down := b.link.down.Load()
	if !wait && down {
		return nil
	}
	b.mu.Lock()
	o := b.owed
	b.owed = owed{window: o.window}
	if down {
		b.owed.successes, o.successes = o.successes, 0
	}
	waiting := b.owed.successes
	b.mu.Unlock()
	if o.successes == 0 && o.used == 0 && waiting == 0 {
		return nil
	}
	args := []any{strconv.FormatInt(o.window, 10), b.ttl, o.successes, o.used}
	heard := func(v any, err error) {
		switch {
		case err == nil:
			_, _ = b.read("charge", o.window, v)
		case errors.Is(err, ErrUnavailable):
			b.owe(o.window, o.successes, o.used)
		default:
			b.owe(o.window, 0, o.used)
		}
	}
	if wait {
		v, err := b.link.run(ctx, "charge", chargeScript, b.keys, args...)
		heard(v, err)
		if err == nil && waiting > 0 {
			// Redis answered the probe: the successes go ahead of the
			// operation, which the queue sends after them.
			_ = b.charge(ctx, false)
		}
		return err
	}
	if err := b.link.record(ctx, "charge", chargeScript, b.keys, args, nil, heard); err != nil {
		heard(nil, err)
	}
	return nil
}

// Acquire implements [fleet.Budget]. While Redis fails it returns the
// fallback's decision and the error.
//
// With [Options.Lease] above 1 it spends a unit of this process's lease
// when it holds one for now's window, without a round trip, and otherwise
// takes a new lease of up to Lease units in one decision (see the package
// documentation, Leases).
func (b *Budget) Acquire(ctx context.Context, now time.Time) (bool, error) {
	if err := b.charge(ctx, true); err != nil {
		return b.fallback(now, err)
	}
	if b.lease.size > 1 {
		return b.acquireLeased(ctx, now)
	}
	r, err := b.run(ctx, "acquire", acquireScript, now)
	if err != nil {
		return b.fallback(now, err)
	}
	if r.granted {
		// The local books take the unit too, as far as this process's own
		// successes allow.
		b.local.TryAcquire(now)
	}
	return r.granted, nil
}

// fallback decides a retry that Redis did not answer, as the options say,
// and returns err with it.
func (b *Budget) fallback(now time.Time, err error) (bool, error) {
	if b.link.failClosed {
		return false, err
	}
	ok := b.local.TryAcquireShare(now, b.link.membersKnown())
	if ok {
		b.owe(windowNumber(now, b.window), 0, 1)
	}
	return ok, err
}

// Available implements [fleet.Budget]: the units left in the fleet's
// window holding now, this process's unspent lease included. While Redis
// fails it returns the local budget's balance (0 with FailClosed) and the
// error.
func (b *Budget) Available(ctx context.Context, now time.Time) (float64, error) {
	err := b.charge(ctx, true)
	var r books
	if err == nil {
		r, err = b.run(ctx, "available", availableScript, now)
	}
	if err != nil {
		if b.link.failClosed {
			return 0, err
		}
		return b.local.BalanceShare(now, b.link.membersKnown()), err
	}
	return b.balance(r) + float64(b.leased(r.window)), nil
}

// balance is the units left by books r: fleet.WindowBudget's capacity and
// rounding, to the bit.
func (b *Budget) balance(r books) float64 {
	capacity := b.minTokens + b.ratio*float64(r.successes) + 1e-9
	return math.Max(0, math.Floor((capacity-float64(r.used))*1e6)/1e6)
}

// CallContext implements [fleet.CallContexter], as [Store.CallContext]
// does: once one operation of a call has failed or timed out, its others
// decide without asking Redis.
func (b *Budget) CallContext(ctx context.Context) context.Context { return b.link.callContext(ctx) }

// KnownBalance implements [fleet.KnownBalancer]: the units left in the
// window holding now, as last heard from Redis, without a round trip. The
// books heard are those of the last reply of any of the budget's scripts,
// this process's own or queued records not yet answered excluded: the
// balance may be a little behind the fleet's. A window newer than any
// heard of has its MinTokens. While Redis fails it is the local budget's
// balance (0 with FailClosed), as for Available. This process's unspent
// lease counts as available.
func (b *Budget) KnownBalance(now time.Time) float64 {
	if b.link.down.Load() {
		if b.link.failClosed {
			return 0
		}
		return b.local.BalanceShare(now, b.link.membersKnown())
	}
	id := windowNumber(now, b.window)
	b.mu.Lock()
	r := b.heard
	b.mu.Unlock()
	if r.window < id {
		r = books{} // nothing heard of now's window yet
	}
	// An older now is counted in the newest window, as a script counts it.
	return b.balance(r) + float64(b.leased(id))
}

// State returns where the budget's decisions come from now.
func (b *Budget) State() State { return b.link.state() }

// Stats returns the budget's state and counters.
func (b *Budget) Stats() Stats { return b.link.stats() }

// books is a window's state as a script returned it.
type books struct {
	window          int64 // the window the caller asked of: see windowNumber
	successes, used int64
	granted         bool
	units           int64 // units taken: 1 if granted, or a lease's
}

// run runs script s on the window holding now, with the arguments of
// args and then extra.
func (b *Budget) run(ctx context.Context, op string, s *redis.Script, now time.Time, extra ...any) (books, error) {
	id := windowNumber(now, b.window)
	v, err := b.link.run(ctx, op, s, b.keys, append(b.args(id), extra...)...)
	if err != nil {
		return books{}, err
	}
	return b.read(op, id, v)
}

// args are a script's arguments for window id.
func (b *Budget) args(id int64) []any {
	return []any{strconv.FormatInt(id, 10), b.ttl, b.minArg, b.ratioArg}
}

// read reads a script's reply for window id, and keeps the books if they
// are the newest heard of.
func (b *Budget) read(op string, id int64, v any) (books, error) {
	r, err := b.link.ints(op, v, 3)
	if err != nil {
		return books{}, err
	}
	bk := books{window: id, successes: r[0], used: r[1], granted: r[2] >= 1, units: r[2]}
	b.mu.Lock()
	// Within a window the counts only grow, so the larger is the newer,
	// whatever order the replies came in.
	switch h := &b.heard; {
	case id > h.window:
		*h = bk
	case id == h.window:
		h.successes, h.used = max(h.successes, bk.successes), max(h.used, bk.used)
	}
	b.mu.Unlock()
	return bk, nil
}

// windowNumber numbers the window holding now's wall time, in windows
// since the Unix epoch: the one clock a fleet shares.
func windowNumber(now time.Time, window time.Duration) int64 {
	n, w := now.UnixNano(), int64(window)
	id := n / w
	if n%w < 0 {
		id--
	}
	return id
}
