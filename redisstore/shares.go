package redisstore

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/damper-ai/damper-go/fleet"
	"github.com/redis/go-redis/v9"
)

// ShareKey returns the Redis key of the hash that holds the tenants'
// shares of the limit group group of the Damper named name:
// damper:{name}:share:<group>, the group escaped as in [BucketsKey].
func ShareKey(name, group string) string {
	return "damper:{" + name + "}:share:" + escapeGroup(group)
}

// ShareActiveKey returns the Redis key of the sorted set of the tenants
// active in the shares of group: damper:{name}:share-active:<group>.
func ShareActiveKey(name, group string) string {
	return "damper:{" + name + "}:share-active:" + escapeGroup(group)
}

// shareKeep is how long the keys of a group's shares outlive the end of
// the last activity they record, in Redis's time.
const shareKeep = time.Minute

// LimitShares implements [fleet.ShareStore]. It keeps the tenants' shares
// of one limit group's rate limit in Redis, shared by every process that
// gives the same [Options.Name]: each tenant active anywhere in the fleet
// counts its weight once, and takes from one bucket whichever process
// its calls reach.
//
// Keys. A hash, [ShareKey], holds W, the summed weights of the tenants
// active, and per tenant t its weight (w:t), its bucket's level (v:t, in
// minutes of the limit) and the time the level held (a:t); a sorted set,
// [ShareActiveKey], scores each tenant with the time it is active until
// (its last ask, or the due time it waits for). Times are the now Damper
// passes in, as seconds since the Unix epoch in a double (a resolution
// under a microsecond). Each ask drops, in the same script, the tenants
// whose time is more than [fleet.TenantIdle] past, and a new tenant
// beyond [fleet.MaxShareTenants] drops the least recently active; both
// keys expire a minute (Redis's time) after the last activity they hold.
//
// Round trips. Take is a decision, one round trip on the call's path;
// Settle is a record, queued for the store's next batch, and only for an
// attempt that used another share than it took. The arithmetic is
// fleet.MemoryStore's: a tenant's capacity is its weight over W, its
// bucket refills at that a minute and takes while it holds at least 0.
//
// When Redis fails, shares in memory (fleet.MemoryStore's) decide for this
// process's tenants alone, and the error is returned for Damper to log; a
// reservation is settled by the side that made it.
//
// It contacts no server. It returns an error, which keeps the group's
// shares in memory, for a group without a name or one longer than 256
// bytes.
func (s *Store) LimitShares(st fleet.ShareSettings) (fleet.LimitShares, error) {
	if st.Group == "" || len(st.Group) > 256 {
		return nil, fmt.Errorf("redisstore: LimitShares: group %q: must be 1 to 256 bytes", st.Group)
	}
	local, err := fleet.MemoryStore{}.LimitShares(st)
	if err != nil {
		return nil, err
	}
	return &shares{
		link:  s.link,
		keys:  []string{ShareKey(s.link.name, st.Group), ShareActiveKey(s.link.name, st.Group)},
		local: local,
	}, nil
}

var _ fleet.ShareStore = (*Store)(nil)

// shares are one group's shares in Redis, with their local fallback.
type shares struct {
	link  *link
	keys  []string
	local fleet.LimitShares
}

// shareReservation is what one request took, from Redis (shared) or,
// during a fallback, from the local shares.
type shareReservation struct {
	tenant string
	f      float64
	taken  bool
	local  fleet.ShareReservation // the local reservation, when Redis did not make it
}

func (r *shareReservation) Taken() bool { return r.taken }

// Take implements [fleet.LimitShares].
func (s *shares) Take(ctx context.Context, now time.Time, a fleet.ShareAsk, latest time.Time) (fleet.ShareReservation, time.Time, error) {
	if err := fleet.CheckShareAsk(a); err != nil {
		return &shareReservation{}, now, err
	}
	if latest.Before(now) {
		latest = now
	}
	ns, nn := timeArgs(now)
	ls, ln := timeArgs(latest)
	v, err := s.link.run(ctx, "share", shTakeScript, s.keys, ns, nn, a.Tenant, a.Weight, fmtFloat(a.Fraction), ls, ln,
		fmtFloat(fleet.TenantIdle.Seconds()), fleet.MaxShareTenants, fmtFloat(fleet.ShareSlack), shareKeep.Milliseconds())
	if err == nil {
		vs, ok := v.([]any)
		var taken int64
		var wait float64
		if ok = ok && len(vs) == 2; ok {
			taken, ok = asInt(vs[0])
			wait, ok = asFloatOK(vs[1], ok)
		}
		if ok && wait >= 0 {
			if taken == 1 {
				return &shareReservation{tenant: a.Tenant, f: a.Fraction, taken: true}, now, nil
			}
			return &shareReservation{}, now.Add(time.Duration(math.Ceil(wait * 1e9))), nil
		}
		err = fmt.Errorf("redisstore: share on %q: unexpected reply %v", s.link.name, v)
		s.link.fail("share", err)
	}
	lr, due, _ := s.local.Take(ctx, now, a, latest)
	if !lr.Taken() {
		return &shareReservation{}, due, err
	}
	return &shareReservation{tenant: a.Tenant, f: a.Fraction, taken: true, local: lr}, due, err
}

