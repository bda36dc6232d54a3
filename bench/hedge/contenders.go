package hedge

import (
	"fmt"
	"net/http"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/failsafe-go/failsafe-go/failsafehttp"
	"github.com/failsafe-go/failsafe-go/hedgepolicy"

	"github.com/damper-ai/damper-go"
)

// FixedDelay is the fixed hedge delay of the contenders that have one: the
// top of the model's fast range, just above its p95. Choosing it takes
// knowing the latency ahead of time, which a quantile does not.
var FixedDelay = DefaultModel.FastMax

// failsafe-go's adaptive hedge is given Damper's defaults: the 95th
// percentile of about the last 200 round trips, once 20 have been seen.
var (
	adaptiveQuantile = defaults.Hedge.Quantile
	adaptiveWindow   = defaults.Hedge.Window
	adaptiveMin      = defaults.Hedge.MinSamples
)

// Contender is one way of calling the Messages API over the provider.
type Contender struct {
	Name string
	// Config says, for the docs, what runs and how it is configured.
	Config string
	// Hedging is true for a contender that sends hedges.
	Hedging bool
	// newClient builds the contender's client over rt.
	newClient func(rt http.RoundTripper) (anthropic.Client, error)
}

// Contenders returns the contenders, in table order.
func Contenders() []Contender {
	return []Contender{SDK(), Damper(), DamperHedge(), DamperHedgeFixed(), FailsafeFixed(), FailsafeQuantile()}
}

func newSDKClient(rt http.RoundTripper, opts ...option.RequestOption) anthropic.Client {
	base := []option.RequestOption{
		option.WithBaseURL("http://provider.sim/"),
		option.WithAPIKey("sim-key"),
		option.WithHTTPClient(&http.Client{Transport: rt}),
	}
	return anthropic.NewClient(append(base, opts...)...)
}

// SDK is the bare SDK client: one attempt per request, there being no
// failure to retry.
func SDK() Contender {
	return Contender{
		Name:   "sdk",
		Config: "SDK v2 client, `WithMaxRetries(0)`",
		newClient: func(rt http.RoundTripper) (anthropic.Client, error) {
			return newSDKClient(rt, option.WithMaxRetries(0)), nil
		},
	}
}

// Damper is Damper's default policy, which does not hedge.
func Damper() Contender {
	return damperContender("damper", "SDK v2 client + `damper.New(damper.Policy{})`", nil)
}

// DamperHedge is Damper's default policy with a HedgePolicy of its
// defaults: a hedge after the 95th percentile of the last 200 attempts'
// time to first content, once 20 have been seen.
func DamperHedge() Contender {
	return damperContender("damper+hedge",
		fmt.Sprintf("SDK v2 client + `damper.New(damper.Policy{Hedge: &damper.HedgePolicy{}})`: a hedge after the p%g of the last %d attempts' time to first content, once %d have been seen",
			100*defaults.Hedge.Quantile, defaults.Hedge.Window, defaults.Hedge.MinSamples),
		&damper.HedgePolicy{})
}

// DamperHedgeFixed is Damper with a hedge after FixedDelay.
func DamperHedgeFixed() Contender {
	return damperContender("damper+hedge "+fmtDuration(FixedDelay),
		fmt.Sprintf("SDK v2 client + `damper.New(damper.Policy{Hedge: &damper.HedgePolicy{Delay: %s}})`", goDuration(FixedDelay)),
		&damper.HedgePolicy{Delay: FixedDelay})
}

func damperContender(name, config string, h *damper.HedgePolicy) Contender {
	return Contender{
		Name:    name,
		Config:  config,
		Hedging: h != nil,
		newClient: func(rt http.RoundTripper) (anthropic.Client, error) {
			p := damper.Policy{}
			if h != nil {
				hp := *h // each run its own
				p.Hedge = &hp
			}
			d, err := damper.New(p)
			if err != nil {
				return anthropic.Client{}, err
			}
			return newSDKClient(rt, d.Option()), nil
		},
	}
}

// FailsafeFixed is failsafe-go's hedge policy with FixedDelay, as a
// RoundTripper under the SDK: its strongest setting on this provider, one
// that only a caller who knows the latency can choose.
func FailsafeFixed() Contender {
	return Contender{
		Name:    "failsafe-go hedge " + fmtDuration(FixedDelay),
		Config:  fmt.Sprintf("failsafe-go v0.9.8 `failsafehttp.NewRoundTripper` with `hedgepolicy.NewWithDelay[*http.Response](%s)` (one hedge, the loser cancelled) under the SDK v2 client (`WithMaxRetries(0)`)", goDuration(FixedDelay)),
		Hedging: true,
		newClient: func(rt http.RoundTripper) (anthropic.Client, error) {
			hp := hedgepolicy.NewWithDelay[*http.Response](FixedDelay)
			return newSDKClient(failsafehttp.NewRoundTripper(rt, hp), option.WithMaxRetries(0)), nil
		},
	}
}

// FailsafeQuantile is failsafe-go's adaptive hedge policy, given Damper's
// defaults: the 95th percentile of about the last 200 round trips, once 20
// have been seen.
func FailsafeQuantile() Contender {
	return Contender{
		Name: fmt.Sprintf("failsafe-go hedge p%g", 100*adaptiveQuantile),
		Config: fmt.Sprintf("failsafe-go v0.9.8 `failsafehttp.NewRoundTripper` with `hedgepolicy.NewWithDelayQuantile[*http.Response](%g, %d, %d)` (a moving estimate of the p%g of round trips, ages of %d, after %d) under the SDK v2 client (`WithMaxRetries(0)`)",
			adaptiveQuantile, adaptiveWindow, adaptiveMin, 100*adaptiveQuantile, adaptiveWindow, adaptiveMin),
		Hedging: true,
		newClient: func(rt http.RoundTripper) (anthropic.Client, error) {
			hp := hedgepolicy.NewWithDelayQuantile[*http.Response](adaptiveQuantile, uint(adaptiveWindow), uint(adaptiveMin))
			return newSDKClient(failsafehttp.NewRoundTripper(rt, hp), option.WithMaxRetries(0)), nil
		},
	}
}

// goDuration writes d as a Go expression, in milliseconds.
func goDuration(d time.Duration) string {
	return fmt.Sprintf("%d * time.Millisecond", d.Milliseconds())
}

// fmtDuration writes d in seconds, as the tables do.
func fmtDuration(d time.Duration) string {
	return fmt.Sprintf("%.2f s", d.Seconds())
}
