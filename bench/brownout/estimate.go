package brownout

import "bytes"

// damperEstimate is Damper's estimate of a Messages body's input tokens,
// which the rate-limit report quotes: a token per four bytes of the JSON
// body, leaving out every base64 "data" string, plus 1,600 tokens for each
// such string. It is a copy of the library's estimator (internal/estimate
// in the root module), kept here on purpose, as a module imports no other
// module's internal packages; TestCountInputTokens checks it against the
// prompt's count.
func damperEstimate(body []byte) int {
	const bytesPerToken, tokensPerBinaryBlock = 4, 1600
	n, blocks := len(body), 0
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
	return (n+bytesPerToken-1)/bytesPerToken + blocks*tokensPerBinaryBlock
}
