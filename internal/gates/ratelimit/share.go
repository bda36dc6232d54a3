package ratelimit

import (
	"context"
	"math"
	"time"

	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/core"
)

// Tenants' weighted shares of a limit group's rate limit: a call made
// for a tenant of a Proxy with two tenants or more first takes its share
// ([fleet.LimitShares]) and then reserves from the group's buckets. A
// request's share is its dominant fraction of the limit: the largest, over
// the buckets whose limit is known, of its cost over the limit, so that
// tenants are fair in whichever bucket binds. The share's wait is the
// limiter's, within MaxWait and the caller's deadline, and what the
// attempt did not use goes back as its reservation does.

// partShares is the shares' part of a store.
var partShares = core.NewStorePart("shares", "damper: tenant shares store error")

// shares makes the tenants' shares of group: the store's, or, when it
// keeps none or fails, shares in memory.
func (l *Limiter) shares(group string) fleet.LimitShares {
	settings := fleet.ShareSettings{Group: group}
	var s fleet.LimitShares
	if st, ok := l.store.(fleet.ShareStore); ok {
		var err error
		if s, err = st.LimitShares(settings); err != nil {
			l.env.LogStoreError(context.Background(), partShares, "shares", err)
			s = nil
		}
	}
	if s == nil {
		s, _ = fleet.MemoryStore{}.LimitShares(settings)
	}
	return s
}

// knownLimits are the group's limits as far as this process knows them:
// the configured ones, and those learned from its own responses.
func (g *limitGroup) knownLimits() (l fleet.RateAmounts) {
	for k := range l {
		l[k] = math.Float64frombits(g.limits[k].Load())
	}
	return l
}

// learn keeps the limits a response names, for the buckets not
// configured.
func (g *limitGroup) learn(o fleet.RateObservation) {
	for k := range o.Has {
		if o.Has[k] && !g.configured[k] && o.Limit[k] > 0 {
			g.limits[k].Store(math.Float64bits(o.Limit[k]))
		}
	}
}

// dominant is the fraction of a minute of limits that amounts take: the
// largest over the known limits, at most 1; 0 when none is known.
func dominant(limits, amounts fleet.RateAmounts) float64 {
	f := 0.0
	for k, l := range limits {
		if l > 0 {
			f = max(f, min(amounts[k]/l, 1))
		}
	}
	return f
}

// shareHold is what an attempt took from its tenant's share.
type shareHold struct {
	shares fleet.LimitShares
	r      fleet.ShareReservation
	limits fleet.RateAmounts // the limits it was taken under
	cost   fleet.RateAmounts
	f      float64
}

// takeShare takes the share of c's tenant for an attempt of cost cr.cost,
// waiting for it within latest. It returns nil and no refusal when the
// call takes no share (no tenant sharing, or no limit known yet), and a
// refusal when the share cannot be had by latest or the wait ended.
func (l *Limiter) takeShare(c core.Call, cr *callRate, now, latest time.Time) (*shareHold, core.Admission, time.Time) {
	t := c.Tenant()
	if t == nil || !t.Shares {
		return nil, core.Admission{}, now
	}
	g := cr.group
	limits := g.knownLimits()
	f := dominant(limits, cr.cost)
	if f <= 0 {
		return nil, core.Admission{}, now
	}
	start := now
	ask := fleet.ShareAsk{Tenant: t.Name, Weight: t.Weight, Fraction: f}
	for {
		r, due, err := g.shares.Take(c.Context(), now, ask, latest)
		c.StoreError(partShares, "take", err)
		if r.Taken() {
			return &shareHold{shares: g.shares, r: r, limits: limits, cost: cr.cost, f: f}, core.Admission{}, now
		}
		if !due.After(now) {
			return nil, core.Admission{}, now // the store could not decide: no share
		}
		if due.After(latest) {
			return nil, core.Admission{Refused: rateDenial(now, due), Queued: now.Sub(start)}, now
		}
		refused, canceled := c.Wait(l, due)
		now = l.clock.Now()
		if refused != nil || canceled {
			return nil, core.Admission{Refused: refused, Canceled: canceled, Queued: now.Sub(start)}, now
		}
	}
}

// settle replaces the share h took by what its attempt used: for each
// bucket known marks, used; for the others, what it asked.
func (h *shareHold) settle(ctx context.Context, now time.Time, used fleet.RateAmounts, known [3]bool) error {
	if h == nil || !h.r.Taken() {
		return nil
	}
	amounts := h.cost
	for k := range known {
		if known[k] {
			amounts[k] = used[k]
		}
	}
	u := dominant(h.limits, amounts)
	if u == h.f {
		return nil // it stands as taken
	}
	return h.shares.Settle(ctx, now, h.r, u)
}
