// Package sse follows a text/event-stream body of the Messages API as the
// SDK's decoder reads it, so that a stream's hold-back and its caller agree
// on every event: where the first content is, where the message ends, and
// which event is an error. It is pure (bytes in, events out) and fuzzed
// against the SDK's own decoder.
package sse

import (
	"bytes"

	"github.com/tidwall/gjson"
)

// Kind is what a dispatched server-sent event means to a stream's
// hold-back: whether it is content, the end of the message, or an error.
type Kind uint8

const (
	None         Kind = iota // no event dispatched in the bytes scanned
	Held                     // an event before content: message_start, ping, an empty block, ...
	Content                  // the first content an SDK caller sees
	MessageStop              // message_stop: the answer is complete
	ErrorEvent               // an event named error
	ErrorStarted             // not an event: a line `event: error` has just ended
	ErrorRenamed             // not an event: a line has renamed an event named error
	// TooLarge is not an event: the event being read has passed
	// Scanner.MaxEvent bytes. Every later Scan reports it again.
	TooLarge
)

// Limits of what the scanner keeps of one event. An event name longer than
// maxEventName is none a hold-back acts on; data beyond MaxEventData (1 MiB)
// is not kept (an error event that large is reported without its body).
const (
	maxEventName = 32
	MaxEventData = 1 << 20
)

// sseField is the field of the SSE line being read.
type sseField uint8

const (
	fieldUnknown sseField = iota // the name is still being read
	fieldEvent
	fieldData
	fieldOther // a comment, an id, a retry or an unknown field: skipped
)

// Scanner follows a text/event-stream body as the SDK's decoder
// (packages/ssestream) reads it, so that the hold-back and the caller agree on
// every event: lines end at "\n" with one trailing "\r" dropped, a field
// name runs to the first ":" (one space after it is dropped), an empty line
// dispatches the event when it has a name or data, and the last `event:`
// line of an event names it.
//
// It keeps nothing of a line but its field name and, when the hold-back needs it,
// the event's name and data, and it finds line ends with bytes.IndexByte,
// so scanning costs little more than the bytes' trip through memory. Data
// is kept for every event before content (a content_block_start's block
// says whether it carries content) and after it only for events whose name
// is not known yet or is "error"; an error event whose data came before a
// line naming another event is reported without all of it.
//
// The zero value is ready to use, in the before-content mode.
type Scanner struct {
	// TrackUsage makes the scanner read the token usage of message_start
	// and message_delta events (see Usage); set it before the first Scan.
	TrackUsage bool
	usage      Usage

	// MaxEvent, when above 0, bounds one event: the bytes from the end of
	// the last event (the empty line that ends it) to the end of this
	// one, its own empty line included. Scan stops at the byte that
	// passes it and reports TooLarge. Set it before the first Scan.
	MaxEvent int
	eventN   int // bytes of the current event so far

	afterContent bool // set once the first content has been dispatched

	// The current line.
	field  sseField
	head   [8]byte // the start of the line while field is fieldUnknown
	headN  int
	lineN  int  // bytes of the line seen so far
	valueN int  // bytes of the field value seen so far
	lastCR bool // the last byte of the line so far is '\r'

	// The current event.
	name     [maxEventName]byte
	nameN    int
	nameLong bool // the event line's value overflowed name
	// errorNamed is whether the current event is named "error" so far.
	errorNamed bool
	dataN      int    // bytes of data as the SDK holds it: each value and a '\n'
	data       []byte // the data, when kept
	drop       bool   // the event's name says its data is not needed
	dataOver   bool   // data overflowed MaxEventData, or was not all kept

	// The event last dispatched: its data stays in data until the next
	// call of scan or eof.
	dispatched bool
	whole      bool // all of its data was kept
}

// scan reads p up to the next point the stream's hold-back must act on and
// returns how many bytes of p it consumed and what it found there: the
// dispatch of an event (its line end included), the end of a line naming
// the event "error" or renaming an event so named, or None with all of
// p consumed. The data of an
// event is valid, through eventData, until the next call.
func (s *Scanner) Scan(p []byte) (n int, kind Kind) {
	s.forget()
	for n < len(p) {
		i := bytes.IndexByte(p[n:], '\n')
		line := i + 1 // the bytes up to the line's end, "\n" included
		if i < 0 {
			line = len(p) - n
		}
		if s.MaxEvent > 0 && s.eventN+line > s.MaxEvent {
			room := s.MaxEvent - s.eventN
			s.segment(p[n : n+room])
			s.eventN = s.MaxEvent
			return n + room, TooLarge
		}
		s.eventN += line
		if i < 0 {
			s.segment(p[n:])
			return len(p), None
		}
		s.segment(p[n : n+i])
		n += i + 1
		if kind := s.endLine(); kind != None {
			return n, kind
		}
	}
	return n, None
}

