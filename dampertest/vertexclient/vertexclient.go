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
// bring in gRPC and start a goroutine when the program starts, the stats
// worker of go.opencensus.io, which never ends. A test binary that imports
// package dampertest alone carries neither; one that imports this package
// and checks for leaked goroutines must ignore that one:
//
//	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction(vertexclient.InitGoroutine))
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

// InitGoroutine is the top function of the goroutine that the vertex
// package's dependencies start at init and never end, for a leak check to
// ignore.
const InitGoroutine = "go.opencensus.io/stats/view.(*worker).start"

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
