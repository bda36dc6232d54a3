package redisstore_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/redis/go-redis/v9"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
	"github.com/damper-ai/damper-go/internal/redistest"
)

// partHook records, for each script a client runs, the part whose key it
// names: one entry per round trip.
type partHook struct {
	mu    sync.Mutex
	parts []string
}

func (h *partHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *partHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if a := cmd.Args(); len(a) > 3 && (cmd.Name() == "evalsha" || cmd.Name() == "eval") {
			key, _ := a[3].(string)
			part := key[strings.LastIndexByte(key, '}')+2:]
			part, _, _ = strings.Cut(part, ":")
			h.mu.Lock()
			h.parts = append(h.parts, part)
			h.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}
func (h *partHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *partHook) take() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	p := h.parts
	h.parts = nil
	return p
}

// allParts is a Policy with every part a Store keeps: the budget, the
// throttle, the breaker and the rate limiter.
func allParts() damper.Policy {
	return damper.Policy{
		Breaker:     &damper.BreakerPolicy{},
		Throttle:    &damper.ThrottlePolicy{},
		RateLimit:   &damper.RateLimitPolicy{},
		BackoffBase: damper.None,
	}
}

// TestRoundTripsPerCall: through a Damper whose every part lives in Redis,
// each gate's admission is one round trip, and so is each record of an
// attempt's end. The exact sequence per call is pinned, so that a change
// that adds a round trip to every call fails here.
func TestRoundTripsPerCall(t *testing.T) {
	srv := redistest.Start(t)
	hook := &partHook{}
	client := newClient1(t, srv.Addr, hook)
	api := dampertest.NewServer(dampertest.InMemory(),
		dampertest.WithRateLimits(dampertest.RateLimits{RequestsPerMinute: 1_000_000}))
	defer api.Close()
	d, err := damper.New(allParts(), damper.WithStore(newStore(t, client, "per-call")))
	mustNil(t, err)
	c := anthropic.NewClient(append([]option.RequestOption{d.Option()}, api.Options()...)...)
	params := anthropic.MessageNewParams{Model: "claude-sonnet-4-6", MaxTokens: 100,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}}
	ctx := context.Background()

	// An attempt: the limiter's Reserve and the breaker's Allow admit it;
	// its response's headers are observed, its usage settles the
	// reservation, and the breaker hears its end.
	attempt := []string{"ratelimit", "breaker", "ratelimit", "ratelimit", "breaker"}
	success := append(slices.Clone(attempt), "budget", "throttle") // a successful first attempt grows both
	for _, cs := range []struct {
		name   string
		steps  []dampertest.Step
		stream bool
		report bool
		want   []string
	}{
		{name: "plain", want: success},
		{name: "plain, report read", report: true, want: append(slices.Clone(success), "budget")},
		{
			// A stream's breaker hears its end at its first content, and
			// its reservation is settled by the usage of its last event.
			name: "stream", stream: true,
			want: []string{"ratelimit", "breaker", "ratelimit", "breaker", "budget", "throttle", "ratelimit"},
		},
		{
			name:  "529, then a retry that succeeds",
			steps: []dampertest.Step{dampertest.Status(529), dampertest.OK()},
			want: slices.Concat(
				// The failed attempt: its reservation given back by Settle,
				// and a failure for the breaker and the throttle.
				attempt, []string{"throttle"},
				// The retry's gates: the limiter and breaker asked, taking
				// nothing, then the throttle and the budget.
				[]string{"ratelimit", "breaker", "throttle", "budget"},
				// The retry, a success that is not a first attempt.
				attempt, []string{"throttle"}),
		},
	} {
		// Twice: the first run of a script on a server is EVALSHA, refused,
		// then EVAL.
		for run := range 2 {
			api.Script("", cs.steps...)
			hook.take()
			var rep damper.Report
			opts := []option.RequestOption{}
			if cs.report {
				opts = append(opts, damper.ReportInto(&rep))
			}
			if cs.stream {
				s := c.Messages.NewStreaming(ctx, params, opts...)
				for s.Next() {
				}
				mustNil(t, s.Err())
			} else {
				_, err := c.Messages.New(ctx, params, opts...)
				mustNil(t, err)
			}
			if got := hook.take(); run == 1 && !slices.Equal(got, cs.want) {
				t.Errorf("%s: round trips to %q, want %q", cs.name, got, cs.want)
			}
		}
	}
}

// BenchmarkCallThroughStore makes a plain call through two Dampers with
// every part configured (budget, throttle, breaker, rate limiter), one
// with its state in memory and one with it in a loopback Redis (a client
// with ContextTimeoutEnabled), against an in-memory fake API: one call
// through each per iteration, alternating which goes first. It reports
// each one's latency percentiles, the difference of their medians, and
// the round trips per call through Redis.
func BenchmarkCallThroughStore(b *testing.B) {
	srv := redistest.Start(b)
	hook := &countHook{}
	client := newClientWith(b, &redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true}, hook)
	api := dampertest.NewServer(dampertest.InMemory(),
		dampertest.WithRateLimits(dampertest.RateLimits{RequestsPerMinute: 1_000_000_000}))
	defer api.Close()
	params := anthropic.MessageNewParams{Model: "claude-sonnet-4-6", MaxTokens: 100,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}}
	ctx := context.Background()
	var calls [2]func()
	lat := [2][]time.Duration{make([]time.Duration, 0, b.N), make([]time.Duration, 0, b.N)}
	for i, settings := range [][]damper.Setting{nil, {damper.WithStore(newStore(b, client, "bench-call"))}} {
		d, err := damper.New(allParts(), settings...)
		mustNil(b, err)
		c := anthropic.NewClient(append([]option.RequestOption{d.Option()}, api.Options()...)...)
		calls[i] = func() {
			start := time.Now()
			if _, err := c.Messages.New(ctx, params); err != nil {
				b.Fatal(err)
			}
			lat[i] = append(lat[i], time.Since(start))
		}
		for range 3 { // loads the scripts
			calls[i]()
		}
		lat[i] = lat[i][:0]
	}
	hook.n.Store(0)
	b.ResetTimer()
	for n := range b.N {
		calls[n%2]()
		calls[1-n%2]()
	}
	b.StopTimer()
	b.ReportMetric(float64(hook.n.Load())/float64(b.N), "roundtrips/call")
	b.ReportMetric(percentile(lat[0], 50), "memory-p50-µs")
	b.ReportMetric(percentile(lat[0], 99), "memory-p99-µs")
	b.ReportMetric(percentile(lat[1], 50), "redis-p50-µs")
	b.ReportMetric(percentile(lat[1], 99), "redis-p99-µs")
	b.ReportMetric(percentile(lat[1], 50)-percentile(lat[0], 50), "added-p50-µs")
}
