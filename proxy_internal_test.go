package damper

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

// endsEvent reports whether b ends with an empty line: a line end ("\n",
// "\r\n" or "\r") right after another.
func endsEvent(b []byte) bool {
	for _, end := range []string{"\n\n", "\r\r", "\n\r", "\r\n\r\n", "\n\r\n", "\r\r\n"} {
		if bytes.HasSuffix(b, []byte(end)) {
			return true
		}
	}
	return false
}

// FuzzEventEnds: whatever the stream and however it is read, the proxy
// passes it on whole and in order, each part it hands on ends an event,
// and what it holds at the end holds no whole event.
func FuzzEventEnds(f *testing.F) {
	f.Add([]byte("event: a\ndata: 1\n\nevent: b\ndata: 2\n\n"), uint8(3))
	f.Add([]byte("event: a\r\ndata: 1\r\n\r\nevent: b\r\ndata: 2\r\n\r\npartial"), uint8(1))
	f.Add([]byte("data: x\r\rdata: y\n\r\ndata: z"), uint8(2))
	f.Fuzz(func(t *testing.T, in []byte, step uint8) {
		size := int(step%16) + 1
		var e eventEnds
		var out, held []byte
		for i := 0; i < len(in); i += size {
			from := len(held)
			held = append(held, in[i:min(i+size, len(in))]...)
			if cut := e.last(held, from, len(held)); cut > 0 {
				out = append(out, held[:cut]...)
				held = append([]byte(nil), held[cut:]...)
				if !endsEvent(out) {
					t.Fatalf("handed on %q, which ends no event", out)
				}
			}
		}
		rest := held
		if len(rest) > 0 && rest[0] == '\n' {
			rest = rest[1:] // the "\n" of a "\r\n" split across reads
		}
		if bytes.Contains(rest, []byte("\n\n")) || bytes.Contains(rest, []byte("\r\n\r\n")) {
			t.Fatalf("holds %q, which has a whole event", rest)
		}
		if out = append(out, held...); !bytes.Equal(out, in) {
			t.Fatalf("passed on %q, want %q", out, in)
		}
	})
}

// BenchmarkCheckMessagesBody times the proxy's check at the door; the
// engine's own read of the same bodies is internal/engine's
// BenchmarkReadBodyFactsAtTheDoor: the check is one more pass over the body's top
// level, at the same speed.
func BenchmarkCheckMessagesBody(b *testing.B) {
	for _, size := range []int{2 << 10, 1 << 20} {
		body := []byte(`{"messages":[{"role":"user","content":"` + strings.Repeat("x", size) +
			`"}],"model":"claude-sonnet-4-6","max_tokens":1024,"stream":true}`)
		b.Run(fmt.Sprintf("check/%dKiB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if err := checkMessagesBody(body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
