package dampertest

import (
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"go.uber.org/goleak"

	_ "github.com/damper-ai/damper-go/dampertest/vertexclient" // the fake Vertex's client
)

// TestMain fails the run if the tests leave a goroutine behind: the server,
// the transport and the SDK clients must all clean up after themselves.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newClient returns an SDK client for srv with the SDK's retries off, so
// that every scripted response reaches the test.
func newClient(srv *Server, opts ...option.RequestOption) anthropic.Client {
	all := append(srv.Options(), option.WithMaxRetries(0))
	return anthropic.NewClient(append(all, opts...)...)
}

// newClientPtr is newClient for one-off calls in an expression.
func newClientPtr(srv *Server, opts ...option.RequestOption) *anthropic.Client {
	c := newClient(srv, opts...)
	return &c
}

// params is a minimal Messages request.
func params() anthropic.MessageNewParams {
	return anthropic.MessageNewParams{
		Model:     DefaultModel,
		MaxTokens: 64,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))},
	}
}
