package damper

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
