// Package estimate estimates the input tokens of a Messages request body
// without calling the API, for the cost ceiling and the rate limiter.
package estimate

import "bytes"

// A rough four bytes of JSON per token, and a flat charge for each base64
// payload (an image or a document), whose size in bytes says little about
// its size in tokens.
const (
	bytesPerToken        = 4
	tokensPerBinaryBlock = 1600
)

// InputTokens estimates the input tokens of a Messages request body: one
// token per four bytes of the JSON body, leaving out every base64 "data"
// string, plus 1,600 tokens for each such string. It errs high for short
// prompts (the JSON keys count) and is only meant to price retries and
// reserve rate limits.
func InputTokens(body []byte) int {
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
	return FromCounts(len(body), len(body)-n, blocks)
}

// FromCounts is the estimate of a body of size bytes, of which dataBytes
// are in blocks base64 "data" strings, for a reader that counted them
// itself.
func FromCounts(size, dataBytes, blocks int) int {
	n := size - dataBytes
	return (n+bytesPerToken-1)/bytesPerToken + blocks*tokensPerBinaryBlock
}
