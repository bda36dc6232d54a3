package engine

import (
	"testing"

	"github.com/damper-ai/damper-go/fleet"
)

// TestUsageCost: an answer's usage priced exactly: cache writes at 1.25×
// and cache reads at 0.1× the input price, the long-context prices past
// LongContextTokens of prompt (cache included), nothing below 0 tokens,
// and at most fleet.MaxSpendAdd.
func TestUsageCost(t *testing.T) {
	sonnet := Price{InputPerMTok: 3, OutputPerMTok: 15}
	long := Price{InputPerMTok: 0.1, OutputPerMTok: 0.5, LongContextTokens: 100_000, LongInputPerMTok: 0.5, LongOutputPerMTok: 2.5}
	for _, tc := range []struct {
		name string
		p    Price
		u    usage
		want float64
	}{
		{"every kind", sonnet, usage{input: 100_000, cacheCreation: 40_000, cacheRead: 200_000, output: 20_000}, 0.81},
		{"short prompt", long, usage{input: 80_000, cacheRead: 20_000, output: 1000}, 0.0087},
		{"long prompt, cache included", long, usage{input: 80_000, cacheRead: 20_001, output: 1000}, 0.04350005},
		{"negative counts", sonnet, usage{input: -5, output: 1_000_000}, 15},
		{"past the bound", sonnet, usage{output: 1 << 62}, fleet.MaxSpendAdd},
	} {
		if got := usageCost(tc.p, tc.u); got != tc.want {
			t.Errorf("%s: usageCost = %v, want %v", tc.name, got, tc.want)
		}
	}
}
