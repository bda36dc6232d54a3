package dampertest

import (
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
)

// streamResult is what a caller of the SDK saw from one stream.
type streamResult struct {
	types []string // event types, pings excluded as the SDK skips them
	msg   anthropic.Message
	err   error
}

// readStream drains a stream through the SDK, accumulating the message.
// onEvent, if set, runs after each event.
func readStream(t *testing.T, client *anthropic.Client, ctx context.Context, scenario string, onEvent func(anthropic.MessageStreamEventUnion)) streamResult {
	t.Helper()
	stream := client.Messages.NewStreaming(ctx, params(), Scenario(scenario))
	defer stream.Close()
	var res streamResult
	for stream.Next() {
		ev := stream.Current()
		res.types = append(res.types, ev.Type)
		if err := res.msg.Accumulate(ev); err != nil {
			t.Fatalf("Accumulate(%s): %v", ev.Type, err)
		}
		if onEvent != nil {
			onEvent(ev)
		}
	}
	res.err = stream.Err()
	return res
}

// names returns the event names of evs without pings.
func names(evs []Event) []string {
	var out []string
	for _, e := range evs {
		if e.Name != "ping" {
			out = append(out, e.Name)
		}
	}
	return out
}

func TestStreamClean(t *testing.T) {
	srv := NewServer()
	defer srv.Close()
	client := newClient(srv)

	st := Stream{Text: "Hello, streaming world — ünïcode ✓ and more text.", ChunkSize: 5, Pings: 2}
	srv.Script("clean", OK().WithStream(st))
	res := readStream(t, &client, context.Background(), "clean", nil)
	if res.err != nil {
		t.Fatal(res.err)
	}
	if got := res.msg.Content[0].Text; got != st.Text {
		t.Errorf("accumulated %q, want %q", got, st.Text)
	}
	if want := names(st.Events()); !slices.Equal(res.types, want) {
		t.Errorf("events %v, want %v", res.types, want)
	}
	if res.msg.StopReason != anthropic.StopReasonEndTurn || res.msg.Model != DefaultModel {
		t.Errorf("message = %s", res.msg.RawJSON())
	}

	// A stream request to an unscripted scenario gets a clean stream of "ok".
	res = readStream(t, &client, context.Background(), "unscripted", nil)
	if res.err != nil || res.msg.Content[0].Text != "ok" {
		t.Errorf("default stream: text %q, err %v", res.msg.Content[0].Text, res.err)
	}
}

func TestStreamWireFormat(t *testing.T) {
	srv := NewServer()
	defer srv.Close()
	st := Stream{Text: "a <b> & c", ChunkSize: 4, Pings: 1, PreContentBytes: 100}
	srv.Script("wire", OK().WithStream(st))

	req, _ := http.NewRequest("POST", srv.URL()+"/v1/messages", strings.NewReader(`{"model":"`+DefaultModel+`","stream":true}`))
	req.Header.Set(ScenarioHeader, "wire")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream; charset=utf-8" {
		t.Errorf("content type %q", ct)
	}

	evs := st.Events()
	var want strings.Builder
	for i, e := range evs {
		if i == 2 { // content_block_start, after message_start and one ping
			want.WriteString(":" + strings.Repeat("x", 97) + "\n\n")
		}
		want.WriteString(e.String())
	}
	if string(body) != want.String() {
		t.Errorf("body:\n%s\nwant:\n%s", body, want.String())
	}

	wantNames := []string{"message_start", "ping", "content_block_start", "content_block_delta", "content_block_delta",
		"content_block_delta", "content_block_stop", "message_delta", "message_stop"}
	var gotNames []string
	for _, e := range evs {
		gotNames = append(gotNames, e.Name)
	}
	if !slices.Equal(gotNames, wantNames) {
		t.Errorf("Events() names %v, want %v", gotNames, wantNames)
	}
	if st.ContentIndex() != 3 || evs[st.ContentIndex()].Name != "content_block_delta" {
		t.Errorf("ContentIndex = %d", st.ContentIndex())
	}
	for _, want := range []string{
		`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a <b"}}`,
		`{"type": "ping"}`,
		`{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null,"stop_details":null},"usage":{"output_tokens":3}}`,
		`"content":[],"stop_reason":null,"stop_sequence":null,"stop_details":null`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("body lacks %s", want)
		}
	}
}

