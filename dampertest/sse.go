package dampertest

import (
	"bytes"
	"cmp"
	"context"
	"net/http"
	"strconv"
	"strings"
)

// Fault is what goes wrong in a scripted SSE stream, at the event of index
// [Stream.At].
type Fault int

const (
	// FaultNone ends the stream cleanly after message_stop.
	FaultNone Fault = iota
	// FaultErrorEvent sends an `event: error` carrying an Anthropic error
	// (of [Stream.ErrorType]) in place of event At, then ends the body
	// cleanly. The HTTP status stays 200, as with the real API.
	FaultErrorEvent
	// FaultReset closes the connection abruptly before event At, so the
	// client's read fails with a transport error.
	FaultReset
	// FaultTruncate ends the body cleanly before event At, without
	// message_stop. The SDK reports no error for it.
	FaultTruncate
	// FaultStall stops sending before event At and holds the connection
	// open until the request's context ends (or the server closes).
	FaultStall
)

// String returns the constant's name.
func (f Fault) String() string {
	switch f {
	case FaultNone:
		return "FaultNone"
	case FaultErrorEvent:
		return "FaultErrorEvent"
	case FaultReset:
		return "FaultReset"
	case FaultTruncate:
		return "FaultTruncate"
	case FaultStall:
		return "FaultStall"
	}
	return "Fault(" + strconv.Itoa(int(f)) + ")"
}

// defaultChunkSize is small enough that a short answer spans several
// content_block_delta events, as a real one does.
const defaultChunkSize = 16

// Stream scripts a Messages API SSE stream. The full event sequence, which
// [Stream.Events] returns, is:
//
//	0        message_start
//	1..P     ping (P = Pings)
//	P+1      content_block_start (an empty text block, index 0)
//	P+2...   content_block_delta (text_delta) for each chunk of Text
//	         content_block_stop
//	         message_delta (stop_reason end_turn, usage)
//	last     message_stop
//
// Each event is sent as "event: NAME\ndata: JSON\n\n" and flushed at once,
// with content type "text/event-stream; charset=utf-8", as the API sends it
// (from [Bedrock], in an event-stream frame, which the SDK turns back into
// SSE); client.Messages.NewStreaming decodes it and Message.Accumulate rebuilds
// Text. The first content, the event a caller can show, is at
// [Stream.ContentIndex].
type Stream struct {
	// Text is the answer, sent in text_delta events; empty means "ok".
	Text string
	// ChunkSize is the number of characters (runes) per
	// content_block_delta; 0 means 16.
	ChunkSize int
	// Pings is the number of ping events after message_start.
	Pings int
	// Fault is what goes wrong; FaultNone for a clean stream.
	Fault Fault
	// At is the index, in the full event sequence, of the event at which
	// Fault happens: events 0 to At-1 are sent, then the fault. It is
	// clamped to [0, len(Events())], where the last value means after
	// message_stop.
	At int
	// ErrorType is error.type of the FaultErrorEvent event; empty means
	// overloaded_error. On [Bedrock] the event is an exception frame:
	// overloaded_error is serviceUnavailableException, api_error
	// internalServerException, rate_limit_error throttlingException, the
	// API's other types modelStreamErrorException, and any other type is
	// the exception's name as it is, such as modelTimeoutException. The SDK
	// reports it as an API error whose Type is that name.
	ErrorType string
	// PreContentBytes is the size of an SSE comment (": xxx...", which
	// clients ignore) sent just before content_block_start, to test bounds
	// on how much a client holds back before the first content. It is not
	// an event and shifts no index; a fault at or before content_block_start
	// comes before it. Bedrock's event stream has no comments: there it is
	// not sent.
	PreContentBytes int
}

// Event is one server-sent event: its name and its data line.
type Event struct {
	Name string
	Data []byte
}

// String returns the event as it is sent on the wire.
func (e Event) String() string {
	return "event: " + e.Name + "\ndata: " + string(e.Data) + "\n\n"
}

// Events returns the full event sequence of s without its fault: what a
// caller should see from a clean stream. message_start names
// [DefaultModel] and the id msg_dampertest, and reports 10 input tokens; a
// served stream names the request's model instead, and its step's
// MessageID if set, and on a server with rate limits reports the input
// tokens the request was charged (see [RateLimits]).
func (s Stream) Events() []Event {
	return s.events(messageID, DefaultModel, defaultInputTokens)
}

// ContentIndex returns the index of the first content_block_delta, the
// first event that carries content: a fault with At <= ContentIndex happens
// before any content, one with a greater At after some.
func (s Stream) ContentIndex() int {
	return 2 + max(s.Pings, 0)
}

