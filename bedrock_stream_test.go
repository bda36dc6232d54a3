package damper_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/bedrock"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/protocol/eventstream"
	"github.com/aws/aws-sdk-go-v2/aws/protocol/eventstream/eventstreamapi"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// bedrockEvents are the events of a whole Bedrock stream whose message is
// id and whose one text block is text.
func bedrockEvents(id, text string) []string {
	return []string{
		`{"type":"message_start","message":{"id":"` + id + `","type":"message","role":"assistant","model":"claude-sonnet-4-6","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":1}}}`,
		`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"` + text + `"}}`,
		`{"type":"content_block_stop","index":0}`,
		`{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":2}}`,
		`{"type":"message_stop","amazon-bedrock-invocationMetrics":{"inputTokenCount":12,"outputTokenCount":2,"invocationLatency":90,"firstByteLatency":40}}`,
	}
}

// frames builds a body in AWS's event-stream framing, as Bedrock's
// InvokeModelWithResponseStream sends it.
type frames struct {
	t   *testing.T
	buf bytes.Buffer
}

func (f *frames) encode(m eventstream.Message) {
	f.t.Helper()
	if err := eventstream.NewEncoder().Encode(&f.buf, m); err != nil {
		f.t.Fatal(err)
	}
}

// chunks adds one chunk event per Anthropic event, its JSON base64-encoded
// under "bytes".
func (f *frames) chunks(events ...string) *frames {
	for _, e := range events {
		payload, _ := json.Marshal(map[string]string{"bytes": base64.StdEncoding.EncodeToString([]byte(e))})
		m := eventstream.Message{Payload: payload}
		m.Headers.Set(eventstreamapi.MessageTypeHeader, eventstream.StringValue(eventstreamapi.EventMessageType))
		m.Headers.Set(eventstreamapi.EventTypeHeader, eventstream.StringValue("chunk"))
		f.encode(m)
	}
	return f
}

// exception adds an exception frame, Bedrock's mid-stream failure.
func (f *frames) exception(name string) *frames {
	m := eventstream.Message{Payload: []byte(`{"message":"` + name + ` from the test server"}`)}
	m.Headers.Set(eventstreamapi.MessageTypeHeader, eventstream.StringValue(eventstreamapi.ExceptionMessageType))
	m.Headers.Set(eventstreamapi.ExceptionTypeHeader, eventstream.StringValue(name))
	f.encode(m)
	return f
}

// errorFrame adds an error frame, whose code is in a header.
func (f *frames) errorFrame(code string) *frames {
	m := eventstream.Message{}
	m.Headers.Set(eventstreamapi.MessageTypeHeader, eventstream.StringValue(eventstreamapi.ErrorMessageType))
	m.Headers.Set(eventstreamapi.ErrorCodeHeader, eventstream.StringValue(code))
	m.Headers.Set(eventstreamapi.ErrorMessageHeader, eventstream.StringValue(code+" from the test server"))
	f.encode(m)
	return f
}

// bedrockStreamFake answers attempt i with bodies[i], and records the path
// and signature of each attempt.
type bedrockStreamFake struct {
	bodies [][]byte
	mu     sync.Mutex
	paths  []string
	auths  []string
}

func (f *bedrockStreamFake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.paths = append(f.paths, r.URL.Path)
	f.auths = append(f.auths, r.Header.Get("Authorization"))
	n := len(f.paths)
	f.mu.Unlock()
	if n > len(f.bodies) {
		w.WriteHeader(http.StatusTeapot) // an attempt the test did not expect
		return
	}
	w.Header().Set("Content-Type", "application/vnd.amazon.eventstream")
	w.Header().Set("X-Amzn-Requestid", "req_bedrock")
	w.Write(f.bodies[n-1])
}

func (f *bedrockStreamFake) attempts() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.paths)
}

// verdicts records Damper's own classification of every failed attempt.
type verdicts struct {
	mu   sync.Mutex
	list []damper.Classification
}

func (v *verdicts) record(_ damper.Failure, c damper.Classification) damper.Classification {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.list = append(v.list, c)
	return c
}

func (v *verdicts) get() []damper.Classification {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]damper.Classification(nil), v.list...)
}

