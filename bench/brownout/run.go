package brownout

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"

	"github.com/damper-ai/damper-go"
)

// epoch is where virtual time starts: a whole minute, so that budget
// windows line up with the scenario's minutes, and far enough in the past
// that the SDK never mistakes a virtual deadline for a later wall-clock one.
var epoch = time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)

// Scenario is one simulated run: a provider with an incident, and the
// offered load of many replicas.
type Scenario struct {
	Name  string // used in file names
	Title string
	// Provider is the simulated API and its incident.
	Provider Provider
	// Replicas is the number of client processes, each with its own retry
	// state (a Damper, a throttler, a failsafe budget).
	Replicas int
	// Rate is the offered load: new logical requests per second, over all
	// replicas (Poisson arrivals, each sent to a random replica).
	Rate float64
	// Duration is how long new requests arrive; the run goes on until the
	// last of them ends.
	Duration time.Duration
	// Deadline is every logical request's deadline: the caller's context.
	Deadline time.Duration
	// Seed makes the run repeatable: arrivals, the provider's draws and
	// each replica's jitter are all drawn from it.
	Seed uint64
	// Prompt is the user message of every request; "" means "hello".
	Prompt string
	// Secondary, when set, is a second provider, with capacity and draws
	// of its own: the contenders that fall back reach it, the others never
	// do. It is healthy unless its Incident says otherwise.
	Secondary *Provider
	// Saturating, when set, is the provider instead of Provider: one whose
	// service time grows with the attempts it holds.
	Saturating *SaturatingProvider
	// Surge, when set, raises the offered load for a while.
	Surge *Surge
	// Cached, when set, gives a share of the requests a cached prompt
	// prefix instead of Prompt.
	Cached *CachedPrompts
}

// CachedPrompts is the share of a scenario's requests that carry a
// cached prompt prefix: each such request draws one of Prefixes system
// prompts, alike in length but for their text, each a block with a cache
// breakpoint (cache_control, ephemeral), followed by a short user
// question; the others send the scenario's Prompt. Each prompt, cached
// or not, counts as many input tokens.
type CachedPrompts struct {
	Share    float64
	Prefixes int
}

// validate reports the first setting that cannot describe cached prompts.
func (c CachedPrompts) validate() error {
	if c.Share <= 0 || c.Share > 1 || c.Prefixes < 1 || c.Prefixes > maxPrefixes {
		return fmt.Errorf("Cached = {Share: %g, Prefixes: %d}: need 0 < Share <= 1 and 1 <= Prefixes <= %d", c.Share, c.Prefixes, maxPrefixes)
	}
	return nil
}

// maxPrefixes bounds a scenario's cached prefixes, each a request body the
// run keeps.
const maxPrefixes = 10_000

// Surge multiplies a scenario's Rate by Factor over [Start, Start+Length).
type Surge struct {
	Start, Length time.Duration
	Factor        float64
}

// validate reports the first setting that cannot describe a surge.
func (u Surge) validate() error {
	if u.Start < 0 || u.Length <= 0 || u.Factor <= 0 {
		return fmt.Errorf("Surge = {Start: %v, Length: %v, Factor: %g}: need Start >= 0, Length > 0, Factor > 0", u.Start, u.Length, u.Factor)
	}
	return nil
}

// nextArrival is the next arrival of a Poisson process of rate sc.Rate,
// multiplied by the surge while it lasts, after now, for a draw e of an
// exponential of mean 1: e is spent at each rate in turn, which is exact
// for a rate that changes by steps.
func (sc Scenario) nextArrival(now time.Duration, e float64) time.Duration {
	u := sc.Surge
	for {
		rate, until := sc.Rate, time.Duration(math.MaxInt64)
		switch {
		case now < u.Start:
			until = u.Start
		case now < u.Start+u.Length:
			rate, until = sc.Rate*u.Factor, u.Start+u.Length
		}
		gap := e / rate
		if until == math.MaxInt64 || gap < (until-now).Seconds() {
			return now + time.Duration(gap*float64(time.Second))
		}
		e -= (until - now).Seconds() * rate
		now = until
	}
}

