package engine

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestProviderOfHosts: every host pattern of an endpoint the SDK knows gets
// the SDK's gen_ai.provider.name, and look-alike hosts of other platforms
// do not take Bedrock's or Vertex's name.
func TestProviderOfHosts(t *testing.T) {
	for _, tt := range []struct {
		url, want string
	}{
		// anthropic.NewClient's default.
		{"https://api.anthropic.com/v1/messages", "anthropic"},
		{"https://API.Anthropic.com./v1/messages", "anthropic"},
		// bedrock.WithConfig: https://bedrock-runtime.{region}.amazonaws.com
		{"https://bedrock-runtime.us-east-1.amazonaws.com/model/m/invoke", "aws.bedrock"},
		{"https://bedrock-runtime.eu-west-3.amazonaws.com:443/v1/messages", "aws.bedrock"},
		{"https://Bedrock-Runtime.us-gov-west-1.amazonaws.com/v1/messages", "aws.bedrock"},
		{"https://bedrock-runtime-fips.us-east-1.amazonaws.com/v1/messages", "aws.bedrock"},
		{"https://vpce-0abc-xyz.bedrock-runtime.us-east-1.vpce.amazonaws.com/v1/messages", "aws.bedrock"},
		{"https://bedrock-runtime.cn-north-1.amazonaws.com.cn/v1/messages", "aws.bedrock"},
		// bedrock.NewMantleClient: https://bedrock-mantle.{region}.api.aws/anthropic
		{"https://bedrock-mantle.us-east-1.api.aws/anthropic/v1/messages", "aws.bedrock"},
		// aws.NewClient: https://aws-external-anthropic.{region}.api.aws, named
		// "anthropic" by the SDK.
		{"https://aws-external-anthropic.us-west-2.api.aws/v1/messages", "anthropic"},
		// vertex.WithCredentials: global, us, eu and regional base URLs.
		{"https://aiplatform.googleapis.com/v1/messages", "gcp.vertex_ai"},
		{"https://aiplatform.us.rep.googleapis.com/v1/messages", "gcp.vertex_ai"},
		{"https://aiplatform.eu.rep.googleapis.com/v1/messages", "gcp.vertex_ai"},
		{"https://us-east5-aiplatform.googleapis.com/v1/messages", "gcp.vertex_ai"},
		{"https://europe-west1-aiplatform.googleapis.com/v1/messages", "gcp.vertex_ai"},
		// googlecloud.NewClient: https://claude.googleapis.com/..., "anthropic".
		{"https://claude.googleapis.com/v1/projects/p/locations/global/workspaces/w/invoke/v1/messages", "anthropic"},
		// foundry.NewClient: https://{resource}.services.ai.azure.com/anthropic/,
		// "anthropic", whatever the resource is called.
		{"https://my-res.services.ai.azure.com/anthropic/v1/messages", "anthropic"},
		{"https://bedrock-runtime.services.ai.azure.com/anthropic/v1/messages", "anthropic"},
		{"https://aiplatform.services.ai.azure.com/anthropic/v1/messages", "anthropic"},
		// Look-alikes outside the platforms' domains.
		{"https://bedrock.example.com/v1/messages", "anthropic"},
		{"https://aiplatform.example.com/v1/messages", "anthropic"},
		{"https://gateway.example.com/aiplatform.googleapis.com/v1/messages", "anthropic"},
		{"https://storage.googleapis.com/v1/messages", "anthropic"},
		{"http://127.0.0.1:8080/v1/messages", "anthropic"},
		{"http://localhost/v1/messages", "anthropic"},
	} {
		req := httptest.NewRequest(http.MethodPost, tt.url, nil)
		if got := providerOf(req); got != tt.want {
			t.Errorf("providerOf(%s) = %q, want %q", tt.url, got, tt.want)
		}
	}
}

