package damper_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// BenchmarkRecommendedPolicyPaired is one successful call through the bare
// SDK, through Damper with the default policy and through Damper with
// RecommendedPolicy (a breaker and a throttle), in turn in the same
// iterations: recommended/default is what the breaker and the throttle
// cost a call that succeeds.
func BenchmarkRecommendedPolicyPaired(b *testing.B) {
	for _, inMemory := range []bool{false, true} {
		name := map[bool]string{false: "loopback", true: "memory"}[inMemory]
		b.Run(name, func(b *testing.B) {
			base := benchOptions(b, inMemory)
			client := func(p damper.Policy) anthropic.Client {
				d, err := damper.New(p)
				if err != nil {
					b.Fatal(err)
				}
				return anthropic.NewClient(append(base, d.Option())...)
			}
			rotatingCalls(b, benchParams("claude-sonnet-4-5", 0),
				contender{"sdk", anthropic.NewClient(base...)},
				contender{"default", client(damper.Policy{})},
				contender{"recommended", client(damper.RecommendedPolicy())})
		})
	}
}

// BenchmarkPolicyCall is one call through Damper alone, in memory, with the
// default policy and with RecommendedPolicy: the figures to profile for
// what the breaker and the throttle cost.
func BenchmarkPolicyCall(b *testing.B) {
	for _, tc := range []struct {
		name string
		p    damper.Policy
	}{{"default", damper.Policy{}}, {"recommended", damper.RecommendedPolicy()}} {
		b.Run(tc.name, func(b *testing.B) {
			d, err := damper.New(tc.p)
			if err != nil {
				b.Fatal(err)
			}
			client := anthropic.NewClient(option.WithAPIKey("bench-key"), option.WithMaxRetries(0),
				option.WithBaseURL(dampertest.MemoryURL),
				option.WithHTTPClient(&http.Client{Transport: dampertest.Transport(benchMessageHandler)}), d.Option())
			params := benchParams("claude-sonnet-4-5", 0)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := client.Messages.New(context.Background(), params); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
