package redisstore_test

import (
	"context"
	"fmt"
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
	"github.com/damper-ai/damper-go/redisstore"
)

// tripHook records each round trip a client makes that runs scripts of
// the store's: a command of its own, or a pipeline (one round trip, its
// scripts in order).
type tripHook struct {
	mu    sync.Mutex
	trips []trip
}

// trip is one round trip: the operations it ran, and whether it carried a
// decision, which its caller waits for.
type trip struct {
	ops      []string
	decision bool
}

func (h *tripHook) add(cmds ...redis.Cmder) {
	var t trip
	for _, cmd := range cmds {
		if cmd.Name() != "evalsha" && cmd.Name() != "eval" {
			continue
		}
		ops, record := redisstore.ScriptOps(cmd.Args())
		if slices.Equal(ops, []string{"store:members"}) {
			continue // the membership's refresh rides along, a few times a second
		}
		t.ops = append(t.ops, ops...)
		t.decision = t.decision || !record
	}
	if len(t.ops) > 0 {
		h.mu.Lock()
		h.trips = append(h.trips, t)
		h.mu.Unlock()
	}
}

func (h *tripHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *tripHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.add(cmd)
		return next(ctx, cmd)
	}
}
func (h *tripHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.add(cmds...)
		return next(ctx, cmds)
	}
}

func (h *tripHook) take() []trip {
	h.mu.Lock()
	defer h.mu.Unlock()
	t := h.trips
	h.trips = nil
	return t
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
// each gate's admission (a decision) is one round trip on the caller's
// path, and the records of an attempt's end are queued, to ride with a
// later decision or go in the queue's own batch; the report's balance
// costs none. The decisions of each call and its records are pinned, so
// that a change that adds a round trip to every call fails here.
func TestRoundTripsPerCall(t *testing.T) {
	srv := redistest.Start(t)
	hook := &tripHook{}
	client := newClient1(t, srv.Addr, hook)
	api := dampertest.NewServer(dampertest.InMemory(),
		dampertest.WithRateLimits(dampertest.RateLimits{RequestsPerMinute: 1_000_000}))
	defer api.Close()
	store := newStore(t, client, "per-call")
	d, err := damper.New(allParts(), damper.WithStore(store))
	mustNil(t, err)
	c := anthropic.NewClient(append([]option.RequestOption{d.Option()}, api.Options()...)...)
	params := anthropic.MessageNewParams{Model: "claude-sonnet-4-6", MaxTokens: 100,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}}
	ctx := context.Background()

	// An attempt is admitted by the limiter's Reserve and the breaker's
	// Allow; its response's headers are observed, its usage settles the
	// reservation, and the breaker hears its end.
	admit := []string{"ratelimit:reserve", "breaker:a"}
	ended := []string{"breaker:d", "ratelimit:observe", "ratelimit:settle"}
	// A successful first attempt grows the budget and the throttle.
	success := slices.Concat(ended, []string{"budget:observe", "throttle:add"})
	for _, cs := range []struct {
		name      string
		steps     []dampertest.Step
		stream    bool
		report    bool
		decisions []string
		records   []string
	}{
		{name: "plain", decisions: admit, records: success},
		{name: "plain, report read", report: true, decisions: admit, records: success},
		{name: "stream", stream: true, decisions: admit, records: success},
		{
			name:  "529, then a retry that succeeds",
			steps: []dampertest.Step{dampertest.Status(529), dampertest.OK()},
			// The retry's gates ask the limiter and the breaker, taking
			// nothing, then the throttle and the budget; then the retry is
			// admitted.
			decisions: slices.Concat(admit, []string{"ratelimit:admits", "breaker:r", "throttle:tokens", "budget:acquire"}, admit),
			// Each attempt's end; the failure and the retry's success each
			// move the throttle. The failure's breaker:d is sent before
			// its Done returns (TestBreakerFailuresReachRedisAtOnce).
			records: slices.Concat(ended, []string{"throttle:add"}, ended, []string{"throttle:add"}),
		},
	} {
		// Twice: the first run of a script on a server loads it.
		for run := range 2 {
			api.Script("", cs.steps...)
			mustNil(t, store.Flush(ctx))
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
			during := hook.take()
			mustNil(t, store.Flush(ctx))
			trips := append(during, hook.take()...)
			if run == 0 {
				continue
			}
			var decisions, records []string
			onPath := 0 // round trips the caller waited for
			for _, tr := range during {
				if tr.decision {
					onPath++
				}
			}
			for _, tr := range trips {
				for _, op := range tr.ops {
					if strings.HasPrefix(op, "budget:observe") || strings.HasPrefix(op, "throttle:add") ||
						op == "breaker:d" || op == "ratelimit:observe" || op == "ratelimit:settle" {
						records = append(records, op)
					} else {
						decisions = append(decisions, op)
					}
				}
			}
			if !slices.Equal(decisions, cs.decisions) {
				t.Errorf("%s: decisions %q, want %q", cs.name, decisions, cs.decisions)
			}
			if onPath != len(cs.decisions) {
				t.Errorf("%s: %d round trips on the caller's path, want %d (one per decision): %v", cs.name, onPath, len(cs.decisions), during)
			}
			// The records' order across parts depends on which batch took
			// them; each part's own order is kept.
			slices.Sort(records)
			want := slices.Sorted(slices.Values(cs.records))
			if !slices.Equal(records, want) {
				t.Errorf("%s: records %q, want %q", cs.name, records, want)
			}
			if cs.report && rep.BudgetBalance == 0 {
				t.Errorf("%s: the report's balance is 0, want the budget's", cs.name)
			}
		}
	}
}

