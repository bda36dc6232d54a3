package engine

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"

	"github.com/damper-ai/damper-go/fleet"
	"github.com/tidwall/gjson"
)

// Signal says whose health a failure speaks of. A circuit breaker listens
// to provider signals only; a rate limiter to caller traffic.
type Signal = fleet.Signal

const (
	// NoSignal: the failure says nothing about load (a bad request, a
	// cancelled context).
	NoSignal = fleet.NoSignal
	// ProviderHealth: 5xx, 529 and transport failures.
	ProviderHealth = fleet.ProviderHealth
	// CallerTraffic: 429, the caller's own rate or spend.
	CallerTraffic = fleet.CallerTraffic
)

// Classification is the verdict on one failed attempt.
type Classification struct {
	Class  Class
	Signal Signal
	// Kind is a short, low-cardinality name for the failure, used in
	// reports, span attributes and metrics: "rate_limited", "spend_limit",
	// "overloaded", "server_error", "client_error", "should_retry_false",
	// "should_retry_true", "transport", "timeout", "canceled", "sse_error",
	// "truncated", "stall", "hold_back_exceeded", "invalid_response" (a
	// success status whose body is not JSON) or "other".
	Kind string
}

// Classifier decides what to do with a failed attempt. It is given
// Damper's own verdict (builtin) and returns the one to act on, so it can
// override any decision or keep it.
//
// The built-in verdict: any failure after content reached the caller is
// ambiguous. Before that, an explicit x-should-retry header wins (retrying
// even a 400 when true); spend-limit 429s are final, other 429s and every
// 5xx are retried, other 4xx are not; an SSE error event is retried when
// its type is transient (the API's overloaded_error, api_error and
// rate_limit_error, or a transient Bedrock exception turned into an error
// event by the SDK's bedrock package); transport failures are retried. It is called once per failed attempt, without
// any Damper lock held, and must be safe for concurrent use.
type Classifier func(f Failure, builtin Classification) Classification

// Spend-limit codes: a 429 that waiting cannot clear.
const (
	errorCodeEnforcedSpendLimit = "enforced_spend_limit_reached"
	errorCodeContractSpendLimit = "contract_spend_limit_reached"
)

// classifyFailure is Damper's built-in classification (see [Classifier]);
// the transient Bedrock exceptions are throttling, service unavailable,
// internal server, model stream error, model timeout and model not ready.
func classifyFailure(f Failure) Classification {
	if f.AfterContent {
		return Classification{Class: Ambiguous, Signal: signalOf(f), Kind: kindOf(f)}
	}
	// The caller's own context ending (cancelled, or past its deadline) is
	// no news of the provider; a per-attempt timeout is, and is retried.
	if (errors.Is(f.Err, context.Canceled) || errors.Is(f.Err, context.DeadlineExceeded)) && !errors.Is(f.Err, ErrAttemptTimeout) {
		return Classification{Class: NotRetryable, Kind: "canceled"}
	}
	if f.Header != nil {
		switch f.Header.Get("X-Should-Retry") {
		case "false":
			return Classification{Class: NotRetryable, Signal: signalOf(f), Kind: "should_retry_false"}
		case "true":
			return Classification{Class: Retryable, Signal: signalOf(f), Kind: "should_retry_true"}
		}
	}
	switch code := f.StatusCode; {
	case code == http.StatusTooManyRequests:
		switch gjson.GetBytes(f.Body, "error.details.error_code").Str {
		case errorCodeEnforcedSpendLimit, errorCodeContractSpendLimit:
			return Classification{Class: NotRetryable, Signal: CallerTraffic, Kind: kindSpendLimit}
		}
		return Classification{Class: Retryable, Signal: CallerTraffic, Kind: "rate_limited"}
	case code == 529:
		return Classification{Class: Retryable, Signal: ProviderHealth, Kind: "overloaded"}
	case code >= 500:
		return Classification{Class: Retryable, Signal: ProviderHealth, Kind: "server_error"}
	case code >= 400:
		return Classification{Class: NotRetryable, Kind: "client_error"}
	case code > 0 && errors.Is(f.Err, errInvalidJSON):
		return Classification{Class: NotRetryable, Kind: "invalid_response"}
	case code > 0:
		return Classification{Class: NotRetryable, Kind: "other"}
	}
	if f.Body != nil {
		// An SSE error event on a 200 stream.
		t := sseErrorTypeOf(f.Body)
		return Classification{Class: t.class, Signal: t.signal, Kind: "sse_error"}
	}
	switch {
	case errors.Is(f.Err, ErrAttemptTimeout):
		return Classification{Class: Retryable, Signal: ProviderHealth, Kind: "timeout"}
	case errors.Is(f.Err, errTruncated):
		return Classification{Class: Retryable, Signal: ProviderHealth, Kind: "truncated"}
	case errors.Is(f.Err, ErrHoldBackExceeded):
		return Classification{Class: NotRetryable, Kind: "hold_back_exceeded"}
	case errors.Is(f.Err, ErrEventTooLarge):
		return Classification{Class: NotRetryable, Kind: "event_too_large"}
	case isTransportError(f.Err):
		return Classification{Class: Retryable, Signal: ProviderHealth, Kind: "transport"}
	}
	return Classification{Class: NotRetryable, Kind: "other"}
}

