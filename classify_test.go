package damper_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"syscall"
	"testing"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

func errBody(typ, code string) []byte {
	if code == "" {
		return fmt.Appendf(nil, `{"type":"error","error":{"type":%q,"message":"m"}}`, typ)
	}
	return fmt.Appendf(nil, `{"type":"error","error":{"type":%q,"message":"m","details":{"error_code":%q}}}`, typ, code)
}

func TestClassify(t *testing.T) {
	hdr := func(k, v string) http.Header { h := http.Header{}; h.Set(k, v); return h }
	tests := []struct {
		name   string
		f      damper.Failure
		class  damper.Class
		signal damper.Signal
		kind   string
	}{
		{"429", damper.Failure{StatusCode: 429, Body: errBody("rate_limit_error", "")}, damper.Retryable, damper.CallerTraffic, "rate_limited"},
		{"429 ramp limit", damper.Failure{StatusCode: 429, Body: errBody("rate_limit_error", "ramp_limit_exceeded")}, damper.Retryable, damper.CallerTraffic, "rate_limited"},
		{"429 enforced spend limit", damper.Failure{StatusCode: 429, Body: errBody("rate_limit_error", "enforced_spend_limit_reached")}, damper.NotRetryable, damper.CallerTraffic, "spend_limit"},
		{"429 contract spend limit", damper.Failure{StatusCode: 429, Body: errBody("rate_limit_error", "contract_spend_limit_reached")}, damper.NotRetryable, damper.CallerTraffic, "spend_limit"},
		{"529", damper.Failure{StatusCode: 529}, damper.Retryable, damper.ProviderHealth, "overloaded"},
		{"500", damper.Failure{StatusCode: 500}, damper.Retryable, damper.ProviderHealth, "server_error"},
		{"502", damper.Failure{StatusCode: 502}, damper.Retryable, damper.ProviderHealth, "server_error"},
		{"503", damper.Failure{StatusCode: 503}, damper.Retryable, damper.ProviderHealth, "server_error"},
		{"504", damper.Failure{StatusCode: 504}, damper.Retryable, damper.ProviderHealth, "server_error"},
		{"599", damper.Failure{StatusCode: 599}, damper.Retryable, damper.ProviderHealth, "server_error"},
		{"400", damper.Failure{StatusCode: 400}, damper.NotRetryable, damper.NoSignal, "client_error"},
		{"401", damper.Failure{StatusCode: 401}, damper.NotRetryable, damper.NoSignal, "client_error"},
		{"402", damper.Failure{StatusCode: 402}, damper.NotRetryable, damper.NoSignal, "client_error"},
		{"403", damper.Failure{StatusCode: 403}, damper.NotRetryable, damper.NoSignal, "client_error"},
		{"404", damper.Failure{StatusCode: 404}, damper.NotRetryable, damper.NoSignal, "client_error"},
		{"408", damper.Failure{StatusCode: 408}, damper.NotRetryable, damper.NoSignal, "client_error"},
		{"409", damper.Failure{StatusCode: 409}, damper.NotRetryable, damper.NoSignal, "client_error"},
		{"413", damper.Failure{StatusCode: 413}, damper.NotRetryable, damper.NoSignal, "client_error"},
		{"500 should-retry false", damper.Failure{StatusCode: 500, Header: hdr("x-should-retry", "false")}, damper.NotRetryable, damper.ProviderHealth, "should_retry_false"},
		{"400 should-retry true", damper.Failure{StatusCode: 400, Header: hdr("x-should-retry", "true")}, damper.Retryable, damper.NoSignal, "should_retry_true"},
		{"reset", damper.Failure{Err: syscall.ECONNRESET}, damper.Retryable, damper.ProviderHealth, "transport"},
		{"refused", damper.Failure{Err: &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}}, damper.Retryable, damper.ProviderHealth, "transport"},
		{"EOF", damper.Failure{Err: io.ErrUnexpectedEOF}, damper.Retryable, damper.ProviderHealth, "transport"},
		{"attempt timeout", damper.Failure{Err: fmt.Errorf("x: %w", damper.ErrAttemptTimeout)}, damper.Retryable, damper.ProviderHealth, "timeout"},
		{"dropped body, should-retry false", damper.Failure{Header: hdr("x-should-retry", "false"), Err: io.ErrUnexpectedEOF}, damper.NotRetryable, damper.ProviderHealth, "should_retry_false"},
		{"caller canceled", damper.Failure{Err: context.Canceled}, damper.NotRetryable, damper.NoSignal, "canceled"},
		{"caller's deadline", damper.Failure{Err: &url.Error{Op: "Post", Err: context.DeadlineExceeded}}, damper.NotRetryable, damper.NoSignal, "canceled"},
		{"network i/o timeout", damper.Failure{Err: &net.OpError{Op: "read", Err: os.ErrDeadlineExceeded}}, damper.Retryable, damper.ProviderHealth, "transport"},
		{"not a transport error", damper.Failure{Err: errors.New("signing failed")}, damper.NotRetryable, damper.NoSignal, "other"},
		{"SSE overloaded", damper.Failure{Body: errBody("overloaded_error", "")}, damper.Retryable, damper.ProviderHealth, "sse_error"},
		{"SSE api_error", damper.Failure{Body: errBody("api_error", "")}, damper.Retryable, damper.ProviderHealth, "sse_error"},
		{"SSE rate limit", damper.Failure{Body: errBody("rate_limit_error", "")}, damper.Retryable, damper.CallerTraffic, "sse_error"},
		{"SSE invalid request", damper.Failure{Body: errBody("invalid_request_error", "")}, damper.NotRetryable, damper.NoSignal, "sse_error"},
		// Bedrock exceptions, as the SDK's bedrock package names them.
		{"SSE throttlingException", damper.Failure{Body: errBody("throttlingException", "")}, damper.Retryable, damper.CallerTraffic, "sse_error"},
		{"SSE serviceUnavailableException", damper.Failure{Body: errBody("serviceUnavailableException", "")}, damper.Retryable, damper.ProviderHealth, "sse_error"},
		{"SSE internalServerException", damper.Failure{Body: errBody("internalServerException", "")}, damper.Retryable, damper.ProviderHealth, "sse_error"},
		{"SSE modelStreamErrorException", damper.Failure{Body: errBody("modelStreamErrorException", "")}, damper.Retryable, damper.ProviderHealth, "sse_error"},
		{"SSE modelTimeoutException", damper.Failure{Body: errBody("modelTimeoutException", "")}, damper.Retryable, damper.ProviderHealth, "sse_error"},
		{"SSE modelNotReadyException", damper.Failure{Body: errBody("modelNotReadyException", "")}, damper.Retryable, damper.ProviderHealth, "sse_error"},
		{"SSE validationException", damper.Failure{Body: errBody("validationException", "")}, damper.NotRetryable, damper.NoSignal, "sse_error"},
		{"SSE accessDeniedException", damper.Failure{Body: errBody("accessDeniedException", "")}, damper.NotRetryable, damper.NoSignal, "sse_error"},
		{"SSE resourceNotFoundException", damper.Failure{Body: errBody("resourceNotFoundException", "")}, damper.NotRetryable, damper.NoSignal, "sse_error"},
		{"SSE modelErrorException", damper.Failure{Body: errBody("modelErrorException", "")}, damper.NotRetryable, damper.NoSignal, "sse_error"},
		{"SSE serviceQuotaExceededException", damper.Failure{Body: errBody("serviceQuotaExceededException", "")}, damper.NotRetryable, damper.CallerTraffic, "sse_error"},
		{"SSE UnknownError", damper.Failure{Body: errBody("UnknownError", "")}, damper.NotRetryable, damper.NoSignal, "sse_error"},
		// AWS error codes, from a payload or an error frame.
		{"SSE ThrottlingException", damper.Failure{Body: errBody("ThrottlingException", "")}, damper.Retryable, damper.CallerTraffic, "sse_error"},
		{"SSE namespaced code", damper.Failure{Body: errBody("com.amazonaws.bedrock#ModelTimeoutException:http://internal/", "")}, damper.Retryable, damper.ProviderHealth, "sse_error"},
		{"SSE ValidationException", damper.Failure{Body: errBody("ValidationException", "")}, damper.NotRetryable, damper.NoSignal, "sse_error"},
		{"SSE InternalFailure", damper.Failure{Body: errBody("InternalFailure", "")}, damper.Retryable, damper.ProviderHealth, "sse_error"},
		{"SSE ServiceUnavailable", damper.Failure{Body: errBody("ServiceUnavailable", "")}, damper.Retryable, damper.ProviderHealth, "sse_error"},
		{"SSE a type only near a Bedrock name", damper.Failure{Body: errBody("throttling", "")}, damper.NotRetryable, damper.NoSignal, "sse_error"},
		{"reset after content", damper.Failure{Err: syscall.ECONNRESET, AfterContent: true}, damper.Ambiguous, damper.ProviderHealth, "transport"},
		{"SSE error after content", damper.Failure{Body: errBody("overloaded_error", ""), AfterContent: true}, damper.Ambiguous, damper.ProviderHealth, "sse_error"},
		{"SSE throttlingException after content", damper.Failure{Body: errBody("throttlingException", ""), AfterContent: true}, damper.Ambiguous, damper.CallerTraffic, "sse_error"},
		{"SSE modelStreamErrorException after content", damper.Failure{Body: errBody("modelStreamErrorException", ""), AfterContent: true}, damper.Ambiguous, damper.ProviderHealth, "sse_error"},
		{"SSE validationException after content", damper.Failure{Body: errBody("validationException", ""), AfterContent: true}, damper.Ambiguous, damper.NoSignal, "sse_error"},
	}
	for _, tt := range tests {
		got := damper.Classify(tt.f)
		want := damper.Classification{Class: tt.class, Signal: tt.signal, Kind: tt.kind}
		if got != want {
			t.Errorf("%s: Classify = %+v, want %+v", tt.name, got, want)
		}
	}
}

