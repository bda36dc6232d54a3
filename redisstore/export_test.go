package redisstore

import (
	"crypto/sha1"
	"encoding/hex"
)

// ScriptOps names the operations of the script that a command's args run
// (EVALSHA or EVAL, with one key), for the tests that count round trips:
// part:operation, with record set for a record (queued) and not for a
// decision. Nil for a command that runs no script of the store's.
func ScriptOps(args []any) (ops []string, record bool) {
	if len(args) < 5 {
		return nil, false
	}
	sha, _ := args[1].(string)
	if name, _ := args[0].(string); name == "eval" {
		sum := sha1.Sum([]byte(sha))
		sha = hex.EncodeToString(sum[:])
	}
	switch sha {
	case observeScript.Hash():
		return []string{"budget:observe"}, true
	case acquireScript.Hash():
		return []string{"budget:acquire"}, false
	case availableScript.Hash():
		return []string{"budget:available"}, false
	case leaseScript.Hash():
		return []string{"budget:lease"}, false
	case chargeScript.Hash():
		return []string{"budget:charge"}, true
	case returnScript.Hash():
		return []string{"budget:return"}, true
	case throttleAddScript.Hash():
		return []string{"throttle:add"}, true
	case throttleReadScript.Hash():
		return []string{"throttle:tokens"}, false
	case breakerScript.Hash():
		op, _ := args[4].(string)
		return []string{"breaker:" + op}, op == "d"
	case bkReserveScript.Hash(), bkReserveLeaseScript.Hash():
		return []string{"ratelimit:reserve"}, false
	case bkAdmitsScript.Hash():
		return []string{"ratelimit:admits"}, false
	case bkObserveScript.Hash():
		return []string{"ratelimit:observe"}, true
	case bkSettleScript.Hash():
		return []string{"ratelimit:settle"}, true
	case bkObserveSettleScript.Hash():
		return []string{"ratelimit:observe", "ratelimit:settle"}, true
	case bkLeaveScript.Hash():
		return []string{"ratelimit:leave"}, true
	case bkPauseScript.Hash():
		return []string{"ratelimit:pause"}, true
	case bkPausedUntilScript.Hash():
		return []string{"ratelimit:paused_until"}, false
	case bkStateScript.Hash():
		return []string{"ratelimit:state"}, false
	case shTakeScript.Hash():
		return []string{"share:take"}, false
	case membersScript.Hash():
		return []string{"store:members"}, true
	case shSettleScript.Hash():
		return []string{"share:settle"}, true
	}
	return []string{"unknown"}, false
}

// JoinNow lets s refresh its membership with its next operation, without
// waiting for the refresh's interval.
func JoinNow(s *Store) { s.link.nextJoin.Store(0) }

// BudgetMembers returns the members b's store last heard of: the share b
// decides on while Redis fails.
func BudgetMembers(b *Budget) int { return b.link.membersKnown() }
