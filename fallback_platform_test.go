package damper_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
	_ "github.com/damper-ai/damper-go/dampertest/vertexclient" // the fake Vertex's client
)

// platformRig is a first-party primary with Bedrock, then Vertex, to fall
// back to, all fakes that check what the real ones check, reached through
// the SDK's bedrock and vertex packages; in memory, on the bubble's clock
// when made in a synctest bubble.
type platformRig struct {
	primary, bedrock, vertex *dampertest.Server
	d                        *damper.Damper
	client                   anthropic.Client
}

func newPlatformRig(t *testing.T, p damper.Policy) *platformRig {
	t.Helper()
	t.Setenv("AWS_BEARER_TOKEN_BEDROCK", "") // else the SDK sends it in place of SigV4
	r := &platformRig{
		primary: dampertest.NewServer(dampertest.InMemory()),
		bedrock: dampertest.NewServer(dampertest.InMemory(), dampertest.Bedrock("us-east-1")),
		vertex:  dampertest.NewServer(dampertest.InMemory(), dampertest.Vertex("us-east5", "fallback-test")),
	}
	for _, s := range []*dampertest.Server{r.primary, r.bedrock, r.vertex} {
		t.Cleanup(s.Close)
	}
	d, err := damper.New(p, damper.WithRand(half), damper.WithBackends(
		damper.Backend{Name: "bedrock", Provider: damper.ProviderBedrock, Options: r.bedrock.Options()},
		damper.Backend{Name: "vertex", Provider: damper.ProviderVertex, Options: r.vertex.Options()},
	))
	if err != nil {
		t.Fatal(err)
	}
	r.d = d
	r.client = anthropic.NewClient(append([]option.RequestOption{d.Option()}, r.primary.Options()...)...)
	return r
}

// accepted checks that every request srv got passed its platform's checks
// (signature, token, path, body) and sent model, and returns them.
func accepted(t *testing.T, srv *dampertest.Server, model string) []dampertest.Request {
	t.Helper()
	reqs := srv.Requests()
	for i, r := range reqs {
		if r.AuthError != "" || r.Model != model {
			t.Fatalf("request %d to %s: refused (%q), model %q; want accepted, %q", i+1, r.Platform, r.AuthError, r.Model, model)
		}
	}
	return reqs
}

// With the first-party API overloaded, Bedrock answers; with Bedrock
// unavailable too, Vertex does; each under its own model ID, signed or
// authorized by the SDK's own package.
func TestFallbackToBedrockThenVertex(t *testing.T) {
	r := newPlatformRig(t, damper.Policy{MaxAttempts: 1})
	r.primary.Script("", dampertest.Status(529))
	r.bedrock.Script("", dampertest.OK().WithText("from Bedrock"), dampertest.Status(503))
	r.vertex.Script("", dampertest.OK().WithText("from Vertex"))

	for i, want := range []struct{ text, backends, provider string }{
		{"from Bedrock", "primary,bedrock", damper.ProviderBedrock},
		{"from Vertex", "primary,bedrock,vertex", damper.ProviderVertex},
	} {
		var rep damper.Report
		msg, err := r.client.Messages.New(context.Background(), params("claude-sonnet-4-5"), damper.ReportInto(&rep))
		if err != nil {
			t.Fatalf("call %d: %v", i+1, err)
		}
		if msg.Content[0].Text != want.text || backends(rep) != want.backends || rep.Provider != want.provider {
			t.Fatalf("call %d: %q from %s (%s); want %q from %s (%s)", i+1, msg.Content[0].Text, backends(rep), rep.Provider, want.text, want.backends, want.provider)
		}
	}
	accepted(t, r.bedrock, "global.anthropic.claude-sonnet-4-5-20250929-v1:0")
	accepted(t, r.vertex, "claude-sonnet-4-5@20250929")
}

