package ratelimit

import (
	"context"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/core"
	"github.com/damper-ai/damper-go/internal/ratelimit"
)

// The rate limiter's pass: one admitted attempt's reservation, settled by
// the answer's usage, and what the answer's headers teach the limiter.

// limitPass is one admitted attempt's reservation.
type limitPass struct {
	group  *limitGroup
	r      fleet.RateReservation
	ticket *fleet.RateTicket // a batch attempt's place in the batch line
	share  *shareHold        // what it took from its tenant's share, if any
	cost   fleet.RateAmounts // what it asked for
	sent   time.Time         // when the line let it go
	ctx    context.Context   // the call's, without its cancellation when the store outlives the call
	done   atomic.Bool       // settled: the group is no longer held
}

// release lets the group go, once, when the reservation is settled.
func (p *limitPass) release(now time.Time) {
	if p.done.CompareAndSwap(false, true) {
		p.group.release(now)
	}
}

// Settle corrects the buckets from the response's headers, pauses them
// after a rate-limit 429, and settles the reservation: by the answer's
// usage; for a failure, with the output it reserved given back (the
// request and its input may have counted); for an attempt never sent,
// entirely. A stream still open settles at its end (SettleEnd).
func (p *limitPass) Settle(now time.Time, e core.Event) {
	if !e.Outcome.Success && e.Failure == nil {
		p.settleBy(now, fleet.RateAmounts{}, [3]bool{true, true, true})
		p.storeError("leave", p.group.leave(p.ctx, p.ticket, now))
		p.release(now)
		return
	}
	if o, ok := rateHeaders(e.Header); ok {
		p.storeError("observe", p.group.g.Observe(p.ctx, now, p.r, o))
		p.group.learn(o)
	}
	if e.Outcome.Success {
		p.group.took.add(now.Sub(p.sent))
	}
	switch {
	case e.Failure != nil:
		if e.Class == core.Retryable && e.Outcome.Signal == fleet.CallerTraffic {
			p.pause(now, e.Header)
		}
		p.settleBy(now, fleet.RateAmounts{}, [3]bool{ratelimit.OutputTokens: true})
	case e.StreamOpen:
		return // settled at the stream's end
	default:
		p.settleUsage(now, e.Usage)
	}
	p.release(now)
}

// SettleEnd settles a stream's reservation at the stream's end.
func (p *limitPass) SettleEnd(now time.Time, u core.Usage) {
	p.settleUsage(now, u)
	p.release(now)
}

// settleUsage settles the reservation by u; without usage the reservation
// stands as taken.
func (p *limitPass) settleUsage(now time.Time, u core.Usage) {
	if !u.Known {
		p.settleBy(now, fleet.RateAmounts{}, [3]bool{})
		return
	}
	in := u.InputTokens + u.CacheCreationInputTokens
	if !p.group.cacheAware {
		in += u.CacheReadInputTokens
	}
	p.settleBy(now, fleet.RateAmounts{1, float64(in), float64(u.OutputTokens)}, [3]bool{true, true, true})
}

func (p *limitPass) settleBy(now time.Time, used fleet.RateAmounts, known [3]bool) {
	p.storeError("settle", p.group.g.Settle(p.ctx, now, p.r, used, known))
	if err := p.share.settle(p.ctx, now, used, known); err != nil {
		p.group.env.LogStoreError(p.ctx, partShares, "settle", err)
	}
}

func (p *limitPass) storeError(op string, err error) {
	if err != nil {
		p.group.env.LogStoreError(p.ctx, partLimiter, op, err)
	}
}

// pause empties the buckets a rate-limit 429 names (those whose remaining
// count is below what the attempt asked, or all three when the response
// names none) until its retry-after, or else each bucket's reset time.
func (p *limitPass) pause(now time.Time, h http.Header) {
	delay, hasDelay := core.ParseRetryAfter(h, now)
	var named [ratelimit.NumKinds]bool
	any := false
	for k, keys := range rateHeaderKeys {
		if v, ok := headerFloat(h, keys.remaining); ok && v < max(p.cost[k], 1) {
			named[k], any = true, true
		}
	}
	for k := range named {
		if any && !named[k] {
			continue
		}
		until := now
		if hasDelay {
			until = now.Add(delay)
		} else if reset, err := time.Parse(time.RFC3339, h.Get(rateHeaderKeys[k].reset)); err == nil {
			until = reset
		}
		var one [ratelimit.NumKinds]bool
		one[k] = true
		p.storeError("pause", p.group.g.Pause(p.ctx, now, one, until))
	}
}

// rateHeaderKeys are the canonical names of each bucket's headers.
var rateHeaderKeys = [ratelimit.NumKinds]struct{ limit, remaining, reset string }{
	{"Anthropic-Ratelimit-Requests-Limit", "Anthropic-Ratelimit-Requests-Remaining", "Anthropic-Ratelimit-Requests-Reset"},
	{"Anthropic-Ratelimit-Input-Tokens-Limit", "Anthropic-Ratelimit-Input-Tokens-Remaining", "Anthropic-Ratelimit-Input-Tokens-Reset"},
	{"Anthropic-Ratelimit-Output-Tokens-Limit", "Anthropic-Ratelimit-Output-Tokens-Remaining", "Anthropic-Ratelimit-Output-Tokens-Reset"},
}

// rateHeaders reads the anthropic-ratelimit-* headers of a response: a
// bucket counts when both its limit and its remaining count parse.
func rateHeaders(h http.Header) (o fleet.RateObservation, ok bool) {
	if h == nil {
		return o, false
	}
	for k, keys := range rateHeaderKeys {
		limit, okL := headerFloat(h, keys.limit)
		rem, okR := headerFloat(h, keys.remaining)
		if okL && okR && limit > 0 {
			o.Has[k], o.Limit[k], o.Remaining[k] = true, limit, max(rem, 0)
			ok = true
		}
	}
	return o, ok
}

func headerFloat(h http.Header, key string) (float64, bool) {
	vs := h[key]
	if len(vs) == 0 {
		return 0, false
	}
	v := strings.TrimSpace(vs[0])
	// The API sends whole numbers: read them without ParseFloat.
	if n := len(v); n > 0 && n <= 15 {
		var x int64
		for i := 0; i < n; i++ {
			c := v[i]
			if c < '0' || c > '9' {
				x = -1
				break
			}
			x = x*10 + int64(c-'0')
		}
		if x >= 0 {
			return float64(x), true
		}
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, false
	}
	return f, true
}
