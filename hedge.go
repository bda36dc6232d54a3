package damper

import (
	"context"
	"math"
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
// have been seen there is no hedge.
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
	// Delay, when set, is a fixed delay before the hedge.
	Delay time.Duration
	// Quantile is the quantile of recent attempts' time to answer (a plain
	// call) or to first content (a stream) after which a hedge leaves, in
	// (0, 1). Default 0.95. Not used with Delay.
	Quantile float64
	// MinDelay is the least delay a Quantile gives: at least this long is
	// waited before a hedge. Default 0.
	MinDelay time.Duration
	// Window is the number of recent attempts kept per limit group, plain
	// calls and streams apart, for the Quantile. Default 200.
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
	}
	p.Quantile = orDefault(p.Quantile, DefaultHedgeQuantile)
	p.Window = orDefault(p.Window, DefaultHedgeWindow)
	p.MinSamples = orDefault(p.MinSamples, min(DefaultHedgeMinSamples, p.Window))
	if p.MinSamples > p.Window {
		return nil, fieldError("Hedge.MinSamples", p.MinSamples, "must not exceed Window")
	}
	return &p, nil
}