// A stream falls back to Bedrock before its first content: the caller
// reads Bedrock's events, which the SDK's bedrock package translated from
// its event stream, and only those.
func TestFallbackStreamToBedrock(t *testing.T) {
	r := newPlatformRig(t, damper.Policy{MaxAttempts: 1})
	r.primary.Script("", dampertest.OK().WithStream(dampertest.Stream{Text: "first-party", Fault: dampertest.FaultReset, At: 1}))
	r.bedrock.Script("", dampertest.OK().WithStream(dampertest.Stream{Text: "streamed from Bedrock"}))
	var rep damper.Report
	msg := streamWhole(t, r.client, "claude-haiku-4-5", &rep)
	if len(msg.Content) != 1 || msg.Content[0].Text != "streamed from Bedrock" || backends(rep) != "primary,bedrock" || rep.Outcome != damper.OutcomeSuccess {
		t.Fatalf("read %+v from %s (%s); want Bedrock's text alone", msg.Content, backends(rep), rep.Outcome)
	}
	if reqs := accepted(t, r.bedrock, "global.anthropic.claude-haiku-4-5-20251001-v1:0"); !reqs[0].Stream {
		t.Fatal("Bedrock got a plain call, want invoke-with-response-stream")
	}
}

// A Bedrock stream that fails after content ends the call as ambiguous:
// nothing moves to Vertex.
func TestFallbackNotAfterBedrockContent(t *testing.T) {
	r := newPlatformRig(t, damper.Policy{MaxAttempts: 1})
	r.primary.Script("", dampertest.Status(529))
	r.bedrock.Script("", dampertest.OK().WithStream(dampertest.Stream{Text: "a long answer from Bedrock", Fault: dampertest.FaultErrorEvent, At: 4}))
	var rep damper.Report
	s := r.client.Messages.NewStreaming(context.Background(), params("claude-sonnet-4-5"), damper.ReportInto(&rep))
	for s.Next() {
	}
	if !errors.Is(s.Err(), damper.ErrAmbiguous) {
		t.Fatalf("stream error %v, want ErrAmbiguous", s.Err())
	}
	_ = s.Close()
	if r.vertex.Count("") != 0 || rep.Outcome != damper.OutcomeAmbiguous || rep.Backend != "bedrock" {
		t.Fatalf("vertex got %d, outcome %s on %s; want none, ambiguous on bedrock", r.vertex.Count(""), rep.Outcome, rep.Backend)
	}
}

// Every attempt on Bedrock is signed afresh: a retry 400 s after the
// first, far past the 5 minutes a SigV4 signature is good for, is signed
// at its own time, which the fake would refuse otherwise.
func TestFallbackSignsEveryAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newPlatformRig(t, damper.Policy{MaxAttempts: 2, MaxRetryAfter: 10 * time.Minute, PerAttemptTimeout: time.Minute})
		r.primary.Script("", dampertest.Status(529))
		r.bedrock.Script("", dampertest.Status(503).RetryAfter("400"), dampertest.OK())
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		var rep damper.Report
		if _, err := r.client.Messages.New(ctx, params("claude-sonnet-4-5"), damper.ReportInto(&rep)); err != nil {
			t.Fatal(err)
		}
		if backends(rep) != "primary,primary,bedrock,bedrock" {
			t.Fatalf("attempts on %s", backends(rep))
		}
		reqs := accepted(t, r.bedrock, "global.anthropic.claude-sonnet-4-5-20250929-v1:0")
		if len(reqs) != 2 || reqs[0].Signature == reqs[1].Signature || reqs[1].SignedAt.Sub(reqs[0].SignedAt) < 400*time.Second {
			t.Fatalf("Bedrock got %d requests, signed at %v and %v; want two, signed 400 s apart", len(reqs), reqs[0].SignedAt, reqs[len(reqs)-1].SignedAt)
		}
	})
}

// A 4xx from Bedrock (a validation error) is the caller's: it never moves
// to Vertex.
func TestFallbackNotOnBedrock4xx(t *testing.T) {
	r := newPlatformRig(t, damper.Policy{MaxAttempts: 1})
	r.primary.Script("", dampertest.Status(529))
	r.bedrock.Script("", dampertest.Status(400))
	var rep damper.Report
	_, err := r.client.Messages.New(context.Background(), params("claude-sonnet-4-5"), damper.ReportInto(&rep))
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || r.vertex.Count("") != 0 || backends(rep) != "primary,bedrock" {
		t.Fatalf("err %v, vertex got %d, attempts on %s; want Bedrock's 400 and no move", err, r.vertex.Count(""), backends(rep))
	}
	// The error names the request that got it: Bedrock's, not the
	// client's own.
	if !strings.Contains(err.Error(), "/model/global.anthropic.claude-sonnet-4-5-20250929-v1:0/invoke") {
		t.Fatalf("err %q, want it to name Bedrock's URL", err)
	}
}
