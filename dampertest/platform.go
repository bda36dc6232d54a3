package dampertest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// The platforms a Server fakes, as [Request.Platform] names them.
const (
	platformAnthropic = "anthropic"
	platformBedrock   = "bedrock"
	platformVertex    = "vertex"
)

// platform is the service a Server fakes: the first-party API unless
// [Bedrock] or [Vertex] says otherwise.
type platform struct {
	name    string
	region  string
	project string // Vertex only
	err     string // the option's arguments are not valid: every request gets a 500
}

// inbound is what the server's platform made of a request before choosing
// its answer.
type inbound struct {
	counted   bool // counted and numbered: a Messages request, or one a platform refused
	model     string
	stream    bool
	signedAt  time.Time // Bedrock: X-Amz-Date
	signature string    // Bedrock: the Authorization header's Signature
	refusal   *refusal  // nil: the request passed the platform's checks
}

// refusal is a platform's answer to a request its checks turned down: it
// takes no step.
type refusal struct {
	status  int
	kind    string // Bedrock's x-amzn-ErrorType, or Vertex's error.status
	message string
}

// inbound reads r as the server's platform would.
func (s *Server) inbound(r *http.Request, body []byte) inbound {
	p := s.platform
	if p.err != "" {
		return inbound{counted: true, refusal: &refusal{http.StatusInternalServerError, p.kind(http.StatusInternalServerError), p.err}}
	}
	switch p.name {
	case platformBedrock:
		return p.bedrockInbound(r, body)
	case platformVertex:
		return p.vertexInbound(r, body)
	}
	model, stream, _ := parseBody(body)
	return inbound{
		counted: r.Method == http.MethodPost && r.URL.Path == "/v1/messages",
		model:   model, stream: stream,
	}
}

// kind is the platform's name for an error of status, for the server's own
// refusals (rate limits, a bad configuration).
func (p platform) kind(status int) string {
	if p.name == platformVertex {
		return googleStatus(status)
	}
	_, name := bedrockError(status, "")
	return name
}

// writeRefusal sends ref in the platform's error shape.
func (s *Server) writeRefusal(w http.ResponseWriter, r *http.Request, ref refusal) {
	if s.platform.name == platformVertex {
		s.writeBody(r.Context(), w, ref.status, googleErrorJSON(ref.status, ref.kind, ref.message), DropNone)
		return
	}
	s.writeBedrockError(r.Context(), w, ref.status, ref.kind, ref.message, DropNone)
}

// checkBody reports what is wrong with the body of a Messages request as a
// platform receives it, which carries anthropic_version and lacks the
// members the SDK moved to the path: "" if nothing.
func checkBody(body []byte, moved ...string) string {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(body, &obj); err != nil || obj == nil {
		return fmt.Sprintf("the body is not a JSON object (%d bytes)", len(body))
	}
	var version any
	_ = json.Unmarshal(obj["anthropic_version"], &version)
	if v, ok := version.(string); !ok || v == "" {
		if _, present := obj["anthropic_version"]; present {
			return "anthropic_version is " + string(bytes.TrimSpace(obj["anthropic_version"])) + "; want a non-empty string"
		}
		return "required key [anthropic_version] not found"
	}
	for _, k := range moved {
		if _, ok := obj[k]; ok {
			return "extraneous key [" + k + "] is not permitted"
		}
	}
	for _, k := range []string{"max_tokens", "messages"} {
		if _, ok := obj[k]; !ok {
			return "required key [" + k + "] not found"
		}
	}
	return ""
}
