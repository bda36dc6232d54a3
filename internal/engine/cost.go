package engine

import "github.com/damper-ai/damper-go/fleet"

// attemptCost returns the estimated cost in dollars of one attempt: the
// estimated input at the input price plus max_tokens at the output price,
// the reservation a retry repeats.
func attemptCost(p Price, inputTokens, maxTokens int) float64 {
	in, out := p.InputPerMTok, p.OutputPerMTok
	if p.LongContextTokens > 0 && inputTokens > p.LongContextTokens {
		in, out = p.LongInputPerMTok, p.LongOutputPerMTok
	}
	return (float64(inputTokens)*in + float64(maxTokens)*out) / 1e6
}

// usageCost returns the cost in dollars of an answer's usage u at price
// p: input tokens at the input price, cache writes at 1.25× and cache
// reads at 0.1× of it, output tokens at the output price; the
// long-context prices when the prompt (input, cache writes and reads)
// passes p.LongContextTokens. A count below 0 counts as 0, and the cost
// is at most fleet.MaxSpendAdd, whatever the usage an upstream reports.
func usageCost(p Price, u usage) float64 {
	input, cacheWrite, cacheRead, output := max(u.input, 0), max(u.cacheCreation, 0), max(u.cacheRead, 0), max(u.output, 0)
	in, out := p.InputPerMTok, p.OutputPerMTok
	if p.LongContextTokens > 0 && input+cacheWrite+cacheRead > int64(p.LongContextTokens) {
		in, out = p.LongInputPerMTok, p.LongOutputPerMTok
	}
	// In thousandths of a dollar per million tokens, so that 1.25× and
	// 0.1× of a price in whole cents stay exact.
	perMTok := float64(input)*in*1000 + float64(cacheWrite)*in*1250 + float64(cacheRead)*in*100 + float64(output)*out*1000
	return min(perMTok/1e9, fleet.MaxSpendAdd)
}