// eof ends the stream: as the SDK's bufio.Scanner does at the end of its
// input, a last line without "\n" still counts as a line, so a final "\r"
// still dispatches an event.
func (s *Scanner) EOF() Kind {
	s.forget()
	if s.lineN == 0 {
		return None
	}
	kind := s.endLine()
	if kind == ErrorStarted || kind == ErrorRenamed {
		return None
	}
	return kind
}

// eventData returns the data of the event just dispatched, as the SDK
// hands it to the JSON decoder (the final "\n" dropped), and whether all of
// it was kept.
func (s *Scanner) EventData() ([]byte, bool) {
	return bytes.TrimSuffix(s.data, []byte("\n")), s.whole
}

// ErrorNamed reports whether the event being read is named "error" so
// far: a later line may still rename it.
func (s *Scanner) ErrorNamed() bool { return s.errorNamed }

// forget drops the data of the event last dispatched.
func (s *Scanner) forget() {
	if s.dispatched {
		s.data, s.drop, s.dataOver, s.dispatched = s.data[:0], false, false, false
	}
}

// segment takes bytes of the current line, with no '\n' among them.
func (s *Scanner) segment(b []byte) {
	if len(b) == 0 {
		return
	}
	s.lineN += len(b)
	s.lastCR = b[len(b)-1] == '\r'
	if s.field == fieldUnknown {
		colon := bytes.IndexByte(b, ':')
		name := b
		if colon >= 0 {
			name = b[:colon]
		}
		if s.headN+len(name) > len(s.head) {
			s.field = fieldOther // longer than any field the scanner reads
			return
		}
		s.headN += copy(s.head[s.headN:], name)
		if colon < 0 {
			return
		}
		s.field = fieldOf(s.head[:s.headN])
		if s.field == fieldEvent {
			s.nameN, s.nameLong = 0, false
		}
		b = b[colon+1:]
	}
	if s.valueN == 0 && len(b) > 0 && b[0] == ' ' {
		b = b[1:]
		s.valueN = 1 // the optional space is dropped once, at the start
	}
	s.valueN += len(b)
	switch s.field {
	case fieldEvent:
		if s.nameN+len(b) > len(s.name) {
			s.nameLong = true
			return
		}
		s.nameN += copy(s.name[s.nameN:], b)
	case fieldData:
		s.dataN += len(b)
		s.keepData(b)
	}
}

func fieldOf(name []byte) sseField {
	switch string(name) {
	case "event":
		return fieldEvent
	case "data":
		return fieldData
	}
	return fieldOther
}

// keepData appends b to the event's data if the event needs it.
func (s *Scanner) keepData(b []byte) {
	if s.drop || s.dataOver {
		return
	}
	if len(s.data)+len(b) > MaxEventData {
		s.dataOver = true
		return
	}
	s.data = append(s.data, b...)
}

// endLine ends the current line and reports what it dispatched or named.
func (s *Scanner) endLine() Kind {
	field, lastCR := s.field, s.lastCR
	if field == fieldUnknown {
		// No colon: the whole line is the field name, with an empty value.
		head := s.head[:s.headN]
		if lastCR {
			head = head[:len(head)-1]
		}
		if len(head) == 0 {
			s.resetLine()
			s.eventN = 0 // an empty line ends the event, dispatched or not
			return s.dispatch()
		}
		field = fieldOf(head)
		if field == fieldEvent {
			s.nameN, s.nameLong = 0, false
		}
	} else if lastCR && s.valueN > 0 {
		s.valueN--
		switch field {
		case fieldEvent:
			if !s.nameLong {
				s.nameN--
			}
		case fieldData:
			s.dataN--
			if !s.drop && !s.dataOver {
				s.data = s.data[:len(s.data)-1]
			}
		}
	}
	s.resetLine()
	switch field {
	case fieldData:
		s.dataN++
		s.keepData([]byte{'\n'})
	case fieldEvent:
		name := s.eventName()
		// Before content every event is held anyway, and kept whole;
		// after it only an error event's data is needed.
		want := name == "error" || !s.afterContent || (s.TrackUsage && name == "message_delta")
		if want && s.drop && s.dataN > 0 {
			s.dataOver = true // data came before this name and was dropped
		}
		s.drop = !want
		wasError := s.errorNamed
		s.errorNamed = name == "error"
		if s.errorNamed {
			return ErrorStarted
		}
		if wasError {
			return ErrorRenamed
		}
	}
	return None
}