func (s Stream) events(id, model string, inputTokens int) []Event {
	text := cmp.Or(s.Text, "ok")
	evs := []Event{{"message_start", marshal(struct {
		Type    string  `json:"type"`
		Message message `json:"message"`
	}{"message_start", message{
		ID: id, Type: "message", Role: "assistant", Model: model,
		Content: []textBlock{},
		Usage:   usage{InputTokens: inputTokens, OutputTokens: 1},
	}})}}
	for range max(s.Pings, 0) {
		// The API writes this one with a space after the colon.
		evs = append(evs, Event{"ping", []byte(`{"type": "ping"}`)})
	}
	evs = append(evs, Event{"content_block_start",
		[]byte(`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`)})
	for _, chunk := range chunks(text, cmp.Or(max(s.ChunkSize, 0), defaultChunkSize)) {
		evs = append(evs, Event{"content_block_delta", marshal(struct {
			Type  string    `json:"type"`
			Index int       `json:"index"`
			Delta textDelta `json:"delta"`
		}{"content_block_delta", 0, textDelta{"text_delta", chunk}})})
	}
	evs = append(evs,
		Event{"content_block_stop", []byte(`{"type":"content_block_stop","index":0}`)},
		Event{"message_delta", []byte(`{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null,"stop_details":null},"usage":{"output_tokens":` +
			strconv.Itoa(outputTokens(text)) + `}}`)},
		Event{"message_stop", []byte(`{"type":"message_stop"}`)},
	)
	return evs
}

type textDelta struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// chunks splits text into pieces of n runes, so no UTF-8 sequence is cut.
func chunks(text string, n int) []string {
	var out []string
	r := []rune(text)
	for len(r) > 0 {
		k := min(n, len(r))
		out = append(out, string(r[:k]))
		r = r[k:]
	}
	return out
}

// padding returns an SSE comment of exactly n bytes (blank lines when n is
// too small to hold one), which a client must skip.
func padding(n int) []byte {
	if n < 3 {
		return bytes.Repeat([]byte("\n"), max(n, 0))
	}
	return []byte(":" + strings.Repeat("x", n-3) + "\n\n")
}

// writeStream sends st as the body of a response whose headers w holds,
// in the platform's format.
func (s *Server) writeStream(ctx context.Context, w http.ResponseWriter, status int, st Stream, c call, requestID string, drop Drop) {
	evs := st.events(c.messageID, c.model, c.inputTokens)
	text := cmp.Or(st.Text, "ok")
	format := sseFormat
	if s.platform.name == platformBedrock {
		format = bedrockFormat(c.inputTokens, outputTokens(text))
	}
	h := w.Header()
	setDefault(h, "Content-Type", format.contentType)
	setDefault(h, "Cache-Control", "no-cache")
	if drop == DropMidBody || drop == StallMidBody {
		var all bytes.Buffer
		for _, e := range evs {
			all.Write(format.event(e))
		}
		w.WriteHeader(status)
		w.Write(all.Bytes()[:all.Len()/2])
		flush(w)
		s.stopMidBody(ctx, drop)
		return
	}
	w.WriteHeader(status)
	flush(w) // headers go out before the first event, as from the API

	at := len(evs) + 1 // never reached: no fault
	if st.Fault != FaultNone {
		at = min(max(st.At, 0), len(evs))
	}
	last := len(evs) - 2 // message_delta, whose usage settles the output
	if at <= last {
		c.ticket.settle(0) // it will never be sent
	}
	padAt := 1 + max(st.Pings, 0)
	for i := 0; i <= len(evs); i++ {
		if i == at {
			s.fault(ctx, w, st, format, requestID)
			return
		}
		if i == len(evs) || ctx.Err() != nil {
			return
		}
		if i == padAt && st.PreContentBytes > 0 && format.comments {
			w.Write(padding(st.PreContentBytes))
		}
		if i == last {
			c.ticket.settle(int64(outputTokens(text)))
		}
		if _, err := w.Write(format.event(evs[i])); err != nil {
			return // the client has gone
		}
		flush(w)
	}
}

// fault performs st.Fault in place of the next event.
func (s *Server) fault(ctx context.Context, w http.ResponseWriter, st Stream, format streamFormat, requestID string) {
	switch st.Fault {
	case FaultErrorEvent:
		w.Write(format.failure(st.ErrorType, requestID))
		flush(w)
	case FaultReset:
		abort()
	case FaultStall:
		s.stall(ctx)
	}
}
