package damper

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// HedgePolicy configures hedging: when an attempt is slow to start
// answering, Damper sends one more attempt beside it, and the first to
// answer wins. The other is cancelled, its connection closed, and nothing of
// it reaches the caller: a stream races to its first content, and only the
// winner's held-back events are released.
//
// The hedge leaves after a delay from the start of the attempt it hedges:
// Delay when set, else the Quantile of the time recent attempts of the same
// limit group (see [LimitGroup]) took to answer a plain call, or to send a
// stream's first content, over the last Window of them. Until MinSamples
// have been seen there is no hedge. Windows are kept for at most 64 (a
// group's plain calls and its streams are two); one with no sample for 30
// minutes is dropped, and a new one that finds no room takes the place of
// the one least recently sampled.
//
// A hedge is an extra attempt and pays like a retry: it counts toward
// Policy.MaxAttempts and the retry cost ceiling (at its full estimated cost,
// since a cancelled attempt may still be billed for its input), passes the
// retry throttle and takes a retry budget unit, and it must find room in the
// rate limiter at once and a closed breaker: it never waits in line, and an
// attempt that a gate refuses is simply not sent. When the attempt it hedges
// fails while the hedge is in flight, the call waits for the hedge instead
// of retrying on top of it.
//
// The zero value hedges at the 95th percentile of recent attempts; a nil
// *HedgePolicy in a Policy means no hedging.
type HedgePolicy struct {
	// Delay, when set, is a fixed delay before the hedge; at most 24 h.
	Delay time.Duration
	// Quantile is the quantile of recent attempts' time to answer (a plain
	// call) or to first content (a stream) after which a hedge leaves, in
	// (0, 1). Default 0.95. Not used with Delay.
	Quantile float64
	// MinDelay is the least delay a Quantile gives: at least this long is
	// waited before a hedge. Default 0; at most 24 h.
	MinDelay time.Duration
	// Window is the number of recent attempts kept per limit group, plain
	// calls and streams apart, for the Quantile. Default 200; at most
	// 10,000.
	Window int
	// MinSamples is the number of attempts a Quantile needs before it is
	// used: until then no call is hedged. Default 20; at most Window.
	MinSamples int
	// OnlyWhenAsked hedges only the calls whose context asks for it (see
	// [ContextWithHedging]); by default every call is hedged but those
	// whose context declines.
	OnlyWhenAsked bool
}

// Defaults of the HedgePolicy fields.
const (
	DefaultHedgeQuantile   = 0.95
	DefaultHedgeWindow     = 200
	DefaultHedgeMinSamples = 20
)

// hedgingKey marks a context asking for hedging, or declining it.
type hedgingKey struct{}

// ContextWithHedging returns ctx marking the Messages calls made with it as
// hedged (on) or not, when the Damper's Policy has a [HedgePolicy]; it
// overrides HedgePolicy.OnlyWhenAsked. Without a HedgePolicy no call is
// hedged.
func ContextWithHedging(ctx context.Context, on bool) context.Context {
	return context.WithValue(ctx, hedgingKey{}, on)
}

