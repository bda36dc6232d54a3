package dampertest

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/bedrock"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/protocol/eventstream"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/credentials"
)

// bedrockModel is a model ID as Bedrock names it, with the colon the SDK
// escapes in the path.
const bedrockModel = "anthropic.claude-sonnet-4-5-20250929-v1:0"

// platformParams is a minimal Messages request for model.
func platformParams(model string) anthropic.MessageNewParams {
	p := params()
	p.Model = anthropic.Model(model)
	return p
}

// newBedrock starts a Bedrock server in us-east-1, on loopback or in
// memory, with the SDK's bearer-token override cleared.
func newBedrock(t *testing.T, memory bool, opts ...ServerOption) *Server {
	t.Helper()
	t.Setenv("AWS_BEARER_TOKEN_BEDROCK", "")
	if memory {
		opts = append(opts, InMemory())
	}
	srv := NewServer(append(opts, Bedrock("us-east-1"))...)
	t.Cleanup(srv.Close)
	return srv
}

// modes runs f over loopback and in memory.
func modes(t *testing.T, f func(t *testing.T, memory bool)) {
	for _, memory := range []bool{false, true} {
		name := "loopback"
		if memory {
			name = "memory"
		}
		t.Run(name, func(t *testing.T) { f(t, memory) })
	}
}

