package hedge

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"testing/synctest"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go"
)

// Scenario is a run's provider and arrivals.
type Scenario struct {
	Model Model
	// Requests arrive open-loop, one every Interval.
	Requests int
	Interval time.Duration
	// AfterHeaders sends the response headers and message_start after
	// the model's Headers time and the first content after its Latency;
	// otherwise all of them come after its Latency.
	AfterHeaders bool
}

// DefaultScenario is 20 requests a second for 100 seconds.
var DefaultScenario = Scenario{
	Model:    DefaultModel,
	Requests: 2000,
	Interval: 50 * time.Millisecond,
}

// requestTimeout bounds each request, far beyond the slowest attempt, so
// that a call that never ends shows as an error and not as a hang.
const requestTimeout = time.Minute

var params = anthropic.MessageNewParams{
	Model:     "claude-sonnet-4-5",
	MaxTokens: 64,
	Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hello"))},
}

// Result is what one contender did in a scenario.
type Result struct {
	Contender Contender
	Requests  int
	// FirstContent holds each successful request's time from its call to
	// the first content_block_delta in the caller's hands, sorted.
	FirstContent []time.Duration
	// Errors counts the requests that failed; FirstError is the first.
	Errors     int
	FirstError string
	// Attempts is the number of attempts the provider received.
	Attempts int
	// Canceled is the number of attempts ended by their context before
	// their first content.
	Canceled int
	// OpenBodies is the number of response bodies left unclosed.
	OpenBodies int
	// ServedByHedge is the number of requests whose stream, read whole,
	// was a hedge's (an attempt after the first), as the provider saw it.
	ServedByHedge int
	// Reported is true when the calls had a Damper report; Hedges and
	// HedgesWon sum its Hedges and HedgeWon.
	Reported  bool
	Hedges    int
	HedgesWon int
}

// Run runs c through s. It must be called inside a synctest bubble, whose
// virtual clock the provider, the SDK, Damper and failsafe-go all read.
func Run(c Contender, s Scenario) (Result, error) {
	p := newProvider(s.Model, s.Requests, s.AfterHeaders)
	client, err := c.newClient(p)
	if err != nil {
		return Result{}, err
	}
	type outcome struct {
		first time.Duration
		err   error
		rep   damper.Report
	}
	out := make([]outcome, s.Requests)
	var wg sync.WaitGroup
	for i := range s.Requests {
		wg.Go(func() {
			o := &out[i]
			o.first, o.err = stream(client, i, &o.rep)
		})
		time.Sleep(s.Interval)
	}
	wg.Wait()
	// A cancelled attempt may still be on its way out.
	synctest.Wait()

	r := Result{Contender: c, Requests: s.Requests, Canceled: int(p.canceled.Load()), OpenBodies: int(p.open.Load())}
	for i := range p.attempts {
		r.Attempts += int(p.attempts[i].Load())
		if p.servedBy[i].Load() > 1 {
			r.ServedByHedge++
		}
	}
	for _, o := range out {
		if o.err != nil {
			if r.Errors == 0 {
				r.FirstError = o.err.Error()
			}
			r.Errors++
			continue
		}
		r.FirstContent = append(r.FirstContent, o.first)
		if o.rep.Attempts > 0 {
			r.Reported = true
		}
		r.Hedges += o.rep.Hedges
		if o.rep.HedgeWon {
			r.HedgesWon++
		}
	}
	slices.Sort(r.FirstContent)
	return r, nil
}

// stream makes request i and reads its stream to the end; it returns the
// time to its first content.
func stream(client anthropic.Client, i int, rep *damper.Report) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	start := time.Now()
	st := client.Messages.NewStreaming(ctx, params,
		option.WithHeader(requestHeader, strconv.Itoa(i)), damper.ReportInto(rep))
	var first time.Duration
	for st.Next() {
		if first == 0 && st.Current().Type == "content_block_delta" {
			first = time.Since(start)
		}
	}
	err := st.Err()
	if cerr := st.Close(); err == nil {
		err = cerr
	}
	if err == nil && first == 0 {
		err = fmt.Errorf("request %d: stream ended without content", i)
	}
	return first, err
}

// Quantile returns the q-quantile of the time to first content (nearest
// rank), or 0 when no request succeeded.
func (r Result) Quantile(q float64) time.Duration {
	n := len(r.FirstContent)
	if n == 0 {
		return 0
	}
	k := int(math.Ceil(q*float64(n))) - 1
	return r.FirstContent[min(max(k, 0), n-1)]
}

// Max returns the longest time to first content.
func (r Result) Max() time.Duration { return r.Quantile(1) }

// AttemptsPerRequest is the provider's attempts per logical request.
func (r Result) AttemptsPerRequest() float64 {
	return float64(r.Attempts) / float64(r.Requests)
}

// ExtraAttempts is the share of attempts beyond one per request, in %.
func (r Result) ExtraAttempts() float64 {
	return 100 * (r.AttemptsPerRequest() - 1)
}

// String is the result on one line, for the test's log.
func (r Result) String() string {
	s := fmt.Sprintf("%-24s p50 %s  p90 %s  p99 %s  max %s  attempts/request %.3f (+%.1f %%)",
		r.Contender.Name, fmtDuration(r.Quantile(0.5)), fmtDuration(r.Quantile(0.9)),
		fmtDuration(r.Quantile(0.99)), fmtDuration(r.Max()), r.AttemptsPerRequest(), r.ExtraAttempts())
	if r.Reported {
		s += fmt.Sprintf("  hedges %d, won %d", r.Hedges, r.HedgesWon)
	}
	if r.ServedByHedge > 0 {
		s += fmt.Sprintf("  served by a hedge %d", r.ServedByHedge)
	}
	if r.Canceled > 0 {
		s += fmt.Sprintf("  canceled %d", r.Canceled)
	}
	if r.OpenBodies > 0 {
		s += fmt.Sprintf("  bodies left open %d", r.OpenBodies)
	}
	if r.Errors > 0 {
		s += fmt.Sprintf("  errors %d (first: %s)", r.Errors, r.FirstError)
	}
	return s
}
