package redisstore

import (
	"context"
	"time"

	"github.com/damper-ai/damper-go/fleet"
)

// What the buckets tell of themselves: their state from Redis (State), and
// what this process knows of it without a round trip (KnownState).

// State implements [fleet.LimitBuckets].
func (b *buckets) State(ctx context.Context, now time.Time) ([3]fleet.RateLimitState, error) {
	var out [3]fleet.RateLimitState
	v, err := b.run(ctx, "state", bkStateScript, now)
	if err == nil {
		vs, ok := v.([]any)
		if ok = ok && len(vs) == 15; ok {
			for k := range out {
				var limit, rem float64
				var conf int64
				var paused time.Time
				limit, ok = asFloatOK(vs[5*k], ok)
				rem, ok = asFloatOK(vs[5*k+1], ok)
				conf, ok = asIntOK(vs[5*k+2], ok)
				paused, ok = asTime(vs[5*k+3:5*k+5], now, ok)
				out[k] = fleet.RateLimitState{
					Bucket: bucketNames[k], Limit: limit, Remaining: rem,
					Learned: limit > 0 && conf == 0, PausedUntil: paused,
				}
			}
			if ok {
				b.answered()
				return out, nil
			}
		}
		err = b.unexpected("state", v)
	}
	out, _ = b.fallback(ctx, now).State(ctx, now)
	return out, err
}

// KnownState returns the buckets as last heard from Redis, without a
// round trip (see [fleet.LimitBuckets]): each limit and level the last
// Reserve's reply told, the level refilled at the limit since and never
// above it; a pause, and a bucket never heard of, as the local twin has
// them. While Redis fails, the local twin's, which has heard this
// process's traffic all along.
func (b *buckets) KnownState(now time.Time) [3]fleet.RateLimitState {
	out, _ := b.local.State(context.Background(), now)
	if b.link.down.Load() {
		return out
	}
	b.mu.Lock()
	h := b.heard
	b.mu.Unlock()
	if !h.ok {
		return out
	}
	for k := range out {
		if h.limit[k] <= 0 || !out[k].PausedUntil.IsZero() {
			continue
		}
		level := h.level[k]
		if now.After(h.at) {
			level += h.limit[k] * now.Sub(h.at).Minutes()
		}
		out[k].Limit, out[k].Remaining = h.limit[k], max(min(level, h.limit[k]), 0)
		out[k].Learned = !b.configured[k]
	}
	return out
}

var bucketNames = [3]string{"requests", "input_tokens", "output_tokens"}