// Plain and streaming calls through the SDK's bedrock package are signed,
// answered and logged with what Bedrock received.
func TestBedrockAnswers(t *testing.T) {
	modes(t, func(t *testing.T, memory bool) {
		srv := newBedrock(t, memory)
		client := newClient(srv)
		srv.Script("", OK().WithText("Hello from Bedrock."),
			OK().WithStream(Stream{Text: "Streamed from Bedrock.", ChunkSize: 5}))
		ctx := context.Background()

		var resp *http.Response
		msg, err := client.Messages.New(ctx, platformParams(bedrockModel), option.WithResponseInto(&resp))
		if err != nil {
			t.Fatal(err)
		}
		if msg.Content[0].Text != "Hello from Bedrock." || msg.Model != bedrockModel || msg.Usage.InputTokens != 10 || msg.Usage.OutputTokens != 5 {
			t.Errorf("message %q of %q, usage %d in %d out; want Hello from Bedrock. of %s, 10 in 5 out",
				msg.Content[0].Text, msg.Model, msg.Usage.InputTokens, msg.Usage.OutputTokens, bedrockModel)
		}
		for k, want := range map[string]string{
			"x-amzn-RequestId":                  "req_dampertest__1",
			"request-id":                        "req_dampertest__1",
			"X-Amzn-Bedrock-Input-Token-Count":  "10",
			"X-Amzn-Bedrock-Output-Token-Count": "5",
		} {
			if got := resp.Header.Get(k); got != want {
				t.Errorf("header %s = %q, want %q", k, got, want)
			}
		}

		stream := client.Messages.NewStreaming(ctx, platformParams(bedrockModel), option.WithResponseInto(&resp))
		var acc anthropic.Message
		n := 0
		for stream.Next() {
			n++
			if err := acc.Accumulate(stream.Current()); err != nil {
				t.Fatal(err)
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		stream.Close()
		if acc.Content[0].Text != "Streamed from Bedrock." || n != len(Stream{Text: "Streamed from Bedrock.", ChunkSize: 5}.Events()) ||
			acc.Usage.InputTokens != 10 || acc.Usage.OutputTokens != 6 {
			t.Errorf("stream: %d events, %q, usage %d in %d out", n, acc.Content[0].Text, acc.Usage.InputTokens, acc.Usage.OutputTokens)
		}

		reqs := srv.Requests()
		if len(reqs) != 2 {
			t.Fatalf("%d requests logged, want 2", len(reqs))
		}
		for i, r := range reqs {
			wantPath := "/model/" + bedrockModel + []string{"/invoke", "/invoke-with-response-stream"}[i]
			if r.Platform != "bedrock" || r.Model != bedrockModel || r.Path != wantPath || r.Stream != (i == 1) || r.N != i+1 || r.AuthError != "" {
				t.Errorf("request %d: %s %s %q stream=%v #%d refused %q", i, r.Platform, r.Path, r.Model, r.Stream, r.N, r.AuthError)
			}
			if time.Since(r.SignedAt) > time.Minute || len(r.Signature) != 64 || r.Header.Get("Authorization") != Redacted {
				t.Errorf("request %d: signed at %v, signature %q, authorization %q", i, r.SignedAt, r.Signature, r.Header.Get("Authorization"))
			}
			var body map[string]any
			if err := json.Unmarshal(r.Body, &body); err != nil {
				t.Fatal(err)
			}
			if _, ok := body["anthropic_version"].(string); !ok || body["model"] != nil || body["stream"] != nil {
				t.Errorf("request %d: body %s; want anthropic_version, and no model or stream", i, r.Body)
			}
		}
		if reqs[0].Signature == reqs[1].Signature {
			t.Error("two requests share a signature")
		}
	})
}

// A model ID with slashes (an inference profile's ARN) is one escaped
// segment of the path, and is logged unescaped.
func TestBedrockModelIDs(t *testing.T) {
	srv := newBedrock(t, true)
	client := newClient(srv)
	for _, model := range []string{
		"global.anthropic.claude-sonnet-4-5-20250929-v1:0",
		"arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-sonnet-4-5-20250929-v1:0",
	} {
		msg, err := client.Messages.New(context.Background(), platformParams(model))
		if err != nil {
			t.Fatalf("%s: %v", model, err)
		}
		if r := srv.Requests()[len(srv.Requests())-1]; r.Model != model || msg.Model != model {
			t.Errorf("logged %q, answered %q; want %q", r.Model, msg.Model, model)
		}
	}
}

// Error statuses are sent in Bedrock's shape and reach the caller as the
// SDK's *anthropic.Error, with Bedrock's status.
func TestBedrockErrorStatuses(t *testing.T) {
	srv := newBedrock(t, false)
	client := newClient(srv)
	for _, tt := range []struct {
		step   Step
		status int
		kind   string
		msg    string
	}{
		{Status(400), 400, "ValidationException", "Malformed input request, please reformat your input and try again."},
		{Status(401), 401, "UnrecognizedClientException", ""},
		{Status(403), 403, "AccessDeniedException", ""},
		{Status(404), 404, "ResourceNotFoundException", ""},
		{Status(408), 408, "ModelTimeoutException", ""},
		{Status(424), 424, "ModelErrorException", ""},
		{Status(429).RetryAfter("3"), 429, "ThrottlingException", "Too many requests, please wait before trying again."},
		{Status(500), 500, "InternalServerException", ""},
		{Status(502), 502, "InternalServerException", ""},
		{Status(503), 503, "ServiceUnavailableException", "Bedrock is unable to process your request."},
		{Status(529), 503, "ServiceUnavailableException", ""},
		{Status(529).WithError("overloaded_error", ""), 503, "ServiceUnavailableException", ""},
		{Status(429).WithError("ModelNotReadyException", "").WithMessage("warming up"), 429, "ModelNotReadyException", "warming up"},
		{Status(400).WithError("ServiceQuotaExceededException", ""), 400, "ServiceQuotaExceededException", ""},
	} {
		name := tt.kind + "/" + strconv.Itoa(tt.step.Status) + "/" + tt.step.ErrorType
		t.Run(name, func(t *testing.T) {
			srv.Script(name, tt.step)
			_, err := client.Messages.New(context.Background(), platformParams(bedrockModel), Scenario(name))
			var apiErr *anthropic.Error
			if !errors.As(err, &apiErr) {
				t.Fatalf("err = %v, want *anthropic.Error", err)
			}
			h := apiErr.Response.Header
			if apiErr.StatusCode != tt.status || h.Get("x-amzn-ErrorType") != tt.kind {
				t.Errorf("status %d, x-amzn-ErrorType %q; want %d, %q", apiErr.StatusCode, h.Get("x-amzn-ErrorType"), tt.status, tt.kind)
			}
			var body map[string]string
			if err := json.Unmarshal([]byte(apiErr.RawJSON()), &body); err != nil || len(body) != 1 || body["message"] == "" {
				t.Errorf("body %s; want {\"message\": ...} alone", apiErr.RawJSON())
			}
			if tt.msg != "" && body["message"] != tt.msg {
				t.Errorf("message %q, want %q", body["message"], tt.msg)
			}
			// The SDK reads error.type and error.message, which Bedrock's
			// body does not have.
			if apiErr.Type() != "" || apiErr.Message != "" {
				t.Errorf("Type() %q, Message %q; want both empty", apiErr.Type(), apiErr.Message)
			}
			wantID := "req_dampertest_" + name + "_1"
			if h.Get("x-amzn-RequestId") != wantID || apiErr.RequestID != wantID {
				t.Errorf("x-amzn-RequestId %q, RequestID %q; want %s", h.Get("x-amzn-RequestId"), apiErr.RequestID, wantID)
			}
			if tt.step.Header != nil && h.Get("retry-after") != tt.step.Header.Get("retry-after") {
				t.Errorf("retry-after %q, want the step's", h.Get("retry-after"))
			}
		})
	}

	// A stream request gets the error before any stream, as Bedrock sends it.
	srv.Script("stream", Status(529))
	stream := client.Messages.NewStreaming(context.Background(), platformParams(bedrockModel), Scenario("stream"))
	for stream.Next() {
	}
	var apiErr *anthropic.Error
	if !errors.As(stream.Err(), &apiErr) || apiErr.StatusCode != 503 || apiErr.Response.Header.Get("x-amzn-ErrorType") != "ServiceUnavailableException" {
		t.Errorf("stream err = %v, want a 503 ServiceUnavailableException", stream.Err())
	}
	stream.Close()
}

// An error event mid-stream becomes an exception frame, which the SDK
// reports from stream.Err() as an API error of the exception's name, on
// the 200 response, after the content before it.
func TestBedrockStreamException(t *testing.T) {
	srv := newBedrock(t, true)
	client := newClient(srv)
	for _, tt := range []struct{ errorType, exception string }{
		{"", "serviceUnavailableException"},
		{"overloaded_error", "serviceUnavailableException"},
		{"api_error", "internalServerException"},
		{"rate_limit_error", "throttlingException"},
		{"invalid_request_error", "modelStreamErrorException"},
		{"modelStreamErrorException", "modelStreamErrorException"},
		{"modelTimeoutException", "modelTimeoutException"},
	} {
		t.Run(tt.exception+"/"+tt.errorType, func(t *testing.T) {
			st := Stream{Text: "The answer is 42.", ChunkSize: 8, Fault: FaultErrorEvent, ErrorType: tt.errorType}
			st.At = st.ContentIndex() + 1
			srv.Script(tt.errorType, OK().WithStream(st))
			stream := client.Messages.NewStreaming(context.Background(), platformParams(bedrockModel), Scenario(tt.errorType))
			defer stream.Close()
			var acc anthropic.Message
			for stream.Next() {
				acc.Accumulate(stream.Current())
			}
			var apiErr *anthropic.Error
			if !errors.As(stream.Err(), &apiErr) {
				t.Fatalf("stream err = %v, want *anthropic.Error", stream.Err())
			}
			if string(apiErr.Type()) != tt.exception || apiErr.StatusCode != 200 || apiErr.Message != bedrockMessage(tt.exception) {
				t.Errorf("Type() %q, status %d, message %q; want %q on 200", apiErr.Type(), apiErr.StatusCode, apiErr.Message, tt.exception)
			}
			if len(acc.Content) != 1 || acc.Content[0].Text != "The answ" {
				t.Errorf("content before the exception %+v, want \"The answ\"", acc.Content)
			}
		})
	}
}

// Drops, resets and truncations behave on Bedrock's event stream as on
// the first-party SSE stream.
func TestBedrockStreamFaults(t *testing.T) {
	srv := newBedrock(t, true)
	client := newClient(srv)
	st := Stream{Text: "The answer is 42.", ChunkSize: 8}
	at := st.ContentIndex() + 1
	for _, tt := range []struct {
		name    string
		step    Step
		wantErr bool
		want    string
	}{
		{"clean", OK().WithStream(st), false, "The answer is 42."},
		{"reset", OK().WithStream(Stream{Text: st.Text, ChunkSize: 8, Fault: FaultReset, At: at}), true, "The answ"},
		{"truncate", OK().WithStream(Stream{Text: st.Text, ChunkSize: 8, Fault: FaultTruncate, At: at}), false, "The answ"},
		{"drop mid body", OK().WithStream(st).WithDrop(DropMidBody), true, ""},
		{"drop before headers", OK().WithStream(st).WithDrop(DropBeforeHeaders), true, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv.Script(tt.name, tt.step)
			stream := client.Messages.NewStreaming(context.Background(), platformParams(bedrockModel), Scenario(tt.name))
			defer stream.Close()
			var acc anthropic.Message
			for stream.Next() {
				acc.Accumulate(stream.Current())
			}
			if (stream.Err() != nil) != tt.wantErr {
				t.Errorf("stream err = %v, want an error: %v", stream.Err(), tt.wantErr)
			}
			if tt.want != "" && (len(acc.Content) != 1 || acc.Content[0].Text != tt.want) {
				t.Errorf("content %+v, want %q", acc.Content, tt.want)
			}
		})
	}
}

// The wire format of a Bedrock stream, read without the SDK: event-stream
// frames whose headers and payloads are Bedrock's.
func TestBedrockEventStreamFrames(t *testing.T) {
	srv := newBedrock(t, true)
	st := Stream{Text: "abc", Fault: FaultErrorEvent, ErrorType: "rate_limit_error"}
	st.At = len(st.Events()) - 1 // in place of message_stop
	srv.Script("hand", OK().WithStream(st), OK().WithStream(Stream{Text: "abc"}))
	for i, wantLast := range []string{"exception", "event"} {
		resp := sendSigned(t, srv, signedRequest(t, http.MethodPost, "/model/"+bedrockModel+"/invoke-with-response-stream", `{"anthropic_version":"bedrock-2023-05-31","max_tokens":5,"messages":[]}`))
		if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != "application/vnd.amazon.eventstream" {
			t.Fatalf("status %d, content type %q", resp.StatusCode, ct)
		}
		dec := eventstream.NewDecoder()
		var last eventstream.Message
		var names []string
		for {
			m, err := dec.Decode(resp.Body, nil)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			last = m
			if m.Headers.Get(":message-type").String() != "event" {
				continue
			}
			if m.Headers.Get(":event-type").String() != "chunk" || m.Headers.Get(":content-type").String() != "application/json" {
				t.Errorf("frame headers %v", m.Headers)
			}
			var chunk struct{ Bytes string }
			if err := json.Unmarshal(m.Payload, &chunk); err != nil {
				t.Fatal(err)
			}
			data, err := base64.StdEncoding.DecodeString(chunk.Bytes)
			if err != nil {
				t.Fatal(err)
			}
			var ev struct {
				Type    string          `json:"type"`
				Metrics json.RawMessage `json:"amazon-bedrock-invocationMetrics"`
			}
			if err := json.Unmarshal(data, &ev); err != nil {
				t.Fatalf("chunk %s: %v", data, err)
			}
			names = append(names, ev.Type)
			if ev.Type == "message_stop" && !bytes.Contains(ev.Metrics, []byte(`"inputTokenCount":10,"outputTokenCount":1`)) {
				t.Errorf("message_stop %s, want the invocation metrics", data)
			}
		}
		resp.Body.Close()
		if got := last.Headers.Get(":message-type").String(); got != wantLast {
			t.Fatalf("response %d: last frame is %q, want %q", i, got, wantLast)
		}
		if wantLast == "exception" {
			if last.Headers.Get(":exception-type").String() != "throttlingException" ||
				string(last.Payload) != `{"message":"Too many requests, please wait before trying again."}` {
				t.Errorf("exception frame %v %s", last.Headers, last.Payload)
			}
			if len(names) != len(st.Events())-1 {
				t.Errorf("events %v before the exception", names)
			}
		} else if strings.Join(names, ",") != strings.Join(eventNames(st.Events()), ",") {
			t.Errorf("events %v, want %v", names, eventNames(st.Events()))
		}
	}
}

func eventNames(evs []Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.Name
	}
	return out
}

