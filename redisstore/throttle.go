package redisstore

import (
	"context"
	"strconv"
	"time"

	"github.com/damper-ai/damper-go/fleet"
	"github.com/redis/go-redis/v9"
)

// ThrottleTTL is how long the retry throttle's count lives in Redis after
// its last change. A count nobody changes for that long disappears, and
// the fleet's throttle starts full again, as a process's does when it
// starts: an hour without a single attempt says nothing recent of the
// provider's health, and each Add refreshes it, so a fleet in use never
// loses its count.
const ThrottleTTL = time.Hour

// ThrottleKey returns the Redis key that holds the count of the retry
// throttle of the store named name: damper:{name}:throttle.
func ThrottleKey(name string) string { return "damper:{" + name + "}:throttle" }

// Throttle implements [fleet.ThrottleStore]: the retry throttle's count of tokens,
// in thousandths, kept for the whole fleet in one Redis string,
// damper:{<Name>}:throttle (see [ThrottleKey]), on the Name's Cluster slot.
// Every process that gives the same Name draws on, and fills, one count.
//
// A missing key is a full count (MaxTokens × 1000). Each Add is a record
// queued for the store's next batch (see the package documentation): a
// Lua script that adds the delta, keeps the count within
// [0, MaxTokens × 1000] (the arithmetic of fleet.MemoryStore's throttle),
// writes it back with a time to live of [ThrottleTTL], and returns it;
// each Tokens is one round trip that reads it. The rule that uses the count
// (half of MaxTokens or fewer: no retry) stays in Damper.
//
// A local throttle, fleet.MemoryStore's, hears every Add of this process
// all along. While Redis fails (see [Store.State]) it decides: Tokens
// returns its count, or 0 (no retry) with [Options.FailClosed], and the
// error as well. The fleet's count misses the Adds made during a
// fallback.
func (s *Store) Throttle(p fleet.ThrottleSettings) (fleet.Throttle, error) {
	// MemoryStore validates p.
	local, err := fleet.MemoryStore{}.Throttle(p)
	if err != nil {
		return nil, err
	}
	maxTokens := p.MaxTokens
	return &throttle{
		link:   s.link,
		keys:   []string{ThrottleKey(s.link.name)},
		maxArg: strconv.FormatInt(int64(maxTokens)*1000, 10),
		ttlArg: strconv.FormatInt(ThrottleTTL.Milliseconds(), 10),
		local:  local,
	}, nil
}

// throttle is a retry throttle's count kept in Redis.
type throttle struct {
	link           *link
	keys           []string
	maxArg, ttlArg string
	local          fleet.Throttle // hears every Add; decides while Redis fails
}

var _ fleet.Throttle = (*throttle)(nil)

// throttleAddScript adds ARGV[1] to the count in KEYS[1] (full, ARGV[2],
// when missing), keeps it within [0, ARGV[2]], stores it for ARGV[3]
// milliseconds and returns it.
var throttleAddScript = redis.NewScript(`
local full = tonumber(ARGV[2])
local n = tonumber(redis.call('GET', KEYS[1]) or full)
n = math.min(math.max(n + tonumber(ARGV[1]), 0), full)
redis.call('SET', KEYS[1], string.format('%d', n), 'PX', ARGV[3])
return n
`)

// throttleReadScript returns the count in KEYS[1], full (ARGV[1]) when
// missing, and at most full.
var throttleReadScript = redis.NewScript(`
local full = tonumber(ARGV[1])
return math.min(tonumber(redis.call('GET', KEYS[1]) or full), full)
`)

// Add implements [fleet.Throttle]: the local throttle hears it at once,
// and Redis with the store's next batch (see the package documentation).
func (t *throttle) Add(ctx context.Context, delta int64) error {
	_ = t.local.Add(ctx, delta) // never fails
	return t.link.record(ctx, "throttle_add", throttleAddScript, t.keys, []any{delta, t.maxArg, t.ttlArg}, nil, func(v any, err error) {
		if err == nil {
			_, _ = t.link.ints("throttle_add", []any{v}, 1)
		}
	})
}

// Tokens implements [fleet.Throttle]: one round trip, after the records
// queued before it.
func (t *throttle) Tokens(ctx context.Context) (int64, error) {
	v, err := t.link.run(ctx, "throttle_tokens", throttleReadScript, t.keys, t.maxArg)
	if err == nil {
		var n []int64
		if n, err = t.link.ints("throttle_tokens", []any{v}, 1); err == nil {
			return n[0], nil
		}
	}
	if t.link.failClosed {
		return 0, err
	}
	n, _ := t.local.Tokens(ctx)
	return n, err
}