// Request is the record of one logical request.
type Request struct {
	Issued, Ended time.Duration // from the start of the run
	OK            bool
	TimedOut      bool // ended by its deadline
	Attempts      int  // provider attempts it made, at either provider
	// Secondary is how many of Attempts went to the secondary provider;
	// BySecondary is true when the secondary's answer ended the request.
	Secondary   int
	BySecondary bool
	// Moved is why the request first moved to another backend, as
	// Damper's report gives it (damper.Fallback.Reason); "" if it never
	// did.
	Moved string
	// CircuitOpen is true when the call ended refused by an open circuit
	// breaker (its error matches damper.ErrCircuitOpen).
	CircuitOpen bool
	// RateLimited is true when the call ended refused by Damper's rate
	// limiter (its error matches damper.ErrRateLimited).
	RateLimited bool
	// ConcurrencyLimited is true when the call ended refused by Damper's
	// concurrency limit: no slot came in time.
	ConcurrencyLimited bool
	// LastSent is when its last attempt reached a provider, from the
	// start of the run; 0 if it made none.
	LastSent time.Duration
	// Prefix is the request's cached prompt prefix, numbered from 1; 0
	// for none. Cache is what its answer did with the cache of the
	// provider that gave it.
	Prefix int
	Cache  CacheOutcome
}

// Attempt is one provider attempt: when it arrived, from the start of the
// run, and which replica sent it.
type Attempt struct {
	At      time.Duration
	Replica int
	Status  int // the provider's answer: 200, 429, 500, 529
}

// CircuitEvent is one change of a replica's circuit breaker, for the
// contenders that have one.
type CircuitEvent struct {
	At      time.Duration
	Replica int
	To      damper.CircuitState
	// Backend is the backend whose breaker it is: damper.PrimaryBackend
	// for the provider's, the only one but for a contender that falls back.
	Backend string
	// Seq is the number of attempts that had reached the provider before
	// the change: the attempts after it are Result.Attempts[Seq:].
	Seq int
}

// Result is one contender's run of one scenario.
type Result struct {
	Scenario  Scenario
	Contender string
	Requests  []Request
	// AttemptsPerSecond and GoodputPerSecond are per whole second of the
	// run: provider attempts by the time they arrived, successful logical
	// requests by the time they ended.
	AttemptsPerSecond []int
	GoodputPerSecond  []int
	// Attempts is every attempt at the provider, in order of arrival;
	// SecondaryAttempts every attempt at the secondary provider, which
	// AttemptsPerSecond does not count.
	Attempts          []Attempt
	SecondaryAttempts []Attempt
	// Circuit is every change of a breaker, in order.
	Circuit []CircuitEvent
	// Held is, with a saturating provider, the most attempts it held in
	// each whole second of the run; HeldByReplica the same for each
	// replica's attempts. Both are nil with any other provider.
	Held          []int
	HeldByReplica [][]int
	// Limit is, with a saturating provider, each replica's concurrency
	// limit at the start of each whole second, as its Damper's gauge
	// damper.concurrency.limit reports it; -1 where it has none.
	Limit [][]int
}

// heldTrack is the most of something held in each second of a run.
type heldTrack struct {
	perSec   []int
	sec, cur int
}

// set records that n are held from at on.
func (h *heldTrack) set(at time.Duration, n int) {
	sec := min(int(at/time.Second), len(h.perSec)-1)
	for h.sec < sec {
		h.sec++
		h.perSec[h.sec] = max(h.perSec[h.sec], h.cur)
	}
	h.perSec[sec] = max(h.perSec[sec], n)
	h.cur = n
}

// runState is a run in progress.
type runState struct {
	s         *sched
	provider  *providerState
	secondary *providerState // nil without Scenario.Secondary
	// saturating is the provider instead of provider, with
	// Scenario.Saturating.
	saturating *psProvider
	res        *Result
}

func (r *runState) recordAttempt(now time.Time, replica, status int, secondary bool) {
	at := now.Sub(epoch)
	if secondary {
		r.res.SecondaryAttempts = append(r.res.SecondaryAttempts, Attempt{At: at, Replica: replica, Status: status})
		return
	}
	r.res.Attempts = append(r.res.Attempts, Attempt{At: at, Replica: replica, Status: status})
	if sec := int(at / time.Second); sec < len(r.res.AttemptsPerSecond) {
		r.res.AttemptsPerSecond[sec]++
	}
}

