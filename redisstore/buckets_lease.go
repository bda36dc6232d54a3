package redisstore

import (
	"context"
	"sync"
	"time"

	"github.com/damper-ai/damper-go/fleet"
)

// limitLeases is a store's lease settings for the rate limiter, and the
// groups that hold a lease now, which Flush gives back.
type limitLeases struct {
	lease    int // Options.Lease: leases are taken when above 1
	leaseFor time.Duration

	mu   sync.Mutex
	held map[*buckets]struct{}
}

func newLimitLeases(o Options) *limitLeases {
	leaseFor := o.LeaseFor
	if leaseFor <= 0 {
		leaseFor = defaultLeaseFor
	}
	return &limitLeases{lease: o.Lease, leaseFor: leaseFor, held: map[*buckets]struct{}{}}
}

func (ls *limitLeases) add(b *buckets) {
	ls.mu.Lock()
	ls.held[b] = struct{}{}
	ls.mu.Unlock()
}

func (ls *limitLeases) remove(b *buckets) {
	ls.mu.Lock()
	delete(ls.held, b)
	ls.mu.Unlock()
}

// giveBack gives back every group's lease, in records.
func (ls *limitLeases) giveBack(ctx context.Context) {
	ls.mu.Lock()
	all := make([]*buckets, 0, len(ls.held))
	for b := range ls.held {
		all = append(all, b)
	}
	ls.mu.Unlock()
	for _, b := range all {
		b.mu.Lock()
		b.giveBackLocked(ctx, b.held.last)
		b.mu.Unlock()
	}
}

// limitLease is the tokens a process holds of one group: taken from the
// shared buckets by one decision, spent by the interactive requests they
// cover without asking Redis.
type limitLease struct {
	on     bool
	tokens fleet.RateAmounts // left, per bucket
	mark   fleet.RateAmounts // each bucket's taken just after the lease was taken
	limits fleet.RateAmounts // the limits the lease was taken under
	at     time.Time         // when it was taken
	last   time.Time         // the latest now it was asked at
	// fallbacks is the link's count of fallbacks when it was taken: one
	// since voids it, even once Redis is back.
	fallbacks uint64
}

// fromLease takes cost from the group's lease, if it holds one that is
// still good and covers cost in every bucket, for an interactive request
// that may be sent now.
func (b *buckets) fromLease(ctx context.Context, now time.Time, cost fleet.RateAmounts, latest time.Time) (*reservation, bool) {
	b.mu.Lock()
	h := &b.held
	if !h.on {
		b.mu.Unlock()
		return nil, false
	}
	if b.link.down.Load() || b.link.fallbacks.Load() != h.fallbacks {
		// Redis failed: what is left refills the shared buckets on its own.
		b.dropLocked()
		b.mu.Unlock()
		return nil, false
	}
	if now.Sub(h.at) >= b.leases.leaseFor {
		b.giveBackLocked(ctx, now)
		b.mu.Unlock()
		return nil, false
	}
	if now.After(h.last) {
		h.last = now
	}
	for k := range cost {
		if cost[k] > h.tokens[k] {
			b.mu.Unlock()
			return nil, false
		}
	}
	if latest.Before(now) {
		b.mu.Unlock()
		return nil, false
	}
	for k := range cost {
		h.tokens[k] -= cost[k]
	}
	mark := h.mark
	b.mu.Unlock()
	// The local twin always takes, as for a reservation Redis made.
	lr, _, _ := b.local.Reserve(context.WithoutCancel(ctx), now, cost, fleet.Interactive, now.Add(farFuture), nil)
	return &reservation{cost: cost, mark: mark, taken: true, shared: true, local: lr}, true
}

// keepLease keeps the top-up of rep, a reply of bkReserveLeaseScript that
// took, as the group's lease, giving back what was left of the one before.
func (b *buckets) keepLease(ctx context.Context, now time.Time, rep reserveReply) {
	if rep.lease <= 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.giveBackLocked(ctx, now)
	n := float64(rep.lease)
	h := limitLease{on: true, limits: rep.limits, at: now, last: now, fallbacks: b.link.fallbacks.Load()}
	for k := range h.tokens {
		h.tokens[k] = n * rep.held[k]
		h.mark[k] = rep.mark[k] + h.tokens[k]
	}
	b.held = h
	b.leases.add(b)
}

// giveBack gives the group's lease back to the shared buckets, in a record.
func (b *buckets) giveBack(ctx context.Context, now time.Time) {
	b.mu.Lock()
	b.giveBackLocked(ctx, now)
	b.mu.Unlock()
}

// giveBackLocked gives the lease back (b.mu held): what is left goes back
// to the shared buckets, as a settled reservation's unused tokens do.
func (b *buckets) giveBackLocked(ctx context.Context, now time.Time) {
	h := b.held
	if !h.on {
		return
	}
	b.dropLocked()
	if b.link.down.Load() {
		return
	}
	args := make([]any, 0, 6)
	some := false
	for _, v := range h.tokens {
		if v > 0 {
			args = append(args, 1, fmtFloat(v))
			some = true
		} else {
			args = append(args, 0, "0")
		}
	}
	if !some {
		return
	}
	// A dropped record is counted by the link; the shared buckets refill
	// without it.
	_ = b.link.record(context.WithoutCancel(ctx), "settle", bkSettleScript, b.keys, b.args(now, args...), nil, nil)
}

// dropLocked forgets the lease (b.mu held).
func (b *buckets) dropLocked() {
	if b.held.on {
		b.held = limitLease{}
		b.leases.remove(b)
	}
}

// leaseObserved gives the lease back when o changes a limit it was taken
// under: a learned limit the response reports anew.
func (b *buckets) leaseObserved(ctx context.Context, now time.Time, o fleet.RateObservation) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.held.on {
		return
	}
	for k := range o.Has {
		if o.Has[k] && !b.configured[k] && o.Limit[k] > 0 && o.Limit[k] != b.held.limits[k] {
			b.giveBackLocked(ctx, now)
			return
		}
	}
}
