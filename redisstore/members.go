package redisstore

import (
	"crypto/rand"
	"encoding/hex"
	"time"

	"github.com/redis/go-redis/v9"
)

// MemberFor is how long a process counts among the members of its
// store's fleet after it last refreshed its membership: far above the
// refresh (at most every [MemberFor]/40, in a batch of the process's
// records), above the
// longest LeaseFor's default tenfold, and above a Timeout's default
// two-hundredfold, so that a process with steady traffic never drops out
// between refreshes, and one that stopped leaves the count within it.
const MemberFor = 10 * time.Second

// memberEvery is the least time between two refreshes of a process's
// membership: one record, added to a batch of the queue as a record or a
// decision joins it.
const memberEvery = MemberFor / 40

// MembersKey returns the Redis key that holds the members of the fleet of
// the Damper named name: damper:{name}:members, a sorted set of one
// random ID per [Store], each scored by the time (Redis's TIME, in
// milliseconds) it last refreshed its membership.
func MembersKey(name string) string { return "damper:{" + name + "}:members" }

// membersScript refreshes member ARGV[1], trims the members not refreshed
// within ARGV[2] milliseconds and returns how many are left. The time is
// Redis's, the one clock every member reads alike.
var membersScript = redis.NewScript(`
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now - ttl))
redis.call('PEXPIRE', KEYS[1], ttl)
return redis.call('ZCARD', KEYS[1])
`)

// newMemberID returns a random ID for one store.
func newMemberID() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand panics instead)
	return hex.EncodeToString(b[:])
}

// joinLocked returns the record that refreshes this process's membership
// when one is due, claiming it, or nil; qmu held.
func (l *link) joinLocked() *queued {
	now := l.now()
	next := l.nextJoin.Load()
	if now < next || !l.nextJoin.CompareAndSwap(next, now+int64(memberEvery)) {
		return nil
	}
	q := &queued{op: "members", s: membersScript, keys: []string{MembersKey(l.name)},
		args: []any{l.member, MemberFor.Milliseconds()}}
	q.done = func(v any, err error) {
		if n, ok := v.(int64); err == nil && ok && n >= 1 {
			l.members.Store(n)
		}
	}
	return q // not counted against QueueLimit: at most one per memberEvery
}

// membersKnown returns how many processes share the store, as last heard
// from Redis: at least 1 (this one), 1 until Redis has answered.
func (l *link) membersKnown() int {
	return int(max(l.members.Load(), 1))
}