// circuitRecorder returns the OnStateChange hook that records replica's
// breaker changes.
func (r *runState) circuitRecorder(replica int) func(damper.CircuitChange) {
	return func(c damper.CircuitChange) {
		r.res.Circuit = append(r.res.Circuit, CircuitEvent{At: c.At.Sub(epoch), Replica: replica, To: c.To, Backend: c.Backend, Seq: len(r.res.Attempts)})
	}
}

// Run simulates sc with contender c.
func Run(sc Scenario, c Contender) (*Result, error) {
	if sc.Replicas < 1 || sc.Rate <= 0 || sc.Duration <= 0 || sc.Deadline <= 0 {
		return nil, fmt.Errorf("brownout: scenario %q: Replicas, Rate, Duration and Deadline must be positive", sc.Name)
	}
	if sc.Saturating != nil {
		if err := sc.Saturating.validate(); err != nil {
			return nil, fmt.Errorf("brownout: scenario %q: %w", sc.Name, err)
		}
	}
	if sc.Surge != nil {
		if err := sc.Surge.validate(); err != nil {
			return nil, fmt.Errorf("brownout: scenario %q: %w", sc.Name, err)
		}
	}
	var prompts []anthropic.MessageNewParams // by prefix, 0 the plain prompt
	if c := sc.Cached; c != nil {
		if err := c.validate(); err != nil {
			return nil, fmt.Errorf("brownout: scenario %q: %w", sc.Name, err)
		}
		prompts = cachedParams(c.Prefixes, countInputTokens(mustMarshal(paramsFor(sc.Prompt))))
	}
	seconds := int(math.Ceil((sc.Duration + sc.Deadline + time.Minute).Seconds()))
	res := &Result{
		Scenario:          sc,
		Contender:         c.Name,
		AttemptsPerSecond: make([]int, seconds),
		GoodputPerSecond:  make([]int, seconds),
	}
	s := newSched(epoch)
	run := &runState{s: s, provider: newProviderState(sc.Provider, sc.Seed, 1), res: res}
	if sc.Secondary != nil {
		// Stream 3: 2 is the arrivals', 100 on the replicas'.
		run.secondary = newProviderState(*sc.Secondary, sc.Seed, 3)
	}
	if sc.Saturating != nil {
		// Stream 1, the provider's: there is no other.
		run.saturating = newPSProvider(*sc.Saturating, s, rand.New(rand.NewPCG(sc.Seed, 1)), sc.Replicas)
		all := heldTrack{perSec: make([]int, seconds)}
		by := make([]heldTrack, sc.Replicas)
		res.HeldByReplica = make([][]int, sc.Replicas)
		for i := range by {
			by[i].perSec = make([]int, seconds)
			res.HeldByReplica[i] = by[i].perSec
		}
		res.Held = all.perSec
		run.saturating.noteHeld = func(now time.Time, replica, n, byReplica int) {
			all.set(now.Sub(epoch), n)
			by[replica].set(now.Sub(epoch), byReplica)
		}
	}

	replicas := make([]call, sc.Replicas)
	var gauges []*gaugeReader
	for i := range replicas {
		env := replicaEnv{
			transport: simTransport{run: run, replica: i},
			clock:     simClock{s: s},
			rng:       rand.New(rand.NewPCG(sc.Seed, uint64(100+i))),
			circuit:   run.circuitRecorder(i),
			params:    paramsFor(sc.Prompt),
			moved:     run.noteMove,
		}
		if prompts != nil {
			prompts[0] = env.params
			env.request = func() anthropic.MessageNewParams {
				if p := s.cur; p != nil {
					return prompts[p.prefix]
				}
				return prompts[0]
			}
		}
		if run.secondary != nil {
			env.secondary = simTransport{run: run, replica: i, secondary: true}
		}
		if sc.Saturating != nil {
			env.meter = newGaugeReader()
			gauges = append(gauges, env.meter)
		}
		r, err := c.newReplica(env)
		if err != nil {
			return nil, fmt.Errorf("brownout: %s replica %d: %w", c.Name, i, err)
		}
		replicas[i] = r
	}

	if gauges != nil {
		res.Limit = sampleLimits(s, gauges, seconds)
	}

	arrivals := rand.New(rand.NewPCG(sc.Seed, 2))
	// Stream 4: the cached prompts' draws, apart from the arrivals'.
	draws := rand.New(rand.NewPCG(sc.Seed, 4))
	end := epoch.Add(sc.Duration)
	var arrive func()
	arrive = func() {
		replica := replicas[arrivals.IntN(len(replicas))]
		prefix := 0
		if c := sc.Cached; c != nil && draws.Float64() < c.Share {
			prefix = 1 + draws.IntN(c.Prefixes)
		}
		run.start(replica, sc.Deadline, prefix)
		var next time.Time
		if sc.Surge == nil {
			next = s.now.Add(time.Duration(arrivals.ExpFloat64() / sc.Rate * float64(time.Second)))
		} else {
			next = epoch.Add(sc.nextArrival(s.now.Sub(epoch), arrivals.ExpFloat64()))
		}
		if next.Before(end) {
			s.at(next, nil, arrive)
		}
	}
	s.at(epoch, nil, arrive)
	// Run until every request has ended: each is bounded by its deadline.
	s.run(epoch.Add(100 * 365 * 24 * time.Hour))
	return res, nil
}