// signedRequest is a request to an in-memory Bedrock server as the SDK's
// bedrock package sends it, signed now with the test credentials.
func signedRequest(t *testing.T, method, path, body string) *http.Request {
	t.Helper()
	r, err := http.NewRequest(method, MemoryURL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set(ScenarioHeader, "hand")
	sign(t, r, body, BedrockSecretKey, "us-east-1", "bedrock", time.Now())
	return r
}

// sign signs r with the real SigV4 signer, as the SDK's bedrock package
// does.
func sign(t *testing.T, r *http.Request, body, secret, region, service string, at time.Time) {
	t.Helper()
	creds := aws.Credentials{AccessKeyID: BedrockAccessKeyID, SecretAccessKey: secret}
	if err := v4.NewSigner().SignHTTP(context.Background(), creds, r, hexSHA256([]byte(body)), service, region, at); err != nil {
		t.Fatal(err)
	}
}

// sendSigned sends r to an in-memory server as it is.
func sendSigned(t *testing.T, srv *Server, r *http.Request) *http.Response {
	t.Helper()
	resp, err := Transport(srv.Handler()).RoundTrip(r)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// bedrockRefusal reads a refusal: its status, x-amzn-ErrorType and message.
func bedrockRefusal(t *testing.T, resp *http.Response) (int, string, string) {
	t.Helper()
	defer resp.Body.Close()
	var body struct{ Message string }
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header.Get("x-amzn-ErrorType"), body.Message
}

const goodBody = `{"anthropic_version":"bedrock-2023-05-31","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`

// Every check of a request is Bedrock's, and a refused request is logged
// and counted but takes no step: the good request after them gets the
// first.
func TestBedrockRefusals(t *testing.T) {
	invoke := "/model/" + strings.ReplaceAll(bedrockModel, ":", "%3A") + "/invoke"
	for _, tt := range []struct {
		name   string
		req    func(t *testing.T) *http.Request
		status int
		kind   string
		msg    string // a prefix of the message
	}{
		{"good", func(t *testing.T) *http.Request { return signedRequest(t, "POST", invoke, goodBody) }, 200, "", ""},
		{"unescaped colon", func(t *testing.T) *http.Request {
			return signedRequest(t, "POST", "/model/"+bedrockModel+"/invoke", goodBody)
		}, 200, "", ""},
		{"query", func(t *testing.T) *http.Request {
			return signedRequest(t, "POST", invoke+"?b=2+2&a=%7E x&a=1", goodBody)
		}, 200, "", ""},

		{"unknown operation", func(t *testing.T) *http.Request {
			return signedRequest(t, "POST", "/model/m/converse", goodBody)
		}, 404, "UnknownOperationException", "dampertest: the fake Bedrock serves POST /model/{modelId}/invoke"},
		{"first-party path", func(t *testing.T) *http.Request { return signedRequest(t, "POST", "/v1/messages", goodBody) },
			404, "UnknownOperationException", ""},
		{"empty model", func(t *testing.T) *http.Request { return signedRequest(t, "POST", "/model//invoke", goodBody) },
			404, "UnknownOperationException", ""},
		{"GET", func(t *testing.T) *http.Request { return signedRequest(t, "GET", invoke, "") },
			404, "UnknownOperationException", "dampertest: the fake Bedrock serves POST /model/{modelId}/invoke and POST /model/{modelId}/invoke-with-response-stream, not GET"},

		{"unsigned", func(t *testing.T) *http.Request {
			r := signedRequest(t, "POST", invoke, goodBody)
			r.Header.Del("Authorization")
			return r
		}, 403, "MissingAuthenticationTokenException", "Missing Authentication Token"},
		{"bearer token", func(t *testing.T) *http.Request {
			r := signedRequest(t, "POST", invoke, goodBody)
			r.Header.Set("Authorization", "Bearer ABSKexample")
			return r
		}, 403, "UnrecognizedClientException", "dampertest: the fake Bedrock accepts SigV4 signatures only"},
		{"other algorithm", func(t *testing.T) *http.Request {
			r := signedRequest(t, "POST", invoke, goodBody)
			r.Header.Set("Authorization", strings.Replace(r.Header.Get("Authorization"), "AWS4-HMAC-SHA256", "AWS4-HMAC-SHA512", 1))
			return r
		}, 403, "IncompleteSignatureException", `Unsupported AWS 'algorithm': "AWS4-HMAC-SHA512"`},
		{"no signature", func(t *testing.T) *http.Request {
			r := signedRequest(t, "POST", invoke, goodBody)
			a := r.Header.Get("Authorization")
			r.Header.Set("Authorization", a[:strings.Index(a, ", Signature=")])
			return r
		}, 403, "IncompleteSignatureException", "Authorization header requires 'Signature' parameter"},
		{"no date", func(t *testing.T) *http.Request {
			r := signedRequest(t, "POST", invoke, goodBody)
			r.Header.Del("X-Amz-Date")
			return r
		}, 403, "IncompleteSignatureException", "Authorization header requires existence of either a 'X-Amz-Date'"},
		{"bad date", func(t *testing.T) *http.Request {
			r := signedRequest(t, "POST", invoke, goodBody)
			r.Header.Set("X-Amz-Date", "yesterday")
			return r
		}, 403, "IncompleteSignatureException", `X-Amz-Date is "yesterday"`},
		{"changed body", func(t *testing.T) *http.Request {
			r := signedRequest(t, "POST", invoke, goodBody)
			changed := strings.Replace(goodBody, `"max_tokens":5`, `"max_tokens":6`, 1)
			r.Body, r.ContentLength = io.NopCloser(strings.NewReader(changed)), int64(len(changed))
			return r
		}, 403, "InvalidSignatureException", "The request signature we calculated does not match the signature you provided."},
		{"changed signed header", func(t *testing.T) *http.Request {
			r := signedRequest(t, "POST", invoke, goodBody)
			r.Header.Set("Content-Type", "text/plain")
			return r
		}, 403, "InvalidSignatureException", "The request signature we calculated does not match"},
		{"changed path", func(t *testing.T) *http.Request {
			r := signedRequest(t, "POST", invoke, goodBody)
			r.URL.Path, r.URL.RawPath = "/model/other/invoke", ""
			return r
		}, 403, "InvalidSignatureException", "The request signature we calculated does not match"},
		{"wrong secret", func(t *testing.T) *http.Request {
			r := signedRequest(t, "POST", invoke, goodBody)
			sign(t, r, goodBody, "not-the-secret", "us-east-1", "bedrock", time.Now())
			return r
		}, 403, "InvalidSignatureException", "The request signature we calculated does not match"},
		{"wrong access key", func(t *testing.T) *http.Request {
			r := signedRequest(t, "POST", invoke, goodBody)
			r.Header.Set("Authorization", strings.Replace(r.Header.Get("Authorization"), BedrockAccessKeyID, "AKIAOTHER", 1))
			return r
		}, 403, "UnrecognizedClientException", "The security token included in the request is invalid."},
		{"wrong region", func(t *testing.T) *http.Request {
			r := signedRequest(t, "POST", invoke, goodBody)
			sign(t, r, goodBody, BedrockSecretKey, "eu-west-1", "bedrock", time.Now())
			return r
		}, 403, "InvalidSignatureException", "Credential should be scoped to a valid region, not 'eu-west-1'."},
		{"wrong service", func(t *testing.T) *http.Request {
			r := signedRequest(t, "POST", invoke, goodBody)
			sign(t, r, goodBody, BedrockSecretKey, "us-east-1", "sagemaker", time.Now())
			return r
		}, 403, "InvalidSignatureException", "Credential should be scoped to correct service: 'bedrock', not 'sagemaker'."},
		{"scope of another day", func(t *testing.T) *http.Request {
			r := signedRequest(t, "POST", invoke, goodBody)
			r.Header.Set("X-Amz-Date", time.Now().UTC().Add(24*time.Hour).Format(amzDateFormat))
			return r
		}, 403, "InvalidSignatureException", "Date in Credential scope does not match YYYYMMDD"},
		{"expired", func(t *testing.T) *http.Request {
			r := signedRequest(t, "POST", invoke, goodBody)
			sign(t, r, goodBody, BedrockSecretKey, "us-east-1", "bedrock", time.Now().Add(-6*time.Minute))
			return r
		}, 403, "InvalidSignatureException", "Signature expired: "},
		{"not yet current", func(t *testing.T) *http.Request {
			r := signedRequest(t, "POST", invoke, goodBody)
			sign(t, r, goodBody, BedrockSecretKey, "us-east-1", "bedrock", time.Now().Add(6*time.Minute))
			return r
		}, 403, "InvalidSignatureException", "Signature not yet current: "},

		{"not JSON", func(t *testing.T) *http.Request { return signedRequest(t, "POST", invoke, "hello") },
			400, "ValidationException", "Malformed input request: #: the body is not a JSON object (5 bytes), please reformat your input and try again."},
		{"no anthropic_version", func(t *testing.T) *http.Request {
			return signedRequest(t, "POST", invoke, `{"max_tokens":5,"messages":[]}`)
		}, 400, "ValidationException", "Malformed input request: #: required key [anthropic_version] not found"},
		{"anthropic_version not a string", func(t *testing.T) *http.Request {
			return signedRequest(t, "POST", invoke, `{"anthropic_version":1,"max_tokens":5,"messages":[]}`)
		}, 400, "ValidationException", "Malformed input request: #: anthropic_version is 1; want a non-empty string"},
		{"model in the body", func(t *testing.T) *http.Request {
			return signedRequest(t, "POST", invoke, `{"anthropic_version":"v","model":"m","max_tokens":5,"messages":[]}`)
		}, 400, "ValidationException", "Malformed input request: #: extraneous key [model] is not permitted"},
		{"stream in the body", func(t *testing.T) *http.Request {
			return signedRequest(t, "POST", invoke, `{"anthropic_version":"v","stream":false,"max_tokens":5,"messages":[]}`)
		}, 400, "ValidationException", "Malformed input request: #: extraneous key [stream] is not permitted"},
		{"no max_tokens", func(t *testing.T) *http.Request {
			return signedRequest(t, "POST", invoke, `{"anthropic_version":"v","messages":[]}`)
		}, 400, "ValidationException", "Malformed input request: #: required key [max_tokens] not found"},
		{"no messages", func(t *testing.T) *http.Request {
			return signedRequest(t, "POST", invoke, `{"anthropic_version":"v","max_tokens":5}`)
		}, 400, "ValidationException", "Malformed input request: #: required key [messages] not found"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := newBedrock(t, true)
			srv.Script("hand", OK().WithText("first step"), OK().WithText("second step"))
			resp := sendSigned(t, srv, tt.req(t))
			if tt.status == 200 {
				defer resp.Body.Close()
				var msg struct{ Content []textBlock }
				if err := json.NewDecoder(resp.Body).Decode(&msg); err != nil || resp.StatusCode != 200 || msg.Content[0].Text != "first step" {
					t.Fatalf("status %d, %+v, %v; want the first step", resp.StatusCode, msg, err)
				}
				if r := srv.Requests()[0]; r.AuthError != "" || r.N != 1 {
					t.Errorf("logged #%d refused %q", r.N, r.AuthError)
				}
				return
			}
			status, kind, msg := bedrockRefusal(t, resp)
			if status != tt.status || kind != tt.kind || !strings.HasPrefix(msg, tt.msg) {
				t.Errorf("%d %s %q; want %d %s %q...", status, kind, msg, tt.status, tt.kind, tt.msg)
			}
			if resp.Header.Get("x-amzn-RequestId") != "req_dampertest_hand_1" {
				t.Errorf("x-amzn-RequestId %q", resp.Header.Get("x-amzn-RequestId"))
			}
			r := srv.Requests()[0]
			if r.AuthError != msg || r.N != 1 || srv.Count("hand") != 1 {
				t.Errorf("logged #%d refused %q, count %d; want #1 refused %q, count 1", r.N, r.AuthError, srv.Count("hand"), msg)
			}

			// The refusal took no step.
			resp = sendSigned(t, srv, signedRequest(t, "POST", invoke, goodBody))
			defer resp.Body.Close()
			var next struct{ Content []textBlock }
			if err := json.NewDecoder(resp.Body).Decode(&next); err != nil || next.Content[0].Text != "first step" {
				t.Errorf("the next request got %+v, %v; want the first step", next, err)
			}
		})
	}
}

// The SDK's count_tokens is not rewritten for Bedrock, and reaches no
// operation of the fake.
func TestBedrockCountTokens(t *testing.T) {
	srv := newBedrock(t, true)
	_, err := newClientPtr(srv).Messages.CountTokens(context.Background(), anthropic.MessageCountTokensParams{
		Model: bedrockModel, Messages: params().Messages,
	})
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Response.Header.Get("x-amzn-ErrorType") != "UnknownOperationException" {
		t.Fatalf("err = %v, want a 404 UnknownOperationException", err)
	}
}

// With AWS_BEARER_TOKEN_BEDROCK set the SDK sends a bearer token instead of
// signing; the fake refuses it and says why.
func TestBedrockBearerTokenRefused(t *testing.T) {
	srv := newBedrock(t, true)
	t.Setenv("AWS_BEARER_TOKEN_BEDROCK", "ABSKexample-token")
	_, err := newClientPtr(srv).Messages.New(context.Background(), platformParams(bedrockModel))
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 403 || !strings.Contains(apiErr.RawJSON(), "AWS_BEARER_TOKEN_BEDROCK") {
		t.Fatalf("err = %v, want a 403 naming AWS_BEARER_TOKEN_BEDROCK", err)
	}
	r := srv.Requests()[0]
	if !strings.Contains(r.AuthError, "AWS_BEARER_TOKEN_BEDROCK") || r.Header.Get("Authorization") != Redacted {
		t.Errorf("logged refusal %q, authorization %q", r.AuthError, r.Header.Get("Authorization"))
	}
}

// A client whose aws.Config has the wrong secret is refused, as Bedrock
// would refuse it.
func TestBedrockWrongSecret(t *testing.T) {
	srv := newBedrock(t, false)
	cfg := aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider(BedrockAccessKeyID, "wrong", "")}
	client := anthropic.NewClient(bedrock.WithConfig(cfg), option.WithBaseURL(srv.URL()), option.WithMaxRetries(0))
	_, err := client.Messages.New(context.Background(), platformParams(bedrockModel))
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 403 || apiErr.Response.Header.Get("x-amzn-ErrorType") != "InvalidSignatureException" {
		t.Fatalf("err = %v, want a 403 InvalidSignatureException", err)
	}
	if r := srv.Requests()[0]; !strings.Contains(r.AuthError, "The Canonical String for this request should have been") {
		t.Errorf("AuthError %q, want the canonical request", r.AuthError)
	}
}