func TestStreamPadding(t *testing.T) {
	for _, n := range []int{0, 1, 2, 3, 4, 1 << 20} {
		if got := len(padding(n)); got != n {
			t.Errorf("len(padding(%d)) = %d", n, got)
		}
	}
	// Padding is invisible to the SDK, even a large one.
	srv := NewServer()
	defer srv.Close()
	client := newClient(srv)
	srv.Script("pad", OK().WithStream(Stream{Text: "padded", PreContentBytes: 1 << 20}))
	res := readStream(t, &client, context.Background(), "pad", nil)
	if res.err != nil || res.msg.Content[0].Text != "padded" {
		t.Errorf("text %q, err %v", res.msg.Content[0].Text, res.err)
	}
}

func TestStreamFaults(t *testing.T) {
	srv := NewServer()
	defer srv.Close()
	client := newClient(srv)

	base := Stream{Text: "abcdefghij", ChunkSize: 2, Pings: 1} // 5 deltas
	all := names(base.Events())
	ci := base.ContentIndex() // 3
	tests := []struct {
		name      string
		st        Stream
		wantTypes []string // what the caller sees (pings excluded)
		wantText  string
		check     func(t *testing.T, err error)
	}{
		{
			name:      "error event before content",
			st:        Stream{Fault: FaultErrorEvent, At: ci},
			wantTypes: all[:2],
			check:     wantAPIError("overloaded_error", "req_dampertest_error_event_before_content_1"),
		},
		{
			name:      "error event after content",
			st:        Stream{Fault: FaultErrorEvent, At: ci + 2, ErrorType: "api_error"},
			wantTypes: all[:4],
			wantText:  "abcd",
			check:     wantAPIError("api_error", "req_dampertest_error_event_after_content_1"),
		},
		{
			name:      "error event first",
			st:        Stream{Fault: FaultErrorEvent, At: 0, ErrorType: "rate_limit_error"},
			wantTypes: nil,
			check:     wantAPIError("rate_limit_error", "req_dampertest_error_event_first_1"),
		},
		{
			name:      "reset after content",
			st:        Stream{Fault: FaultReset, At: ci + 1},
			wantTypes: all[:3],
			wantText:  "ab",
			check:     wantErrIs(io.ErrUnexpectedEOF),
		},
		{
			name:      "reset before message_start",
			st:        Stream{Fault: FaultReset, At: -5},
			wantTypes: nil,
			check:     wantErrIs(io.ErrUnexpectedEOF),
		},
		{
			name:      "truncate before message_stop",
			st:        Stream{Fault: FaultTruncate, At: len(base.Events()) - 1},
			wantTypes: all[:len(all)-1],
			wantText:  "abcdefghij",
			check:     wantErrIs(nil), // the SDK cannot tell: that is the point
		},
		{
			name:      "fault after the end is a clean stream",
			st:        Stream{Fault: FaultTruncate, At: 99},
			wantTypes: all,
			wantText:  "abcdefghij",
			check:     wantErrIs(nil),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := tt.st
			st.Text, st.ChunkSize, st.Pings = base.Text, base.ChunkSize, base.Pings
			scenario := strings.ReplaceAll(tt.name, " ", "_")
			srv.Script(scenario, OK().WithStream(st))
			res := readStream(t, &client, context.Background(), scenario, nil)
			if !slices.Equal(res.types, tt.wantTypes) {
				t.Errorf("events %v, want %v", res.types, tt.wantTypes)
			}
			if len(res.msg.Content) > 0 && res.msg.Content[0].Text != tt.wantText {
				t.Errorf("text %q, want %q", res.msg.Content[0].Text, tt.wantText)
			}
			tt.check(t, res.err)
		})
	}
}