// sampleLimits schedules, at the start of each of seconds, a reading of
// each replica's concurrency limit from its gauges, and returns where the
// readings go: by replica, then by second.
func sampleLimits(s *sched, gauges []*gaugeReader, seconds int) [][]int {
	limits := make([][]int, len(gauges))
	for i := range limits {
		limits[i] = make([]int, seconds)
	}
	for sec := range seconds {
		s.at(epoch.Add(time.Duration(sec)*time.Second), nil, func() {
			for i, g := range gauges {
				v, ok := g.read("damper.concurrency.limit")
				limits[i][sec] = -1
				if ok {
					limits[i][sec] = int(v)
				}
			}
		})
	}
	return limits
}

// noteMove records reason as the running request's first move to
// another backend.
func (r *runState) noteMove(reason string) {
	if p := r.s.cur; p != nil && p.moved == "" {
		p.moved = reason
	}
}

// newProviderState is p at the start of a run, its draws from stream of
// seed.
func newProviderState(p Provider, seed, stream uint64) *providerState {
	ps := &providerState{
		Provider: p,
		start:    epoch,
		rng:      rand.New(rand.NewPCG(seed, stream)),
		last:     epoch,
		left:     p.Capacity,
	}
	if p.CacheLifetime > 0 {
		ps.cache, ps.prefixes = map[string]time.Time{}, map[string]string{}
	}
	if rl := p.RateLimit; rl != nil {
		ps.requests = newRateBucket(rl.RequestsPerMinute, epoch)
		ps.inputTokens = newRateBucket(rl.InputTokensPerMinute, epoch)
	}
	return ps
}

// start issues one logical request on replica, with the cached prompt
// prefix numbered prefix (0: none).
func (r *runState) start(replica call, deadline time.Duration, prefix int) {
	s := r.s
	issued := s.now
	ctx, cancel := newDeadlineCtx(issued.Add(deadline))
	idx := len(r.res.Requests)
	r.res.Requests = append(r.res.Requests, Request{Issued: issued.Sub(epoch), Prefix: prefix})
	var expire *event
	done := false
	p := s.spawn(ctx, func(p *proc) {
		p.prefix = prefix
		err := replica(ctx)
		rec := &r.res.Requests[idx]
		rec.Ended = s.now.Sub(epoch)
		rec.OK = err == nil
		rec.TimedOut = ctx.expired
		rec.Attempts = p.attempt
		rec.Secondary, rec.BySecondary, rec.Moved = p.secondary, p.bySecondary, p.moved
		if rec.OK {
			rec.Cache = p.cache
		}
		rec.CircuitOpen = errors.Is(err, damper.ErrCircuitOpen)
		rec.RateLimited = errors.Is(err, damper.ErrRateLimited)
		rec.ConcurrencyLimited = concurrencyLimited(err)
		if p.attempt > 0 {
			rec.LastSent = p.sent.Sub(epoch)
		}
		if rec.OK {
			if sec := int(rec.Ended / time.Second); sec < len(r.res.GoodputPerSecond) {
				r.res.GoodputPerSecond[sec]++
			}
		}
		s.cancel(expire)
		cancel()
		done = true
	})
	if !done {
		expire = s.at(ctx.deadline, p, func() {
			ctx.expired = true
			cancel()
		})
	}
}
