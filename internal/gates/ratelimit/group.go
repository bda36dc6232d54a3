package ratelimit

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/core"
)

// The rate limiter's groups: each group's buckets, kept in a bounded set
// that drops idle groups, and how long its attempts take.

// maxResolved bounds the model IDs whose group the limiter remembers.
const maxResolved = 1024

// limitGroup is one group's buckets, and how long its attempts take.
type limitGroup struct {
	name       string
	g          fleet.LimitBuckets
	kept       bool      // g is not in memory: its store outlives the call
	env        *core.Env // for its store's errors
	cacheAware bool
	took       attemptTimes

	// shares are its tenants' shares of its limits; limits are the
	// limits known to this process, as float64 bits: the configured ones
	// and those its responses teach (see learn).
	shares     fleet.LimitShares
	limits     [3]atomic.Uint64
	configured [3]bool

	// users counts the attempts between their admission (a wait in line
	// included) and their settling; -1 once the group is dropped, after
	// which no attempt may use it.
	users   atomic.Int64
	lastUse atomic.Int64 // the last admission or settling, in Unix nanoseconds
}

// acquire counts an attempt in, unless g was dropped.
func (g *limitGroup) acquire(now time.Time) bool {
	for {
		n := g.users.Load()
		if n < 0 {
			return false
		}
		if g.users.CompareAndSwap(n, n+1) {
			g.lastUse.Store(now.UnixNano())
			return true
		}
	}
}

// release counts an attempt out.
func (g *limitGroup) release(now time.Time) {
	g.lastUse.Store(now.UnixNano())
	g.users.Add(-1)
}

// atRest reports whether dropping g loses nothing but its learned limits:
// its store keeps its state, or its buckets are full and not paused.
func (g *limitGroup) atRest(now time.Time) bool {
	if g.kept {
		return true
	}
	st, _ := g.g.State(context.Background(), now)
	for _, b := range st {
		if !b.PausedUntil.IsZero() || b.Limit > 0 && b.Remaining < b.Limit {
			return false
		}
	}
	return true
}

// attemptTimes follows how long a group's answered attempts take (to the
// whole answer, or to a stream's first content) as TCP follows round trips:
// a smoothed mean and mean deviation. An attempt is not started from the
// line unless the mean plus four deviations still fits before the caller's
// deadline: one sent at the deadline's edge would be counted by the API
// and then cut off by the deadline.
type attemptTimes struct {
	mu        sync.Mutex
	mean, dev time.Duration
	n         int
}

func (a *attemptTimes) add(d time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.n == 0 {
		a.mean, a.dev = d, d/2
	} else {
		diff := d - a.mean
		a.mean += diff / 8
		a.dev += (max(diff, -diff) - a.dev) / 4
	}
	a.n++
}

// room is the time to leave an attempt before the caller's deadline: at
// least core.MinAttempt.
func (a *attemptTimes) room() time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	return max(core.MinAttempt, a.mean+4*a.dev)
}

// group returns the group of model, made on first use: while the limiter
// holds maxLimitGroups groups (idle ones dropped first), a model of a new
// group that is not configured goes to otherGroup.
func (l *Limiter) group(model string) *limitGroup {
	if g, ok := l.byModel.Load(model); ok && g.(*limitGroup).users.Load() >= 0 {
		return g.(*limitGroup)
	}
	name := LimitGroup(model)
	l.mu.Lock()
	g, ok := l.groups[name]
	if !ok {
		now := l.clock.Now()
		if _, configured := l.p.Limits[name]; !configured && name != otherGroup && l.unconfigured() >= maxLimitGroups {
			l.sweep(now)
			if l.unconfigured() >= maxLimitGroups {
				name = otherGroup
				g, ok = l.groups[name]
			}
		}
		if !ok {
			g = &limitGroup{name: name, cacheAware: cacheAwareITPM(name), g: l.buckets(name), env: l.env, shares: l.shares(name)}
			g.kept = !fleet.InMemory(g.g)
			lim := l.p.Limits[name]
			for k, v := range [3]int{lim.RequestsPerMinute, lim.InputTokensPerMinute, lim.OutputTokensPerMinute} {
				g.configured[k] = v > 0
				g.limits[k].Store(math.Float64bits(float64(v)))
			}
			g.lastUse.Store(now.UnixNano())
			l.groups[name] = g
		}
	}
	l.mu.Unlock()
	if len(model) <= core.MaxModelID {
		if _, ok := l.byModel.Load(model); ok {
			l.byModel.Store(model, g) // in place of a dropped group
		} else if l.byModelCount.Load() < maxResolved {
			if _, loaded := l.byModel.LoadOrStore(model, g); !loaded {
				l.byModelCount.Add(1)
			}
		}
	}
	return g
}

