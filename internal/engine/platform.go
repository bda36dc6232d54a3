package engine

import (
	"net/http"
	"strings"
)

// Where Damper's Option() must go so that it runs before the middleware of
// a platform option that signs or rewrites the request.
const (
	fixBedrock    = "before bedrock.WithConfig (or bedrock.WithLoadDefaultConfig)"
	fixVertex     = "before vertex.WithGoogleAuth (or vertex.WithCredentials)"
	fixMantle     = "among the opts of bedrock.NewMantleClient"
	fixAWS        = "among the opts of aws.NewClient"
	fixSigV4      = "before the option that signs requests"
	fixFoundry    = "among the opts of foundry.NewClient"
	fixGoogleAuth = "before the Options of googlecloud.NewClient"
)

// IsMessagesPath reports whether req creates a message (POST /v1/messages,
// the Beta variant included): the only call Damper retries, once it is
// sure no platform has signed it yet (SignedBy).
func IsMessagesPath(req *http.Request) bool {
	return req.Method == http.MethodPost && strings.HasSuffix(req.URL.Path, "/v1/messages")
}

// SignedBy returns where Damper's option belongs when req is a Messages call
// that a platform's middleware has already signed or rewritten, and "" for
// any other request.
//
// Each signal is one that only the platform's own middleware puts on a
// Messages request, so a first-party call with the caller's own headers
// (an API key or OAuth token, which the SDK sends as "Authorization:
// Bearer") cannot trip it:
//
//   - Bedrock (bedrock.WithConfig, SigV4 or bearer token) and Vertex
//     (vertex.WithCredentials) move a Messages call to their own paths:
//     POST /model/{model}/invoke[-with-response-stream] and
//     POST .../publishers/anthropic/models/{model}:[stream]rawPredict.
//     Vertex adds its OAuth token in the HTTP client's transport, below
//     every middleware, so only the path shows.
//   - Bedrock Mantle and the AWS gateway keep the path and sign with SigV4:
//     an "Authorization: AWS4-HMAC-SHA256" header, whose credential scope
//     names the signing service (bedrock-mantle, aws-external-anthropic).
//   - Foundry with an Entra ID token provider adds "Authorization: Bearer"
//     with a JWT, on a *.services.ai.azure.com host. A Foundry API key is
//     sent as x-api-key, or by first-party options as a bearer token that is
//     not a JWT, so neither trips it.
//   - The Google Cloud gateway (googlecloud.NewClient) adds
//     "Authorization: Bearer ya29..." (a Google OAuth access token) on
//     claude.googleapis.com.
//
// A caller who puts an Entra ID or Google access token on those hosts
// themselves is refused too, as the two cannot be told apart: such a token
// belongs in foundry's AzureADTokenProvider or googlecloud's TokenSource,
// which every attempt then calls.
func SignedBy(req *http.Request) string {
	if req.Method != http.MethodPost {
		return ""
	}
	p := req.URL.Path
	if !strings.HasSuffix(p, "/v1/messages") {
		switch {
		case strings.Contains(p, "/model/") && (strings.HasSuffix(p, "/invoke") || strings.HasSuffix(p, "/invoke-with-response-stream")):
			return fixBedrock
		case strings.Contains(p, "/publishers/anthropic/models/") && !strings.HasSuffix(p, "/count-tokens:rawPredict") &&
			(strings.HasSuffix(p, ":rawPredict") || strings.HasSuffix(p, ":streamRawPredict")):
			return fixVertex
		}
		return ""
	}
	auth := req.Header.Get("Authorization")
	if auth == "" {
		return ""
	}
	if rest, ok := strings.CutPrefix(auth, "AWS4-HMAC-SHA256 "); ok {
		switch sigV4Service(rest) {
		case "bedrock-mantle":
			return fixMantle
		case "aws-external-anthropic":
			return fixAWS
		case "bedrock":
			return fixBedrock
		}
		return fixSigV4
	}
	token, ok := strings.CutPrefix(auth, "Bearer ")
	if !ok {
		return ""
	}
	host := hostOf(req)
	switch {
	case strings.HasSuffix(host, ".services.ai.azure.com") && strings.HasPrefix(token, "eyJ"):
		// A JWT: base64url of a JSON header, `{"`.
		return fixFoundry
	case host == "claude.googleapis.com" && strings.HasPrefix(token, "ya29."):
		return fixGoogleAuth
	}
	return ""
}

