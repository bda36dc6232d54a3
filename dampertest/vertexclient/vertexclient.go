// Package vertexclient links the SDK's vertex package into dampertest. A
// test that talks to a fake Vertex AI endpoint (see [dampertest.Vertex])
// imports it for its side effect:
//
//	import _ "github.com/damper-ai/damper-go/dampertest/vertexclient"
//
// and [dampertest.Server.Options] of a Vertex server then returns
// option.WithHTTPClient, vertex.WithCredentials with
// [dampertest.VertexToken] as a static token, and option.WithBaseURL, in
// that order: the SDK's own OAuth transport wraps the client given before
// it, so the token is sent by the SDK, over loopback or in memory.
// Without this import those options fail every request with an error that
// names it.
//
// It is a package of its own because the vertex package's dependencies
// bring in gRPC and Google's client libraries, which a test binary that
// imports package dampertest alone does without.
package vertexclient

import (
	"context"
	"net/http"

	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/anthropics/anthropic-sdk-go/v2/vertex"
	"golang.org/x/oauth2"
	"golang.org/x/oauth2/google"

	"github.com/damper-ai/damper-go/dampertest/internal/vertexhook"
)

func init() {
	vertexhook.Options = options
}

// options builds credentials that hold a static token and a project, so
// that the vertex package looks nothing up: no environment, no metadata
// server.
func options(region, project, token string, client *http.Client) []option.RequestOption {
	creds := &google.Credentials{
		ProjectID:   project,
		TokenSource: oauth2.StaticTokenSource(&oauth2.Token{AccessToken: token}),
	}
	return []option.RequestOption{
		option.WithHTTPClient(client),
		vertex.WithCredentials(context.Background(), region, project, creds),
	}
}
