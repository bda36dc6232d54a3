// Package redisstore keeps a Damper's state in Redis, so that a fleet of
// processes shares one retry budget, one retry throttle, one circuit
// breaker and one set of rate-limit buckets, instead of each holding its
// own: 50 replicas with budgets of their own allow 50 budgets of retries,
// and 50 rate limiters each learning the organisation's limit each spend
// all of it.
//
// It is a module of its own, so that users of damper who do not need Redis
// never download a Redis client.
//
// # What is shared
//
// [New] returns a [Store], a [fleet.Store]: give it to [damper.WithStore]
// and every part the Policy configures lives in Redis, under the store's
// [Options.Name]. The parts take their values from the Policy: give every
// process of the fleet the same Policy and the same Name.
//
//	rdb := redis.NewClient(&redis.Options{Addr: "redis:6379", ContextTimeoutEnabled: true, MaxRetries: -1})
//	store, err := redisstore.New(rdb, redisstore.Options{Name: "checkout"})
//	if err != nil {
//		return err
//	}
//	d, err := damper.New(policy, damper.WithName("checkout"), damper.WithStore(store))
//
// The retry budget has the arithmetic of [fleet.WindowBudget], for the
// whole fleet: within one window the retries granted to all processes
// together are at most MinTokens + Ratio × the successful first attempts of
// all processes in that window. A retry takes one unit, a refused one
// none, and unused units do not carry over. Its values are the Policy's
// RetryBudgetRatio, RetryBudgetWindow and RetryBudgetMinTokens: the store
// is the way to a shared budget (a Policy that configures no other part
// keeps the rest in memory).
//
// Windows are aligned on multiples of the window since the Unix epoch, by the
// wall time of the now that Damper passes in (its clock's, never Redis's TIME):
// the fleet shares no other clock. An operation whose now is in an older window
// than the one Redis holds is counted in the newer one, as WindowBudget counts
// a late caller, so a process whose clock lags joins the fleet's window instead
// of resetting it; a window begins for everyone when the fastest clock reaches
// it, so the clocks' skew is the error.
//
// # Keys and scripts
//
// A budget is one hash, damper:{<Name>}:budget (see [Key]), with the fields
// w (the window's start, in windows since the epoch), s (successful first
// attempts) and u (units used). The braces make the name a hash tag: every
// key of one Damper lands on one Redis Cluster slot. Each operation is one
// Lua script (EVALSHA, with EVAL the first time a server sees it): it
// starts a new window when now has moved past the stored one, then counts
// a success, takes a unit, or reads the books. Starting a window sets the
// key to expire after three windows (at least a second), so a budget
// nobody uses disappears. An outcome other than a successful first attempt
// costs nothing.
//
// A tenant's spend of one UTC day, for its daily cost ceiling, is one
// string, damper:{<Name>}:spend:<tenant>:<yyyy-mm-dd> (see [SpendKey]):
// an integer of nanodollars, added to by INCRBY in a script that sets it
// to expire after [SpendTTL] (see [Store.Spend]).
//
// # Decisions and records
//
// The parts' operations are of two kinds. A decision is one whose answer
// the caller waits for: the limiter's Reserve, the breaker's Allow, the
// throttle's Tokens, the budget's Acquire (the gates' admissions), a
// tenant's spend's Spent, and the reads. A record is one whose result no
// decision of the call waits on: the budget's Observe, the throttle's
// Add, the breaker's Done, the limiter's Observe, Settle, Leave and
// Pause, and a spend's Add. A record goes into the
// store's queue and returns at once; the local state that decides during a
// fallback hears it at once, as before. One record is sent as a decision
// is, its caller waiting for it: the breaker's Done of a failure, so that
// the fleet's next Allow counts it (see [Store.Breaker]). The queue goes to Redis in
// batches, one pipeline each (one round trip, each operation still its
// own script), one batch at a time: a writer goroutine of the store's
// sends it as soon as no batch is in flight, and ends when the queue is
// empty. A decision that finds the queue empty and no batch in flight is
// one round trip of its own; otherwise it joins the queue and goes in its
// next batch, after the records queued before it, so that this process's
// decisions always see its own records, in order. A successful call
// through a Damper whose every part is in Redis thus makes two round trips
// on its caller's path, the limiter's and the breaker's admissions, and
// its five records follow in a batch of their own or ride with the next
// decision. The limiter's Observe and Settle of one response go as one
// script when the second finds the first queued still.
//
// The queue holds at most [QueueLimit] records: one more is dropped, its
// error returned and counted ([Stats].Dropped), and the caller never
// waits. A batch that fails counts against Redis as one operation does
// (see below): the records in it are lost to the fleet, as a failed
// record always was. [Store.Flush] sends what is queued and waits for it:
// for tests that read Redis right after a call, and for a clean stop.
//
// The budget keeps the books of the newest window it heard of in any
// script's reply, and answers [Budget.KnownBalance] from them, without a
// round trip: the balance as last heard from Redis, which this process's
// records still queued, and other processes' operations since, have not
// moved. Damper reads a call's report's balance and its gauge so;
// [Budget.Available], asked directly, asks Redis.
//
// # Leases
//
// Every decision asks Redis, and one Redis runs every script of a Name on
// one core: a fleet asking many decisions a second can fill it. With
// [Options.Lease] above 1 a process takes several units of the shared
// state in one decision and spends them without asking Redis, trading
// exactness for fewer operations, within a stated bound:
//
//   - Units are taken in Redis, atomically, by a script with the same
//     test as a decision's: the fleet never takes more than the shared
//     state holds. A lease moves when a unit is spent, never how many
//     exist.
//   - A process holds at most Lease units at a time, and takes one lease
//     at a time: its goroutines that find none to spend wait for the
//     decision in flight rather than each taking one of their own.
//   - Leased units belong to one window: a new window voids them (units
//     never carry over), and so does a fallback (the local budget decides
//     as without leases). Units kept unspent for [Options.LeaseFor]
//     (measured on the process's own clock, not on the now Damper
//     passes), and those held when [Store.Flush] is called, go back to
//     their window in a record.
//   - Records are exact as without leases: the budget's Observe is one
//     success counted, in the queue.
//
// For the retry budget, Acquire spends a unit of the process's lease for
// now's window when it holds one; otherwise it asks Redis, in one
// decision, for up to Lease units of the window, as many as are left, and
// keeps all but the one it spends; none left is a refusal. Within a
// window the fleet's grants are then:
//
//   - never more than MinTokens + Ratio × the successes, as without a
//     lease: a unit leased is a unit used in Redis's books;
//   - at least that less (Lease-1) × the processes: a unit leased and not
//     yet spent counts as used for the others, so a process may be
//     refused while others hold units that they spend later, give back,
//     or leave unspent when the window ends (at most Lease-1 each, fewer
//     retries, never more). A fleet whose every process asks until it is
//     refused, as in an outage, spends them all: it is granted exactly
//     MinTokens + Ratio × the successes.
//
// [Budget.Available] and [Budget.KnownBalance] count the process's
// unspent lease as available; other processes see those units as used.
// A fleet then asks Redis about once per Lease retries granted, plus one
// decision per refusal (the fleet test in the module's tests measures it;
// docs/BENCHMARKS.md has the figures). A Redis that restarts without
// persistence loses the books, not the leases: what a process holds is
// still spent, and given back to the new books.
//
// Use a lease when the budget's decisions are a share of Redis's load
// worth saving: a large fleet in an outage asks a retry for each failure,
// each a round trip without a lease. Keep Lease × the processes well under
// MinTokens, or the units stranded in leases are a large part of the
// budget: a budget of 10 shared by 20 processes wants no lease.
//
// # Leases of the rate limiter's tokens
//
// With [Options.Lease] above 1, the rate limiter's Reserve for an
// interactive request that Redis admits at once, every limit of the group
// known, takes in its one script the request's cost and up to Lease-1 more
// calls' worth of it, from what the buckets hold then (never below 0, so
// the lease makes nobody wait who would not have); the process keeps that
// as the group's lease. The group's next interactive Reserves that the
// lease covers in every bucket take from it, due at now, with no round
// trip: with Lease 5, ten requests that fit make two decisions. A batch
// request, a request that must wait and a group with a limit not known
// yet ask Redis as without leases; so does a request the lease does
// not cover, whose decision's top-up replaces the lease (what was left goes
// back). A refusal is still one decision. Settle corrects a leased
// reservation as any other (what it did not use goes back to the shared
// buckets, in a record; what it used beyond comes out of them), and
// Observe stays a record.
//
// The lease goes back, its unspent tokens in a record (as a reservation's
// unused ones), when this process's 429 pauses the group (before the
// pause empties the buckets), when a response reports a new learned limit,
// at the group's first Reserve once LeaseFor has passed since it was taken
// (a lease that old is never spent), and at [Store.Flush]. A fallback
// since it was taken, or a pause found under way (PausedUntil, which a
// batch request asks), drops it instead: the pause emptied the buckets,
// and they refill without it.
//
// The bounds, each in one direction:
//
//   - Never more than the buckets held: tokens are taken from the shared
//     buckets atomically, in a script, when the lease is taken, so the
//     fleet never admits more than the buckets held; a lease moves when a
//     token is taken, never how many there are.
//   - Fewer or later: a process holds at most Lease calls' worth, the
//     request's and Lease-1 more of the cost that took them, so a request
//     may be refused, or made to wait, while up to (Lease-1) × cost ×
//     processes sit unspent in other processes' leases. This errs towards
//     fewer admissions, never more.
//   - More than the provider allows: when a response's headers lower a
//     bucket (Observe: traffic the fleet does not see), or another
//     process's 429 pauses the group, the tokens already out in leases may
//     still be spent: at most Lease-1 calls per process beyond what the
//     provider's count allows, until LeaseFor has passed. This is the one
//     bound towards more.
//
// With Lease 0 or 1 every decision asks Redis, by the same scripts as
// without leases.
//
// # When Redis fails
//
// Every operation waits for Redis at most [Options.Timeout] (50 ms by
// default), whatever the client's own timeouts (a decision that joins the
// queue, at most two: the batch in flight, then its own). Give the store a
// client with ContextTimeoutEnabled: it then gives up at the deadline itself, and
// the round trip runs on the caller's goroutine; otherwise go-redis waits
// by its ReadTimeout (seconds), so the round trip runs on a goroutine of
// its own that the caller stops waiting for, which costs some tens of
// microseconds per operation and leaves a stuck connection busy until the
// ReadTimeout. An operation that fails or times out decides without Redis;
// unless Redis answered another one meanwhile (see below), it also switches
// the store to fallback ([StateFallback]), with one log line, and every
// operation but the probes then decides so:
//
//   - by default, a local fleet.WindowBudget with the same parameters
//     decides, as this process's share of one budget (below). It has heard
//     this process's successes, and the units it took, all along, so a
//     fallback in the middle of a window starts from what this process
//     earned and spent in it. In a long outage each process then grants up
//     to MinTokens / N + Ratio × its own successes per window: the fleet at
//     most MinTokens + Ratio × all successes, one budget.
//   - with [Options.FailClosed], every retry is refused (Available is 0).
//
// # A share in a fault
//
// Each Store counts the processes that share its Name: a sorted set,
// [MembersKey], where each store (a random ID) refreshes itself with
// Redis's time at most every [MemberFor]/40, as a record in a batch its
// traffic sends anyway or in the round trip of a [Store.Probe], and from
// which members not refreshed within [MemberFor] are trimmed; the reply's count is kept ([Store.Members], 1
// until Redis has answered). While Redis fails, each process limits itself
// to its share of the last count N: the budget decides as one of N
// budgets (MinTokens / N + Ratio × its own successes, see [Budget]), and
// the rate limiter's buckets in memory hold 1/N of each bucket's limit and
// level as Redis last told them (see [Store.LimitBuckets]); what they
// admitted is charged to the shared buckets once Redis answers, as the
// budget's grants and successes are to its books, and Redis decides again
// for every process, each taking its full part. A fleet whose processes
// all count the same N then stays, in a fault of any length, within one
// budget per window the fault spans and what the shared buckets would
// have admitted; a process that counts fewer members (one whose last
// refresh came before others joined, or one that has never heard Redis:
// N = 1) takes more, its bound 1/N_i of the limits. The breaker, the throttle,
// the tenants' shares and spend decide on this process's state alone (the
// fleet guide, docs/guide/fleet.md, states each part's bound).
//
// The store is the one layer that handles Redis's failures: give it a
// client with retries off (MaxRetries: -1, where go-redis's default is 3).
// go-redis sends a pipeline again when its replies are cut by an EOF or a
// connection reset, as in a failover, though Redis ran it: a batch of
// records, or a decision, would then be applied twice, counting successes
// or taking units and tokens that no call spent. Without retries the cut
// is one failure, the store's fallback and probes take over, and the books
// hold each operation once. [New] warns on [Options.Logger] when a
// *redis.Client or *redis.Ring retries. A *redis.ClusterClient has retries
// off by default, but sends the commands of a pipeline whose replies were
// cut again within MaxRedirects, which also follows MOVED and ASK and is
// kept: on a Cluster, a cut in the middle of a batch's replies may apply
// the commands not yet answered twice.
//
// Successes heard during a fallback are counted locally only. Either way the
// error is returned too, for Damper to log and count (its damper.store.errors
// metric, by part and operation); errors of operations decided
// without asking Redis match [ErrUnavailable].
//
// A switch needs news of Redis, so that one outage makes one fallback and
// one return, not a flapping between them. An operation's failure switches
// to the fallback only when Redis has answered nothing since the operation
// began: when it answered another in between, the failure was that
// operation's own (a connection the outage left stuck, a queue behind the
// callers coming back), and the store stays on Redis. During a fallback one
// operation at a time asks Redis again, the probe, and none sooner than
// [Options.ProbeInterval] (the timeout, by default) after the last one
// ended; the others decide at once, and records are not queued. A probe
// is a decision, or a call of [Store.Probe], which a process whose traffic
// makes few decisions calls on a timer. Only a probe that Redis answers
// switches back ([StateShared]); an answer to an operation sent before the
// fallback does not. Each switch logs one line. [Store.State] and
// [Store.Stats] show the state and count the switches, failures, unasked
// operations and dropped records, for metrics.
//
// A call waits out at most one failure: Damper gives each call's context to
// [Store.CallContext], and once one operation of the call has failed or
// timed out, the call's others decide without asking Redis, whatever the
// state. That failure takes at most one timeout, or two for a decision
// sent behind a batch of records in flight (the batch's, then its own).
// Operations in flight at once, as a hedged call's, may each wait theirs.
//
// A Redis that restarts without persistence has lost the window's books:
// the fleet starts the window again from MinTokens. An operation that timed
// out may still be carried out once Redis answers: a unit is then taken
// for a caller that the fallback already answered, so a slow Redis errs
// towards fewer retries, never more. go-redis stops dialing a server after
// PoolSize failed dials in a row and then tries once a second: after a
// long outage the budget is back on Redis within about a second of Redis,
// after a short one within a probe interval and a timeout.
package redisstore