// sigV4Service returns the service of the credential scope of a SigV4
// Authorization header, given without its algorithm:
// "Credential=AKID/20250101/us-east-1/bedrock-mantle/aws4_request, ...".
func sigV4Service(auth string) string {
	_, scope, ok := strings.Cut(auth, "Credential=")
	if !ok {
		return ""
	}
	scope, _, _ = strings.Cut(scope, ",")
	scope, ok = strings.CutSuffix(scope, "/aws4_request")
	if !ok {
		return ""
	}
	return scope[strings.LastIndexByte(scope, '/')+1:]
}

// providerOf names the platform a request goes to, for reports, spans and
// metrics, with the SDK's values of gen_ai.provider.name. It decides by host,
// as the host of each platform's default endpoint is its own:
//
//   - "aws.bedrock": Amazon Bedrock (bedrock.WithConfig,
//     bedrock-runtime.{region}.amazonaws.com, FIPS and VPC endpoints
//     included) and Bedrock Mantle (bedrock.NewMantleClient,
//     bedrock-mantle.{region}.api.aws): an AWS host with a label that starts
//     with bedrock-runtime or bedrock-mantle.
//   - "gcp.vertex_ai": Vertex AI (vertex.WithCredentials): a googleapis.com
//     host whose first label holds "aiplatform": aiplatform.googleapis.com,
//     {region}-aiplatform.googleapis.com, and the multi-region
//     aiplatform.{us,eu}.rep.googleapis.com.
//   - "anthropic": every other host, among them the first-party API
//     (api.anthropic.com) and the platforms that serve the first-party API
//     and that the SDK names so: the AWS gateway
//     (aws-external-anthropic.{region}.api.aws), Microsoft Foundry
//     ({resource}.services.ai.azure.com) and the Google Cloud gateway
//     (claude.googleapis.com).
//
// A platform reached through a base URL of its own (a proxy or private
// link) is named by that host, so "anthropic" unless it is one of the above.
func providerOf(req *http.Request) string {
	host := hostOf(req)
	switch {
	case isBedrockHost(host):
		return "aws.bedrock"
	case isVertexHost(host):
		return "gcp.vertex_ai"
	}
	return "anthropic"
}

// hostOf returns the host of req's URL in lower case, without port or
// trailing dot. It allocates only for a host with upper-case letters.
func hostOf(req *http.Request) string {
	return strings.ToLower(strings.TrimSuffix(req.URL.Hostname(), "."))
}

// isBedrockHost reports whether host is an AWS host with a label that
// starts with bedrock-runtime or bedrock-mantle.
func isBedrockHost(host string) bool {
	if !strings.HasSuffix(host, ".amazonaws.com") && !strings.HasSuffix(host, ".amazonaws.com.cn") && !strings.HasSuffix(host, ".api.aws") {
		return false
	}
	return strings.HasPrefix(host, "bedrock-runtime") || strings.Contains(host, ".bedrock-runtime") ||
		strings.HasPrefix(host, "bedrock-mantle") || strings.Contains(host, ".bedrock-mantle")
}

// isVertexHost reports whether host is a googleapis.com host whose first
// label holds "aiplatform".
func isVertexHost(host string) bool {
	first, _, _ := strings.Cut(host, ".")
	return strings.HasSuffix(host, ".googleapis.com") && strings.Contains(first, "aiplatform")
}
