package redisstore

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/damper-ai/damper-go/fleet"
	"github.com/redis/go-redis/v9"
)

// SpendTTL is how long a tenant's count of one day lives in Redis after
// its last Add: the day's count outlives the day by a day or more, and
// then disappears by itself.
const SpendTTL = 48 * time.Hour

// SpendKey returns the Redis key that holds the spend of tenant in the
// UTC day holding now, in the store named name:
// damper:{name}:spend:<tenant>:<yyyy-mm-dd>.
func SpendKey(name, tenant string, now time.Time) string {
	return "damper:{" + name + "}:spend:" + tenant + ":" + now.UTC().Format(time.DateOnly)
}

// Spend implements [fleet.SpendStore]: a tenant's spend of each UTC day,
// kept for the whole fleet in one Redis string per day,
// damper:{<Name>}:spend:<tenant>:<yyyy-mm-dd> (see [SpendKey]), on the
// Name's Cluster slot. Every process that gives the same Name counts into,
// and reads, one count per tenant and day. A new day is a new key, so the
// count starts from 0 at 00:00 UTC by the now Damper passes.
//
// The count is an integer of nanodollars (see [fleet.Spend]), added to
// by INCRBY, exact whatever the number of calls; a float (INCRBYFLOAT)
// would drift in the last digits. Each Add is a record queued for the
// store's next batch (see the package documentation): a Lua script that
// adds and sets the key to expire after [SpendTTL]. Each Spent is one
// round trip that reads it.
//
// A local count, fleet.MemoryStore's, hears every Add of this process
// all along. While Redis fails (see [Store.State]) Spent returns the most
// this process knows: the fleet's count last heard from Redis for that
// day with this process's Adds that Redis did not take, or the local
// count, whichever is more, and the error as well; a tenant's fleet may
// then spend beyond its ceiling by what other processes spend meanwhile.
// Adds that Redis did not take (a fallback, a full queue, a failed batch)
// are added to the next Add or Spent of the same day that reaches it, so the fleet's
// count misses none of them once Redis is back; one that timed out but
// was carried out all the same is counted twice, erring towards
// refusing sooner. [Options.FailClosed] does not apply.
func (s *Store) Spend(p fleet.SpendSettings) (fleet.Spend, error) {
	// MemoryStore validates p.
	local, err := fleet.MemoryStore{}.Spend(p)
	if err != nil {
		return nil, err
	}
	return &spend{
		link:   s.link,
		tenant: p.Tenant,
		ttlArg: strconv.FormatInt(SpendTTL.Milliseconds(), 10),
		local:  local,
	}, nil
}

// spend is a tenant's spend kept in Redis.
type spend struct {
	link   *link
	tenant string
	ttlArg string
	local  fleet.Spend // hears every Add; answers while Redis fails

	mu    sync.Mutex
	heard dayNanos // the newest day's count last heard from Redis
	owed  dayNanos // Adds Redis did not take, sent with the next
}

// dayNanos is a count of nanodollars of one UTC day.
type dayNanos struct {
	day   int64 // days since the Unix epoch
	nanos int64
}

var _ fleet.Spend = (*spend)(nil)

// spendAddScript adds ARGV[1] to the count in KEYS[1], sets it to expire
// after ARGV[2] milliseconds, and returns it.
var spendAddScript = redis.NewScript(`
local n = redis.call('INCRBY', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return n
`)

// spendReadScript returns the count in KEYS[1], 0 when missing.
var spendReadScript = redis.NewScript(`
return tonumber(redis.call('GET', KEYS[1]) or '0')
`)

// Add implements [fleet.Spend]: the local count hears it at once, and
// Redis with the store's next batch, with the Adds of the same day it did
// not take before.
func (s *spend) Add(ctx context.Context, now time.Time, usd float64) error {
	n, err := fleet.SpendNanos(usd)
	if err != nil {
		return err
	}
	_ = s.local.Add(ctx, now, usd) // never fails once n is
	day := utcDay(now)
	n += s.takeOwed(day)
	if n == 0 {
		return nil
	}
	return s.send(ctx, now, day, n)
}

// send queues the record that adds n nanodollars to day's count in Redis;
// what Redis does not take is owed again.
func (s *spend) send(ctx context.Context, now time.Time, day, n int64) error {
	keys := []string{SpendKey(s.link.name, s.tenant, now)}
	err := s.link.record(ctx, "spend_add", spendAddScript, keys, []any{n, s.ttlArg}, nil, func(v any, err error) {
		if err != nil {
			s.owe(day, n)
			return
		}
		if total, err := s.link.ints("spend_add", []any{v}, 1); err == nil {
			s.hear(day, total[0])
		}
	})
	if err != nil {
		s.owe(day, n)
	}
	return err
}

// Spent implements [fleet.Spend]: one round trip, after the records
// queued before it. The Adds Redis did not take count too, and go to
// Redis first, in the same round trip, when Redis is asked: a process
// that the ceiling stops from adding more still gives the fleet its
// count.
func (s *spend) Spent(ctx context.Context, now time.Time) (float64, error) {
	day := utcDay(now)
	if s.link.state() == StateShared {
		if n := s.takeOwed(day); n > 0 {
			_ = s.send(ctx, now, day, n)
		}
	}
	v, err := s.link.run(ctx, "spend_spent", spendReadScript, []string{SpendKey(s.link.name, s.tenant, now)})
	if err == nil {
		var n []int64
		if n, err = s.link.ints("spend_spent", []any{v}, 1); err == nil {
			s.hear(day, n[0])
			owed := s.takeOwed(day)
			if owed > 0 {
				// Redis answered the probe: what it did not take follows.
				_ = s.send(ctx, now, day, owed)
			}
			return float64(n[0]+owed) / 1e9, nil
		}
	}
	owed, heard := s.known(day)
	local, _ := s.local.Spent(ctx, now)
	return max(float64(owed+heard)/1e9, local), err
}

// takeOwed returns, and forgets, the nanodollars owed to Redis for day;
// those of an earlier day are dropped, as that day's ceiling is past.
func (s *spend) takeOwed(day int64) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	if s.owed.day == day {
		n = s.owed.nanos
	}
	if s.owed.day <= day {
		s.owed = dayNanos{}
	}
	return n
}

// owe keeps n nanodollars of day that Redis did not take, for the next
// Add of that day.
func (s *spend) owe(day, n int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.owed.day == day:
		s.owed.nanos += n
	case day > s.owed.day:
		s.owed = dayNanos{day, n}
	}
}

// known returns the nanodollars of day owed to Redis, and the count of
// day last heard from it.
func (s *spend) known(day int64) (owed, heard int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.owed.day == day {
		owed = s.owed.nanos
	}
	if s.heard.day == day {
		heard = s.heard.nanos
	}
	return owed, heard
}

// hear keeps the count of day that Redis answered, when it is the newest
// heard of.
func (s *spend) hear(day, nanos int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch h := &s.heard; {
	case day > h.day:
		*h = dayNanos{day, nanos}
	case day == h.day:
		h.nanos = max(h.nanos, nanos)
	}
}

// utcDay numbers the UTC day holding now, in days since the Unix epoch.
func utcDay(now time.Time) int64 {
	sec := now.Unix()
	d := sec / 86400
	if sec%86400 < 0 {
		d--
	}
	return d
}
