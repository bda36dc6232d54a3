package damper_test

import (
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"

	"github.com/damper-ai/damper-go"
)

// BenchmarkConcurrencyLimitPaired is one successful call through Damper
// with RecommendedPolicy, without and with an adaptive concurrency limit,
// in turn in the same iterations: limited/recommended is what taking and
// giving back a slot, and timing the attempt, cost a call.
func BenchmarkConcurrencyLimitPaired(b *testing.B) {
	base := benchOptions(b, true)
	client := func(p damper.Policy) anthropic.Client {
		d, err := damper.New(p)
		if err != nil {
			b.Fatal(err)
		}
		return anthropic.NewClient(append(base, d.Option())...)
	}
	limited := damper.RecommendedPolicy()
	limited.Concurrency = &damper.ConcurrencyPolicy{Adaptive: true}
	rotatingCalls(b, benchParams("claude-sonnet-4-5", 0),
		contender{"recommended", client(damper.RecommendedPolicy())},
		contender{"limited", client(limited)})
}
