package ratelimit

import (
	"time"
)

// What a group learns from the API's answers: the limits and remaining
// amounts a response's headers report (Observe), and the pauses a rate
// limit refusal asks for (Pause, PausedUntil).

// Observation is what one response's headers say of the buckets.
type Observation struct {
	Has       [NumKinds]bool // the response carried the bucket's headers
	Limit     Amounts
	Remaining Amounts
}

// Observe corrects the buckets from a response to the request of r, which
// must have taken, before r is settled.
//
// The response counts what remained when the API admitted r: r's request
// and input tokens as the API counts them, its output as the max_tokens
// reserved (which settling r corrects), and any number of the requests
// taken after r, or taken before it and not answered yet, depending on
// when each reached the API. So what remains now is at most the count,
// and at least the count less all of those. The group's own accounting is
// exact for its own traffic, so a count only lowers a level, to the count
// itself: other traffic on the same limits took what the group does not
// know of. It never raises one, since a count that is higher than the
// level may be older news than the level.
//
// A bucket whose limit is not configured takes the response's limit. On
// learning it, its level is the least the count allows; when a learned
// limit changes, its level moves with it, unless it is paused. A level set from the count holds
// r's request and input tokens as the API counted them, so settling r
// leaves those alone.
func (g *Group) Observe(now time.Time, r *Reservation, o Observation) {
	g.mu.Lock()
	defer g.mu.Unlock()
	// older: what requests taken before r and not answered took; unsent:
	// what requests not sent yet took, which no count holds.
	var older, unsent Amounts
	for _, open := range g.open {
		for k := range older {
			if open.seq < r.seq {
				older[k] += open.cost[k]
			}
			if open.due.After(now) {
				unsent[k] += open.cost[k]
			}
		}
	}
	g.answered(r)
	for k := range g.b {
		if !o.Has[k] {
			continue
		}
		b := &g.b[k]
		b.advance(now)
		level := b.level
		learning := false
		if limit := o.Limit[k]; !b.configured && limit > 0 && limit != b.limit {
			learning = b.limit == 0
			switch {
			case learning:
				level = o.Remaining[k] - g.mayLack(k, r, limit)
			case !b.pausedUntil.After(now):
				level += limit - b.limit // a pause holds its level
			}
			b.limit = limit
		}
		if b.limit == 0 {
			continue
		}
		if g.followOthers && !learning && !b.pausedUntil.After(now) {
			// The group's own traffic puts the count between the level
			// with what it has not sent added back, and the level with
			// everything the count may lack added back: a count below
			// that shows other traffic, one above it less than was
			// allowed for.
			gap := 0.0
			lo, hi := level+unsent[k], level+(b.taken-r.mark[k])+older[k]
			if o.Remaining[k] > hi {
				gap = hi - o.Remaining[k]
			} else if o.Remaining[k] < lo {
				gap = lo - o.Remaining[k]
			}
			b.others = min(max(b.others+gap/othersWindow, 0), b.limit/60)
		}
		level = min(level, o.Remaining[k], b.limit)
		if level != b.level && Kind(k) != OutputTokens {
			r.seen[k] = true
		}
		b.level = level
	}
}

// mayLack is what a count of bucket k of limit in the response to r may
// lack: what was taken after r, and what requests taken before it and not
// answered took, each request counted for no more than the limit (one
// taken before the limit was known may hold more: its settling gives the
// rest back). It requires g.mu, and r off the open list.
func (g *Group) mayLack(k int, r *Reservation, limit float64) float64 {
	lack := g.b[k].taken - r.mark[k]
	for _, o := range g.open {
		held := min(o.cost[k], limit)
		if o.seq < r.seq {
			lack += held
		} else {
			lack -= o.cost[k] - held
		}
	}
	return lack
}

// Pause empties the buckets named and admits nothing from them before
// until, the API's delay: every request of the group waits for it. They
// refill meanwhile, so that at until they hold what the API would.
func (g *Group) Pause(now time.Time, named [NumKinds]bool, until time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for k := range g.b {
		if !named[k] {
			continue
		}
		b := &g.b[k]
		b.advance(now)
		b.level = min(b.level, 0)
		if until.After(b.pausedUntil) {
			b.pausedUntil = until
		}
	}
}

// PausedUntil is when the group's last pause ends, or the zero time when
// none is under way at now.
func (g *Group) PausedUntil(now time.Time) time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	var until time.Time
	for _, b := range g.b {
		if b.pausedUntil.After(now) && b.pausedUntil.After(until) {
			until = b.pausedUntil
		}
	}
	return until
}