func wantAPIError(errorType, requestID string) func(*testing.T, error) {
	return func(t *testing.T, err error) {
		t.Helper()
		var apiErr *anthropic.Error
		if !errors.As(err, &apiErr) {
			t.Fatalf("err = %v, want *anthropic.Error", err)
		}
		// An error event arrives on a 200 response.
		if apiErr.StatusCode != 200 || string(apiErr.Type()) != errorType || apiErr.RequestID != requestID {
			t.Errorf("status %d, type %q, request id %q; want 200 %s %s", apiErr.StatusCode, apiErr.Type(), apiErr.RequestID, errorType, requestID)
		}
	}
}

func wantErrIs(target error) func(*testing.T, error) {
	return func(t *testing.T, err error) {
		t.Helper()
		if target == nil && err != nil || !errors.Is(err, target) {
			t.Errorf("err = %v, want %v", err, target)
		}
	}
}

func TestStreamStall(t *testing.T) {
	srv := NewServer()
	defer srv.Close()
	client := newClient(srv)
	st := Stream{Text: "abcdef", ChunkSize: 2, Fault: FaultStall}
	st.At = st.ContentIndex() + 1
	srv.Script("stall", OK().WithStream(st))

	// The caller gives up after the first content: the stall holds until then.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res := readStream(t, &client, ctx, "stall", func(ev anthropic.MessageStreamEventUnion) {
		if ev.Type == "content_block_delta" {
			cancel()
		}
	})
	if !errors.Is(res.err, context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", res.err)
	}
	if res.msg.Content[0].Text != "ab" {
		t.Errorf("text %q", res.msg.Content[0].Text)
	}
}

func TestStreamStallReleasedByClose(t *testing.T) {
	srv := NewServer()
	client := newClient(srv)
	srv.Script("stall", OK().WithStream(Stream{Fault: FaultStall, At: 1}))

	stream := client.Messages.NewStreaming(context.Background(), params(), Scenario("stall"))
	defer stream.Close()
	if !stream.Next() || stream.Current().Type != "message_start" {
		t.Fatalf("first event: %v", stream.Err())
	}
	srv.Close() // must not wait for the stalled handler forever
	if stream.Next() {
		t.Fatalf("event after the stall: %s", stream.Current().Type)
	}
	if !errors.Is(stream.Err(), io.ErrUnexpectedEOF) {
		t.Errorf("err = %v, want io.ErrUnexpectedEOF (connection cut)", stream.Err())
	}
}

func TestStreamDropMidBody(t *testing.T) {
	srv := NewServer()
	defer srv.Close()
	client := newClient(srv)
	srv.Script("drop", OK().WithStream(Stream{Text: strings.Repeat("x", 100)}).WithDrop(DropMidBody))
	res := readStream(t, &client, context.Background(), "drop", nil)
	if !errors.Is(res.err, io.ErrUnexpectedEOF) {
		t.Errorf("err = %v", res.err)
	}
	if len(res.types) == 0 || slices.Contains(res.types, "message_stop") {
		t.Errorf("events %v: want some, without message_stop", res.types)
	}
}

func TestStreamErrorStatus(t *testing.T) {
	// An error status answers with a JSON error even for a scripted stream.
	srv := NewServer()
	defer srv.Close()
	client := newClient(srv)
	srv.Script("529", Status(529).WithStream(Stream{}))
	res := readStream(t, &client, context.Background(), "529", nil)
	var apiErr *anthropic.Error
	if !errors.As(res.err, &apiErr) || apiErr.StatusCode != 529 || apiErr.Type() != "overloaded_error" {
		t.Errorf("err = %v", res.err)
	}
}