// FuzzClassify: no status, header or body panics the classifier, and its
// hard rules hold for every input.
func FuzzClassify(f *testing.F) {
	f.Add(429, "", errBody("rate_limit_error", "enforced_spend_limit_reached"), false)
	f.Add(500, "false", []byte("not json"), false)
	f.Add(0, "true", errBody("overloaded_error", ""), true)
	f.Add(-1, "", []byte(`{"error":{"details":{"error_code":["x"]}}}`), false)
	f.Fuzz(func(t *testing.T, status int, shouldRetry string, body []byte, afterContent bool) {
		h := http.Header{}
		h.Set("x-should-retry", shouldRetry)
		f := damper.Failure{StatusCode: status, Header: h, Body: body, AfterContent: afterContent}
		c := damper.Classify(f)
		switch {
		case afterContent && c.Class != damper.Ambiguous:
			t.Fatalf("after content: %+v", c)
		case !afterContent && shouldRetry == "false" && c.Class != damper.NotRetryable:
			t.Fatalf("x-should-retry false: %+v", c)
		case !afterContent && shouldRetry == "true" && c.Class != damper.Retryable:
			t.Fatalf("x-should-retry true: %+v", c)
		case c.Class < damper.Retryable || c.Class > damper.Ambiguous || c.Kind == "":
			t.Fatalf("invalid classification %+v", c)
		}
	})
}

func TestClassifierOverrides(t *testing.T) {
	r := newRig(t, damper.Policy{Classifier: func(f damper.Failure, c damper.Classification) damper.Classification {
		if f.StatusCode == 400 {
			c.Class = damper.Retryable
		}
		return c
	}})
	r.srv.Script("", dampertest.Status(400), dampertest.OK())
	if _, err := r.client.Messages.New(context.Background(), params("claude-sonnet-4-6")); err != nil {
		t.Fatal(err)
	}
	if got := r.srv.Count(""); got != 2 {
		t.Errorf("attempts = %d, want 2: the classifier made 400 retryable", got)
	}
}
