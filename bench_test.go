package damper_test

// Microbenchmarks of the core, gathered in one place; the numbers and the
// command that produced them are in docs/BENCHMARKS.md:
//
//	go test -bench . -benchmem -run '^$'

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go"
)

const benchMessage = `{"id":"msg_bench","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":1}}`

// benchClients returns a bare SDK client and one through Damper's default
// policy, both to one loopback server that answers every call at once.
func benchClients(b *testing.B) (sdk, withDamper anthropic.Client, params anthropic.MessageNewParams) {
	b.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(benchMessage))
	}))
	b.Cleanup(srv.Close)
	base := []option.RequestOption{option.WithBaseURL(srv.URL), option.WithAPIKey("bench-key")}
	d, err := damper.New(damper.Policy{})
	if err != nil {
		b.Fatal(err)
	}
	params = anthropic.MessageNewParams{
		Model:     "claude-sonnet-4-5",
		MaxTokens: 64,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hello"))},
	}
	return anthropic.NewClient(base...), anthropic.NewClient(append(base, d.Option())...), params
}

// BenchmarkSuccessfulCall is one successful Messages.New on a loopback
// server, through the bare SDK and through Damper with its default policy:
// the difference is Damper's overhead on the path every call takes.
func BenchmarkSuccessfulCall(b *testing.B) {
	sdk, withDamper, params := benchClients(b)
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

// BenchmarkSuccessfulCallPaired makes, in every iteration, one successful
// call through the bare SDK and one through Damper, to the same loopback
// server, alternating which goes first. Both see the same machine load, so
// the ratio it reports holds on a busy machine, where two separate runs of
// BenchmarkSuccessfulCall do not.
func BenchmarkSuccessfulCallPaired(b *testing.B) {
	sdk, withDamper, params := benchClients(b)
	clients := [2]anthropic.Client{sdk, withDamper}
	var spent [2]time.Duration
	for i := 0; b.Loop(); i++ {
		for k := range 2 {
			j := (i + k) % 2
			start := time.Now()
			if _, err := clients[j].Messages.New(context.Background(), params); err != nil {
				b.Fatal(err)
			}
			spent[j] += time.Since(start)
		}
	}
	n := float64(b.N)
	b.ReportMetric(float64(spent[0].Nanoseconds())/n, "sdk-ns/call")
	b.ReportMetric(float64(spent[1].Nanoseconds())/n, "damper-ns/call")
	b.ReportMetric(float64(spent[1])/float64(spent[0]), "damper/sdk")
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
