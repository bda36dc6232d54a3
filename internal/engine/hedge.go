package engine

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"
)

// Hedging: its policy, its delay (hedger) and a hedge's admission; the
// race of a hedged round is in race.go.

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
	// Zero: a quantile of recent attempts.
	Delay time.Duration `key:"delay" min:">0" max:"24h" zero:"a quantile of recent attempts"`
	// Quantile is the quantile of recent attempts' time to answer (a plain
	// call) or to first content (a stream) after which a hedge leaves, in
	// (0, 1). Default 0.95. Not used with Delay.
	Quantile float64 `key:"quantile" default:"0.95" in:"(0,1)"`
	// MinDelay is the least delay a Quantile gives: at least this long is
	// waited before a hedge. Default 0; at most 24 h.
	MinDelay time.Duration `key:"min_delay" min:"0" max:"24h"`
	// Window is the number of recent attempts kept per limit group, plain
	// calls and streams apart, for the Quantile. Default 200; at least 1,
	// at most 10,000 (each window is allocated whole).
	Window int `key:"window" default:"200" min:"1" max:"10000"`
	// MinSamples is the number of attempts a Quantile needs before it is
	// used: until then no call is hedged. Default 20, or Window when it
	// is smaller; at least 1, at most Window.
	MinSamples int `key:"min_samples" default:"20" min:"1" max:"10000"`
	// OnlyWhenAsked hedges only the calls whose context asks for it (see
	// [ContextWithHedging]); by default every call is hedged but those
	// whose context declines.
	OnlyWhenAsked bool `key:"only_when_asked"`
}

// hedgingKey marks a context asking for hedging, or declining it.
type hedgingKey struct{}

// ContextWithHedging returns ctx marking the Messages calls made with it as
// hedged (on) or not, when the Damper's Policy has a [HedgePolicy]; it
// overrides HedgePolicy.OnlyWhenAsked. Without a HedgePolicy no call is
// hedged.
func ContextWithHedging(ctx context.Context, on bool) context.Context {
	return context.WithValue(ctx, hedgingKey{}, on)
}

// check is what the tags of HedgePolicy cannot say: MinSamples is at
// most Window, and so is its default.
func (p *HedgePolicy) check(given HedgePolicy) error {
	if given.MinSamples == 0 {
		p.MinSamples = min(p.MinSamples, p.Window)
	}
	if p.MinSamples > p.Window {
		return fieldError("MinSamples", p.MinSamples, fmt.Sprintf("must not exceed Window (%d)", p.Window))
	}
	return nil
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

// due returns the delay after which the attempt under way of a call made
// in ctx is hedged, or false when it is not: no HedgePolicy (h nil), no
// attempt left for a hedge (room false), the call's context declines (or
// does not ask, under OnlyWhenAsked), or too few samples of k yet for the
// quantile.
func (h *hedger) due(ctx context.Context, k latencyKey, room bool) (time.Duration, bool) {
	if h == nil || !room {
		return 0, false
	}
	if on, asked := ctx.Value(hedgingKey{}).(bool); asked && !on || !asked && h.p.OnlyWhenAsked {
		return 0, false
	}
	return h.delay(k)
}

// noteLatency keeps, for the hedge delay of k, the time an attempt
// started at start took to answer (plain) or to its first content
// (stream), firstAt, if it got so far; h may be nil.
func (h *hedger) noteLatency(k latencyKey, start, firstAt time.Time) {
	if h != nil && !firstAt.IsZero() {
		h.record(k, firstAt.Sub(start))
	}
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
