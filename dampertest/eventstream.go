package dampertest

import (
	"bytes"
	"cmp"
	"encoding/base64"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/aws/protocol/eventstream"
	"github.com/aws/aws-sdk-go-v2/aws/protocol/eventstream/eventstreamapi"
)

// streamFormat is how a stream's events go on the wire: as SSE from the
// first-party API and Vertex, in event-stream frames from Bedrock.
type streamFormat struct {
	contentType string
	comments    bool // it has comments, which can carry Stream.PreContentBytes
	event       func(Event) []byte
	failure     func(errorType, requestID string) []byte // the event of FaultErrorEvent
}

// sseFormat is the first-party API's.
var sseFormat = streamFormat{
	contentType: "text/event-stream; charset=utf-8",
	comments:    true,
	event:       func(e Event) []byte { return []byte(e.String()) },
	failure: func(errorType, requestID string) []byte {
		return []byte(Event{"error", errorJSON(cmp.Or(errorType, "overloaded_error"), "", "", requestID)}.String())
	},
}

// bedrockFormat is InvokeModelWithResponseStream's: each event's JSON
// base64-encoded under "bytes" in a chunk frame, a failure as an exception
// frame. message_stop carries the invocation metrics Bedrock adds to it.
func bedrockFormat(inputTokens, outputTokens int) streamFormat {
	return streamFormat{
		contentType: "application/vnd.amazon.eventstream",
		event: func(e Event) []byte {
			data := e.Data
			if e.Name == "message_stop" {
				data = []byte(`{"type":"message_stop","amazon-bedrock-invocationMetrics":{"inputTokenCount":` +
					strconv.Itoa(inputTokens) + `,"outputTokenCount":` + strconv.Itoa(outputTokens) +
					`,"invocationLatency":0,"firstByteLatency":0}}`)
			}
			return chunkFrame(data)
		},
		failure: func(errorType, _ string) []byte {
			name := bedrockException(errorType)
			return exceptionFrame(name, bedrockMessage(name))
		},
	}
}

// bedrockException is the exception a Bedrock stream fails with where the
// API's stream sends an error event of errorType. A type other than the
// API's own is taken as Bedrock's name, such as modelTimeoutException.
func bedrockException(errorType string) string {
	switch cmp.Or(errorType, "overloaded_error") {
	case "overloaded_error":
		return "serviceUnavailableException"
	case "api_error":
		return "internalServerException"
	case "rate_limit_error":
		return "throttlingException"
	}
	if anthropicErrorTypes[errorType] {
		return "modelStreamErrorException"
	}
	return errorType
}

// chunkFrame is one event of a Bedrock stream.
func chunkFrame(data []byte) []byte {
	m := eventstream.Message{Payload: marshal(struct {
		Bytes string `json:"bytes"`
	}{base64.StdEncoding.EncodeToString(data)})}
	m.Headers.Set(eventstreamapi.MessageTypeHeader, eventstream.StringValue(eventstreamapi.EventMessageType))
	m.Headers.Set(eventstreamapi.EventTypeHeader, eventstream.StringValue("chunk"))
	m.Headers.Set(eventstreamapi.ContentTypeHeader, eventstream.StringValue("application/json"))
	return encodeFrame(m)
}

// exceptionFrame is the failure of a Bedrock stream.
func exceptionFrame(name, msg string) []byte {
	m := eventstream.Message{Payload: marshal(struct {
		Message string `json:"message"`
	}{msg})}
	m.Headers.Set(eventstreamapi.MessageTypeHeader, eventstream.StringValue(eventstreamapi.ExceptionMessageType))
	m.Headers.Set(eventstreamapi.ExceptionTypeHeader, eventstream.StringValue(name))
	m.Headers.Set(eventstreamapi.ContentTypeHeader, eventstream.StringValue("application/json"))
	return encodeFrame(m)
}

// encodeFrame encodes m. A frame the format cannot hold (a payload over
// 16 MiB from a huge chunk of text, a header over 32 KiB from a huge
// exception name) becomes an exception frame that says why, as the stream
// cannot go on.
func encodeFrame(m eventstream.Message) []byte {
	var buf bytes.Buffer
	if err := eventstream.NewEncoder().Encode(&buf, m); err != nil {
		buf.Reset()
		f := eventstream.Message{Payload: marshal(struct {
			Message string `json:"message"`
		}{"dampertest: cannot encode an event-stream frame: " + err.Error()})}
		f.Headers.Set(eventstreamapi.MessageTypeHeader, eventstream.StringValue(eventstreamapi.ExceptionMessageType))
		f.Headers.Set(eventstreamapi.ExceptionTypeHeader, eventstream.StringValue("internalServerException"))
		_ = eventstream.NewEncoder().Encode(&buf, f) // small and fixed: it fits
	}
	return buf.Bytes()
}