// TestSignedBy: each platform's mark of a request its middleware has signed
// or rewritten names that platform's fix, and nothing a caller sets on a
// Messages call of its own does.
func TestSignedBy(t *testing.T) {
	const (
		sigV4 = "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20260101/us-east-1/%s/aws4_request, SignedHeaders=host;x-amz-date, Signature=abc"
		jwt   = "Bearer eyJhbGciOiJSUzI1NiJ9.eyJhdWQiOiJodHRwczovL2FpLmF6dXJlLmNvbSJ9.c2ln"
	)
	for _, tt := range []struct {
		name, method, url, auth, want string
	}{
		{"bedrock invoke", "POST", "https://bedrock-runtime.us-east-1.amazonaws.com/model/anthropic.claude-sonnet-4-6/invoke", "", fixBedrock},
		{"bedrock stream", "POST", "https://bedrock-runtime.us-east-1.amazonaws.com/model/m/invoke-with-response-stream", "Bearer token", fixBedrock},
		{"bedrock behind a path prefix", "POST", "https://proxy.example.com/bedrock/v1/messages", strings.Replace(sigV4, "%s", "bedrock", 1), fixBedrock},
		{"vertex", "POST", "https://us-east5-aiplatform.googleapis.com/v1/projects/p/locations/us-east5/publishers/anthropic/models/claude-sonnet-4-6:rawPredict", "", fixVertex},
		{"vertex stream", "POST", "https://aiplatform.eu.rep.googleapis.com/v1/projects/p/locations/eu/publishers/anthropic/models/m:streamRawPredict", "", fixVertex},
		{"mantle SigV4", "POST", "https://bedrock-mantle.us-east-1.api.aws/anthropic/v1/messages", strings.Replace(sigV4, "%s", "bedrock-mantle", 1), fixMantle},
		{"aws gateway SigV4", "POST", "https://aws-external-anthropic.us-east-1.api.aws/v1/messages", strings.Replace(sigV4, "%s", "aws-external-anthropic", 1), fixAWS},
		{"SigV4 of another service", "POST", "https://gateway.example.com/v1/messages", strings.Replace(sigV4, "%s", "execute-api", 1), fixSigV4},
		{"SigV4 without a scope", "POST", "https://gateway.example.com/v1/messages", "AWS4-HMAC-SHA256 Signature=abc", fixSigV4},
		{"foundry Entra ID", "POST", "https://my-res.services.ai.azure.com/anthropic/v1/messages", jwt, fixFoundry},
		{"google cloud gateway", "POST", "https://claude.googleapis.com/v1/projects/p/locations/global/workspaces/w/invoke/v1/messages", "Bearer ya29.a0AfH6SM", fixGoogleAuth},

		// Requests Damper must run.
		{"first party", "POST", "https://api.anthropic.com/v1/messages", "", ""},
		{"first party, API key", "POST", "https://api.anthropic.com/v1/messages", "Bearer sk-ant-api03-xyz", ""},
		{"first party, OAuth JWT", "POST", "https://api.anthropic.com/v1/messages", jwt, ""},
		{"first party, Google token", "POST", "https://api.anthropic.com/v1/messages", "Bearer ya29.a0AfH6SM", ""},
		{"first party, basic auth", "POST", "https://proxy.example.com/v1/messages", "Basic dXNlcjpwYXNz", ""},
		{"foundry, API key as bearer", "POST", "https://my-res.services.ai.azure.com/anthropic/v1/messages", "Bearer 0123456789abcdef0123456789abcdef", ""},
		{"mantle, API key", "POST", "https://bedrock-mantle.us-east-1.api.aws/anthropic/v1/messages", "Bearer ABSKQmVkcm9ja0FQSUtleQ", ""},
		{"aws gateway, API key", "POST", "https://aws-external-anthropic.us-east-1.api.aws/v1/messages", "Bearer sk-ant-api03-xyz", ""},
		{"google cloud gateway, Anthropic key", "POST", "https://claude.googleapis.com/v1/projects/p/locations/global/workspaces/w/invoke/v1/messages", "Bearer sk-ant-api03-xyz", ""},
		{"vertex host, unrewritten", "POST", "https://us-east5-aiplatform.googleapis.com/v1/messages", "", ""},

		// Other requests pass through, rewritten or not.
		{"vertex count tokens", "POST", "https://us-east5-aiplatform.googleapis.com/v1/projects/p/locations/us-east5/publishers/anthropic/models/count-tokens:rawPredict", "", ""},
		{"SigV4 count tokens", "POST", "https://bedrock-mantle.us-east-1.api.aws/anthropic/v1/messages/count_tokens", strings.Replace(sigV4, "%s", "bedrock-mantle", 1), ""},
		{"SigV4 models", "GET", "https://aws-external-anthropic.us-east-1.api.aws/v1/models", strings.Replace(sigV4, "%s", "aws-external-anthropic", 1), ""},
		{"bedrock path, GET", "GET", "https://bedrock-runtime.us-east-1.amazonaws.com/model/m/invoke", "", ""},
	} {
		req := httptest.NewRequest(tt.method, tt.url, nil)
		if tt.auth != "" {
			req.Header.Set("Authorization", tt.auth)
		}
		if got := SignedBy(req); got != tt.want {
			t.Errorf("%s: signedBy = %q, want %q", tt.name, got, tt.want)
		}

	}
}

// TestRouteDoesNotAllocate: the checks that run on every request allocate
// nothing.
func TestRouteDoesNotAllocate(t *testing.T) {
	for _, url := range []string{
		"https://api.anthropic.com/v1/messages",
		"https://bedrock-runtime.us-east-1.amazonaws.com/v1/messages",
		"https://aiplatform.eu.rep.googleapis.com/v1/messages",
		"https://my-res.services.ai.azure.com/anthropic/v1/messages",
	} {
		req := httptest.NewRequest(http.MethodPost, url, nil)
		req.Header.Set("Authorization", "Bearer sk-ant-api03-xyz")
		if n := testing.AllocsPerRun(100, func() {
			_ = SignedBy(req)
			_ = IsMessagesPath(req)
			_ = providerOf(req)
		}); n != 0 {
			t.Errorf("%s: %v allocations per request", url, n)
		}
	}
}
