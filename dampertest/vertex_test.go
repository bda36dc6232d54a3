package dampertest

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go/dampertest/internal/vertexhook"
)

// vertexModel is a model as Vertex names it.
const vertexModel = "claude-sonnet-4-5@20250929"

// vertexModels is the path of the models of the test project.
const vertexModels = "/v1/projects/my-project/locations/us-east5/publishers/anthropic/models/"

// newVertex starts a Vertex server for my-project in us-east5, on loopback
// or in memory.
func newVertex(t *testing.T, memory bool, opts ...ServerOption) *Server {
	t.Helper()
	if memory {
		opts = append(opts, InMemory())
	}
	srv := NewServer(append(opts, Vertex("us-east5", "my-project"))...)
	t.Cleanup(srv.Close)
	return srv
}

// Plain and streaming calls through the SDK's vertex package carry the
// token, are answered and logged with what Vertex received.
func TestVertexAnswers(t *testing.T) {
	modes(t, func(t *testing.T, memory bool) {
		srv := newVertex(t, memory)
		client := newClient(srv)
		srv.Script("", OK().WithText("Hello from Vertex."),
			OK().WithStream(Stream{Text: "Streamed from Vertex.", ChunkSize: 5}))
		ctx := context.Background()

		msg, err := client.Messages.New(ctx, platformParams(vertexModel))
		if err != nil {
			t.Fatal(err)
		}
		if msg.Content[0].Text != "Hello from Vertex." || msg.Model != vertexModel || msg.Usage.InputTokens != 10 || msg.Usage.OutputTokens != 5 {
			t.Errorf("message %q of %q, usage %d in %d out", msg.Content[0].Text, msg.Model, msg.Usage.InputTokens, msg.Usage.OutputTokens)
		}

		stream := client.Messages.NewStreaming(ctx, platformParams(vertexModel))
		var acc anthropic.Message
		for stream.Next() {
			if err := acc.Accumulate(stream.Current()); err != nil {
				t.Fatal(err)
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		stream.Close()
		if acc.Content[0].Text != "Streamed from Vertex." || acc.Usage.OutputTokens != 6 {
			t.Errorf("stream: %q, %d out", acc.Content[0].Text, acc.Usage.OutputTokens)
		}

		reqs := srv.Requests()
		if len(reqs) != 2 {
			t.Fatalf("%d requests logged, want 2", len(reqs))
		}
		for i, r := range reqs {
			wantPath := vertexModels + vertexModel + []string{":rawPredict", ":streamRawPredict"}[i]
			if r.Platform != "vertex" || r.Model != vertexModel || r.Path != wantPath || r.Stream != (i == 1) || r.N != i+1 {
				t.Errorf("request %d: %s %s %q stream=%v #%d", i, r.Platform, r.Path, r.Model, r.Stream, r.N)
			}
			// Accepted, so the SDK sent the token; the log hides it.
			if r.AuthError != "" || r.Header.Get("Authorization") != Redacted || !r.SignedAt.IsZero() || r.Signature != "" {
				t.Errorf("request %d: refused %q, authorization %q, signed %v %q", i, r.AuthError, r.Header.Get("Authorization"), r.SignedAt, r.Signature)
			}
			var body map[string]any
			if err := json.Unmarshal(r.Body, &body); err != nil {
				t.Fatal(err)
			}
			if _, ok := body["anthropic_version"].(string); !ok || body["model"] != nil || (body["stream"] == true) != (i == 1) {
				t.Errorf("request %d: body %s", i, r.Body)
			}
		}
	})
}

// Model errors are the first-party API's, as Vertex passes them on.
func TestVertexErrors(t *testing.T) {
	srv := newVertex(t, true)
	client := newClient(srv)
	for _, tt := range []struct {
		status   int
		wantType string
	}{{529, "overloaded_error"}, {429, "rate_limit_error"}, {500, "api_error"}, {400, "invalid_request_error"}} {
		srv.Script(http.StatusText(tt.status), Status(tt.status).RetryAfter("2"))
		_, err := client.Messages.New(context.Background(), platformParams(vertexModel), Scenario(http.StatusText(tt.status)))
		var apiErr *anthropic.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != tt.status || string(apiErr.Type()) != tt.wantType ||
			apiErr.Response.Header.Get("retry-after") != "2" {
			t.Errorf("%d: err = %v, want %s", tt.status, err, tt.wantType)
		}
	}

	st := Stream{Text: "The answer is 42.", ChunkSize: 8, Fault: FaultErrorEvent}
	st.At = st.ContentIndex() + 1
	srv.Script("stream", OK().WithStream(st))
	stream := client.Messages.NewStreaming(context.Background(), platformParams(vertexModel), Scenario("stream"))
	defer stream.Close()
	for stream.Next() {
	}
	var apiErr *anthropic.Error
	if !errors.As(stream.Err(), &apiErr) || apiErr.Type() != "overloaded_error" || apiErr.StatusCode != 200 {
		t.Errorf("stream err = %v, want overloaded_error on 200", stream.Err())
	}
}

// Every check of a request is Vertex's, in Google's error shape, and a
// refused request is logged and counted but takes no step.
func TestVertexRefusals(t *testing.T) {
	predict := vertexModels + vertexModel + ":rawPredict"
	streamPredict := vertexModels + vertexModel + ":streamRawPredict"
	const body = `{"anthropic_version":"vertex-2023-10-16","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`
	for _, tt := range []struct {
		name                 string
		method, path, body   string
		auth                 string
		status               int
		googleStatus, prefix string
	}{
		{"good", "POST", predict, body, "Bearer " + VertexToken, 200, "", ""},
		{"good stream", "POST", streamPredict, strings.Replace(body, "{", `{"stream":true,`, 1), "Bearer " + VertexToken, 200, "", ""},
		{"GET", "GET", predict, "", "Bearer " + VertexToken, 404, "NOT_FOUND", "dampertest: the fake Vertex AI serves POST " + vertexModels + "{model}:rawPredict and :streamRawPredict, not GET"},
		{"other method", "POST", vertexModels + vertexModel + ":predict", body, "Bearer " + VertexToken, 404, "NOT_FOUND", "dampertest: the fake Vertex AI serves POST"},
		{"no method", "POST", vertexModels + vertexModel, body, "Bearer " + VertexToken, 404, "NOT_FOUND", "dampertest: the fake Vertex AI serves POST"},
		{"first-party path", "POST", "/v1/messages", body, "Bearer " + VertexToken, 404, "NOT_FOUND", "dampertest: the fake Vertex AI serves POST"},
		{"other project", "POST", strings.Replace(predict, "my-project", "their-project", 1), body, "Bearer " + VertexToken, 404, "NOT_FOUND",
			"dampertest: the fake Vertex AI serves project my-project in us-east5, not project their-project in us-east5"},
		{"other region", "POST", strings.Replace(predict, "us-east5", "europe-west1", 1), body, "Bearer " + VertexToken, 404, "NOT_FOUND",
			"dampertest: the fake Vertex AI serves project my-project in us-east5, not project my-project in europe-west1"},
		{"count tokens", "POST", vertexModels + "count-tokens:rawPredict", body, "Bearer " + VertexToken, 404, "NOT_FOUND", "dampertest: the fake Vertex AI serves Messages only"},
		{"no token", "POST", predict, body, "", 401, "UNAUTHENTICATED", "Request is missing required authentication credential."},
		{"wrong token", "POST", predict, body, "Bearer ya29.other", 401, "UNAUTHENTICATED", "Request had invalid authentication credentials."},
		{"not bearer", "POST", predict, body, "Basic " + VertexToken, 401, "UNAUTHENTICATED", "Request had invalid authentication credentials."},
		{"not JSON", "POST", predict, "[1]", "Bearer " + VertexToken, 400, "INVALID_ARGUMENT", "Invalid request body: the body is not a JSON object (3 bytes)."},
		{"no anthropic_version", "POST", predict, `{"max_tokens":5,"messages":[]}`, "Bearer " + VertexToken, 400, "INVALID_ARGUMENT",
			"Invalid request body: required key [anthropic_version] not found."},
		{"model in the body", "POST", predict, `{"anthropic_version":"v","model":"m","max_tokens":5,"messages":[]}`, "Bearer " + VertexToken, 400, "INVALID_ARGUMENT",
			"Invalid request body: extraneous key [model] is not permitted."},
		{"no max_tokens", "POST", predict, `{"anthropic_version":"v","messages":[]}`, "Bearer " + VertexToken, 400, "INVALID_ARGUMENT",
			"Invalid request body: required key [max_tokens] not found."},
		{"no messages", "POST", predict, `{"anthropic_version":"v","max_tokens":5}`, "Bearer " + VertexToken, 400, "INVALID_ARGUMENT",
			"Invalid request body: required key [messages] not found."},
		{"stream on rawPredict", "POST", predict, strings.Replace(body, "{", `{"stream":true,`, 1), "Bearer " + VertexToken, 400, "INVALID_ARGUMENT",
			"Invalid request body: stream is true but the method is :rawPredict"},
		{"no stream on streamRawPredict", "POST", streamPredict, body, "Bearer " + VertexToken, 400, "INVALID_ARGUMENT",
			"Invalid request body: stream is false or absent but the method is :streamRawPredict"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := newVertex(t, true)
			srv.Script("hand", OK().WithText("first step"))
			send := func(method, path, body, auth string) *http.Response {
				r, err := http.NewRequest(method, MemoryURL+path, strings.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				r.Header.Set(ScenarioHeader, "hand")
				if auth != "" {
					r.Header.Set("Authorization", auth)
				}
				resp, err := Transport(srv.Handler()).RoundTrip(r)
				if err != nil {
					t.Fatal(err)
				}
				return resp
			}
			resp := send(tt.method, tt.path, tt.body, tt.auth)
			defer resp.Body.Close()
			if tt.status == 200 {
				if resp.StatusCode != 200 || srv.Requests()[0].AuthError != "" {
					t.Fatalf("status %d, refused %q", resp.StatusCode, srv.Requests()[0].AuthError)
				}
				return
			}
			var got struct {
				Error struct {
					Code    int
					Message string
					Status  string
				}
			}
			if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
				t.Fatal(err)
			}
			e := got.Error
			if resp.StatusCode != tt.status || e.Code != tt.status || e.Status != tt.googleStatus || !strings.HasPrefix(e.Message, tt.prefix) {
				t.Errorf("%d %+v; want %d %s %q...", resp.StatusCode, e, tt.status, tt.googleStatus, tt.prefix)
			}
			if r := srv.Requests()[0]; r.AuthError != e.Message || r.N != 1 || srv.Count("hand") != 1 {
				t.Errorf("logged #%d refused %q, count %d", r.N, r.AuthError, srv.Count("hand"))
			}
			next := send("POST", predict, body, "Bearer "+VertexToken)
			defer next.Body.Close()
			var msg struct{ Content []textBlock }
			if err := json.NewDecoder(next.Body).Decode(&msg); err != nil || msg.Content[0].Text != "first step" {
				t.Errorf("the next request got %+v, %v; want the first step", msg, err)
			}
		})
	}
}

// Rate limits answer in Google's shape, without the API's rate-limit
// headers.
func TestVertexRateLimits(t *testing.T) {
	srv := newVertex(t, true, WithRateLimits(RateLimits{RequestsPerMinute: 1}))
	client := newClient(srv)
	if _, err := client.Messages.New(context.Background(), platformParams(vertexModel)); err != nil {
		t.Fatal(err)
	}
	_, err := client.Messages.New(context.Background(), platformParams(vertexModel))
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 429 || !strings.Contains(apiErr.RawJSON(), `"status":"RESOURCE_EXHAUSTED"`) {
		t.Fatalf("err = %v, want a 429 RESOURCE_EXHAUSTED", err)
	}
	if h := apiErr.Response.Header; h.Get("retry-after") == "" || h.Get("anthropic-ratelimit-requests-limit") != "" {
		t.Errorf("headers %v; want retry-after and no anthropic-ratelimit-*", h)
	}
}

// Without package vertexclient linked in, a Vertex server's options fail
// every request, before it is sent, with an error that names the import.
func TestVertexWithoutVertexClient(t *testing.T) {
	saved := vertexhook.Options
	vertexhook.Options = nil
	t.Cleanup(func() { vertexhook.Options = saved })
	srv := newVertex(t, true)
	client := anthropic.NewClient(append(srv.Options(), option.WithMaxRetries(0))...)
	_, err := client.Messages.New(context.Background(), platformParams(vertexModel))
	if !errors.Is(err, errNoVertexClient) || !strings.Contains(err.Error(), "dampertest/vertexclient") {
		t.Fatalf("err = %v, want errNoVertexClient", err)
	}
	if n := len(srv.Requests()); n != 0 {
		t.Errorf("%d requests reached the server, want none", n)
	}
}

// A Vertex server with no region, or no project: the SDK's vertex package
// refuses to send, and a request sent by hand gets a 500 that says why.
func TestVertexNoRegionOrProject(t *testing.T) {
	for _, o := range []ServerOption{Vertex("", "p"), Vertex("r", "")} {
		srv := NewServer(o, InMemory())
		defer srv.Close()
		_, err := newClientPtr(srv).Messages.New(context.Background(), platformParams(vertexModel))
		if err == nil || len(srv.Requests()) != 0 {
			t.Errorf("the SDK sent %d requests, err %v; want none sent and an error", len(srv.Requests()), err)
		}
		r, _ := http.NewRequest("POST", MemoryURL+vertexModels+vertexModel+":rawPredict", strings.NewReader("{}"))
		resp, err := Transport(srv.Handler()).RoundTrip(r)
		if err != nil {
			t.Fatal(err)
		}
		var got struct {
			Error struct{ Message, Status string }
		}
		json.NewDecoder(resp.Body).Decode(&got)
		resp.Body.Close()
		if resp.StatusCode != 500 || got.Error.Status != "INTERNAL" || !strings.Contains(got.Error.Message, "is empty") {
			t.Errorf("%d %+v, want a 500 INTERNAL naming the empty argument", resp.StatusCode, got.Error)
		}
	}
}
