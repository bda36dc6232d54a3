package damper

import (
	"errors"
	"net/http"
	"strings"
)

var errOptionOrder = errors.New("damper: the request reached Damper already signed for Bedrock or Vertex; give damper's Option() before bedrock.WithConfig or vertex.WithGoogleAuth so that every attempt is signed afresh")

// isMessagesCall reports whether req creates a message (POST /v1/messages,
// the Beta variant included), the only call Damper retries.
func isMessagesCall(req *http.Request) bool {
	return req.Method == http.MethodPost && strings.HasSuffix(req.URL.Path, "/v1/messages")
}

// isSignedPlatformCall reports whether req is a Messages call that a
// Bedrock or Vertex middleware has already rewritten: Damper was given
// after the platform option.
func isSignedPlatformCall(req *http.Request) bool {
	p := req.URL.Path
	return req.Method == http.MethodPost &&
		(strings.Contains(p, "/model/") && (strings.HasSuffix(p, "/invoke") || strings.HasSuffix(p, "/invoke-with-response-stream")) ||
			strings.HasSuffix(p, ":rawPredict") || strings.HasSuffix(p, ":streamRawPredict"))
}

// providerOf names the platform a request goes to, for reports and spans.
func providerOf(req *http.Request) string {
	host := req.URL.Hostname()
	switch {
	case strings.Contains(host, "bedrock"):
		return "aws.bedrock"
	case strings.HasSuffix(host, "googleapis.com") && strings.Contains(host, "aiplatform"):
		// Regional, global and multi-region (aiplatform.eu.rep.googleapis.com) hosts.
		return "gcp.vertex_ai"
	}
	return "anthropic"
}
