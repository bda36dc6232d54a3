package sse

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2/packages/ssestream"
)

// scanned is one event as the hold-back sees it.
type scanned struct {
	kind Kind
	data string // for error events
}

func (e scanned) String() string { return fmt.Sprintf("%d%q", e.kind, e.data) }

// sdkEvents decodes body with the SDK's own decoder and classifies each
// event by the documented rule: what Damper's scanner must find.
func sdkEvents(body []byte) []scanned {
	res := &http.Response{
		Header: http.Header{"Content-Type": {"text/event-stream"}},
		Body:   io.NopCloser(bytes.NewReader(body)),
	}
	dec := ssestream.NewDecoder(res)
	var out []scanned
	after := false
	for dec.Next() {
		ev := dec.Event()
		data := bytes.TrimSuffix(ev.Data, []byte("\n"))
		kind := Held
		switch {
		case ev.Type == "error":
			out = append(out, scanned{ErrorEvent, string(data)})
			continue
		case ev.Type == "message_stop":
			kind = MessageStop
		case after || len(data) == 0:
		case ev.Type == "content_block_delta",
			ev.Type == "content_block_start" && blockHasContent(data, true):
			kind, after = Content, true
		}
		out = append(out, scanned{kind: kind})
	}
	return out
}

// partial stands for the data of an error event the scanner did not keep.
const partial = "\x00partial"

// scanEvents runs the scanner over body cut into pieces of size n.
func scanEvents(body []byte, n int) []scanned {
	var s Scanner
	var out []scanned
	record := func(kind Kind) {
		switch kind {
		case None, ErrorStarted, ErrorRenamed:
		case ErrorEvent:
			data, whole := s.EventData()
			if !whole {
				// Data before a line naming another event, after content:
				// documented as not kept.
				data = []byte(partial)
			}
			out = append(out, scanned{ErrorEvent, string(data)})
		default:
			out = append(out, scanned{kind: kind})
		}
	}
	for len(body) > 0 {
		chunk := body[:min(n, len(body))]
		body = body[len(chunk):]
		for off := 0; off < len(chunk); {
			k, kind := s.Scan(chunk[off:])
			if k == 0 {
				panic("scan consumed nothing")
			}
			off += k
			record(kind)
		}
	}
	record(s.EOF())
	return out
}

const anthropicStream = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"content\":[]}}\n\n" +
	"event: ping\ndata: {\"type\": \"ping\"}\n\n" +
	"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n" +
	"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n" +
	"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n" +
	"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"

// FuzzScanner checks that the scanner sees the same events as the SDK's
// decoder, whatever the bytes and however they are cut into reads.
func FuzzScanner(f *testing.F) {
	f.Add([]byte(anthropicStream), uint8(7))
	f.Add(bytes.ReplaceAll([]byte(anthropicStream), []byte("\n"), []byte("\r\n")), uint8(1))
	f.Add([]byte("data: {\"a\":1}\nevent: error\n\n:comment\nevent\ndata\n\n"), uint8(3))
	f.Add([]byte("event: content_block_start\ndata: {\"content_block\":{\"type\":\"tool_use\",\"input\":{}}}\n\nevent:content_block_start\ndata:{\"content_block\":{\"type\":\"web_search_tool_result\"}}\n\n"), uint8(5))
	f.Add([]byte("event: message_stop\r\ndata: {}\r\n\r"), uint8(2))
	f.Add([]byte("event: error\r"), uint8(64))
	f.Fuzz(func(t *testing.T, body []byte, cut uint8) {
		want := sdkEvents(body)
		got := scanEvents(body, int(cut)%64+1)
		for i := range min(len(got), len(want)) {
			if got[i].kind == ErrorEvent && got[i].data == partial {
				want[i].data = partial
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("body %q cut every %d:\nscanner %v\nSDK     %v", body, int(cut)%64+1, got, want)
		}
	})
}

// Every cut of a real stream finds the same events.
func TestScannerEveryCut(t *testing.T) {
	for _, body := range []string{anthropicStream, string(bytes.ReplaceAll([]byte(anthropicStream), []byte("\n"), []byte("\r\n")))} {
		want := sdkEvents([]byte(body))
		if len(want) != 6 || want[3].kind != Content || want[4].kind != ErrorEvent || want[5].kind != MessageStop {
			t.Fatalf("SDK events %v", want)
		}
		for n := 1; n <= len(body); n++ {
			if got := scanEvents([]byte(body), n); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("cut every %d: %v, want %v", n, got, want)
			}
		}
	}
}

func TestBlockHasContent(t *testing.T) {
	tests := map[string]bool{
		`{"content_block":{"type":"text","text":""}}`:                               false,
		`{"content_block":{"type":"text","text":"Hi"}}`:                             true,
		`{"content_block":{"type":"thinking","thinking":"","signature":""}}`:        false,
		`{"content_block":{"type":"tool_use","id":"t","name":"f","input":{}}}`:      false,
		`{"content_block":{"type":"tool_use","id":"t","name":"f","input":{ }}}`:     false,
		`{"content_block":{"type":"tool_use","id":"t","name":"f","input":{"a":1}}}`: true,
		`{"content_block":{"type":"web_search_tool_result","content":[]}}`:          true,
		`{"content_block":{"type":"redacted_thinking","data":"x"}}`:                 true,
		`{"type":"content_block_start"}`:                                            false,
	}
	for data, want := range tests {
		if got := blockHasContent([]byte(data), true); got != want {
			t.Errorf("blockHasContent(%s) = %v, want %v", data, got, want)
		}
	}
}