// A signed request replayed after 6 minutes is stale and refused; a fresh
// one, signed anew by the SDK, is accepted. In a synctest bubble both the
// SDK's signing time and the server's check are the bubble's time.
func TestBedrockStaleSignature(t *testing.T) {
	t.Setenv("AWS_BEARER_TOKEN_BEDROCK", "")
	synctest.Test(t, func(t *testing.T) {
		srv := NewServer(Bedrock("us-east-1"), InMemory())
		defer srv.Close()
		var captured *http.Request
		var capturedBody []byte
		capture := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			capturedBody, _ = io.ReadAll(r.Body)
			captured = r.Clone(r.Context())
			r.Body = io.NopCloser(bytes.NewReader(capturedBody))
			return Transport(srv.Handler()).RoundTrip(r)
		})
		client := newClient(srv, option.WithHTTPClient(&http.Client{Transport: capture}))
		if _, err := client.Messages.New(context.Background(), platformParams(bedrockModel)); err != nil {
			t.Fatal(err)
		}

		time.Sleep(6 * time.Minute)
		replay := captured.Clone(context.Background())
		replay.Body = io.NopCloser(bytes.NewReader(capturedBody))
		status, kind, msg := bedrockRefusal(t, sendSigned(t, srv, replay))
		if status != 403 || kind != "InvalidSignatureException" || !strings.HasPrefix(msg, "Signature expired: ") {
			t.Errorf("replay: %d %s %q; want 403 InvalidSignatureException Signature expired", status, kind, msg)
		}
		if _, err := client.Messages.New(context.Background(), platformParams(bedrockModel)); err != nil {
			t.Fatalf("fresh request: %v", err)
		}
		reqs := srv.Requests()
		if len(reqs) != 3 || !reqs[1].SignedAt.Equal(reqs[0].SignedAt) || reqs[2].SignedAt.Sub(reqs[0].SignedAt) != 6*time.Minute {
			t.Fatalf("log %+v", reqs)
		}
		if reqs[0].AuthError != "" || reqs[1].AuthError != msg || reqs[2].AuthError != "" || reqs[1].Signature != reqs[0].Signature {
			t.Errorf("refusals %q, %q, %q", reqs[0].AuthError, reqs[1].AuthError, reqs[2].AuthError)
		}
		synctest.Wait()
	})
}

