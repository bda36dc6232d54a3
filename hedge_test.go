package damper_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// The hedging tests run in synctest bubbles, on the real clock: time moves
// only when every goroutine waits, so two attempts race in exact virtual
// time and the tests read when each event happened.

// plan is how raceAPI answers one attempt.
type plan struct {
	wait   time.Duration   // before the response's headers
	status int             // an error status; 0 answers
	text   string          // the answer's text
	gaps   []time.Duration // a stream's: the wait before each event after the headers
}

// raceAPI answers the n-th request by the n-th plan, and records whether
// each request's connection was closed before its handler was done.
type raceAPI struct {
	plans []plan

	mu     sync.Mutex
	n      int
	cut    []bool // per request: its context ended before the handler was done
	bodies [][]byte
}

func (a *raceAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	a.mu.Lock()
	a.n++
	n := a.n
	a.cut = append(a.cut, false)
	a.bodies = append(a.bodies, body)
	a.mu.Unlock()
	p := a.plans[min(n, len(a.plans))-1]
	cut := func() {
		a.mu.Lock()
		a.cut[n-1] = true
		a.mu.Unlock()
	}
	if !sleepCtx(r.Context(), p.wait) {
		cut()
		return
	}
	w.Header().Set("Request-Id", fmt.Sprintf("req_%d", n))
	if p.status != 0 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(p.status)
		io.WriteString(w, `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`)
		return
	}
	text := cmp.Or(p.text, fmt.Sprintf("answer %d", n))
	if !strings.Contains(string(body), `"stream":true`) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"msg_%d","type":"message","role":"assistant","model":"claude-sonnet-4-6","content":[{"type":"text","text":%q}],`+
			`"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":5}}`, n, text)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	flush := http.NewResponseController(w).Flush
	_ = flush()
	for i, ev := range (dampertest.Stream{Text: text, ChunkSize: 4}).Events() {
		if i < len(p.gaps) && !sleepCtx(r.Context(), p.gaps[i]) {
			cut()
			return
		}
		if _, err := io.WriteString(w, ev.String()); err != nil {
			cut()
			return
		}
		_ = flush()
	}
}

// cutOf returns, per request, whether its connection was closed early.
func (a *raceAPI) cutOf() []bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]bool(nil), a.cut...)
}

func (a *raceAPI) requests() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n
}

// sleepCtx waits d, or until ctx ends, and reports whether d passed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// hedgeRig is a Damper in front of a raceAPI, in memory.
type hedgeRig struct {
	api    *raceAPI
	d      *damper.Damper
	client anthropic.Client
}

func newHedgeRig(t *testing.T, p damper.Policy, plans ...plan) *hedgeRig {
	t.Helper()
	api := &raceAPI{plans: plans}
	d, err := damper.New(p, damper.WithRand(half))
	if err != nil {
		t.Fatal(err)
	}
	return &hedgeRig{api: api, d: d, client: memClient(d, api)}
}

// plain makes one plain call in ctx and returns its text, its report and
// how long it took.
func (r *hedgeRig) plain(ctx context.Context, opts ...option.RequestOption) (string, damper.Report, time.Duration, error) {
	var rep damper.Report
	start := time.Now()
	msg, err := r.client.Messages.New(ctx, params("claude-sonnet-4-6"), append(opts, damper.ReportInto(&rep))...)
	took := time.Since(start)
	if err != nil {
		return "", rep, took, err
	}
	return msg.Content[0].Text, rep, took, nil
}

// stream makes one streaming call and returns the text its caller read,
// its report, and when its first content came.
func (r *hedgeRig) stream(ctx context.Context) (string, damper.Report, time.Duration, error) {
	var rep damper.Report
	start := time.Now()
	s := r.client.Messages.NewStreaming(ctx, params("claude-sonnet-4-6"), damper.ReportInto(&rep))
	defer s.Close()
	var text strings.Builder
	var first time.Duration
	for s.Next() {
		ev := s.Current()
		if ev.Type == "content_block_delta" {
			if text.Len() == 0 {
				first = time.Since(start)
			}
			text.WriteString(ev.Delta.Text)
		}
	}
	return text.String(), rep, first, s.Err()
}

func fixedHedge(d time.Duration) *damper.HedgePolicy { return &damper.HedgePolicy{Delay: d} }

func TestHedgeWinsWhenThePrimaryIsSlow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newHedgeRig(t, damper.Policy{Hedge: fixedHedge(time.Second)},
			plan{wait: 10 * time.Second}, plan{wait: 100 * time.Millisecond, text: "hedged"})
		before, _ := r.d.Budget().Available(context.Background(), time.Now())
		text, rep, took, err := r.plain(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if text != "hedged" || took != 1100*time.Millisecond {
			t.Fatalf("got %q after %v, want the hedge's answer after 1.1s", text, took)
		}
		if rep.Attempts != 2 || rep.Hedges != 1 || !rep.HedgeWon || rep.Outcome != damper.OutcomeSuccess {
			t.Fatalf("report %+v", rep)
		}
		if !rep.Priced || rep.EstimatedCostUSD == 0 || rep.RetryCostUSD != rep.EstimatedCostUSD {
			t.Fatalf("retry cost %v for an attempt estimated at %v: want the hedge at a whole attempt's cost", rep.RetryCostUSD, rep.EstimatedCostUSD)
		}
		if len(rep.AttemptLog) != 2 {
			t.Fatalf("attempt log %+v", rep.AttemptLog)
		}
		lost, won := rep.AttemptLog[0], rep.AttemptLog[1]
		if !lost.Lost || lost.Hedge || lost.Kind != "hedge_lost" || lost.Duration != 1100*time.Millisecond {
			t.Fatalf("the primary's record %+v, want lost after 1.1s", lost)
		}
		if won.Lost || !won.Hedge || won.Class != 0 || won.StatusCode != 200 || won.Duration != 100*time.Millisecond {
			t.Fatalf("the hedge's record %+v", won)
		}
		synctest.Wait()
		if cut := r.api.cutOf(); !cut[0] || cut[1] {
			t.Fatalf("connections cut %v, want the primary's only", cut)
		}
		after, _ := r.d.Budget().Available(context.Background(), time.Now())
		if before-after != 1 {
			t.Fatalf("budget %v before, %v after: want one unit for the hedge", before, after)
		}
	})
}

func TestHedgeLosesWhenThePrimaryAnswersFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newHedgeRig(t, damper.Policy{Hedge: fixedHedge(time.Second)},
			plan{wait: 1500 * time.Millisecond, text: "primary"}, plan{wait: 5 * time.Second})
		text, rep, took, err := r.plain(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if text != "primary" || took != 1500*time.Millisecond {
			t.Fatalf("got %q after %v", text, took)
		}
		if rep.Attempts != 2 || rep.Hedges != 1 || rep.HedgeWon {
			t.Fatalf("report %+v", rep)
		}
		if l := rep.AttemptLog; len(l) != 2 || !l[0].Hedge || !l[0].Lost || l[0].Duration != 500*time.Millisecond || l[1].Hedge || l[1].Class != 0 {
			t.Fatalf("attempt log %+v, want the lost hedge then the primary", l)
		}
		synctest.Wait()
		if cut := r.api.cutOf(); cut[0] || !cut[1] {
			t.Fatalf("connections cut %v, want the hedge's only", cut)
		}
	})
}

func TestHedgeNotSentWhenTheAnswerComesInTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newHedgeRig(t, damper.Policy{Hedge: fixedHedge(time.Second)}, plan{wait: 999 * time.Millisecond})
		_, rep, _, err := r.plain(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if rep.Attempts != 1 || rep.Hedges != 0 || r.api.requests() != 1 {
			t.Fatalf("report %+v after %d requests", rep, r.api.requests())
		}
	})
}

// A primary that fails while its hedge is in flight waits for the hedge:
// no retry is sent on top of it, and only the hedge's unit is spent.
func TestHedgeFailedPrimaryWaitsForTheHedge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newHedgeRig(t, damper.Policy{Hedge: fixedHedge(time.Second)},
			plan{wait: 1500 * time.Millisecond, status: 529}, plan{wait: 2 * time.Second, text: "hedged"})
		before, _ := r.d.Budget().Available(context.Background(), time.Now())
		text, rep, took, err := r.plain(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if text != "hedged" || took != 3*time.Second || r.api.requests() != 2 {
			t.Fatalf("got %q after %v and %d requests", text, took, r.api.requests())
		}
		if l := rep.AttemptLog; len(l) != 2 || l[0].StatusCode != 529 || l[0].Backoff != 0 || !l[1].Hedge || l[1].Class != 0 {
			t.Fatalf("attempt log %+v", l)
		}
		after, _ := r.d.Budget().Available(context.Background(), time.Now())
		if before-after != 1 {
			t.Fatalf("budget %v before, %v after: want one unit", before, after)
		}
	})
}

// When both attempts of a race fail, the call retries as it would have
// after one: the hedge counted as an attempt.
func TestHedgeBothFailThenRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newHedgeRig(t, damper.Policy{Hedge: fixedHedge(time.Second), BackoffBase: damper.None},
			plan{wait: 1500 * time.Millisecond, status: 529}, plan{wait: time.Second, status: 529}, plan{text: "third"})
		text, rep, took, err := r.plain(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if text != "third" || took != 2*time.Second || rep.Attempts != 3 || rep.Hedges != 1 {
			t.Fatalf("got %q after %v; report %+v", text, took, rep)
		}
	})
}

// A caller's error is not retried, and ends the race: the hedge in flight
// is cancelled.
func TestHedgeClientErrorEndsTheRace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newHedgeRig(t, damper.Policy{Hedge: fixedHedge(time.Second)},
			plan{wait: 1500 * time.Millisecond, status: 400}, plan{wait: 5 * time.Second})
		_, rep, took, err := r.plain(context.Background())
		var apiErr *anthropic.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || took != 1500*time.Millisecond {
			t.Fatalf("err %v after %v, want the 400 at once", err, took)
		}
		if l := rep.AttemptLog; rep.Outcome != damper.OutcomeError || len(l) != 2 || !l[1].Lost || !l[1].Hedge {
			t.Fatalf("report %+v", rep)
		}
		synctest.Wait()
		if cut := r.api.cutOf(); !cut[1] {
			t.Fatalf("connections cut %v, want the hedge's", cut)
		}
	})
}

func TestHedgeStreamWinnerIsReleased(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		slow := plan{text: "slow primary", gaps: []time.Duration{0, 0, 10 * time.Second}}
		fast := plan{text: "fast hedge", gaps: []time.Duration{0, 0, 200 * time.Millisecond}}
		r := newHedgeRig(t, damper.Policy{Hedge: fixedHedge(time.Second)}, slow, fast)
		text, rep, first, err := r.stream(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if text != "fast hedge" || first != 1200*time.Millisecond || rep.FirstContent != first {
			t.Fatalf("read %q, first content after %v (report %v)", text, first, rep.FirstContent)
		}
		if rep.Hedges != 1 || !rep.HedgeWon || rep.Outcome != damper.OutcomeSuccess || len(rep.AttemptLog) != 2 || !rep.AttemptLog[0].Lost {
			t.Fatalf("report %+v", rep)
		}
		synctest.Wait()
		if cut := r.api.cutOf(); !cut[0] || cut[1] {
			t.Fatalf("connections cut %v", cut)
		}
	})
}

// The caller reads one attempt's events, the first to send content, for
// any timing of two streams' events.
func TestHedgeStreamRaceProperty(t *testing.T) {
	for seed := range uint64(200) {
		rnd := rand.New(rand.NewPCG(seed, 7))
		// Whole milliseconds, so that which comes first is never a tie
		// unless drawn as one.
		ms := func(n int) time.Duration { return time.Duration(rnd.IntN(n)) * time.Millisecond }
		var plans [2]plan
		var firstContent [2]time.Duration // from the call's start
		for i := range plans {
			gaps := make([]time.Duration, 12)
			for k := range gaps {
				gaps[k] = ms(800)
			}
			plans[i] = plan{wait: ms(1500), text: fmt.Sprintf("attempt %d says hello", i+1), gaps: gaps}
			// The first content is the first content_block_delta, event 2.
			firstContent[i] = plans[i].wait + gaps[0] + gaps[1] + gaps[2]
		}
		// Half a millisecond off the grid: the hedge never leaves at the
		// instant the primary's content comes, nor do the two come at once.
		delay := 100*time.Millisecond + ms(1000) + 500*time.Microsecond
		firstContent[1] += delay
		synctest.Test(t, func(t *testing.T) {
			r := newHedgeRig(t, damper.Policy{Hedge: fixedHedge(delay)}, plans[0], plans[1])
			text, rep, first, err := r.stream(context.Background())
			if err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
			hedged := firstContent[0] > delay
			want, at := plans[0].text, firstContent[0]
			if hedged && firstContent[1] < firstContent[0] {
				want, at = plans[1].text, firstContent[1]
			}
			if text != want || first != at {
				t.Fatalf("seed %d (delay %v, first content %v): read %q at %v, want %q at %v",
					seed, delay, firstContent, text, first, want, at)
			}
			if hedged != (rep.Hedges == 1) || len(rep.AttemptLog) != rep.Attempts {
				t.Fatalf("seed %d: report %+v", seed, rep)
			}
			synctest.Wait()
			if cut := r.api.cutOf(); hedged && cut[0] == cut[1] {
				t.Fatalf("seed %d: connections cut %v, want the loser's only", seed, cut)
			}
		})
	}
}

func TestHedgeQuantileOfRecentAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var plans []plan
		for i := range 5 {
			plans = append(plans, plan{wait: time.Duration(i+1) * 100 * time.Millisecond})
		}
		plans = append(plans, plan{wait: 10 * time.Second}, plan{wait: 50 * time.Millisecond, text: "hedged"})
		r := newHedgeRig(t, damper.Policy{Hedge: &damper.HedgePolicy{Quantile: 0.8, Window: 10, MinSamples: 5}}, plans...)
		for i := range 5 {
			_, rep, _, err := r.plain(context.Background())
			if err != nil || rep.Hedges != 0 {
				t.Fatalf("call %d: %v, report %+v: no hedge before MinSamples", i+1, err, rep)
			}
		}
		// The 0.8 quantile of 100..500 ms is 400 ms.
		text, rep, took, err := r.plain(context.Background())
		if err != nil || text != "hedged" || took != 450*time.Millisecond || rep.Hedges != 1 {
			t.Fatalf("got %q after %v (%v); report %+v", text, took, err, rep)
		}
	})
}

func TestHedgeAskedPerCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		slow := plan{wait: 2 * time.Second}
		r := newHedgeRig(t, damper.Policy{Hedge: &damper.HedgePolicy{Delay: time.Second, OnlyWhenAsked: true}}, slow)
		if _, rep, _, _ := r.plain(context.Background()); rep.Hedges != 0 {
			t.Fatalf("not asked, yet hedged: %+v", rep)
		}
		if _, rep, _, _ := r.plain(damper.ContextWithHedging(context.Background(), true)); rep.Hedges != 1 {
			t.Fatalf("asked, yet not hedged: %+v", rep)
		}
		r = newHedgeRig(t, damper.Policy{Hedge: fixedHedge(time.Second)}, slow)
		if _, rep, _, _ := r.plain(damper.ContextWithHedging(context.Background(), false)); rep.Hedges != 0 {
			t.Fatalf("declined, yet hedged: %+v", rep)
		}
	})
}

// Every gate a retry passes refuses a hedge that it would not pay for:
// the hedge is then not sent, and the call goes on with its primary.
func TestHedgeRefusedByGates(t *testing.T) {
	cases := []struct {
		name   string
		policy damper.Policy
		ctx    func() (context.Context, context.CancelFunc)
		wait   time.Duration // the primary's
	}{
		{"attempts", damper.Policy{MaxAttempts: 1}, nil, 3 * time.Second},
		{"budget", damper.Policy{RetryBudgetMinTokens: damper.None, RetryBudgetRatio: damper.None}, nil, 3 * time.Second},
		{"cost ceiling", damper.Policy{MaxRetryCostUSD: 0.000001}, nil, 3 * time.Second},
		// At 1 s a hedge could not have the least attempt's time before
		// the deadline; the primary answers just within it.
		{"deadline", damper.Policy{}, func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 1400*time.Millisecond)
		}, 1300 * time.Millisecond},
		{"rate limiter", damper.Policy{RateLimit: &damper.RateLimitPolicy{
			Limits: map[string]damper.RateLimits{"claude-sonnet-4": {RequestsPerMinute: 1}}}}, nil, 3 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := tc.policy
				p.Hedge = fixedHedge(time.Second)
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				if tc.ctx != nil {
					ctx, cancel = tc.ctx()
				}
				defer cancel()
				r := newHedgeRig(t, p, plan{wait: tc.wait, text: "primary"})
				text, rep, took, err := r.plain(ctx)
				if err != nil || text != "primary" || took != tc.wait {
					t.Fatalf("got %q after %v: %v", text, took, err)
				}
				if rep.Attempts != 1 || rep.Hedges != 0 || r.api.requests() != 1 || rep.RetryCostUSD != 0 {
					t.Fatalf("report %+v after %d requests: want no hedge", rep, r.api.requests())
				}
				if p.RateLimit != nil {
					// The refused hedge gave its reservation back: only the
					// primary's request was taken.
					for _, s := range r.d.RateLimits() {
						if s.Bucket == "requests" && s.Remaining < -0.01 {
							t.Fatalf("requests bucket %+v: the hedge's reservation was kept", s)
						}
					}
				}
			})
		})
	}
}

// A half-open breaker lets one probe through: the probe is not hedged.
func TestHedgeNotWhileTheProbeIsOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fail := plan{status: 500}
		r := newHedgeRig(t, damper.Policy{
			// Failures are not retried, so that each call is one attempt.
			Classifier: func(_ damper.Failure, c damper.Classification) damper.Classification {
				c.Class = damper.NotRetryable
				return c
			},
			Breaker: &damper.BreakerPolicy{MinAttempts: 2, FailureRatio: 0.5, OpenFor: time.Second},
			Hedge:   fixedHedge(100 * time.Millisecond),
		}, fail, fail, plan{wait: time.Second, text: "probe"})
		for range 2 {
			_, _, _, _ = r.plain(context.Background())
		}
		if _, rep, _, err := r.plain(context.Background()); !errors.Is(err, damper.ErrCircuitOpen) || rep.Attempts != 0 {
			t.Fatalf("third call: %v, %+v: want the open breaker's refusal", err, rep)
		}
		time.Sleep(time.Second)
		text, rep, _, err := r.plain(context.Background())
		if err != nil || text != "probe" || rep.Hedges != 0 || !rep.AttemptLog[0].Probe {
			t.Fatalf("probe: %q, %v, %+v", text, err, rep)
		}
	})
}

// slowUpload sends request bodies 4 KiB every 100 ms.
type slowUpload struct{ next http.RoundTripper }

func (s slowUpload) RoundTrip(req *http.Request) (*http.Response, error) {
	var sent bytes.Buffer
	chunk := make([]byte, 4<<10)
	for {
		n, err := req.Body.Read(chunk)
		sent.Write(chunk[:n])
		if err != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	req = req.Clone(req.Context())
	req.Body = io.NopCloser(&sent)
	return s.next.RoundTrip(req)
}

// A caller's own *bytes.Reader body is one reader that the SDK seeks back
// for each attempt: a hedge that leaves while the primary still sends it
// gets a copy, and both send the whole body.
func TestHedgeRawReaderBody(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newHedgeRig(t, damper.Policy{Hedge: fixedHedge(time.Second)},
			plan{wait: 10 * time.Second}, plan{text: "hedged"})
		r.client = anthropic.NewClient(r.d.Option(),
			option.WithBaseURL("http://api.invalid"), option.WithAPIKey("test-key"),
			option.WithHTTPClient(&http.Client{Transport: slowUpload{dampertest.Transport(r.api)}}))
		body := []byte(`{"model":"claude-sonnet-4-6","max_tokens":64,"messages":[{"role":"user","content":"` + strings.Repeat("x", 64<<10) + `"}]}`)
		var rep damper.Report
		msg, err := r.client.Messages.New(context.Background(), anthropic.MessageNewParams{},
			option.WithRequestBody("application/json", bytes.NewReader(body)), damper.ReportInto(&rep))
		if err != nil || msg.Content[0].Text != "hedged" || rep.Hedges != 1 {
			t.Fatalf("%v, %+v", err, rep)
		}
		for i, got := range r.api.bodies {
			if !bytes.Equal(got, body) {
				t.Fatalf("request %d sent %d bytes of the %d-byte body", i+1, len(got), len(body))
			}
		}
	})
}

func TestHedgePolicyErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct {
		h     damper.HedgePolicy
		field string
	}{
		{damper.HedgePolicy{Delay: -1}, "Hedge.Delay"},
		{damper.HedgePolicy{Quantile: 1}, "Hedge.Quantile"},
		{damper.HedgePolicy{MinDelay: -time.Second}, "Hedge.MinDelay"},
		{damper.HedgePolicy{Window: -3}, "Hedge.Window"},
		{damper.HedgePolicy{Window: 10, MinSamples: 11}, "Hedge.MinSamples"},
	} {
		_, err := damper.New(damper.Policy{Hedge: &tc.h})
		if err == nil || !strings.Contains(err.Error(), "Policy."+tc.field+" = ") {
			t.Errorf("%+v: %v, want an error naming %s", tc.h, err, tc.field)
		}
	}
	d, err := damper.New(damper.Policy{Hedge: &damper.HedgePolicy{}})
	if err != nil {
		t.Fatal(err)
	}
	if h := d.Policy().Hedge; h.Quantile != 0.95 || h.Window != 200 || h.MinSamples != 20 {
		t.Fatalf("defaults %+v", h)
	}
}

// Spans mark hedges and the attempts that lost their race, and damper.hedges
// counts hedges sent, won and canceled.
func TestHedgeTelemetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		spans := tracetest.NewInMemoryExporter()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
		reader := sdkmetric.NewManualReader()
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		defer func() { _ = tp.Shutdown(context.Background()); _ = mp.Shutdown(context.Background()) }()
		api := &raceAPI{plans: []plan{
			{wait: 10 * time.Second}, {wait: 100 * time.Millisecond}, // the hedge wins
			{wait: 1500 * time.Millisecond}, {wait: 5 * time.Second}, // the primary wins
		}}
		d, err := damper.New(damper.Policy{Hedge: fixedHedge(time.Second)},
			damper.WithTracerProvider(tp), damper.WithMeterProvider(mp))
		if err != nil {
			t.Fatal(err)
		}
		r := &hedgeRig{api: api, d: d, client: memClient(d, api)}
		for range 2 {
			if _, _, _, err := r.plain(context.Background()); err != nil {
				t.Fatal(err)
			}
		}

		type attemptSpan struct{ hedge, lost, failed bool }
		var got []attemptSpan
		for _, s := range spans.GetSpans() {
			if s.Name != "damper.attempt" {
				continue
			}
			var a attemptSpan
			for _, kv := range s.Attributes {
				switch kv.Key {
				case "damper.hedge":
					a.hedge = kv.Value.AsBool()
				case "damper.hedge.lost":
					a.lost = kv.Value.AsBool()
				}
			}
			a.failed = s.Status.Code == codes.Error
			got = append(got, a)
		}
		// In the order they ended: each call's loser, then its winner.
		want := []attemptSpan{{lost: true}, {hedge: true}, {hedge: true, lost: true}, {}}
		if !slices.Equal(got, want) {
			t.Fatalf("attempt spans %+v, want %+v", got, want)
		}

		var rm metricdata.ResourceMetrics
		if err := reader.Collect(context.Background(), &rm); err != nil {
			t.Fatal(err)
		}
		hedges := map[string]int64{}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if m.Name != "damper.hedges" {
					continue
				}
				for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
					v, _ := p.Attributes.Value("damper.hedge.result")
					hedges[v.AsString()] += p.Value
				}
			}
		}
		if want := map[string]int64{"sent": 2, "won": 1, "canceled": 1}; !maps.Equal(hedges, want) {
			t.Fatalf("damper.hedges %v, want %v", hedges, want)
		}
	})
}

// A hedged call ends on the attempt that decided it, not on the one its
// race cancelled after: the GenAI metrics' and the damper.request span's
// error.type are the failure's, and each decision line names the attempt
// whose status and request ID it carries, whichever of the two failed and
// whichever failed last.
func TestHedgeCallEndsOnTheDecidingAttempt(t *testing.T) {
	line := func(msg string, attempt, status int, kind string) map[string]any {
		return map[string]any{"msg": msg, "attempt": float64(attempt), "status": float64(status),
			"kind": kind, "request_id": fmt.Sprintf("req_%d", attempt)}
	}
	for _, tc := range []struct {
		name     string
		policy   damper.Policy
		plans    []plan
		status   int    // the status the caller gets; 0: an answer
		lostLast bool   // the log ends with the record of the attempt cancelled
		errType  string // the call's error.type; "": none
		lines    []map[string]any
	}{{
		name:     "the primary fails with the hedge in flight",
		plans:    []plan{{wait: 1500 * time.Millisecond, status: 400}, {wait: 5 * time.Second}},
		status:   400,
		lostLast: true,
		errType:  "400",
		lines:    []map[string]any{line("damper: not retrying", 1, 400, "client_error")},
	}, {
		name:     "the hedge fails with the primary in flight",
		plans:    []plan{{wait: 10 * time.Second}, {wait: 100 * time.Millisecond, status: 400}},
		status:   400,
		lostLast: true,
		errType:  "400",
		lines:    []map[string]any{line("damper: not retrying", 2, 400, "client_error")},
	}, {
		name:    "both fail, the primary last, and no retry is left",
		policy:  damper.Policy{MaxAttempts: 2},
		plans:   []plan{{wait: 1500 * time.Millisecond, status: 529}, {wait: 100 * time.Millisecond, status: 529}},
		status:  529,
		errType: "attempts_exhausted",
		lines:   []map[string]any{line("damper: not retrying", 1, 529, "overloaded")},
	}, {
		name:   "both fail, the primary last, and the call retries",
		policy: damper.Policy{BackoffBase: damper.None},
		plans:  []plan{{wait: 1500 * time.Millisecond, status: 529}, {wait: 100 * time.Millisecond, status: 529}, {text: "third"}},
		lines:  []map[string]any{line("damper: retrying", 1, 529, "overloaded")},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				spans := tracetest.NewInMemoryExporter()
				tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
				reader := sdkmetric.NewManualReader()
				mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
				defer func() { _ = tp.Shutdown(context.Background()); _ = mp.Shutdown(context.Background()) }()
				var logs bytes.Buffer
				p := tc.policy
				p.Hedge = fixedHedge(time.Second)
				d, err := damper.New(p, damper.WithRand(half), damper.WithTracerProvider(tp), damper.WithMeterProvider(mp),
					damper.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))))
				if err != nil {
					t.Fatal(err)
				}
				api := &raceAPI{plans: tc.plans}
				r := &hedgeRig{api: api, d: d, client: memClient(d, api)}
				_, rep, _, err := r.plain(context.Background())
				var apiErr *anthropic.Error
				switch {
				case tc.status == 0 && err != nil:
					t.Fatal(err)
				case tc.status != 0 && (!errors.As(err, &apiErr) || apiErr.StatusCode != tc.status || apiErr.RequestID != tc.lines[0]["request_id"]):
					t.Fatalf("err %v, want the %d of %s", err, tc.status, tc.lines[0]["request_id"])
				}
				if l := rep.AttemptLog; rep.Hedges != 1 || len(l) < 2 || l[0].Lost || l[1].Lost != tc.lostLast {
					t.Fatalf("report %+v, want a hedge, and the lost attempt's record last: %t", rep, tc.lostLast)
				}

				var genAITypes, requestTypes []string
				var rm metricdata.ResourceMetrics
				if err := reader.Collect(context.Background(), &rm); err != nil {
					t.Fatal(err)
				}
				for _, sm := range rm.ScopeMetrics {
					for _, m := range sm.Metrics {
						if m.Name != "gen_ai.client.operation.duration" {
							continue
						}
						for _, p := range m.Data.(metricdata.Histogram[float64]).DataPoints {
							v, _ := p.Attributes.Value("error.type")
							genAITypes = append(genAITypes, v.AsString())
						}
					}
				}
				for _, s := range spans.GetSpans() {
					if s.Name != "damper.request" {
						continue
					}
					typ := ""
					for _, kv := range s.Attributes {
						if kv.Key == "error.type" {
							typ = kv.Value.AsString()
						}
					}
					requestTypes = append(requestTypes, typ)
				}
				if want := []string{tc.errType}; !slices.Equal(genAITypes, want) || !slices.Equal(requestTypes, want) {
					t.Errorf("error.type: GenAI %q, damper.request %q; want %q", genAITypes, requestTypes, want)
				}

				var got []map[string]any
				for l := range strings.Lines(logs.String()) {
					var m map[string]any
					if err := json.Unmarshal([]byte(l), &m); err != nil {
						t.Fatalf("log line %q: %v", l, err)
					}
					got = append(got, map[string]any{"msg": m["msg"], "attempt": m["attempt"], "status": m["status"],
						"kind": m["kind"], "request_id": m["request_id"]})
				}
				if !reflect.DeepEqual(got, tc.lines) {
					t.Errorf("log lines %v, want %v", got, tc.lines)
				}
			})
		})
	}
}