func (s *Scanner) resetLine() {
	s.field, s.headN, s.lineN, s.valueN, s.lastCR = fieldUnknown, 0, 0, 0, false
}

// eventName returns the name of the current event; a name too long to
// keep reads as one the hold-back does not act on.
func (s *Scanner) eventName() string {
	if s.nameLong {
		return "\x00long"
	}
	return string(s.name[:s.nameN])
}

// dispatch ends the current event on an empty line and classifies it.
func (s *Scanner) dispatch() Kind {
	if s.nameN == 0 && !s.nameLong && s.dataN == 0 {
		s.drop, s.dataOver = false, false
		return None // the SDK skips it: nothing to dispatch
	}
	s.whole = !s.drop && !s.dataOver
	kind := s.classify()
	if s.TrackUsage && s.whole {
		s.readUsage()
	}
	if kind == Content {
		s.afterContent = true
	}
	s.nameN, s.nameLong, s.dataN, s.dispatched, s.errorNamed = 0, false, 0, true, false
	return kind
}

// classify names the kind of the event being dispatched.
func (s *Scanner) classify() Kind {
	// The SDK skips an event whose data is empty once its final "\n" is
	// dropped, so such an event is never content.
	hasData := s.dataN > 1
	switch s.eventName() {
	case "error":
		return ErrorEvent
	case "message_stop":
		return MessageStop
	case "content_block_delta":
		if hasData && !s.afterContent {
			return Content
		}
	case "content_block_start":
		if hasData && !s.afterContent && blockHasContent(s.data, s.whole) {
			return Content
		}
	}
	return Held
}

// Usage is the token usage of a stream's message, as its events give it.
type Usage struct {
	Input, CacheCreation, CacheRead, Output int64
	// Known is true once an event has given any of it.
	Known bool
	// Events counts the events that gave any of it, so that a reader can
	// tell that it has changed.
	Events int
}

// Usage returns the usage read so far: message_start's, updated by each
// message_delta (whose counts are the message's totals so far).
func (s *Scanner) Usage() Usage { return s.usage }

// readUsage takes the usage of the event being dispatched, if it has one.
func (s *Scanner) readUsage() {
	var u gjson.Result
	switch s.eventName() {
	case "message_start":
		u = gjson.GetBytes(s.data, "message.usage")
	case "message_delta":
		u = gjson.GetBytes(s.data, "usage")
	default:
		return
	}
	if !u.IsObject() {
		return
	}
	s.usage.Events++
	for _, f := range [...]struct {
		key string
		dst *int64
	}{
		{"input_tokens", &s.usage.Input},
		{"cache_creation_input_tokens", &s.usage.CacheCreation},
		{"cache_read_input_tokens", &s.usage.CacheRead},
		{"output_tokens", &s.usage.Output},
	} {
		if v := u.Get(f.key); v.Type == gjson.Number {
			*f.dst = v.Int()
			s.usage.Known = true
		}
	}
}

// blockHasContent reports whether the data of a content_block_start event
// carries content the caller can use: any block but an empty text or
// thinking block, or a tool call whose input is still to come. A block too
// large to have been kept counts as content.
func blockHasContent(data []byte, whole bool) bool {
	if !whole {
		return true
	}
	block := gjson.GetBytes(data, "content_block")
	switch block.Get("type").Str {
	case "text":
		return block.Get("text").Str != ""
	case "thinking":
		return block.Get("thinking").Str != ""
	case "tool_use", "server_tool_use", "mcp_tool_use":
		in := block.Get("input")
		return in.Exists() && in.Type != gjson.Null && !isEmptyObject(in.Raw)
	case "":
		return false // not a block: nothing the caller can show
	}
	return true
}

func isEmptyObject(raw string) bool {
	return bytes.Equal(bytes.Join(bytes.Fields([]byte(raw)), nil), []byte("{}"))
}
