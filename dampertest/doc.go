// Package dampertest provides a fake Anthropic Messages API and a fake
// clock, for testing code that calls the API through the official Go SDK
// (github.com/anthropics/anthropic-sdk-go/v2), in the spirit of
// net/http/httptest.
//
// A [Server] answers POST /v1/messages from scripts: per scenario, a list of
// [Step] values, one per request, that set the status, the headers
// (retry-after, retry-after-ms, x-should-retry, request-id), the error type
// and error code of an Anthropic error body, a delay, a dropped or stalled
// connection, the message's id, or an SSE [Stream] that ends cleanly or
// fails at a chosen event. The
// request header [ScenarioHeader], set from the SDK with [Scenario], picks
// the scenario. The server logs what it receives, with secrets redacted.
//
//	srv := dampertest.NewServer()
//	defer srv.Close()
//	srv.Script("busy", dampertest.Status(529), dampertest.OK())
//	client := anthropic.NewClient(srv.Options()...)
//	msg, err := client.Messages.New(ctx, params, dampertest.Scenario("busy"))
//
// Made with [Bedrock] or [Vertex], the same Server is a fake Amazon Bedrock
// runtime or Vertex AI endpoint, reached through the SDK's own bedrock and
// vertex packages (for Vertex, with package dampertest/vertexclient
// imported), so that the requests are rewritten, signed and decoded as in
// production. The same steps script it, and it checks what the platform
// would: the path, the SigV4 signature (with [BedrockAccessKeyID] and
// [BedrockSecretKey]) or the OAuth token ([VertexToken]), and the body. It
// answers in the platform's shape, Bedrock's event stream and error bodies
// included, and logs what the platform received: the model from the path,
// the signing time and signature, and why a request was refused.
//
//	srv := dampertest.NewServer(dampertest.Bedrock("us-east-1"))
//	client := anthropic.NewClient(srv.Options()...) // bedrock.WithConfig, then the base URL
//
// A [Clock] is a virtual clock whose time moves only when told to, so that
// waits, backoffs and timeouts are exact and tests never sleep. Given to the
// server with [WithClock], it also times the server's delays.
//
// [Transport] serves any http.Handler, such as [Server.Handler], in memory,
// for simulations that make thousands of calls without a network. A Server
// made with [InMemory] listens nowhere and is reached that way; made inside
// a testing/synctest bubble, it waits on the bubble's clock.
package dampertest
