package dampertest

import (
	"net/http"
	"strconv"
	"time"
)

// Drop says whether, and when, the server cuts the connection, or stops
// sending on it, instead of finishing a response.
type Drop int

const (
	// DropNone finishes the response normally.
	DropNone Drop = iota
	// DropBeforeHeaders closes the connection without sending anything, so
	// the client sees a transport error (EOF) and no status.
	DropBeforeHeaders
	// DropMidBody sends the status, the headers and the first half of the
	// body, then closes the connection. JSON bodies declare their full
	// Content-Length, so the client sees io.ErrUnexpectedEOF while reading;
	// an SSE stream sends half the bytes of its clean events. (To cut a
	// stream at a chosen event, use FaultReset.)
	DropMidBody
	// StallMidBody sends what DropMidBody sends, then keeps the connection
	// open, sending nothing more, until the request's context ends (or the
	// server closes): a body that stops and never ends. (To stall a stream
	// at a chosen event, use FaultStall.)
	StallMidBody
)

// String returns the constant's name.
func (d Drop) String() string {
	switch d {
	case DropNone:
		return "DropNone"
	case DropBeforeHeaders:
		return "DropBeforeHeaders"
	case DropMidBody:
		return "DropMidBody"
	case StallMidBody:
		return "StallMidBody"
	}
	return "Drop(" + strconv.Itoa(int(d)) + ")"
}

// Step describes one scripted response. The zero Step is a 200 with the
// default message. Steps are values: their methods return a modified copy,
// so one base step can be reused.
//
// What is sent, after Delay and unless Drop cuts or stalls it, in order of
// precedence:
//   - Body set: Body as it is, with Status;
//   - Status >= 400: an Anthropic error body, even if Stream is set, as the
//     API answers errors before any stream starts;
//   - Stream set, or the request asked for "stream": true: an SSE stream
//     (a stream request without Stream gets a clean stream of Text);
//   - otherwise: a Messages API message whose text is Text.
type Step struct {
	// Status is the HTTP status; 0 means 200. On [Bedrock] an error status
	// is sent as Bedrock sends it: 400 ValidationException, 401
	// UnrecognizedClientException, 403 AccessDeniedException, 404
	// ResourceNotFoundException, 408 ModelTimeoutException, 424
	// ModelErrorException, 429 ThrottlingException, 503 and 529 (which
	// Bedrock does not have) 503 ServiceUnavailableException, any other 5xx
	// InternalServerException, any other 4xx ValidationException: the type
	// in the x-amzn-ErrorType header, and a {"message": ...} body.
	Status int
	// Header holds extra response headers, such as retry-after,
	// retry-after-ms, x-should-retry or request-id. Set here, request-id
	// replaces the generated one.
	Header http.Header
	// ErrorType is error.type of an error body. Empty means the type the API
	// uses for Status (see [DefaultErrorType]). On Bedrock, one of the API's
	// types is replaced by Bedrock's for Status, and any other is sent as
	// x-amzn-ErrorType as it is, such as ModelNotReadyException.
	ErrorType string
	// ErrorCode, when set, is sent as error.details.error_code, such as
	// "enforced_spend_limit_reached". Bedrock's error bodies have none.
	ErrorCode string
	// Message is error.message of an error body; empty means a default.
	Message string
	// Body, when non-nil, replaces the generated body. It need not be JSON.
	// The content type stays application/json unless Header sets one.
	Body []byte
	// Delay holds the response this long before its headers, on the
	// server's clock (see [WithClock]).
	Delay time.Duration
	// Drop cuts the connection before or during the response, or stalls it.
	Drop Drop
	// Stream, when set, makes a successful response an SSE stream.
	Stream *Stream
	// Text is the text of the default message; empty means "ok".
	Text string
	// MessageID is the id of the message sent, plain or in a stream's
	// message_start; empty means "msg_dampertest". A distinct id per step
	// tells the answers of two attempts apart.
	MessageID string
}

// OK returns a step that answers 200 with the default message.
func OK() Step { return Step{} }

// Status returns a step that answers code; for code >= 400 the body is an
// Anthropic error of [DefaultErrorType](code).
func Status(code int) Step { return Step{Status: code} }

// SpendLimit returns the 429 the API sends when an organization reaches its
// spend limit: rate_limit_error with error.details.error_code
// "enforced_spend_limit_reached" and no retry-after header. Waiting does not
// clear it.
func SpendLimit() Step {
	return Step{
		Status:    http.StatusTooManyRequests,
		ErrorCode: "enforced_spend_limit_reached",
		Message:   "You have reached your specified API usage limits.",
	}
}

// WithHeader returns a copy of s that also sends the response header k: v,
// replacing any value of k set before.
func (s Step) WithHeader(k, v string) Step {
	s.Header = s.Header.Clone()
	if s.Header == nil {
		s.Header = http.Header{}
	}
	s.Header.Set(k, v)
	return s
}

// RetryAfter returns a copy of s with the retry-after header (seconds or an
// HTTP date; any string, so that tests can send malformed values).
func (s Step) RetryAfter(v string) Step { return s.WithHeader("retry-after", v) }

// RetryAfterMs returns a copy of s with the retry-after-ms header.
func (s Step) RetryAfterMs(v string) Step { return s.WithHeader("retry-after-ms", v) }

// ShouldRetry returns a copy of s with x-should-retry: true or false, the
// API's explicit instruction that overrides the status.
func (s Step) ShouldRetry(retry bool) Step {
	return s.WithHeader("x-should-retry", strconv.FormatBool(retry))
}

// WithError returns a copy of s with the given error.type and
// error.details.error_code; an empty errorType means the default for the
// status, an empty errorCode means no details.
func (s Step) WithError(errorType, errorCode string) Step {
	s.ErrorType, s.ErrorCode = errorType, errorCode
	return s
}

// WithMessage returns a copy of s whose error body says msg.
func (s Step) WithMessage(msg string) Step {
	s.Message = msg
	return s
}

// WithBody returns a copy of s that sends body as it is.
func (s Step) WithBody(body []byte) Step {
	s.Body = append([]byte{}, body...)
	return s
}

// WithDelay returns a copy of s held for d before its headers.
func (s Step) WithDelay(d time.Duration) Step {
	s.Delay = d
	return s
}

// WithDrop returns a copy of s that cuts the connection as d says.
func (s Step) WithDrop(d Drop) Step {
	s.Drop = d
	return s
}

// WithStream returns a copy of s that answers with the SSE stream st.
func (s Step) WithStream(st Stream) Step {
	s.Stream = &st
	return s
}

// WithText returns a copy of s whose default message says text.
func (s Step) WithText(text string) Step {
	s.Text = text
	return s
}

// WithMessageID returns a copy of s whose message, plain or streamed, has
// the id id.
func (s Step) WithMessageID(id string) Step {
	s.MessageID = id
	return s
}

// clone returns a deep copy, so that a script cannot be changed through
// the caller's maps and slices after Script returns.
func (s Step) clone() Step {
	s.Header = s.Header.Clone()
	if s.Body != nil {
		s.Body = append([]byte{}, s.Body...)
	}
	if s.Stream != nil {
		st := *s.Stream
		s.Stream = &st
	}
	return s
}

// script is the steps of one scenario. Its first step answers the first
// request received after Script was called.
type script struct {
	steps []Step
	base  int // requests of the scenario received before Script
}

// step returns the step for the n-th request of the scenario (1-based),
// repeating the last step once the script is used up.
func (sc script) step(n int) Step {
	i := min(n-sc.base, len(sc.steps)) - 1
	return sc.steps[max(i, 0)]
}
