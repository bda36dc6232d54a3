package redisstore

import "github.com/redis/go-redis/v9"

// The rate limiter's scripts keep one limit group in one hash, KEYS[1]
// (see [BucketsKey]), with, for each bucket k (0 requests, 1 input tokens,
// 2 output tokens):
//
//	l<k>  the limit per minute (0 while unknown)
//	c<k>  1 for a configured limit, 0 for a learned one
//	v<k>  the level, tokens, possibly below 0
//	a<k>  when the level held
//	t<k>  taken: what the fleet took from the group, net of what settled back
//	p<k>  when the bucket's pause ends ("": none)
//
// and bn, when the next batch request to join the batch line may take its
// turn ("": none), and e, the group's epoch; and for each batch request
// waiting in line, w<s>:<n> (its slot, seconds and nanoseconds since the
// Unix epoch) = "<s>:<n>", the end of its turn, when the next may take
// theirs. The line's fields are written in absolute time, so that a slot
// names its holder across epochs; bn is the last end, worked out again
// when a request leaves the line, and a slot whose end has passed is
// dropped when the line is scanned. Times are nanoseconds since
// the epoch e, a whole second since the Unix epoch set when the hash is
// made: a double holds them exactly for 104 days either side, and e moves
// up to now, the times with it, once now is 30 days past it. Levels,
// limits and takes are written with string.format('%.17g'), which a double
// survives exactly.
//
// Times travel as two arguments, whole seconds since the Unix epoch and
// nanoseconds (the seconds "z" for the zero time). Every script is given
// ARGV[1..2] now (Damper's clock, never Redis's), ARGV[3] the key's base
// time to live (milliseconds), ARGV[4..6] the configured limits (0 for a
// learned one) and ARGV[7] the batch share; its own arguments follow from
// ARGV[8]. The arithmetic is internal/ratelimit's, operation for operation,
// in the same double-precision operations on the same nanoseconds, so that
// the results are the same to the bit. A time returned is two integers,
// seconds and nanoseconds; floats are returned as strings, since a
// script's numbers reach the client as integers.
//
// A script that changes the group writes every field and sets the key to
// expire the base time to live after every bucket is full again, every
// pause has ended and the batch line is empty: a group nobody uses
// disappears, and comes back as a new one (configured limits full, learned
// ones unknown) whose first response teaches it its limits again.
const bucketsPrelude = `
local key = KEYS[1]
local NONE = -1e300
local share = tonumber(ARGV[7])
local fields = redis.call('HMGET', key,
  'l0', 'c0', 'v0', 'a0', 't0', 'p0',
  'l1', 'c1', 'v1', 'a1', 't1', 'p1',
  'l2', 'c2', 'v2', 'a2', 't2', 'p2', 'bn', 'e')
local nowSec = tonumber(ARGV[1])
local e = tonumber(fields[20]) or nowSec
local B = {}
for k = 1, 3 do
  local i = (k - 1) * 6
  local b = {
    limit = tonumber(fields[i + 1]) or 0,
    conf = fields[i + 2] == '1',
    level = tonumber(fields[i + 3]) or 0,
    at = tonumber(fields[i + 4]) or NONE,
    taken = tonumber(fields[i + 5]) or 0,
    paused = tonumber(fields[i + 6]) or NONE,
  }
  local cl = tonumber(ARGV[3 + k])
  if cl > 0 and (not b.conf or b.limit ~= cl) then
    -- A configured limit: a new group's bucket starts full.
    if b.limit == 0 then b.level = cl end
    b.limit, b.conf = cl, true
    b.level = math.min(b.level, cl)
  end
  B[k] = b
end
local bn = tonumber(fields[19]) or NONE
if math.abs(nowSec - e) > 2592000 then
  local shift = (nowSec - e) * 1e9
  e = nowSec
  for k = 1, 3 do
    if B[k].at > NONE then B[k].at = B[k].at - shift end
    if B[k].paused > NONE then B[k].paused = B[k].paused - shift end
  end
  if bn > NONE then bn = bn - shift end
end

-- T reads the time in ARGV[i], ARGV[i+1].
local function T(i)
  if ARGV[i] == 'z' then return NONE end
  return (tonumber(ARGV[i]) - e) * 1e9 + tonumber(ARGV[i + 1])
end
local now = T(1)

local function fmt(x) return string.format('%.17g', x) end

local function fmtTime(x)
  if x <= NONE then return '' end
  return fmt(x)
end

-- out returns time x as seconds and nanoseconds since the Unix epoch.
local function out(x)
  local s = math.floor(x / 1e9)
  local n = x - s * 1e9
  if n < 0 then s, n = s - 1, n + 1e9 elseif n >= 1e9 then s, n = s + 1, n - 1e9 end
  return e + s, n
end

-- secs converts nanoseconds to seconds as Go's Duration.Seconds does.
local function secs(ns)
  local s = math.floor(ns / 1e9)
  local n = ns - s * 1e9
  if n < 0 then s, n = s - 1, n + 1e9 elseif n >= 1e9 then s, n = s + 1, n - 1e9 end
  return s + n / 1e9
end

-- nanos converts seconds to nanoseconds, rounded up, as internal/ratelimit's
-- seconds does.
local function nanos(s)
  local x = s * 1e9
  local d = math.floor(x)
  if d < x then d = d + 1 end
  return d
end

local function advance(b)
  if now <= b.at then return end
  if b.limit > 0 then
    b.level = math.min(b.limit, b.level + b.limit * secs(now - b.at) / 60)
  end
  b.at = now
end

local function bucketDue(b, need)
  local t = now
  if b.limit > 0 and b.level < need - b.limit * 1e-12 then
    if b.at > t then t = b.at end
    t = t + nanos((need - b.level) * 60 / b.limit)
  end
  if b.paused > t then t = b.paused end
  return t
end

-- groupDue is when every bucket holds what a request of cost at priority
-- batch (true) or interactive needs, no earlier than from.
local function groupDue(from, cost, batch)
  local due = from
  for k = 1, 3 do
    local b = B[k]
    advance(b)
    local floor = 0
    if batch then floor = (1 - share) * b.limit end
    local d = bucketDue(b, math.min(cost[k] + floor, b.limit))
    if d > due then due = d end
  end
  return due
end

-- wfield is the line's field of a slot given as seconds and nanoseconds.
local function wfield(s, n)
  return string.format('w%d:%d', tonumber(s), tonumber(n))
end

-- lineScan drops the slots whose turn has ended and returns the last end
-- of those left (NONE for none).
local function lineScan()
  local all = redis.call('HGETALL', key)
  local last = NONE
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, 1) == 'w' then
      local s, n = string.match(all[i + 1], '^(-?%d+):(%d+)$')
      local t = NONE
      if s then t = (tonumber(s) - e) * 1e9 + tonumber(n) end
      if t <= now then
        redis.call('HDEL', key, all[i])
      elseif t > last then
        last = t
      end
    end
  end
  return last
end

-- leaveLine takes the slot given as seconds and nanoseconds out of the
-- line; it returns true when it was there, bn then the new last end.
local function leaveLine(s, n)
  if redis.call('HDEL', key, wfield(s, n)) == 0 then return false end
  bn = lineScan()
  return true
end

local function save()
  local ttl = tonumber(ARGV[3])
  local longest = 0
  local args = {}
  for k = 1, 3 do
    local b = B[k]
    local i = tostring(k - 1)
    local c = '0'
    if b.conf then c = '1' end
    args[#args + 1] = 'l' .. i; args[#args + 1] = fmt(b.limit)
    args[#args + 1] = 'c' .. i; args[#args + 1] = c
    args[#args + 1] = 'v' .. i; args[#args + 1] = fmt(b.level)
    args[#args + 1] = 'a' .. i; args[#args + 1] = fmtTime(b.at)
    args[#args + 1] = 't' .. i; args[#args + 1] = fmt(b.taken)
    args[#args + 1] = 'p' .. i; args[#args + 1] = fmtTime(b.paused)
    if b.limit > 0 and b.level < b.limit then
      longest = math.max(longest, (b.limit - b.level) * 60000 / b.limit + math.max(b.at - now, 0) / 1e6)
    end
    longest = math.max(longest, (b.paused - now) / 1e6)
  end
  longest = math.max(longest, (bn - now) / 1e6)
  args[#args + 1] = 'bn'; args[#args + 1] = fmtTime(bn)
  args[#args + 1] = 'e'; args[#args + 1] = fmt(e)
  redis.call('HSET', key, unpack(args))
  redis.call('PEXPIRE', key, fmt(math.ceil(ttl + math.min(longest, 86400000))))
end
`