// BenchmarkScan measures the scan of a long answer's bytes after content.
func BenchmarkScan(b *testing.B) {
	var body bytes.Buffer
	for body.Len() < 1<<20 {
		body.WriteString("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"some words of the answer, sixty-four bytes or so, as a delta\"}}\n\n")
	}
	p := body.Bytes()
	b.SetBytes(int64(len(p)))
	b.ReportAllocs()
	for b.Loop() {
		s := Scanner{afterContent: true}
		for off := 0; off < len(p); {
			k, _ := s.Scan(p[off:min(off+32<<10, len(p))])
			off += k
		}
	}
}

// MaxEvent bounds one event, its empty line included, however it is cut
// into Scans: Scan stops at the byte that passes it, and reports TooLarge
// from then on; the events before it are found as without the bound.
func TestScannerMaxEvent(t *testing.T) {
	start := "event: message_start\ndata: {\"type\":\"message_start\"}\n\n"
	big := "event: content_block_delta\r\ndata: " + string(bytes.Repeat([]byte("x"), 100)) + "\n: comment\n\n"
	for _, tc := range []struct {
		name  string
		body  string
		max   int
		at    int // where TooLarge is reported; -1 for never
		kinds []Kind
	}{
		{"fits exactly", start + big, len(big), -1, []Kind{Held, Content}},
		{"one byte over", start + big, len(big) - 1, len(start) + len(big) - 1, []Kind{Held, TooLarge}},
		{"no line end", start + "data: " + string(bytes.Repeat([]byte("y"), 500)), 64, len(start) + 64, []Kind{Held, TooLarge}},
		{"comments only", string(bytes.Repeat([]byte(": ping\n"), 100)), 70, 70, []Kind{TooLarge}},
		{"unbounded", start + big, 0, -1, []Kind{Held, Content}},
	} {
		for _, cut := range []int{1, 7, 1 << 20} {
			s := Scanner{MaxEvent: tc.max}
			var kinds []Kind
			at, off := -1, 0
			body := []byte(tc.body)
			for off < len(body) {
				end := min(off+cut, len(body))
				n, kind := s.Scan(body[off:end])
				off += n
				if kind == TooLarge {
					at = off
					kinds = append(kinds, kind)
					if n, again := s.Scan(body[off:]); n != 0 || again != TooLarge {
						t.Errorf("%s, cut %d: after TooLarge, Scan read %d and found %d", tc.name, cut, n, again)
					}
					break
				}
				if kind != None {
					kinds = append(kinds, kind)
				}
			}
			if at != tc.at || fmt.Sprint(kinds) != fmt.Sprint(tc.kinds) {
				t.Errorf("%s, cut %d: kinds %v, TooLarge at %d; want %v at %d", tc.name, cut, kinds, at, tc.kinds, tc.at)
			}
		}
	}
}

// scanBounded runs a scanner with MaxEvent max over body cut into pieces
// of size n, and returns the kinds it found up to TooLarge, and the offset
// of TooLarge (-1 if none).
func scanBounded(body []byte, n, max int) ([]Kind, int) {
	s := Scanner{MaxEvent: max}
	var kinds []Kind
	for off := 0; off < len(body); {
		end := min(off+n, len(body))
		k, kind := s.Scan(body[off:end])
		off += k
		switch kind {
		case None, ErrorStarted, ErrorRenamed:
		case TooLarge:
			return kinds, off
		default:
			kinds = append(kinds, kind)
		}
	}
	return kinds, -1
}

// tooLargeAt returns where an event of body first passes max bytes, the
// empty line ("\n" or "\r\n" after a line end) counted in it; -1 if none.
func tooLargeAt(body []byte, max int) int {
	event := 0
	for off := 0; off < len(body); {
		i := bytes.IndexByte(body[off:], '\n')
		line := i + 1
		if i < 0 {
			line = len(body) - off
		}
		if event+line > max {
			return off + max - event
		}
		event += line
		if i < 0 {
			return -1
		}
		if l := body[off : off+i]; len(l) == 0 || string(l) == "\r" {
			event = 0
		}
		off += i + 1
	}
	return -1
}

// FuzzScannerMaxEvent checks that a bounded scanner reports TooLarge where
// an event first passes the bound, however the bytes are cut, and finds
// the same events before it as a scanner without the bound.
func FuzzScannerMaxEvent(f *testing.F) {
	f.Add([]byte(anthropicStream), uint8(7), uint8(60))
	f.Add(bytes.ReplaceAll([]byte(anthropicStream), []byte("\n"), []byte("\r\n")), uint8(1), uint8(120))
	f.Add([]byte(": ping\n: ping\n: ping\n\ndata: x\n\n"), uint8(3), uint8(20))
	f.Fuzz(func(t *testing.T, body []byte, cut, max uint8) {
		n, limit := int(cut)%64+1, int(max)+1
		kinds, at := scanBounded(body, n, limit)
		if want := tooLargeAt(body, limit); at != want {
			t.Fatalf("body %q cut every %d, limit %d: TooLarge at %d, want %d", body, n, limit, at, want)
		}
		end := len(body)
		if at >= 0 {
			end = at
		}
		want, _ := scanBounded(body[:end], n, 0)
		if fmt.Sprint(kinds) != fmt.Sprint(want) {
			t.Fatalf("body %q cut every %d, limit %d: kinds %v, want %v", body, n, limit, kinds, want)
		}
	})
}
