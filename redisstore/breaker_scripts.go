package redisstore

import "github.com/redis/go-redis/v9"

// breakerScript is internal/breaker's state machine on one hash, KEYS[1],
// one call per operation. Its fields, every one optional (a missing key is
// a closed breaker of generation 0 that has counted nothing):
//
//	st  the state: 1 closed, 2 open, 3 half-open
//	g   the generation
//	of  the current open period, in microseconds
//	ou  when the open period ends, in microseconds since the Unix epoch
//	pr  1 while a probe is out
//	ps  when the probe started, in microseconds since the epoch
//	pd  "start:due": when the probe that started at start is due to answer,
//	    in microseconds since the epoch; for another start (a probe of a
//	    process that does not write pd), its start plus ProbeLimit
//	nw  the newest slice counted, in slices (Window/30) since the epoch
//	i   the incarnation: when the key was made, in microseconds since the
//	    epoch, above every incarnation its maker had seen
//	b0 … b29  the window's buckets, "slice:total:failures", bucket k holding
//	    the slice ≡ k (mod 30)
//
// ARGV: 1 the operation (a Allow, r RefusesAt, d Done, s State), 2 now in
// microseconds since the epoch, 3 the slice holding now (computed in Go,
// to the nanosecond, as internal/breaker does), 4 RefusesAt's time in
// microseconds or Done's ticket generation, 5 Done's probe flag (0 or 1),
// 6 Done's verdict (0 neutral, 1 success, 2 failure), 7 the newest
// incarnation the caller has seen, 8 OpenFor, 9 MaxOpenFor and
// 10 ProbeLimit in microseconds, 11 MinAttempts, 12 FailureRatio,
// 13 the ratio's slack, 14 the key's time to live in milliseconds,
// 15 Allow's deadline in microseconds since the epoch ("" for none),
// 16 internal/breaker's OverdueWait in microseconds.
//
// It returns {ok, probe, next, generation, state, open-until, incarnation}:
// ok is Allow's admission or RefusesAt's refusal, probe whether Allow
// admitted the probe or whether RefusesAt has a next probe to tell, next
// when a refused attempt should ask again (internal/breaker's nextProbe),
// and the last three the breaker's state after the operation, for
// OnChange.
//
// Numbers written to the hash go through fmt, since Redis would turn a Lua
// number into a string with 14 significant digits.
var breakerScript = redis.NewScript(`
local key = KEYS[1]
local op = ARGV[1]
local now = tonumber(ARGV[2])
local openFor, maxOpenFor, probeLimit = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local h = redis.call('HMGET', key, 'st', 'g', 'of', 'ou', 'pr', 'ps', 'nw', 'i', 'pd')
local st = tonumber(h[1]) or 1
local g = tonumber(h[2]) or 0
local of = tonumber(h[3]) or openFor
local ou = tonumber(h[4]) or 0
local pr = h[5] == '1'
local ps = tonumber(h[6]) or 0
local nw = tonumber(h[7])
local inc = tonumber(h[8]) or 0
local pd = ps + probeLimit
do
  local s, d = string.match(h[9] or '', '^(-?%d+):(-?%d+)$')
  if s and tonumber(s) == ps then pd = tonumber(d) end
end
local dirty = false
local sets = {}

local function num(x) return string.format('%.0f', x) end
local function set(f, v)
  sets[#sets + 1] = f
  sets[#sets + 1] = v
  dirty = true
end
local bucketFields = {}
for k = 0, 29 do bucketFields[k + 1] = 'b' .. k end

local function change(to)
  if to == 1 then
    of = openFor
    set('of', num(of))
    redis.call('HDEL', key, unpack(bucketFields))
  end
  st = to
  g = g + 1
  pr = false
  set('st', st)
  set('g', num(g))
  set('pr', '0')
end
local function open(d)
  of = d
  ou = now + d
  set('of', num(of))
  set('ou', num(ou))
  change(2)
end
local function tick()
  if st == 2 and now >= ou then change(3) end
end
-- when a refused attempt should ask again: the end of the open period, or
-- the probe's due time (OverdueWait on once it has passed), never later
-- than the current open period from now
local function retryAt()
  local n = ou
  if st == 3 then
    n = pd
    if n <= now then n = now + tonumber(ARGV[16]) end
  end
  return math.min(n, now + of)
end
local function parse(b)
  local s, t, f = string.match(b, '^(-?%d+):(%d+):(%d+)$')
  return tonumber(s), tonumber(t), tonumber(f)
end
local function count(failed)
  local i = tonumber(ARGV[3])
  if nw and nw > i then i = nw end
  nw = i
  set('nw', num(i))
  local field = 'b' .. (i % 30)
  local b = redis.call('HGET', key, field)
  local s, t, f = i, 0, 0
  if b then
    s, t, f = parse(b)
    if s ~= i then s, t, f = i, 0, 0 end
  end
  t = t + 1
  if failed then f = f + 1 end
  set(field, num(s) .. ':' .. t .. ':' .. f)
  return i, field, t, f
end
local function tripped(i, field, t, f)
  local total, failures = 0, 0
  local bs = redis.call('HMGET', key, unpack(bucketFields))
  for k = 1, 30 do
    if bucketFields[k] == field then
      total, failures = total + t, failures + f
    elseif bs[k] then
      local s, bt, bf = parse(bs[k])
      if s > i - 30 and s <= i then
        total, failures = total + bt, failures + bf
      end
    end
  end
  return total >= tonumber(ARGV[11]) and failures >= tonumber(ARGV[12]) * total * tonumber(ARGV[13])
end

tick()
local ok, probe, next = 0, 0, 0
if op == 'a' then
  if st == 1 then
    ok = 1
  elseif st == 2 or pr then
    next = retryAt()
  else
    pr, ps, pd = true, now, now + probeLimit
    local dl = tonumber(ARGV[15])
    if dl and dl < pd then pd = dl end
    set('pr', '1')
    set('ps', num(ps))
    set('pd', num(ps) .. ':' .. num(pd))
    ok, probe = 1, 1
  end
elseif op == 'r' then
  local due
  if st == 2 then
    due = ou
  elseif st == 3 and pr then
    due = pd
  end
  if due then
    next, probe = retryAt(), 1
    if due > tonumber(ARGV[4]) then ok = 1 end
  end
elseif op == 'd' and tonumber(ARGV[4]) == g then
  local v = ARGV[6]
  if st == 1 then
    if v ~= '0' then
      local i, field, t, f = count(v == '2')
      if v == '2' and tripped(i, field, t, f) then open(openFor) end
    end
  elseif st == 3 and ARGV[5] == '1' then
    pr = false
    set('pr', '0')
    if v == '1' then
      change(1)
    elseif v == '2' then
      open(math.min(2 * of, maxOpenFor))
    end
  end
end
if dirty then
  if inc == 0 then
    inc = math.max(now, tonumber(ARGV[7]) + 1, 1)
    set('i', num(inc))
  end
  redis.call('HSET', key, unpack(sets))
  redis.call('PEXPIRE', key, ARGV[14])
end
return {ok, probe, next, g, st, ou, inc}
`)