// withDefaults returns a copy of p with every zero field set to its
// default, or an error naming the first field that cannot be used.
func (p HedgePolicy) withDefaults() (*HedgePolicy, error) {
	switch {
	case p.Delay < 0:
		return nil, fieldError("Hedge.Delay", p.Delay, "must be positive (0 means a quantile of recent attempts)")
	case math.IsNaN(p.Quantile) || p.Quantile < 0 || p.Quantile >= 1:
		return nil, fieldError("Hedge.Quantile", p.Quantile, "must be in (0, 1) (0 means the default, 0.95)")
	case p.MinDelay < 0:
		return nil, fieldError("Hedge.MinDelay", p.MinDelay, "must be at least 0")
	case p.Window < 0:
		return nil, fieldError("Hedge.Window", p.Window, "must be at least 1 (0 means the default, 200)")
	case p.MinSamples < 0:
		return nil, fieldError("Hedge.MinSamples", p.MinSamples, "must be at least 1 (0 means the default, 20)")
	case p.Window > maxHedgeWindow: // each window is allocated whole
		return nil, atMost("Hedge.Window", p.Window, maxHedgeWindow)
	}
	if err := atMostDuration("Hedge.Delay", p.Delay); err != nil {
		return nil, err
	}
	if err := atMostDuration("Hedge.MinDelay", p.MinDelay); err != nil {
		return nil, err
	}
	p.Quantile = orDefault(p.Quantile, DefaultHedgeQuantile)
	p.Window = orDefault(p.Window, DefaultHedgeWindow)
	p.MinSamples = orDefault(p.MinSamples, min(DefaultHedgeMinSamples, p.Window))
	if p.MinSamples > p.Window {
		return nil, fieldError("Hedge.MinSamples", p.MinSamples, fmt.Sprintf("must not exceed Window (%d)", p.Window))
	}
	return &p, nil
}

// errHedgeLost ends an attempt whose race another attempt won.
var errHedgeLost = errors.New("damper: another attempt of the call answered first")

// race is one round of a hedged call: the attempt the loop sent and its
// hedge. The first to answer claims the win (a plain answer once read
// whole, a stream at its first content); the other can no longer win and
// hands nothing to the caller.
type race struct {
	won   atomic.Bool
	delay time.Duration // after which the hedge was due
}

func (r *race) claim() bool { return r.won.CompareAndSwap(false, true) }

// raced is an attempt of a race and what it came to.
type raced struct {
	a *attempt
	r attemptResult
}

// race sends attempt a, started, and after delay, if no attempt has
// answered, its hedge, and returns the attempt whose result ends the race:
// the first answer, or a failure that is not retried (every attempt still
// in flight is then cancelled), or the last of the failures. Every failure
// is judged (ended, and told to the passes and observers) as it comes, so
// a failed attempt with the hedge in flight waits for the hedge instead of
// retrying on top of it. When race returns, every attempt it sent has
// ended but the winner, which ends as a plain call's does (it is ended
// here) or with its stream, and no goroutine of it is left.
func (c *call) race(a *attempt, next sendFunc, delay time.Duration) (*attempt, attemptResult, Classification, bool) {
	c.ownBody()
	rc := &race{delay: delay}
	results := make(chan raced, 2)
	var flying []*attempt // sent, and their results not yet in
	run := func(a *attempt) {
		a.race = rc
		flying = append(flying, a)
		go func() { results <- raced{a, c.send(a, next)} }()
	}
	run(a)
	due := make(chan struct{}, 1)
	stop := c.d.clock.AfterFunc(delay, func() { due <- struct{}{} })
	defer stop()
	for {
		select {
		case <-due:
			if len(results) > 0 {
				continue // an answer came with the delay: it goes first, and no hedge leaves
			}
			if h := admitHedge(c); h != nil {
				run(h)
			}
		case x := <-results:
			flying = slices.DeleteFunc(flying, func(f *attempt) bool { return f == x.a })
			c.noteLatency(x.a, x.r)
			if x.r.failure == nil {
				stop()
				c.endRace(rc, flying, results)
				if !c.stream {
					x.a.end(succeeded(x.r.res))
				}
				if x.a.hedge {
					c.mu.Lock()
					c.report.HedgeWon = true
					c.mu.Unlock()
					c.trace.hedgeResult(hedgeWon)
				}
				return x.a, x.r, Classification{}, false
			}
			if x.r.err == errHedgeLost {
				c.lose(rc, x.a, x.r) // the winner's result comes next
				continue
			}
			cls, canceled := c.judge(x.a, x.r)
			if len(flying) > 0 && !canceled && cls.Class == Retryable {
				continue
			}
			stop()
			c.endRace(rc, flying, results)
			return x.a, x.r, cls, canceled
		}
	}
}

