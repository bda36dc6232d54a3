package concurrency

import (
	"context"
	"slices"

	"github.com/damper-ai/damper-go/internal/core"
)

// The concurrency limit's line: attempts waiting for a slot, a line per
// priority holding a line per tenant, served by weight.

// slotWaiter is an attempt waiting in line. granted is set, under the
// limit's lock, when a slot is taken for it; cancel then ends its wait.
type slotWaiter struct {
	granted bool
	cancel  context.CancelFunc
	tenant  *core.Tenant // the call's; nil: none
	seq     uint64       // its place in the order of arrival
}

// slotLine is the line of one priority: a line per tenant with attempts
// waiting, each first come, first served. It holds at most one line per
// tenant of the Proxy, and one for calls without a tenant.
type slotLine struct {
	n       int // waiters, in all the tenants' lines
	tenants []*tenantLine
}

type tenantLine struct {
	t       *core.Tenant
	waiters []*slotWaiter // oldest first
}

// push puts w at the end of its tenant's line.
func (q *slotLine) push(w *slotWaiter) {
	q.n++
	for _, tl := range q.tenants {
		if tl.t == w.tenant {
			tl.waiters = append(tl.waiters, w)
			return
		}
	}
	q.tenants = append(q.tenants, &tenantLine{t: w.tenant, waiters: []*slotWaiter{w}})
}

// remove takes w out of the line, if it is in it.
func (q *slotLine) remove(w *slotWaiter) {
	for i, tl := range q.tenants {
		if tl.t != w.tenant {
			continue
		}
		if j := slices.Index(tl.waiters, w); j >= 0 {
			tl.waiters = slices.Delete(tl.waiters, j, j+1)
			q.n--
		}
		if len(tl.waiters) == 0 {
			q.tenants = slices.Delete(q.tenants, i, i+1)
		}
		return
	}
}

// pop takes out the next waiter: the oldest of the tenant that holds the
// fewest slots per unit of weight (held(t) / weight(t)), the one whose
// oldest came first among equals. The line must not be empty.
func (q *slotLine) pop(held func(*core.Tenant) int) *slotWaiter {
	best := 0
	for i := 1; i < len(q.tenants); i++ {
		a, b := q.tenants[i], q.tenants[best]
		// held(a)/w(a) < held(b)/w(b), without division.
		x, y := held(a.t)*b.t.ShareWeight(), held(b.t)*a.t.ShareWeight()
		if x < y || x == y && a.waiters[0].seq < b.waiters[0].seq {
			best = i
		}
	}
	tl := q.tenants[best]
	w := tl.waiters[0]
	tl.waiters[0] = nil
	if tl.waiters = tl.waiters[1:]; len(tl.waiters) == 0 {
		q.tenants = slices.Delete(q.tenants, best, best+1)
	}
	q.n--
	return w
}
