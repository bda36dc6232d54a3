package damper_test

// Microbenchmarks of the core, gathered in one place; the numbers and the
// command that produced them are in docs/BENCHMARKS.md:
//
//	go test -bench . -benchmem -run '^$'

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

const benchMessage = `{"id":"msg_bench","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":1}}`

// benchMessageHandler answers every call at once with benchMessage.
var benchMessageHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Request-Id", "req_bench")
	_, _ = w.Write([]byte(benchMessage))
})

// benchClients returns a bare SDK client and one through Damper's default
// policy, both to one server that answers every call at once: on loopback,
// or in memory (no socket, so that Damper's own cost is not lost in the
// kernel's).
func benchClients(b *testing.B, inMemory bool, extra ...option.RequestOption) (sdk, withDamper anthropic.Client) {
	b.Helper()
	base := benchOptions(b, inMemory, extra...)
	d, err := damper.New(damper.Policy{})
	if err != nil {
		b.Fatal(err)
	}
	return anthropic.NewClient(base...), anthropic.NewClient(append(base, d.Option())...)
}

// benchOptions are the SDK options of a client of benchMessageHandler, on
// loopback or in memory, with no retries of the SDK's own.
func benchOptions(b *testing.B, inMemory bool, extra ...option.RequestOption) []option.RequestOption {
	b.Helper()
	base := append([]option.RequestOption{option.WithAPIKey("bench-key"), option.WithMaxRetries(0)}, extra...)
	if inMemory {
		return append(base, option.WithBaseURL(dampertest.MemoryURL),
			option.WithHTTPClient(&http.Client{Transport: dampertest.Transport(benchMessageHandler)}))
	}
	srv := httptest.NewServer(benchMessageHandler)
	b.Cleanup(srv.Close)
	return append(base, option.WithBaseURL(srv.URL))
}

// benchParams is a request with a user message of about size bytes.
func benchParams(model anthropic.Model, size int) anthropic.MessageNewParams {
	text := "hello"
	if size > len(text) {
		text = strings.Repeat("lorem ipsum ", size/12)
	}
	return anthropic.MessageNewParams{
		Model:     model,
		MaxTokens: 64,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(text))},
	}
}