// endRace cancels the attempts of race rc still in flight and ends each as
// its result comes: lost, or canceled when the caller's context ended.
func (c *call) endRace(rc *race, flying []*attempt, results chan raced) {
	rc.claim() // none of them can win now
	for _, a := range flying {
		a.cancel(errHedgeLost)
	}
	for range flying {
		x := <-results
		if c.ctx.Err() != nil && x.r.failure != nil {
			c.judge(x.a, x.r)
			continue
		}
		closeBody(x.r.res)
		c.lose(rc, x.a, x.r)
	}
}

// lose ends attempt a, which lost race rc, with its result r. Its time
// so far is a lower bound of its latency, kept for the hedge delay when it
// is at least the delay: without it, the slow attempts that hedges cancel
// would leave the statistics, and the quantile would fall.
func (c *call) lose(rc *race, a *attempt, r attemptResult) {
	if h := c.d.hedge; h != nil && r.firstAt.IsZero() {
		if took := c.d.clock.Now().Sub(a.start); took >= rc.delay {
			h.record(c.latencyKey, took)
		}
	}
	a.end(AttemptReport{Class: NotRetryable, Kind: "hedge_lost", Err: errHedgeLost.Error(), Lost: true})
	c.observe(a, attemptEvent{outcome: AttemptOutcome{First: a.first}, class: NotRetryable, failure: &Failure{Err: errHedgeLost}})
}

// hedgeDelay returns the delay after which the attempt under way is hedged,
// or false when it is not: no HedgePolicy, the call's context declines
// (or does not ask, under OnlyWhenAsked), no attempt left for a hedge, or
// too few samples yet for the quantile.
func (c *call) hedgeDelay() (time.Duration, bool) {
	h := c.d.hedge
	if h == nil || c.report.Attempts-c.routeFrom >= c.d.policy.MaxAttempts {
		return 0, false
	}
	if on, asked := c.ctx.Value(hedgingKey{}).(bool); asked && !on || !asked && h.p.OnlyWhenAsked {
		return 0, false
	}
	return h.delay(c.latencyKey)
}

// noteLatency keeps, for the hedge delay, the time attempt a took to
// answer (plain) or to its first content (stream), if it got so far.
func (c *call) noteLatency(a *attempt, r attemptResult) {
	if h := c.d.hedge; h != nil && !r.firstAt.IsZero() {
		h.record(c.latencyKey, r.firstAt.Sub(a.start))
	}
}

// ownBody gives a raced call a copy of its body of its own when GetBody
// hands out one reader again and again (a caller's *bytes.Reader, which
// the SDK seeks back for each attempt): two attempts in flight at once
// cannot share it. The SDK's own bodies are independent readers of one
// buffer, and need no copy.
func (c *call) ownBody() {
	if c.bodyCopy != nil || c.req.GetBody == nil {
		return
	}
	first, err := c.req.GetBody()
	if err != nil {
		return // the attempt that asks again fails with it
	}
	second, err := c.req.GetBody()
	if err != nil {
		return
	}
	if v, w := reflect.ValueOf(first), reflect.ValueOf(second); v.Type() != w.Type() || !v.Comparable() || !v.Equal(w) {
		_, _ = first.Close(), second.Close()
		return
	}
	defer func() { _ = first.Close() }()
	if body, err := readInto(nil, first, c.req.ContentLength); err == nil {
		c.bodyCopy = body
	}
}

// body returns the body of an attempt's request, areq: the call's own copy,
// if it has one, else a fresh one from GetBody.
func (c *call) body(areq *http.Request) (io.ReadCloser, error) {
	if c.bodyCopy != nil {
		return io.NopCloser(bytes.NewReader(c.bodyCopy)), nil
	}
	return areq.GetBody()
}