// bkReserveScript asks for a request's cost. ARGV[8..10] is the cost,
// ARGV[11] 1 for a batch request, ARGV[12..13] latest, ARGV[14..15] the
// ticket's slot ("z": it has not joined the line). It returns {taken,
// due (2), slot (2; 0, -1 for none), mark0, mark1, mark2, held0, held1,
// held2, level0, level1, level2, limit0, limit1, limit2}, held being what
// the request took (no more than a known limit), and the levels and limits
// those the buckets hold after it: a fallback's share starts from them.
// A batch request asking before its slot gives its place up and joins the
// line again at its end.
var bkReserveScript = redis.NewScript(bucketsPrelude + bkReserveBody + `
save()
return reply(1, marks[1], marks[2], marks[3])
`)

// bkReserveLeaseScript is bkReserveScript for an interactive request that
// also asks for a lease: ARGV[16] more calls' worth of its held amounts.
// Once the request has taken, and only when it may be sent now and every
// bucket's limit is known, it takes n × held more, n the most calls, up to
// ARGV[16], that every bucket holds now after the request (never below
// 0: the lease makes nobody wait who would not have). A reply that took
// has four more elements: n and the three limits; one that did not is
// bkReserveScript's.
var bkReserveLeaseScript = redis.NewScript(bucketsPrelude + bkReserveBody + `
local n = tonumber(ARGV[16])
local any = false
if due > now then n = 0 end
for k = 1, 3 do
  local b = B[k]
  if b.limit <= 0 then
    n = 0
  elseif held[k] > 0 then
    any = true
    n = math.min(n, math.floor(math.max(b.level, 0) / held[k]))
  end
end
if not any then n = 0 end
if n > 0 then
  for k = 1, 3 do
    B[k].level = B[k].level - n * held[k]
    B[k].taken = B[k].taken + n * held[k]
  end
end
extra = {n, fmt(B[1].limit), fmt(B[2].limit), fmt(B[3].limit)}
save()
return reply(1, marks[1], marks[2], marks[3])
`)