// BenchmarkSuccessfulCall is one successful Messages.New on a loopback
// server, through the bare SDK and through Damper with its default policy:
// the difference is Damper's overhead on the path every call takes.
func BenchmarkSuccessfulCall(b *testing.B) {
	sdk, withDamper := benchClients(b, false)
	params := benchParams("claude-sonnet-4-5", 0)
	clients := []struct {
		name   string
		client anthropic.Client
	}{{"sdk", sdk}, {"damper", withDamper}}
	for _, c := range clients {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.client.Messages.New(context.Background(), params); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSuccessfulCallMemory is BenchmarkSuccessfulCall in memory, with
// no socket: the difference in B/op and allocs/op is what Damper adds to a
// call.
func BenchmarkSuccessfulCallMemory(b *testing.B) {
	sdk, withDamper := benchClients(b, true)
	params := benchParams("claude-sonnet-4-5", 0)
	for _, c := range []struct {
		name   string
		client anthropic.Client
	}{{"sdk", sdk}, {"damper", withDamper}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.client.Messages.New(context.Background(), params); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSuccessfulCallPaired makes, in every iteration, one successful
// call through the bare SDK and one through Damper, to the same server,
// alternating which goes first. Both see the same machine load, so the
// ratio it reports holds on a busy machine, where two separate runs of
// BenchmarkSuccessfulCall do not. It runs on loopback and in memory, with
// a small prompt and a 100 KB one, with a dated model ID, and with a
// request timeout shorter than Damper's per-attempt timeout, which then
// bounds every attempt.
func BenchmarkSuccessfulCallPaired(b *testing.B) {
	timeout := option.WithRequestTimeout(defaults.PerAttemptTimeout / 2)
	cases := []struct {
		name     string
		inMemory bool
		params   anthropic.MessageNewParams
		extra    []option.RequestOption
	}{
		{"loopback/small", false, benchParams("claude-sonnet-4-5", 0), nil},
		{"loopback/100KB", false, benchParams("claude-sonnet-4-5", 100_000), nil},
		{"loopback/small-timeout", false, benchParams("claude-sonnet-4-5", 0), []option.RequestOption{timeout}},
		{"memory/small", true, benchParams("claude-sonnet-4-5", 0), nil},
		{"memory/100KB", true, benchParams("claude-sonnet-4-5", 100_000), nil},
		{"memory/small-dated", true, benchParams("claude-sonnet-4-5-20250929", 0), nil},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			sdk, withDamper := benchClients(b, tc.inMemory, tc.extra...)
			pairedCalls(b, "damper", [2]anthropic.Client{sdk, withDamper}, tc.params)
		})
	}
}

// BenchmarkSuccessfulCallFloor puts a third contender beside the two of
// BenchmarkSuccessfulCallPaired, on loopback: a middleware that does only
// what every Damper attempt must, a context of its own with the attempt's
// deadline and the answer read whole before it is handed on. Its ratio to
// the bare SDK is the floor under Damper's, and Damper's ratio to it
// (damper/floor) is what Damper's own work costs, measured in the same
// iterations.
func BenchmarkSuccessfulCallFloor(b *testing.B) {
	floor := option.WithMiddleware(func(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		ctx, cancel := context.WithDeadline(req.Context(), time.Now().Add(defaults.PerAttemptTimeout))
		defer cancel()
		res, err := next(req.WithContext(ctx))
		if err != nil {
			return nil, err
		}
		body, err := io.ReadAll(res.Body)
		_ = res.Body.Close()
		res.Body = io.NopCloser(bytes.NewReader(body))
		return res, err
	})
	for _, size := range []int{0, 100_000} {
		b.Run(fmt.Sprintf("prompt=%d", size), func(b *testing.B) {
			srv := httptest.NewServer(benchMessageHandler)
			b.Cleanup(srv.Close)
			base := []option.RequestOption{option.WithAPIKey("bench-key"), option.WithMaxRetries(0), option.WithBaseURL(srv.URL)}
			d, err := damper.New(damper.Policy{})
			if err != nil {
				b.Fatal(err)
			}
			rotatingCalls(b, benchParams("claude-sonnet-4-5", size),
				contender{"sdk", anthropic.NewClient(base...)},
				contender{"floor", anthropic.NewClient(append(base, floor)...)},
				contender{"damper", anthropic.NewClient(append(base, d.Option())...)})
		})
	}
}

// pairedCalls is rotatingCalls of the bare SDK, clients[0], and one
// contender, clients[1], named name.
func pairedCalls(b *testing.B, name string, clients [2]anthropic.Client, params anthropic.MessageNewParams) {
	rotatingCalls(b, params, contender{"sdk", clients[0]}, contender{name, clients[1]})
}

// contender is a client a benchmark times, by name.
type contender struct {
	name   string
	client anthropic.Client
}

// rotatingCalls makes one call through each contender per iteration, each
// in turn going first, so that all see the same machine load, and reports
// each one's mean time per call and, for each after the first, its ratio
// to the first (the bare SDK) and, when there are three, the third's to
// the second. The ratio of the means counts every pause, the collector's
// among them; the ratio of the medians (suffix "-median") leaves out the
// pauses the machine makes in one call of a thousand, which the means of
// two runs do not share.
func rotatingCalls(b *testing.B, params anthropic.MessageNewParams, cs ...contender) {
	b.ReportAllocs()
	spent := make([]time.Duration, len(cs))
	took := make([][]time.Duration, len(cs))
	for i := 0; b.Loop(); i++ {
		for k := range cs {
			j := (i + k) % len(cs)
			start := time.Now()
			if _, err := cs[j].client.Messages.New(context.Background(), params); err != nil {
				b.Fatal(err)
			}
			d := time.Since(start)
			spent[j] += d
			took[j] = append(took[j], d)
		}
	}
	n := float64(b.N)
	ratio := func(j, base int) {
		name := cs[j].name + "/" + cs[base].name
		b.ReportMetric(float64(spent[j])/float64(spent[base]), name)
		b.ReportMetric(float64(median(took[j]))/float64(median(took[base])), name+"-median")
	}
	for j, c := range cs {
		b.ReportMetric(float64(spent[j].Nanoseconds())/n, c.name+"-ns/call")
		if j > 0 {
			ratio(j, 0)
		}
	}
	if len(cs) == 3 {
		ratio(2, 1)
	}
}

// median returns the median of ds, which it sorts.
func median(ds []time.Duration) time.Duration {
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// BenchmarkDamperCall is one call through Damper alone, in memory: the
// figure to profile (-cpuprofile, -memprofile), with nothing else in it.
func BenchmarkDamperCall(b *testing.B) {
	for _, size := range []int{0, 100_000} {
		b.Run(fmt.Sprintf("prompt=%d", size), func(b *testing.B) {
			_, withDamper := benchClients(b, true)
			params := benchParams("claude-sonnet-4-5", size)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := withDamper.Messages.New(context.Background(), params); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkWindowBudgetAdmission is the retry budget's admission decision
// under parallel load: granted (units left) and refused (none left).
func BenchmarkWindowBudgetAdmission(b *testing.B) {
	now := time.Date(2026, 11, 1, 0, 0, 30, 0, time.UTC)
	b.Run("granted", func(b *testing.B) {
		budget := mustBudget(b, 0.1, time.Minute, 1<<40)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if !budget.TryAcquire(now) {
					b.Error("TryAcquire refused with units left")
					return
				}
			}
		})
	})
	b.Run("refused", func(b *testing.B) {
		budget := mustBudget(b, 0.1, time.Minute, 0)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if budget.TryAcquire(now) {
					b.Error("TryAcquire granted with no units")
					return
				}
			}
		})
	})
}
