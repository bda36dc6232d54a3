package dampertest

import (
	"bytes"
	"encoding/json"
	"net/http"
	"time"
)

// Request is one entry of the server's request log.
type Request struct {
	// Scenario is the value of the ScenarioHeader request header ("" if
	// absent).
	Scenario string
	// N is the 1-based index of the request among the Messages requests of
	// its scenario, the number its step was chosen by unless some of them
	// took none (see [Server.Script]). It is 0 for a request to any other
	// endpoint of the first-party server, which takes no step; on Bedrock
	// and Vertex every request is numbered, those the platform's checks
	// refused included.
	N int
	// Method and Path are the request's method and URL path (no query),
	// unescaped.
	Method, Path string
	// Header is a copy of the request headers with the values of secrets
	// (x-api-key, authorization and the like) replaced by "REDACTED".
	Header http.Header
	// Body is the request body as received.
	Body []byte
	// Stream reports whether the request asked for a stream: its body's
	// "stream": true on the first-party API, the
	// invoke-with-response-stream path on Bedrock, either the body or the
	// :streamRawPredict method on Vertex.
	Stream bool
	// At is when the request arrived, on the server's clock (the fake Clock
	// given with WithClock, else real time).
	At time.Time
	// RateLimited reports whether the server's rate limits refused the
	// request with a 429 (see [WithRateLimits]); such a request took no
	// step.
	RateLimited bool
	// Platform is what the server fakes: "anthropic", "bedrock" (see
	// [Bedrock]) or "vertex" (see [Vertex]).
	Platform string
	// Model is the model the request named, as the platform read it: from
	// the body on the first-party API, from the path, unescaped, on Bedrock
	// (such as anthropic.claude-sonnet-4-5-20250929-v1:0) and Vertex. ""
	// if it named none, or if the path could not be read.
	Model string
	// SignedAt and Signature are, on Bedrock, the request's X-Amz-Date and
	// the Signature of its SigV4 Authorization header, as far as they
	// could be read: a retry signed afresh has its own. Zero elsewhere.
	SignedAt  time.Time
	Signature string
	// AuthError is why the platform's checks refused the request, its path,
	// its authentication or its body, as the message of the error sent
	// says; "" if it passed them. Always "" on the first-party server,
	// which checks none of them.
	AuthError string
}

// clone returns a copy that shares nothing with r.
func (r Request) clone() Request {
	r.Header = r.Header.Clone()
	r.Body = bytes.Clone(r.Body)
	return r
}

// Redacted is the value that replaces secrets in the request log.
const Redacted = "REDACTED"

// secretHeaders are never kept in the log, so that a test that prints it
// cannot leak a real key.
var secretHeaders = []string{"X-Api-Key", "Authorization", "Proxy-Authorization", "Api-Key", "X-Amz-Security-Token", "Cookie"}

func redact(h http.Header) http.Header {
	h = h.Clone()
	for _, k := range secretHeaders {
		for i := range h[k] {
			h[k][i] = Redacted
		}
	}
	return h
}

// parseBody reads the fields of a Messages request the server echoes or
// reserves (max_tokens, for rate limits). A body that is not JSON leaves
// them empty; a max_tokens out of range is clamped, above any limit.
func parseBody(body []byte) (model string, stream bool, maxTokens int64) {
	var p struct {
		Model     string  `json:"model"`
		Stream    bool    `json:"stream"`
		MaxTokens float64 `json:"max_tokens"`
	}
	_ = json.Unmarshal(body, &p)
	return p.Model, p.Stream, int64(min(max(p.MaxTokens, 0), maxCost))
}
