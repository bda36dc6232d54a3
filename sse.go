package damper

import (
	"bytes"

	"github.com/tidwall/gjson"
)

// sseKind is what a dispatched server-sent event means to a stream's
// hold-back: whether it is content, the end of the message, or an error.
type sseKind uint8

const (
	sseNone         sseKind = iota // no event dispatched in the bytes scanned
	sseHeld                        // an event before content: message_start, ping, an empty block, ...
	sseContent                     // the first content an SDK caller sees
	sseMessageStop                 // message_stop: the answer is complete
	sseError                       // an event named error
	sseErrorStarted                // not an event: a line `event: error` has just ended
	sseErrorRenamed                // not an event: a line has renamed an event named error
)

// Limits of what the scanner keeps of one event. An event name longer than
// maxEventName is none Damper acts on; data beyond maxEventData is not kept
// (an error event that large is reported without its body).
const (
	maxEventName = 32
	maxEventData = maxErrorBody
)

// sseField is the field of the SSE line being read.
type sseField uint8

const (
	fieldUnknown sseField = iota // the name is still being read
	fieldEvent
	fieldData
	fieldOther // a comment, an id, a retry or an unknown field: skipped
)

// sseScanner follows a text/event-stream body as the SDK's decoder
// (packages/ssestream) reads it, so that Damper and the caller agree on
// every event: lines end at "\n" with one trailing "\r" dropped, a field
// name runs to the first ":" (one space after it is dropped), an empty line
// dispatches the event when it has a name or data, and the last `event:`
// line of an event names it.
//
// It keeps nothing of a line but its field name and, when Damper needs it,
// the event's name and data, and it finds line ends with bytes.IndexByte,
// so scanning costs little more than the bytes' trip through memory. Data
// is kept for every event before content (a content_block_start's block
// says whether it carries content) and after it only for events whose name
// is not known yet or is "error"; an error event whose data came before a
// line naming another event is reported without all of it.
//
// The zero value is ready to use, in the before-content mode.
type sseScanner struct {
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
	dataOver   bool   // data overflowed maxEventData, or was not all kept

	// The event last dispatched: its data stays in data until the next
	// call of scan or eof.
	dispatched bool
	whole      bool // all of its data was kept
}

// scan reads p up to the next point the stream's hold-back must act on and
// returns how many bytes of p it consumed and what it found there: the
// dispatch of an event (its line end included), the end of a line naming
// the event "error" or renaming an event so named, or sseNone with all of
// p consumed. The data of an
// event is valid, through eventData, until the next call.
func (s *sseScanner) scan(p []byte) (n int, kind sseKind) {
	s.forget()
	for n < len(p) {
		i := bytes.IndexByte(p[n:], '\n')
		if i < 0 {
			s.segment(p[n:])
			return len(p), sseNone
		}
		s.segment(p[n : n+i])
		n += i + 1
		if kind := s.endLine(); kind != sseNone {
			return n, kind
		}
	}
	return n, sseNone
}

// eof ends the stream: as the SDK's bufio.Scanner does at the end of its
// input, a last line without "\n" still counts as a line, so a final "\r"
// still dispatches an event.
func (s *sseScanner) eof() sseKind {
	s.forget()
	if s.lineN == 0 {
		return sseNone
	}
	kind := s.endLine()
	if kind == sseErrorStarted || kind == sseErrorRenamed {
		return sseNone
	}
	return kind
}

// eventData returns the data of the event just dispatched, as the SDK
// hands it to the JSON decoder (the final "\n" dropped), and whether all of
// it was kept.
func (s *sseScanner) eventData() ([]byte, bool) {
	return bytes.TrimSuffix(s.data, []byte("\n")), s.whole
}

// forget drops the data of the event last dispatched.
func (s *sseScanner) forget() {
	if s.dispatched {
		s.data, s.drop, s.dataOver, s.dispatched = s.data[:0], false, false, false
	}
}

// segment takes bytes of the current line, with no '\n' among them.
func (s *sseScanner) segment(b []byte) {
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
			s.field = fieldOther // longer than any field Damper reads
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
func (s *sseScanner) keepData(b []byte) {
	if s.drop || s.dataOver {
		return
	}
	if len(s.data)+len(b) > maxEventData {
		s.dataOver = true
		return
	}
	s.data = append(s.data, b...)
}

// endLine ends the current line and reports what it dispatched or named.
func (s *sseScanner) endLine() sseKind {
	field, lastCR := s.field, s.lastCR
	if field == fieldUnknown {
		// No colon: the whole line is the field name, with an empty value.
		head := s.head[:s.headN]
		if lastCR {
			head = head[:len(head)-1]
		}
		if len(head) == 0 {
			s.resetLine()
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
		want := name == "error" || !s.afterContent
		if want && s.drop && s.dataN > 0 {
			s.dataOver = true // data came before this name and was dropped
		}
		s.drop = !want
		wasError := s.errorNamed
		s.errorNamed = name == "error"
		if s.errorNamed {
			return sseErrorStarted
		}
		if wasError {
			return sseErrorRenamed
		}
	}
	return sseNone
}

func (s *sseScanner) resetLine() {
	s.field, s.headN, s.lineN, s.valueN, s.lastCR = fieldUnknown, 0, 0, 0, false
}

// eventName returns the name of the current event; a name too long to
// keep reads as one Damper does not act on.
func (s *sseScanner) eventName() string {
	if s.nameLong {
		return "\x00long"
	}
	return string(s.name[:s.nameN])
}

// dispatch ends the current event on an empty line and classifies it.
func (s *sseScanner) dispatch() sseKind {
	if s.nameN == 0 && !s.nameLong && s.dataN == 0 {
		s.drop, s.dataOver = false, false
		return sseNone // the SDK skips it: nothing to dispatch
	}
	s.whole = !s.drop && !s.dataOver
	kind := s.classify()
	if kind == sseContent {
		s.afterContent = true
	}
	s.nameN, s.nameLong, s.dataN, s.dispatched, s.errorNamed = 0, false, 0, true, false
	return kind
}

// classify names the kind of the event being dispatched.
func (s *sseScanner) classify() sseKind {
	// The SDK skips an event whose data is empty once its final "\n" is
	// dropped, so such an event is never content.
	hasData := s.dataN > 1
	switch s.eventName() {
	case "error":
		return sseError
	case "message_stop":
		return sseMessageStop
	case "content_block_delta":
		if hasData && !s.afterContent {
			return sseContent
		}
	case "content_block_start":
		if hasData && !s.afterContent && blockHasContent(s.data, s.whole) {
			return sseContent
		}
	}
	return sseHeld
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