// unconfigured counts the groups that maxLimitGroups bounds; it requires
// l.mu.
func (l *Limiter) unconfigured() int {
	n := len(l.groups)
	for name := range l.p.Limits {
		if _, ok := l.groups[name]; ok {
			n--
		}
	}
	if _, ok := l.groups[otherGroup]; ok {
		n--
	}
	return n
}

// sweep drops the groups unused for groupIdle that no attempt holds and
// whose buckets are at rest: one that comes back is new, its configured
// limits full and its learned ones learned again from the next response.
// It requires l.mu.
func (l *Limiter) sweep(now time.Time) {
	l.nextSweep.Store(now.Add(sweepEvery).UnixNano())
	idleSince := now.Add(-groupIdle).UnixNano()
	dropped := false
	for name, g := range l.groups {
		if g.lastUse.Load() > idleSince || g.users.Load() != 0 || !g.atRest(now) || !g.users.CompareAndSwap(0, -1) {
			continue
		}
		delete(l.groups, name)
		dropped = true
	}
	if dropped {
		l.byModel.Range(func(model, g any) bool {
			if g.(*limitGroup).users.Load() < 0 && l.byModel.CompareAndDelete(model, g) {
				l.byModelCount.Add(-1)
			}
			return true
		})
	}
}

// maybeSweep sweeps when it is time, unless another goroutine holds l.mu.
func (l *Limiter) maybeSweep(now time.Time) {
	if now.UnixNano() >= l.nextSweep.Load() && l.mu.TryLock() {
		l.sweep(now)
		l.mu.Unlock()
	}
}

// buckets makes the buckets of group: the store's, or, when it keeps none
// or fails, the buckets in memory.
func (l *Limiter) buckets(group string) fleet.LimitBuckets {
	settings := fleet.LimitSettings{Group: group, Limits: l.p.Limits[group], BatchShare: l.p.BatchShare}
	var b fleet.LimitBuckets
	if s, ok := l.store.(fleet.LimitStore); ok {
		var err error
		if b, err = s.LimitBuckets(settings); err != nil {
			l.env.LogStoreError(context.Background(), partLimiter, "buckets", err)
			b = nil
		}
	}
	if b == nil {
		b, _ = fleet.MemoryStore{}.LimitBuckets(settings)
	}
	return b
}

// ctx is the context of g's operations that record what the call began:
// without the call's cancellation when g's store outlives it.
func (g *limitGroup) ctx(ctx context.Context) context.Context {
	if g.kept {
		return context.WithoutCancel(ctx)
	}
	return ctx
}

// cancel gives back all that r and share took, and t's place in the
// batch line: its attempt was never sent.
func (g *limitGroup) cancel(c core.Call, r fleet.RateReservation, t *fleet.RateTicket, share *shareHold, now time.Time) {
	if r.Taken() {
		c.StoreError(partLimiter, "settle", g.g.Settle(g.ctx(c.Context()), now, r, fleet.RateAmounts{}, [3]bool{true, true, true}))
	}
	c.StoreError(partShares, "settle", share.settle(g.ctx(c.Context()), now, fleet.RateAmounts{}, [3]bool{true, true, true}))
	c.StoreError(partLimiter, "leave", g.leave(g.ctx(c.Context()), t, now))
}

// leave takes t out of the batch line, if it holds a place there.
func (g *limitGroup) leave(ctx context.Context, t *fleet.RateTicket, now time.Time) error {
	if t == nil || t.Slot.IsZero() {
		return nil
	}
	return g.g.Leave(ctx, now, t)
}

// knownBuckets are buckets that know their state without asking their
// store (see fleet.LimitBuckets).
type knownBuckets interface {
	KnownState(now time.Time) [3]fleet.RateLimitState
}

// Known returns the buckets of model's group as far as they know at no
// cost, or false when the group is not made yet or its buckets cannot
// tell. It makes no group.
func (l *Limiter) Known(model string, now time.Time) ([3]fleet.RateLimitState, bool) {
	var g *limitGroup
	if v, ok := l.byModel.Load(model); ok {
		g = v.(*limitGroup)
	} else {
		l.mu.Lock()
		g = l.groups[LimitGroup(model)]
		l.mu.Unlock()
	}
	if g == nil || g.users.Load() < 0 {
		return [3]fleet.RateLimitState{}, false
	}
	kb, ok := g.g.(knownBuckets)
	if !ok {
		return [3]fleet.RateLimitState{}, false
	}
	return kb.KnownState(now), true
}