// Settle implements [fleet.LimitShares]: a record, queued.
func (s *shares) Settle(ctx context.Context, now time.Time, rr fleet.ShareReservation, used float64) error {
	r, ok := rr.(*shareReservation)
	if !ok || !r.taken {
		return nil
	}
	r.taken = false
	if r.local != nil {
		return s.local.Settle(ctx, now, r.local, used)
	}
	if math.IsNaN(used) || used < 0 {
		used = 0
	}
	ns, nn := timeArgs(now)
	return s.link.record(ctx, "share_settle", shSettleScript, s.keys,
		[]any{ns, nn, r.tenant, fmtFloat(r.f - used)}, nil, nil)
}

// The shares' scripts: KEYS[1] the hash, KEYS[2] the sorted set (see
// Store.LimitShares); ARGV[1..2] now as seconds and nanoseconds since the
// Unix epoch, ARGV[3] the tenant.
const sharesPrelude = `
local hkey, zkey = KEYS[1], KEYS[2]
local now = tonumber(ARGV[1]) + tonumber(ARGV[2]) / 1e9
local t = ARGV[3]
local W = tonumber(redis.call('HGET', hkey, 'W')) or 0
local function fmt(x) return string.format('%.17g', x) end
`

// shTakeScript asks for tenant ARGV[3] of weight ARGV[4] for fraction
// ARGV[5], a request that can wait until ARGV[6..7]; ARGV[8] is the idle
// time in seconds, ARGV[9] the most tenants held, ARGV[10] the slack and
// ARGV[11] the keys' time to live past the last activity (ms). It returns
// {1, "0"} when it took, else {0, the wait in seconds}.
var shTakeScript = redis.NewScript(sharesPrelude + `
local w, f = tonumber(ARGV[4]), tonumber(ARGV[5])
local latest = tonumber(ARGV[6]) + tonumber(ARGV[7]) / 1e9
local idle, most, slack = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])

local function drop(name)
  W = W - (tonumber(redis.call('HGET', hkey, 'w:' .. name)) or 0)
  redis.call('HDEL', hkey, 'w:' .. name, 'v:' .. name, 'a:' .. name)
  redis.call('ZREM', zkey, name)
end
for _, name in ipairs(redis.call('ZRANGEBYSCORE', zkey, '-inf', '(' .. fmt(now - idle))) do
  drop(name)
end

local cur = redis.call('HMGET', hkey, 'w:' .. t, 'v:' .. t, 'a:' .. t)
local level, at, active
if not cur[1] then
  if redis.call('ZSCORE', zkey, t) == false and redis.call('ZCARD', zkey) >= most then
    drop(redis.call('ZRANGE', zkey, 0, 0)[1])
  end
  W = W + w
  level, at, active = w / W, now, now
else
  W = W + w - tonumber(cur[1])
  level, at = tonumber(cur[2]), tonumber(cur[3])
  active = tonumber(redis.call('ZSCORE', zkey, t)) or now
end
local s = w / W
if now > at then
  level = level + s * (now - at) / 60
  at = now
end
level = math.min(level, s)
local taken, wait = 0, 0
if level >= -s * slack then
  level = level - f
  taken = 1
  active = math.max(active, now)
else
  wait = -level / s * 60
  if now + wait > latest then
    active = math.max(active, now)
  else
    active = math.max(active, now + wait)
  end
end
redis.call('HSET', hkey, 'W', W, 'w:' .. t, w, 'v:' .. t, fmt(level), 'a:' .. t, fmt(at))
redis.call('ZADD', zkey, fmt(active), t)
local ttl = math.ceil((active - now + idle) * 1000) + tonumber(ARGV[11])
for _, k in ipairs({hkey, zkey}) do
  if redis.call('PTTL', k) < ttl then redis.call('PEXPIRE', k, ttl) end
end
return {taken, fmt(wait)}
`)

// shSettleScript gives ARGV[4] (negative: takes it) back to tenant
// ARGV[3]'s bucket, refilled to now, within its share; a tenant dropped
// since gets nothing. It returns 1 when it gave, else 0.
var shSettleScript = redis.NewScript(sharesPrelude + `
local cur = redis.call('HMGET', hkey, 'w:' .. t, 'v:' .. t, 'a:' .. t)
if not cur[1] or W <= 0 then return 0 end
local s = tonumber(cur[1]) / W
local level, at = tonumber(cur[2]), tonumber(cur[3])
if now > at then
  level = level + s * (now - at) / 60
  at = now
end
level = math.min(level + tonumber(ARGV[4]), s)
redis.call('HSET', hkey, 'v:' .. t, fmt(level), 'a:' .. t, fmt(at))
return 1
`)
