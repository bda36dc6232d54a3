package dampertest

import (
	"errors"
	"net/http"
	"net/url"
	"strings"

	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go/dampertest/internal/vertexhook"
)

// VertexToken is the OAuth access token a server made with [Vertex]
// accepts, and that [Server.Options] sends. It is made up.
const VertexToken = "ya29.dampertest-token"

// Vertex makes the server a fake Vertex AI endpoint for project in region,
// such as us-east5 or global, for clients built with the SDK's vertex
// package (see [Server.Options], and package
// github.com/damper-ai/damper-go/dampertest/vertexclient, which a test must
// import for them).
//
// It serves POST
// /v1/projects/{project}/locations/{region}/publishers/anthropic/models/{model}:rawPredict
// and :streamRawPredict, and checks each request as Vertex would before any
// step: the path, with this project and region (else 404 NOT_FOUND); the
// header Authorization: Bearer [VertexToken] (else 401 UNAUTHENTICATED);
// the body, a JSON object with anthropic_version, max_tokens and messages,
// without the model the SDK moves to the path, and whose stream agrees
// with the method (else 400 INVALID_ARGUMENT). A refusal is Google's shape,
// {"error": {"code", "message", "status"}}; it is logged, with its reason
// in [Request.AuthError], and counted, and takes no step.
//
// A request that passes is answered by its step exactly as on the
// first-party server, SSE streams and Anthropic error bodies included, as
// Vertex serves the model's own answers.
func Vertex(region, project string) ServerOption {
	return func(s *Server) {
		s.platform = platform{name: platformVertex, region: region, project: project}
		switch {
		case region == "":
			s.platform.err = "dampertest: the Vertex region is empty; want one such as us-east5 or global"
		case project == "":
			s.platform.err = "dampertest: the Vertex project is empty"
		}
	}
}

// errNoVertexClient fails the requests of a client whose options could not
// reach Vertex.
var errNoVertexClient = errors.New("dampertest: Server.Options of a Vertex server needs the SDK's vertex package: " +
	`add import _ "github.com/damper-ai/damper-go/dampertest/vertexclient" to the test`)

// vertexOptions reaches the server through the SDK's own Vertex
// adaptation, with a static token: nothing is looked up in the
// environment or on the network. The vertex package comes from package
// vertexclient, which links it in: its dependencies start a goroutine when
// the program starts and bring gRPC, which a test of the first-party API
// should not have to carry.
func (s *Server) vertexOptions() []option.RequestOption {
	// Given before vertex's option, which wraps the client's transport with
	// its OAuth one, so that the SDK itself adds the token in both modes.
	client := &http.Client{}
	if s.ts == nil {
		client.Transport = Transport(s.Handler())
	}
	var opts []option.RequestOption
	if vertexhook.Options != nil {
		opts = vertexhook.Options(s.platform.region, s.platform.project, VertexToken, client)
	} else {
		opts = []option.RequestOption{option.WithoutEnvironmentDefaults(),
			option.WithMiddleware(func(*http.Request, option.MiddlewareNext) (*http.Response, error) {
				return nil, errNoVertexClient
			})}
	}
	// The base URL comes after vertex's option, which sets its own.
	return append(opts, option.WithBaseURL(s.URL()))
}

// The methods of Vertex's publisher models the server serves.
const (
	vertexPredict = "rawPredict"
	vertexStream  = "streamRawPredict"
)

// vertexPath reads the project, the region, the model and the method from
// the escaped path of a request to Vertex,
// /v1/projects/{project}/locations/{region}/publishers/anthropic/models/{model}:{method}.
func vertexPath(escaped string) (project, region, model, method string, ok bool) {
	parts := strings.Split(escaped, "/")
	if len(parts) != 10 || parts[0] != "" || parts[1] != "v1" || parts[2] != "projects" || parts[4] != "locations" ||
		parts[6] != "publishers" || parts[7] != "anthropic" || parts[8] != "models" {
		return "", "", "", "", false
	}
	var segs [3]string
	for i, p := range []string{parts[3], parts[5], parts[9]} {
		seg, err := url.PathUnescape(p)
		if err != nil || seg == "" {
			return "", "", "", "", false
		}
		segs[i] = seg
	}
	i := strings.LastIndexByte(segs[2], ':')
	if i <= 0 {
		return "", "", "", "", false
	}
	return segs[0], segs[1], segs[2][:i], segs[2][i+1:], true
}

