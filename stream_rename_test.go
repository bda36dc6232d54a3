package damper_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// rawSSE serves body as a stream, in writes of chunk bytes.
func rawSSE(body string, chunk int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		for rest := body; len(rest) > 0; {
			n := min(chunk, len(rest))
			_, _ = io.WriteString(w, rest[:n])
			_ = http.NewResponseController(w).Flush()
			rest = rest[n:]
		}
	}
}

// sameAsBareSDK drains one stream of h through Damper and one through the
// SDK alone, and checks that the caller sees the same events and, for a
// stream the SDK ends without error, no error.
func sameAsBareSDK(t *testing.T, h http.Handler) {
	t.Helper()
	synctest.Test(t, func(t *testing.T) {
		bare := anthropic.NewClient(option.WithBaseURL("http://api.invalid"), option.WithAPIKey("test-key"),
			option.WithHTTPClient(&http.Client{Transport: dampertest.Transport(h)}))
		want, wantErr := drain(bare.Messages.NewStreaming(context.Background(), streamParams()))
		var rep damper.Report
		client := memClient(newDamper(t, damper.Policy{}), h)
		got, err := drain(client.Messages.NewStreaming(context.Background(), streamParams(), damper.ReportInto(&rep)))
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("err %v, the SDK alone: %v", err, wantErr)
		}
		if rawEvents(got) != rawEvents(want) {
			t.Fatalf("events through Damper:\n%s\nthe SDK alone:\n%s", rawEvents(got), rawEvents(want))
		}
		if wantErr == nil && rep.Outcome != damper.OutcomeSuccess {
			t.Fatalf("report outcome %q, want success", rep.Outcome)
		}
	})
}

// sseBody is a whole stream of text with extra inserted after its first
// content_block_delta: the events the caller sees after content.
func sseBody(text, extra string) string {
	var b strings.Builder
	deltas := 0
	for _, e := range (dampertest.Stream{Text: text, ChunkSize: 4}).Events() {
		b.WriteString(e.String())
		if e.Name == "content_block_delta" {
			if deltas++; deltas == 1 {
				b.WriteString(extra)
			}
		}
	}
	return b.String()
}

// An event first named error and then renamed by a later line is the later
// name's, as the SDK's decoder has it: after content, Damper delivers it
// as the SDK alone does, in any cut of the bytes.
func TestStreamErrorEventRenamedAfterContent(t *testing.T) {
	delta := `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" more"}}`
	for name, extra := range map[string]string{
		"renamed":               "event: error\nevent: content_block_delta\ndata: " + delta + "\n\n",
		"data before rename":    "event: error\ndata: " + delta + "\nevent: content_block_delta\n\n",
		"renamed, then error":   "event: error\nevent: ping\nevent: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"x\"}}\n\n",
		"renamed twice":         "event: error\nevent: content_block_delta\nevent: error\nevent: content_block_delta\ndata: " + delta + "\n\n",
		"renamed to a ping":     "event: error\r\nevent: ping\r\ndata: {\"type\": \"ping\"}\r\n\r\n",
		"error, not renamed":    "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"busy\"}}\n\n",
		"error named last only": "event: content_block_delta\nevent: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"busy\"}}\n\n",
	} {
		body := sseBody("Hello, renamed world", extra)
		for _, chunk := range []int{1, 7, 64, 1 << 20} {
			t.Run(fmt.Sprintf("%s/chunk %d", name, chunk), func(t *testing.T) {
				sameAsBareSDK(t, rawSSE(body, chunk))
			})
		}
	}
}

// A stream with no content at all, longer than one read of the SDK's
// decoder, is held back whole and then released whole at message_stop.
func TestStreamWithoutContentReleasedWhole(t *testing.T) {
	var b strings.Builder
	evs := (dampertest.Stream{Text: "x"}).Events()
	b.WriteString(evs[0].String()) // message_start
	for i := range 400 {
		fmt.Fprintf(&b, "event: ping\ndata: {\"type\": \"ping\", \"n\": %d}\n\n", i)
	}
	b.WriteString("event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n")
	b.WriteString("event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n")
	b.WriteString("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":0}}\n\n")
	b.WriteString("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
	if b.Len() < 16<<10 {
		t.Fatalf("the stream is %d bytes, want more than the decoder's first reads", b.Len())
	}
	sameAsBareSDK(t, rawSSE(b.String(), 1<<20))
}