// TestRecordsReachRedis: the records of calls through a Damper, queued
// and sent in batches, leave in Redis the values each one's own round trip
// left: the budget's books, the throttle's count and the breaker's window.
func TestRecordsReachRedis(t *testing.T) {
	srv := redistest.Start(t)
	client := newClient1(t, srv.Addr)
	clk := dampertest.NewClock(time.Now().Truncate(time.Minute).Add(time.Minute))
	api := dampertest.NewServer(dampertest.InMemory(), dampertest.WithClock(clk),
		dampertest.WithRateLimits(dampertest.RateLimits{RequestsPerMinute: 1_000_000}))
	defer api.Close()
	store := newStore(t, client, "records")
	d, err := damper.New(allParts(), damper.WithStore(store), damper.WithClock(clk))
	mustNil(t, err)
	c := anthropic.NewClient(append([]option.RequestOption{d.Option()}, api.Options()...)...)
	params := anthropic.MessageNewParams{Model: "claude-sonnet-4-6", MaxTokens: 100,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}}
	ctx := context.Background()

	_, err = c.Messages.New(ctx, params)
	mustNil(t, err)
	s := c.Messages.NewStreaming(ctx, params)
	for s.Next() {
	}
	mustNil(t, s.Err())
	api.Script("", dampertest.Status(529), dampertest.OK())
	_, err = c.Messages.New(ctx, params)
	mustNil(t, err)
	mustNil(t, store.Flush(ctx))

	// Two successful first attempts, one retry granted.
	now := clk.Now()
	checkHash(t, client, redisstore.Key("records"), map[string]string{
		"w": fmt.Sprint(now.UnixNano() / int64(time.Minute)), "s": "2", "u": "1",
	})
	// Full at 10 000; each answer earns 200, up to full, a 529 costs 1000.
	if got := client.Get(ctx, redisstore.ThrottleKey("records")).Val(); got != "9200" {
		t.Errorf("the throttle holds %q, want 9200", got)
	}
	// Four attempts in one slice of the default 30 s window, one a failure.
	slice := now.UnixNano() / int64(time.Second)
	if got := client.HGet(ctx, redisstore.BreakerKey("records"), fmt.Sprintf("b%d", slice%30)).Val(); got != fmt.Sprintf("%d:4:1", slice) {
		t.Errorf("the breaker's slice holds %q, want %d:4:1", got, slice)
	}
	if st := store.Stats(); st.Failures != 0 || st.Dropped != 0 || st.Unasked != 0 {
		t.Errorf("stats %+v, want no failure, drop or unasked operation", st)
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