// bkReserveBody is the reserve scripts' common part: it returns when the
// request does not take, and leaves marks, the group taken from but not
// saved, when it does.
const bkReserveBody = `
local cost = {tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])}
local batch = ARGV[11] == '1'
local latest = T(12)
local slot = T(14)
local due = groupDue(now, cost, batch)
local held = {}
for k = 1, 3 do
  held[k] = cost[k]
  if B[k].limit > 0 then held[k] = math.min(cost[k], B[k].limit) end
end
local extra = {}
local function reply(taken, m1, m2, m3)
  local ds, dn = out(due)
  local ss, sn = 0, -1
  if slot > NONE then ss, sn = out(slot) end
  local r = {taken, ds, dn, ss, sn, m1, m2, m3, fmt(held[1]), fmt(held[2]), fmt(held[3]),
    fmt(B[1].level), fmt(B[2].level), fmt(B[3].level), fmt(B[1].limit), fmt(B[2].limit), fmt(B[3].limit)}
  for _, x in ipairs(extra) do r[#r + 1] = x end
  return r
end
if batch then
  local inLine = slot <= NONE or now < slot
  local left = false
  if inLine then
    if slot > NONE then
      left = leaveLine(ARGV[14], ARGV[15])
      slot = NONE
    end
    if bn > due then due = bn end
  end
  if due > now then
    if due <= latest and inLine then
      slot = due
      local longest = 1
      for k = 1, 3 do
        if B[k].limit > 0 then
          longest = math.max(longest, nanos(held[k] * 60 / B[k].limit))
        end
      end
      bn = due + longest
      lineScan()
      local ss, sn = out(slot)
      local es, en = out(bn)
      redis.call('HSET', key, wfield(ss, sn), string.format('%d:%d', es, en))
      save()
    elseif left then
      save()
    end
    return reply(0, '0', '0', '0')
  end
elseif due > latest then
  return reply(0, '0', '0', '0')
end
local marks = {}
for k = 1, 3 do
  local b = B[k]
  b.level = b.level - held[k]
  b.taken = b.taken + held[k]
  marks[k] = fmt(b.taken)
end
`

// bkLeaveScript takes the batch request whose slot is ARGV[8..9] out of the
// line. It returns 1.
var bkLeaveScript = redis.NewScript(bucketsPrelude + `
if leaveLine(ARGV[8], ARGV[9]) then save() end
return 1
`)

// bkAdmitsScript reports when a request could take, taking nothing.
// ARGV[8..10] is the cost, ARGV[11] 1 for batch, ARGV[12..13] the later
// time asked about. It returns the due time.
var bkAdmitsScript = redis.NewScript(bucketsPrelude + `
local cost = {tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])}
local batch = ARGV[11] == '1'
local due = groupDue(T(12), cost, batch)
if batch and bn > due then due = bn end
local s, n = out(due)
return {s, n}
`)