// vertexInbound checks r as Vertex would: its path, then its token, then
// its body.
func (p platform) vertexInbound(r *http.Request, body []byte) inbound {
	in := inbound{counted: true}
	project, region, model, method, ok := vertexPath(r.URL.EscapedPath())
	in.model = model
	_, stream, _ := parseBody(body)
	in.stream = stream || method == vertexStream
	refuse := func(status int, msg string) inbound {
		in.refusal = &refusal{status, googleStatus(status), msg}
		return in
	}
	want := "/v1/projects/" + p.project + "/locations/" + p.region + "/publishers/anthropic/models/{model}"
	switch {
	case r.Method != http.MethodPost || !ok || (method != vertexPredict && method != vertexStream):
		return refuse(http.StatusNotFound, "dampertest: the fake Vertex AI serves POST "+want+":rawPredict and :streamRawPredict, not "+
			r.Method+" "+r.URL.EscapedPath())
	case project != p.project || region != p.region:
		return refuse(http.StatusNotFound, "dampertest: the fake Vertex AI serves project "+p.project+" in "+p.region+
			", not project "+project+" in "+region)
	case model == "count-tokens":
		return refuse(http.StatusNotFound, "dampertest: the fake Vertex AI serves Messages only, not count-tokens")
	}
	switch auth := r.Header.Get("Authorization"); {
	case auth == "":
		return refuse(http.StatusUnauthorized, "Request is missing required authentication credential. "+
			"Expected OAuth 2 access token, login cookie or other valid authentication credential.")
	case auth != "Bearer "+VertexToken:
		return refuse(http.StatusUnauthorized, "Request had invalid authentication credentials. "+
			"Expected OAuth 2 access token, login cookie or other valid authentication credential. "+
			"(dampertest: want Authorization: Bearer VertexToken)")
	}
	if problem := checkBody(body, "model"); problem != "" {
		return refuse(http.StatusBadRequest, "Invalid request body: "+problem+".")
	}
	if stream != (method == vertexStream) {
		return refuse(http.StatusBadRequest, "Invalid request body: stream is "+streamOf(stream)+
			" but the method is :"+method+"; want stream true with :streamRawPredict only.")
	}
	return in
}

func streamOf(stream bool) string {
	if stream {
		return "true"
	}
	return "false or absent"
}

// googleStatus is the status name Google APIs send with an HTTP status.
func googleStatus(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "INVALID_ARGUMENT"
	case http.StatusUnauthorized:
		return "UNAUTHENTICATED"
	case http.StatusForbidden:
		return "PERMISSION_DENIED"
	case http.StatusNotFound:
		return "NOT_FOUND"
	case http.StatusConflict:
		return "ABORTED"
	case http.StatusTooManyRequests:
		return "RESOURCE_EXHAUSTED"
	case http.StatusNotImplemented:
		return "UNIMPLEMENTED"
	case http.StatusServiceUnavailable:
		return "UNAVAILABLE"
	case http.StatusGatewayTimeout:
		return "DEADLINE_EXCEEDED"
	}
	if status >= 500 {
		return "INTERNAL"
	}
	return "FAILED_PRECONDITION"
}

// googleErrorJSON is the error body of a Google API.
func googleErrorJSON(code int, status, msg string) []byte {
	type googleError struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
		Status  string `json:"status"`
	}
	return marshal(struct {
		Error googleError `json:"error"`
	}{googleError{code, msg, status}})
}