// latencyKey names a window of latency samples: a limit group's plain calls
// or streams.
type latencyKey struct {
	group  string
	stream bool
}

// hedger keeps a Damper's hedge delays: per latencyKey, the last Window
// latencies, and their quantile, sorted again only once a sixteenth of
// the window is new. A caller names any model, and so any limit group: at
// most maxLatencyWindows windows are kept, a window with no sample for
// latencyWindowIdle on the Damper's clock is dropped, and a new group
// finding no room takes the place of the one least recently sampled.
type hedger struct {
	p     HedgePolicy
	clock Clock

	mu        sync.Mutex
	windows   map[latencyKey]*latencyWindow // requires mu
	nextSweep time.Time                     // requires mu
}

// Bounds of the hedger's windows.
const (
	maxLatencyWindows = 64
	latencyWindowIdle = 30 * time.Minute
)

type latencyWindow struct {
	ring   []time.Duration
	next   int // where the next sample goes
	n      int // samples held, at most len(ring)
	fresh  int // samples since q was computed
	q      time.Duration
	sorted []time.Duration // scratch
	used   time.Time       // when the last sample came
}

func newHedger(p HedgePolicy, clock Clock) *hedger {
	return &hedger{p: p, clock: clock, windows: make(map[latencyKey]*latencyWindow)}
}

// bounded returns k with its group cut to maxLabelBytes, longer than any
// group of a model ID: groups alike so far share a window.
func (k latencyKey) bounded() latencyKey {
	if len(k.group) > maxLabelBytes {
		k.group = k.group[:maxLabelBytes]
	}
	return k
}

// record keeps one latency sample of k.
func (h *hedger) record(k latencyKey, d time.Duration) {
	if h.p.Delay > 0 {
		return // a fixed delay needs no statistics
	}
	k = k.bounded()
	now := h.clock.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if !now.Before(h.nextSweep) {
		h.sweep(now)
	}
	w := h.windows[k]
	if w == nil {
		if len(h.windows) >= maxLatencyWindows {
			h.evict()
		}
		w = &latencyWindow{ring: make([]time.Duration, h.p.Window)}
		k.group = strings.Clone(k.group) // not the caller's string, which may be part of more
		h.windows[k] = w
	}
	w.used = now
	w.ring[w.next] = d
	w.next = (w.next + 1) % len(w.ring)
	w.n = min(w.n+1, len(w.ring))
	w.fresh++
}

// sweep drops the windows idle since latencyWindowIdle before now.
// Requires mu.
func (h *hedger) sweep(now time.Time) {
	for k, w := range h.windows {
		if now.Sub(w.used) >= latencyWindowIdle {
			delete(h.windows, k)
		}
	}
	h.nextSweep = now.Add(latencyWindowIdle / 4)
}

// evict drops the window least recently sampled. Requires mu.
func (h *hedger) evict() {
	var oldest latencyKey
	var at time.Time
	first := true
	for k, w := range h.windows {
		if first || w.used.Before(at) {
			oldest, at, first = k, w.used, false
		}
	}
	delete(h.windows, oldest)
}

// delay returns the hedge delay of k, or false while k has fewer samples
// than MinSamples.
func (h *hedger) delay(k latencyKey) (time.Duration, bool) {
	if h.p.Delay > 0 {
		return h.p.Delay, true
	}
	k = k.bounded()
	h.mu.Lock()
	defer h.mu.Unlock()
	w := h.windows[k]
	if w == nil || w.n < h.p.MinSamples {
		return 0, false
	}
	if w.fresh > 0 && (w.q == 0 || w.fresh*16 >= w.n) {
		w.sorted = append(w.sorted[:0], w.ring[:w.n]...)
		slices.Sort(w.sorted)
		rank := int(math.Ceil(h.p.Quantile*float64(w.n))) - 1
		w.q = w.sorted[max(rank, 0)]
		w.fresh = 0
	}
	return max(w.q, h.p.MinDelay), true
}
