package damper

import "bytes"

// Token-estimate constants: a rough four bytes of JSON per token, and a
// flat charge for each base64 payload (an image or a document), whose size
// in bytes says little about its size in tokens.
const (
	bytesPerToken        = 4
	tokensPerBinaryBlock = 1600
)

// EstimateInputTokens estimates the input tokens of a Messages request
// body without calling the API: one token per four bytes of the JSON body,
// leaving out every base64 "data" string, plus 1,600 tokens for each such
// string. It errs high for short prompts (the JSON keys count) and is only
// meant to price retries.
func EstimateInputTokens(body []byte) int {
	n := len(body)
	blocks := 0
	key := []byte(`"data":"`)
	for i := 0; ; {
		j := bytes.Index(body[i:], key)
		if j < 0 {
			break
		}
		start := i + j + len(key)
		end := bytes.IndexByte(body[start:], '"')
		if end < 0 {
			break
		}
		n -= end
		blocks++
		i = start + end
	}
	return inputTokens(len(body), len(body)-n, blocks)
}

// inputTokens is the estimate of a body of size bytes, of which dataBytes
// are in blocks base64 "data" strings.
func inputTokens(size, dataBytes, blocks int) int {
	n := size - dataBytes
	return (n+bytesPerToken-1)/bytesPerToken + blocks*tokensPerBinaryBlock
}

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
