package redisstore

import (
	"context"
	"time"

	"github.com/damper-ai/damper-go/fleet"
)

// The buckets while Redis fails: the local twin, or this process's share of
// the shared buckets as last heard (fallback, newShare), and what local
// decisions owe the shared buckets once Redis answers again (payOwed).

// answered drops the share of the last fallback: Redis decides again, and
// the next fallback starts from what it last told.
func (b *buckets) answered() {
	b.mu.Lock()
	b.share = nil
	b.mu.Unlock()
}

// payOwed takes owed, what local decisions took while Redis failed, from
// the shared buckets, in a record (a settle giving back less than
// nothing); a dropped record is counted by the link.
func (b *buckets) payOwed(ctx context.Context, now time.Time, owed fleet.RateAmounts) {
	if owed == (fleet.RateAmounts{}) {
		return
	}
	args := make([]any, 0, 6)
	for _, v := range owed {
		args = append(args, 1, fmtFloat(-v))
	}
	_ = b.link.record(context.WithoutCancel(ctx), "settle", bkSettleScript, b.keys, b.args(now, args...), nil, nil)
}

// buckets returns the local buckets that made r's local reservation.
func (r *reservation) buckets(b *buckets) fleet.LimitBuckets {
	if r.owner != nil {
		return r.owner
	}
	return b.local
}

// fallback returns the buckets that decide while Redis fails: with other
// members in the store, this process's share (see newShare), kept until
// Redis decides again; alone, or before Redis has ever answered, the
// local twin, which has heard this process's traffic all along.
func (b *buckets) fallback(ctx context.Context, now time.Time) fleet.LimitBuckets {
	n := b.link.membersKnown()
	if n <= 1 {
		return b.local
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.share == nil {
		b.share = b.newShare(ctx, now, float64(n))
	}
	return b.share
}

// newShare returns buckets in memory holding 1/n of the shared buckets as
// last heard: each bucket's limit (rate and capacity) over n, and its
// level over n, refilled at that rate since it was heard; a bucket never
// heard from Redis takes the twin's limit and level instead, and the
// twin's pauses hold. b.mu held.
func (b *buckets) newShare(ctx context.Context, now time.Time, n float64) fleet.LimitBuckets {
	twin, _ := b.local.State(ctx, now)
	h := b.heard
	var limits, levels fleet.RateAmounts
	var named [3]bool
	var until time.Time
	for k := range limits {
		limit, level, at := twin[k].Limit, twin[k].Remaining, now
		if h.ok && h.limit[k] > 0 {
			limit, level, at = h.limit[k], h.level[k], h.at
		}
		if limit <= 0 {
			continue // unknown: admits everything, as the twin's does
		}
		limits[k] = limit / n
		levels[k] = level / n
		if now.After(at) {
			levels[k] += limits[k] * now.Sub(at).Seconds() / 60
		}
		levels[k] = min(levels[k], limits[k])
		if p := twin[k].PausedUntil; p.After(now) {
			named[k] = true
			if p.After(until) {
				until = p
			}
		}
	}
	share, err := fleet.MemoryStore{}.LimitShare(limits, levels, now, b.batch)
	if err != nil {
		return b.local
	}
	if !until.IsZero() {
		_ = share.Pause(ctx, now, named, until)
	}
	return share
}