// bedrockStreamClient is a Bedrock client, SigV4 with static credentials,
// pointed at fake on loopback, with a Damper on a virtual clock first.
func bedrockStreamClient(t *testing.T, fake http.Handler, v *verdicts) anthropic.Client {
	t.Helper()
	t.Setenv("AWS_BEARER_TOKEN_BEDROCK", "")
	srv := httptest.NewServer(fake)
	tr := &http.Transport{}
	t.Cleanup(func() {
		srv.Close()
		tr.CloseIdleConnections()
	})
	clk := dampertest.NewClock(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC))
	d, err := damper.New(damper.Policy{Classifier: v.record}, damper.WithClock(clk), damper.WithRand(half))
	if err != nil {
		t.Fatal(err)
	}
	cfg := aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", "")}
	return anthropic.NewClient(d.Option(), bedrock.WithConfig(cfg),
		option.WithBaseURL(srv.URL), option.WithHTTPClient(&http.Client{Transport: tr}))
}

// checkSignedStreams checks that every attempt went to Bedrock's streaming
// invoke path, signed.
func checkSignedStreams(t *testing.T, f *bedrockStreamFake) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, p := range f.paths {
		if !strings.HasSuffix(p, "/invoke-with-response-stream") || !strings.HasPrefix(f.auths[i], "AWS4-HMAC-SHA256") {
			t.Errorf("attempt %d: path %s, Authorization %.20q; want a signed invoke-with-response-stream", i+1, p, f.auths[i])
		}
	}
}

// A transient Bedrock failure before the first content is retried, and the
// caller's stream holds the second attempt's events only.
func TestBedrockStreamTransientFailureBeforeContentIsRetried(t *testing.T) {
	first := bedrockEvents("msg_first", "lost")
	for _, tt := range []struct {
		name   string
		fail   func(*frames) *frames
		signal damper.Signal
	}{
		{"throttlingException", func(f *frames) *frames { return f.exception("throttlingException") }, damper.CallerTraffic},
		{"serviceUnavailableException", func(f *frames) *frames { return f.exception("serviceUnavailableException") }, damper.ProviderHealth},
		{"internalServerException", func(f *frames) *frames { return f.exception("internalServerException") }, damper.ProviderHealth},
		{"modelStreamErrorException", func(f *frames) *frames { return f.exception("modelStreamErrorException") }, damper.ProviderHealth},
		{"modelTimeoutException", func(f *frames) *frames { return f.exception("modelTimeoutException") }, damper.ProviderHealth},
		{"error frame InternalFailure", func(f *frames) *frames { return f.errorFrame("InternalFailure") }, damper.ProviderHealth},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// message_start and an empty text block: nothing the caller
			// can use has come when the exception does.
			fake := &bedrockStreamFake{bodies: [][]byte{
				tt.fail((&frames{t: t}).chunks(first[:2]...)).buf.Bytes(),
				(&frames{t: t}).chunks(bedrockEvents("msg_second", "ok")...).buf.Bytes(),
			}}
			v := &verdicts{}
			client := bedrockStreamClient(t, fake, v)
			var rep damper.Report
			evs, err := drain(client.Messages.NewStreaming(context.Background(), params("claude-sonnet-4-6"), damper.ReportInto(&rep)))
			if err != nil {
				t.Fatalf("stream error %v, want none: the second attempt succeeds", err)
			}
			var msg anthropic.Message
			for _, e := range evs {
				if err := msg.Accumulate(e); err != nil {
					t.Fatal(err)
				}
			}
			if len(evs) != 6 || msg.ID != "msg_second" || len(msg.Content) != 1 || msg.Content[0].Text != "ok" {
				t.Fatalf("caller saw %d events of message %q, content %+v; want the 6 of msg_second alone", len(evs), msg.ID, msg.Content)
			}
			if got := fake.attempts(); got != 2 || rep.Attempts != 2 || rep.Outcome != damper.OutcomeSuccess {
				t.Fatalf("server saw %d attempts; report: %d attempts, outcome %q; want 2, 2, success", got, rep.Attempts, rep.Outcome)
			}
			checkSignedStreams(t, fake)
			want := damper.Classification{Class: damper.Retryable, Signal: tt.signal, Kind: "sse_error"}
			if got := v.get(); len(got) != 1 || got[0] != want {
				t.Errorf("verdicts %+v, want [%+v]", got, want)
			}
		})
	}
}

