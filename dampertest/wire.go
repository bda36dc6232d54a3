package dampertest

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// DefaultModel is the model named in responses to requests that name none,
// and in the message_start event of [Stream.Events]. Otherwise a response
// echoes the request's model.
const DefaultModel = "claude-dampertest"

// messageID is the id of every message the server sends unless its step
// sets one, so that scripted streams are byte-for-byte predictable.
const messageID = "msg_dampertest"

// defaultInputTokens is the input usage reported for every request by a
// server without rate limits, and in [Stream.Events]; the server does no
// tokenizing. A server with rate limits reports what it charged (see
// [RateLimits]).
const defaultInputTokens = 10

// DefaultErrorType returns the error.type the Anthropic API sends with an
// HTTP status: 400 invalid_request_error, 401 authentication_error,
// 402 billing_error, 403 permission_error, 404 not_found_error,
// 413 request_too_large, 429 rate_limit_error, 529 overloaded_error,
// any other 5xx api_error, any other 4xx invalid_request_error.
// It returns "" for a status below 400.
func DefaultErrorType(status int) string {
	switch {
	case status < 400:
		return ""
	case status == 401:
		return "authentication_error"
	case status == 402:
		return "billing_error"
	case status == 403:
		return "permission_error"
	case status == 404:
		return "not_found_error"
	case status == 413:
		return "request_too_large"
	case status == 429:
		return "rate_limit_error"
	case status == 529:
		return "overloaded_error"
	case status >= 500:
		return "api_error"
	}
	return "invalid_request_error"
}

// defaultMessages follow the API's wording where it is well known; callers
// must not match on them anyway.
var defaultMessages = map[string]string{
	"invalid_request_error": "Invalid request.",
	"authentication_error":  "invalid x-api-key",
	"billing_error":         "Your credit balance is too low to access the Anthropic API.",
	"permission_error":      "Your API key does not have permission to use the specified resource.",
	"not_found_error":       "Not found.",
	"request_too_large":     "Request exceeds the maximum allowed number of bytes.",
	"rate_limit_error":      "This request would exceed your organization's rate limit.",
	"api_error":             "Internal server error",
	"overloaded_error":      "Overloaded",
}

type errorBody struct {
	Type      string      `json:"type"`
	Error     errorObject `json:"error"`
	RequestID string      `json:"request_id,omitempty"`
}

type errorObject struct {
	Type    string        `json:"type"`
	Message string        `json:"message"`
	Details *errorDetails `json:"details,omitempty"`
}

type errorDetails struct {
	ErrorCode string `json:"error_code"`
}

// errorJSON returns the body of an error response or an SSE error event.
func errorJSON(errorType, code, msg, requestID string) []byte {
	if msg == "" {
		msg = defaultMessages[errorType]
	}
	if msg == "" {
		msg = "dampertest: scripted " + errorType
	}
	obj := errorObject{Type: errorType, Message: msg}
	if code != "" {
		obj.Details = &errorDetails{ErrorCode: code}
	}
	return marshal(errorBody{Type: "error", Error: obj, RequestID: requestID})
}

type message struct {
	ID           string      `json:"id"`
	Type         string      `json:"type"`
	Role         string      `json:"role"`
	Model        string      `json:"model"`
	Content      []textBlock `json:"content"`
	StopReason   *string     `json:"stop_reason"`
	StopSequence *string     `json:"stop_sequence"`
	StopDetails  *struct{}   `json:"stop_details"` // always null: no refusal detail
	Usage        usage       `json:"usage"`
}

type textBlock struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type usage struct {
	InputTokens              int `json:"input_tokens"`
	CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int `json:"cache_read_input_tokens"`
	OutputTokens             int `json:"output_tokens"`
}

// messageJSON returns a complete Messages API message saying text, for a
// request of inputTokens.
func messageJSON(id, model, text string, inputTokens int) []byte {
	endTurn := "end_turn"
	return marshal(message{
		ID: id, Type: "message", Role: "assistant", Model: model,
		Content:    []textBlock{{Type: "text", Text: text}},
		StopReason: &endTurn,
		Usage:      usage{InputTokens: inputTokens, OutputTokens: outputTokens(text)},
	})
}

// outputTokens is a rough count, about four characters a token, never 0:
// the API reports at least one output token even for an empty answer.
func outputTokens(text string) int {
	return max(1, (utf8.RuneCountInString(text)+3)/4)
}

// marshal encodes v compactly, leaving <, > and & literal as the API does.
func marshal(v any) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		panic("dampertest: " + err.Error()) // only fixed, encodable types reach here
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}