// The SDK signs each retry afresh (its retry count header changes), and
// the fake accepts each.
func TestBedrockRetriesAreSignedAfresh(t *testing.T) {
	t.Setenv("AWS_BEARER_TOKEN_BEDROCK", "")
	synctest.Test(t, func(t *testing.T) {
		srv := NewServer(Bedrock("us-east-1"), InMemory())
		defer srv.Close()
		srv.Script("", Status(529), OK())
		client := anthropic.NewClient(append(srv.Options(), option.WithMaxRetries(1))...)
		if _, err := client.Messages.New(context.Background(), platformParams(bedrockModel)); err != nil {
			t.Fatal(err)
		}
		reqs := srv.Requests()
		if len(reqs) != 2 || reqs[0].Signature == reqs[1].Signature || reqs[0].AuthError != "" || reqs[1].AuthError != "" {
			t.Fatalf("log %+v; want two accepted requests with their own signatures", reqs)
		}
		synctest.Wait()
	})
}

// Rate limits answer in Bedrock's shape, without the API's rate-limit
// headers.
func TestBedrockRateLimits(t *testing.T) {
	srv := newBedrock(t, true, WithRateLimits(RateLimits{RequestsPerMinute: 1}))
	client := newClient(srv)
	if _, err := client.Messages.New(context.Background(), platformParams(bedrockModel)); err != nil {
		t.Fatal(err)
	}
	_, err := client.Messages.New(context.Background(), platformParams(bedrockModel))
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 429 || apiErr.Response.Header.Get("x-amzn-ErrorType") != "ThrottlingException" {
		t.Fatalf("err = %v, want a 429 ThrottlingException", err)
	}
	if h := apiErr.Response.Header; h.Get("retry-after") == "" || h.Get("anthropic-ratelimit-requests-limit") != "" {
		t.Errorf("headers %v; want retry-after and no anthropic-ratelimit-*", h)
	}
	if !srv.Requests()[1].RateLimited {
		t.Error("the refusal is not marked RateLimited")
	}
}

// A Bedrock server with no region refuses every request and says why.
func TestBedrockNoRegion(t *testing.T) {
	srv := NewServer(Bedrock(""), InMemory())
	defer srv.Close()
	status, kind, msg := bedrockRefusal(t, sendSigned(t, srv, signedRequest(t, "POST", "/model/m/invoke", goodBody)))
	if status != 500 || kind != "InternalServerException" || !strings.Contains(msg, "region is empty") {
		t.Errorf("%d %s %q", status, kind, msg)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