func signalOf(f Failure) Signal {
	switch {
	case f.StatusCode == http.StatusTooManyRequests:
		return CallerTraffic
	case f.StatusCode >= 500 || (f.StatusCode == 0 && f.Err != nil):
		return ProviderHealth
	case f.StatusCode == 0 && f.Body != nil:
		return signalOfSSE(f.Body)
	}
	return NoSignal
}

func signalOfSSE(body []byte) Signal {
	return sseErrorTypeOf(body).signal
}

// sseErrorType is the verdict on an SSE error event of one type.
type sseErrorType struct {
	class  Class
	signal Signal
}

// sseErrorTypes holds the verdict on each error type an SSE error event
// can carry; any other type is not retried. The SDK's bedrock package
// turns a mid-stream AWS exception into an error event whose type is the
// exception's name, so Bedrock's names stand beside their first-party
// equivalents: throttling is the caller's rate, the transient server-side
// exceptions are the provider's health.
var sseErrorTypes = map[string]sseErrorType{
	"rate_limit_error": {Retryable, CallerTraffic},
	"overloaded_error": {Retryable, ProviderHealth},
	"api_error":        {Retryable, ProviderHealth},

	// Bedrock's exceptions, as the names of its stream's union members.
	"throttlingException":         {Retryable, CallerTraffic},
	"serviceUnavailableException": {Retryable, ProviderHealth},
	"internalServerException":     {Retryable, ProviderHealth},
	"modelStreamErrorException":   {Retryable, ProviderHealth},
	"modelTimeoutException":       {Retryable, ProviderHealth},
	"modelNotReadyException":      {Retryable, ProviderHealth},
	// AWS's common errors, which an error frame may name.
	"internalFailure":    {Retryable, ProviderHealth},
	"serviceUnavailable": {Retryable, ProviderHealth},
	// Final: the request, model, access or quota, which a retry does not
	// change. Any name missing from the table is final too.
	"validationException":           {NotRetryable, NoSignal},
	"accessDeniedException":         {NotRetryable, NoSignal},
	"resourceNotFoundException":     {NotRetryable, NoSignal},
	"modelErrorException":           {NotRetryable, NoSignal},
	"serviceQuotaExceededException": {NotRetryable, CallerTraffic},
}

// sseErrorTypeOf looks up the error type of an SSE error event's data.
// The SDK names a Bedrock exception after the frame's exception-type header
// ("throttlingException"), else after the code in its payload or error
// header, an AWS error code ("ThrottlingException", maybe with a namespace
// before "#" or a suffix after ":"): the name is cut to its bare form, as
// AWS SDKs cut codes, and its first letter lowered before the lookup.
func sseErrorTypeOf(body []byte) sseErrorType {
	name := gjson.GetBytes(body, "error.type").Str
	if i := strings.IndexByte(name, ':'); i >= 0 {
		name = name[:i]
	}
	if i := strings.IndexByte(name, '#'); i >= 0 {
		name = name[i+1:]
	}
	if name != "" && 'A' <= name[0] && name[0] <= 'Z' {
		name = string(name[0]+'a'-'A') + name[1:]
	}
	if t, ok := sseErrorTypes[name]; ok {
		return t
	}
	return sseErrorType{NotRetryable, NoSignal}
}

func kindOf(f Failure) string {
	switch {
	case f.StatusCode > 0:
		return "client_error"
	case f.Body != nil:
		return "sse_error"
	case errors.Is(f.Err, errStalled):
		return "stall"
	case errors.Is(f.Err, errTruncated):
		return "truncated"
	case errors.Is(f.Err, ErrEventTooLarge):
		return "event_too_large"
	case errors.Is(f.Err, context.Canceled), errors.Is(f.Err, context.DeadlineExceeded) && !errors.Is(f.Err, ErrAttemptTimeout):
		return "canceled"
	}
	return "transport"
}

// isTransportError reports whether err is a failure of the connection to
// the API (refused, reset, closed early, a network timeout, a TLS alert, a
// body whose framing or encoding broke after its headers) rather than of the caller's configuration (a bad URL, an untrusted
// certificate).
func isTransportError(err error) bool {
	if err == nil {
		return false
	}
	if errors.As(err, new(bodyError)) {
		return true // headers came, so the configuration was right
	}
	var unknownAuthority x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var invalid x509.CertificateInvalidError
	if errors.As(err, &unknownAuthority) || errors.As(err, &hostname) || errors.As(err, &invalid) {
		return false
	}
	var netErr net.Error
	var alert tls.AlertError
	var recordHeader tls.RecordHeaderError
	return errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNABORTED) ||
		errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, net.ErrClosed) ||
		errors.As(err, &netErr) ||
		errors.As(err, &alert) ||
		errors.As(err, &recordHeader)
}

// Stream failures that are not transport errors of their own.
var (
	errTruncated = errors.New("damper: stream ended without message_stop")
	errStalled   = errors.New("damper: stream stalled between events")
)

// classify is the one classification of a failed attempt: the built-in
// verdict, then the Policy's Classifier, which may change it.
func (d *Damper) classify(f Failure) Classification {
	cls := classifyFailure(f)
	if d.policy.Classifier != nil {
		cls = d.policy.Classifier(f, cls)
	}
	return cls
}
