package redisstore

import "github.com/redis/go-redis/v9"

// Every script keeps one window's books in one hash, KEYS[1], with the
// fields w (the window's start, in windows since the Unix epoch, as a
// decimal integer), s (successful first attempts) and u (units used).
// ARGV[1] is the window holding the caller's now, ARGV[2] the key's time to
// live in milliseconds. Each returns {s, u, granted}.
//
// A caller whose window is older than the stored one is counted in the
// stored one, as fleet.WindowBudget counts a late caller: a process whose
// clock lags the fleet's joins its window instead of resetting it. A newer
// window replaces the books and sets the key's expiry, so a budget nobody
// uses disappears a few windows later.
const prelude = `
local function after(a, b)
  local na, nb = string.sub(a, 1, 1) == '-', string.sub(b, 1, 1) == '-'
  if na ~= nb then return nb end
  if #a ~= #b then return (#a > #b) ~= na end
  for i = 1, #a do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return (x > y) ~= na end
  end
  return false
end
local key = KEYS[1]
local book = redis.call('HMGET', key, 'w', 's', 'u')
local s, u
if not book[1] or after(ARGV[1], book[1]) then
  s, u = 0, 0
  redis.call('HSET', key, 'w', ARGV[1], 's', 0, 'u', 0)
  redis.call('PEXPIRE', key, ARGV[2])
else
  s, u = tonumber(book[2]), tonumber(book[3])
end
`

// observeScript counts a successful first attempt.
var observeScript = redis.NewScript(prelude + `
s = redis.call('HINCRBY', key, 's', 1)
return {s, u, 0}
`)

// acquireScript takes a unit when one is left. ARGV[3] is the minimum
// tokens and ARGV[4] the ratio: the test is fleet.WindowBudget's, in the
// same double-precision operations, epsilon included.
var acquireScript = redis.NewScript(prelude + `
if u + 1 > tonumber(ARGV[3]) + tonumber(ARGV[4]) * s + 1e-9 then
  return {s, u, 0}
end
u = redis.call('HINCRBY', key, 'u', 1)
return {s, u, 1}
`)

// availableScript reads the books; the balance is computed in Go, since a
// script's numbers reach the client as integers.
var availableScript = redis.NewScript(prelude + `
return {s, u, 0}
`)

// leaseScript takes up to ARGV[5] units at once, as many as are left (a
// lease: see Options.Lease), each by acquireScript's test, and returns
// {s, u, units taken}.
var leaseScript = redis.NewScript(prelude + `
local cap = tonumber(ARGV[3]) + tonumber(ARGV[4]) * s + 1e-9
local n = 0
while n < tonumber(ARGV[5]) and u + n + 1 <= cap do
  n = n + 1
end
if n > 0 then
  u = redis.call('HINCRBY', key, 'u', n)
end
return {s, u, n}
`)

// returnScript gives back ARGV[2] leased units, unspent, to window
// ARGV[1]: only while the books are still that window's (a newer window
// has fresh books, and the units of an older one are void), and never
// below none used. It returns {s, u, 1} when it gave them back, else
// {0, 0, 0}. It does not start a window, so it has no prelude.
var returnScript = redis.NewScript(`
local key = KEYS[1]
local book = redis.call('HMGET', key, 'w', 's', 'u')
if book[1] ~= ARGV[1] then
  return {0, 0, 0}
end
local n = math.min(tonumber(ARGV[2]), tonumber(book[3]))
local u = redis.call('HINCRBY', key, 'u', -n)
return {tonumber(book[2]), u, 1}
`)

// chargeScript charges the books of window ARGV[1] with what a fallback
// counted in it: ARGV[3] successes and ARGV[4] units. Books of a newer
// window take nothing: the fault's window is over.
var chargeScript = redis.NewScript(prelude + `
if book[1] and after(book[1], ARGV[1]) then
  return {s, u, 0}
end
if tonumber(ARGV[3]) > 0 then s = redis.call('HINCRBY', key, 's', ARGV[3]) end
if tonumber(ARGV[4]) > 0 then u = redis.call('HINCRBY', key, 'u', ARGV[4]) end
return {s, u, 0}
`)