// bkObserveScript corrects the buckets from a response's headers. For
// each bucket k, ARGV[8+4k..11+4k] are has (1 or 0), the response's limit,
// its remaining count and the reservation's mark. It returns, per bucket,
// 1 when the level was set from the count (the response counted the
// request as the API will: settling leaves that bucket alone).
var bkObserveScript = redis.NewScript(bucketsPrelude + bkObserveBody + `
return seen
`)

// bkObserveBody is bkObserveScript's work, which leaves seen.
const bkObserveBody = `
local seen = {0, 0, 0}
local changed = false
for k = 1, 3 do
  local i = 8 + (k - 1) * 4
  if ARGV[i] == '1' then
    local b = B[k]
    local limit, rem, mark = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
    advance(b)
    local level = b.level
    if not b.conf and limit > 0 and limit ~= b.limit then
      if b.limit == 0 then
        -- What the fleet took after the request counts for one limit at
        -- most: no request takes more, once the limit is known.
        level = rem - math.min(math.max(b.taken - mark, 0), limit)
      elseif not (b.paused > now) then
        level = level + limit - b.limit
      end
      b.limit = limit
    end
    if b.limit ~= 0 then
      level = math.min(level, rem, b.limit)
      if level ~= b.level and k ~= 3 then seen[k] = 1 end
      b.level = level
    end
    changed = true
  end
end
if changed then save() end
`

// bkSettleScript gives back, or takes, what a request used less what it
// took. For each bucket k, ARGV[8+2k] is 1 when the bucket settles and
// ARGV[9+2k] what goes back. It returns 1.
var bkSettleScript = redis.NewScript(bucketsPrelude + `
local seen = {0, 0, 0}
local first = 8
` + bkSettleBody + `
return 1
`)

// bkObserveSettleScript is bkObserveScript then bkSettleScript, for a
// request whose response's headers and usage go in one batch: settling's
// arguments follow from ARGV[20], and a bucket whose level was set from
// the count is left alone, as Settle leaves it after Observe's reply. It
// returns what bkObserveScript returns.
var bkObserveSettleScript = redis.NewScript(bucketsPrelude + bkObserveBody + `
local first = 20
` + bkSettleBody + `
return seen
`)

// bkSettleBody settles the buckets from ARGV[first], but those in seen.
const bkSettleBody = `
for k = 1, 3 do
  local i = first + (k - 1) * 2
  if ARGV[i] == '1' and seen[k] == 0 then
    local b = B[k]
    local back = tonumber(ARGV[i + 1])
    advance(b)
    b.taken = b.taken - back
    b.level = b.level + back
    if b.limit > 0 then b.level = math.min(b.level, b.limit) end
  end
end
save()
`

// bkPauseScript empties the buckets named, ARGV[8..10] 1 or 0, until
// ARGV[11..12]. It returns 1.
var bkPauseScript = redis.NewScript(bucketsPrelude + `
local untilT = T(11)
for k = 1, 3 do
  if ARGV[7 + k] == '1' then
    local b = B[k]
    advance(b)
    b.level = math.min(b.level, 0)
    if untilT > b.paused then b.paused = untilT end
  end
end
save()
return 1
`)

// bkPausedUntilScript returns when the group's last pause ends, {0, -1}
// when none is under way at now.
var bkPausedUntilScript = redis.NewScript(bucketsPrelude + `
local u = NONE
for k = 1, 3 do
  local p = B[k].paused
  if p > now and p > u then u = p end
end
if u <= NONE then return {0, -1} end
local s, n = out(u)
return {s, n}
`)

// bkStateScript returns, per bucket, {limit, remaining, configured, paused
// until (2; 0, -1 for none under way)}, taking nothing and writing nothing.
var bkStateScript = redis.NewScript(bucketsPrelude + `
local res = {}
for k = 1, 3 do
  local b = B[k]
  advance(b)
  local rem, ps, pn = 0, 0, -1
  if b.paused > now then
    ps, pn = out(b.paused)
  elseif b.limit > 0 then
    rem = math.max(b.level, 0)
  end
  local c = 0
  if b.conf then c = 1 end
  res[#res + 1] = fmt(b.limit)
  res[#res + 1] = fmt(rem)
  res[#res + 1] = c
  res[#res + 1] = ps
  res[#res + 1] = pn
end
return res
`)