// The same failures after the first content are ambiguous: the caller keeps
// what it had, the stream ends with ErrAmbiguous and the exception as an
// API error, and no further attempt is made. The first attempt fails with
// the same exception before content, and is retried: so the exception is a
// transient one, and only its coming after content stops the retries.
func TestBedrockStreamFailureAfterContentIsAmbiguous(t *testing.T) {
	first := bedrockEvents("msg_first", "lost")
	second := bedrockEvents("msg_second", "Hel")
	for _, tt := range []struct {
		name   string
		signal damper.Signal
	}{
		{"throttlingException", damper.CallerTraffic},
		{"serviceUnavailableException", damper.ProviderHealth},
		{"modelStreamErrorException", damper.ProviderHealth},
	} {
		t.Run(tt.name, func(t *testing.T) {
			fake := &bedrockStreamFake{bodies: [][]byte{
				(&frames{t: t}).chunks(first[:2]...).exception(tt.name).buf.Bytes(),
				(&frames{t: t}).chunks(second[:3]...).exception(tt.name).buf.Bytes(),
				(&frames{t: t}).chunks(bedrockEvents("msg_third", "ok")...).buf.Bytes(),
			}}
			v := &verdicts{}
			client := bedrockStreamClient(t, fake, v)
			var rep damper.Report
			got, err := drain(client.Messages.NewStreaming(context.Background(), params("claude-sonnet-4-6"), damper.ReportInto(&rep)))
			var apiErr *anthropic.Error
			if !errors.Is(err, damper.ErrAmbiguous) || !errors.As(err, &apiErr) || apiErr.Type() != anthropic.ErrorType(tt.name) {
				t.Fatalf("stream error %v, want ErrAmbiguous with a %s API error", err, tt.name)
			}
			if len(got) != 3 || got[0].Message.ID != "msg_second" || got[2].Delta.Text != "Hel" {
				t.Fatalf("caller saw %d events, want the 3 of msg_second sent before its exception", len(got))
			}
			if n := fake.attempts(); n != 2 || rep.Attempts != 2 || rep.Outcome != damper.OutcomeAmbiguous {
				t.Fatalf("server saw %d attempts; report: %d attempts, outcome %q; want 2, 2, ambiguous", n, rep.Attempts, rep.Outcome)
			}
			checkSignedStreams(t, fake)
			if log := rep.AttemptLog; len(log) != 2 || log[0].Class != damper.Retryable || log[1].Class != damper.Ambiguous || log[1].Kind != "sse_error" {
				t.Errorf("attempt log %+v, want a retryable attempt, then an ambiguous sse_error", log)
			}
			want := []damper.Classification{
				{Class: damper.Retryable, Signal: tt.signal, Kind: "sse_error"},
				{Class: damper.Ambiguous, Signal: tt.signal, Kind: "sse_error"},
			}
			if got := v.get(); len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
				t.Errorf("verdicts %+v, want %+v", got, want)
			}
		})
	}
}

// A Bedrock failure that a retry cannot mend is returned at once, before
// any content, as the API error the SDK builds from it.
func TestBedrockStreamFinalFailureIsNotRetried(t *testing.T) {
	first := bedrockEvents("msg_first", "lost")
	for _, name := range []string{"validationException", "UnknownError"} {
		t.Run(name, func(t *testing.T) {
			fake := &bedrockStreamFake{bodies: [][]byte{
				(&frames{t: t}).chunks(first[:2]...).exception(name).buf.Bytes(),
				(&frames{t: t}).chunks(bedrockEvents("msg_second", "ok")...).buf.Bytes(),
			}}
			v := &verdicts{}
			client := bedrockStreamClient(t, fake, v)
			var rep damper.Report
			got, err := drain(client.Messages.NewStreaming(context.Background(), params("claude-sonnet-4-6"), damper.ReportInto(&rep)))
			var apiErr *anthropic.Error
			if !errors.As(err, &apiErr) || apiErr.Type() != anthropic.ErrorType(name) || errors.Is(err, damper.ErrAmbiguous) {
				t.Fatalf("stream error %v, want the %s API error, not ambiguous", err, name)
			}
			if len(got) != 0 {
				t.Errorf("caller saw %d events, want none: the attempt failed before content", len(got))
			}
			if n := fake.attempts(); n != 1 || rep.Attempts != 1 || rep.Outcome != damper.OutcomeError {
				t.Fatalf("server saw %d attempts; report: %d attempts, outcome %q; want 1, 1, error", n, rep.Attempts, rep.Outcome)
			}
			want := damper.Classification{Class: damper.NotRetryable, Signal: damper.NoSignal, Kind: "sse_error"}
			if got := v.get(); len(got) != 1 || got[0] != want {
				t.Errorf("verdicts %+v, want [%+v]", got, want)
			}
		})
	}
}
