package damper_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/anthropics/anthropic-sdk-go/v2/packages/ssestream"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// streamRig is a Damper on a virtual clock in front of a loopback fake API,
// with an HTTP client of its own so that its connections close with the test.
type streamRig struct {
	clock  *dampertest.Clock
	srv    *dampertest.Server
	d      *damper.Damper
	client anthropic.Client
}

func newStreamRig(t *testing.T, p damper.Policy) *streamRig {
	t.Helper()
	clk := dampertest.NewClock(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC))
	srv := dampertest.NewServer(dampertest.WithClock(clk))
	tr := &http.Transport{}
	t.Cleanup(func() {
		srv.Close()
		tr.CloseIdleConnections()
	})
	d, err := damper.New(p, damper.WithClock(clk), damper.WithRand(func() float64 { return 0.5 }))
	if err != nil {
		t.Fatal(err)
	}
	opts := append([]option.RequestOption{d.Option()}, srv.Options()...)
	opts = append(opts, option.WithHTTPClient(&http.Client{Transport: tr}))
	return &streamRig{clock: clk, srv: srv, d: d, client: anthropic.NewClient(opts...)}
}

// streamParams asks for the default model, so that the server's
// message_start is byte for byte the one of dampertest.Stream.Events.
func streamParams() anthropic.MessageNewParams {
	return anthropic.MessageNewParams{
		Model:     dampertest.DefaultModel,
		MaxTokens: 256,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Explain retry storms"))},
	}
}

// drain reads a stream to its end and closes it.
func drain(s *ssestream.Stream[anthropic.MessageStreamEventUnion]) ([]anthropic.MessageStreamEventUnion, error) {
	defer s.Close()
	var evs []anthropic.MessageStreamEventUnion
	for s.Next() {
		evs = append(evs, s.Current())
	}
	return evs, s.Err()
}

// seen returns the events a caller sees of st when it stops before event
// at (len(Events()) for all of them): the SDK skips pings.
func seen(st dampertest.Stream, at int) []string {
	var out []string
	for i, e := range st.Events() {
		if i >= at {
			break
		}
		if e.Name != "ping" {
			out = append(out, string(e.Data))
		}
	}
	return out
}

// checkEvents fails t unless got are exactly the events want, in order,
// and accumulate into a message whose text is text.
func checkEvents(t *testing.T, got []anthropic.MessageStreamEventUnion, want []string, text string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("caller saw %d events, want %d:\n%s", len(got), len(want), rawEvents(got))
	}
	var msg anthropic.Message
	for i, ev := range got {
		if ev.RawJSON() != want[i] {
			t.Fatalf("event %d = %s, want %s", i, ev.RawJSON(), want[i])
		}
		if err := msg.Accumulate(ev); err != nil {
			t.Fatalf("Accumulate(event %d): %v", i, err)
		}
	}
	var b strings.Builder
	for _, block := range msg.Content {
		b.WriteString(block.Text)
	}
	if b.String() != text {
		t.Fatalf("accumulated text %q, want %q", b.String(), text)
	}
}

func rawEvents(evs []anthropic.MessageStreamEventUnion) string {
	var b strings.Builder
	for _, e := range evs {
		b.WriteString(e.RawJSON() + "\n")
	}
	return b.String()
}

const (
	firstText  = "The first attempt's answer, which no caller may see."
	secondText = "The second attempt's answer, long enough to take several deltas."
)

// Every failure before the first content is retried, and the caller sees
// exactly the retried attempt's events.
func TestStreamRetriesFailuresBeforeContent(t *testing.T) {
	first := dampertest.Stream{Text: firstText, Pings: 1}
	content := first.ContentIndex()
	tests := []struct {
		name string
		step dampertest.Step
		kind string
	}{
		{"529 status", dampertest.Status(529), "overloaded"},
		{"overloaded event after message_start", streamStep(first, dampertest.FaultErrorEvent, 1, ""), "sse_error"},
		{"api_error event before content", streamStep(first, dampertest.FaultErrorEvent, content, "api_error"), "sse_error"},
		{"rate_limit_error event", streamStep(first, dampertest.FaultErrorEvent, 2, "rate_limit_error"), "sse_error"},
		{"reset before any event", streamStep(first, dampertest.FaultReset, 0, ""), "transport"},
		{"reset just before content", streamStep(first, dampertest.FaultReset, content, ""), "transport"},
		{"end without message_stop before content", streamStep(first, dampertest.FaultTruncate, content, ""), "truncated"},
		{"drop before headers", dampertest.Step{Drop: dampertest.DropBeforeHeaders}, "transport"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newStreamRig(t, damper.Policy{})
			second := dampertest.Stream{Text: secondText, Pings: 2}
			r.srv.Script("s", tt.step, dampertest.OK().WithStream(second))

			var rep damper.Report
			stream := r.client.Messages.NewStreaming(context.Background(), streamParams(),
				dampertest.Scenario("s"), damper.ReportInto(&rep))
			if rep.Outcome != "" || rep.Attempts != 2 {
				t.Fatalf("report at first content: outcome %q, %d attempts; want none yet, 2", rep.Outcome, rep.Attempts)
			}
			evs, err := drain(stream)
			if err != nil {
				t.Fatalf("stream error: %v", err)
			}
			checkEvents(t, evs, seen(second, len(second.Events())), secondText)
			if n := r.srv.Count("s"); n != 2 {
				t.Fatalf("server got %d requests, want 2", n)
			}
			if rep.Outcome != damper.OutcomeSuccess || rep.Attempts != 2 || rep.AttemptLog[0].Kind != tt.kind {
				t.Fatalf("report: outcome %q, %d attempts, first %+v; want success, 2, kind %s", rep.Outcome, rep.Attempts, rep.AttemptLog[0], tt.kind)
			}
			// The only wait is the backoff, half of BackoffBase (rand 0.5).
			if rep.FirstContent != 500*time.Millisecond || rep.Duration != 500*time.Millisecond {
				t.Fatalf("FirstContent %v, Duration %v; want 500ms, 500ms", rep.FirstContent, rep.Duration)
			}
			if got := r.clock.Sleeps(); len(got) != 1 || got[0] != 500*time.Millisecond {
				t.Fatalf("sleeps %v, want [500ms]", got)
			}
		})
	}
}

func streamStep(st dampertest.Stream, f dampertest.Fault, at int, errorType string) dampertest.Step {
	st.Fault, st.At, st.ErrorType = f, at, errorType
	return dampertest.OK().WithStream(st)
}

// A failure after content is surfaced as ambiguous, never retried, and the
// caller has exactly the events that came before it.
func TestStreamFailureAfterContentIsAmbiguous(t *testing.T) {
	st := dampertest.Stream{Text: firstText, Pings: 1, ChunkSize: 8}
	at := st.ContentIndex() + 3 // three deltas reached the caller
	partial := []rune(firstText)[:3*8]
	tests := []struct {
		name  string
		fault dampertest.Fault
		kind  string
		check func(error) bool
	}{
		{"overloaded event", dampertest.FaultErrorEvent, "sse_error", func(err error) bool {
			var apiErr *anthropic.Error
			return errors.As(err, &apiErr) && apiErr.Type() == "overloaded_error" && apiErr.RequestID == "req_dampertest_s_1"
		}},
		{"reset", dampertest.FaultReset, "transport", func(err error) bool {
			return errors.Is(err, io.ErrUnexpectedEOF)
		}},
		{"end without message_stop", dampertest.FaultTruncate, "truncated", func(err error) bool {
			return strings.Contains(err.Error(), "message_stop")
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newStreamRig(t, damper.Policy{})
			r.srv.Script("s", streamStep(st, tt.fault, at, ""), dampertest.OK())
			var rep damper.Report
			evs, err := drain(r.client.Messages.NewStreaming(context.Background(), streamParams(),
				dampertest.Scenario("s"), damper.ReportInto(&rep)))
			if !errors.Is(err, damper.ErrAmbiguous) || !tt.check(err) {
				t.Fatalf("stream error %v, want ErrAmbiguous and its cause", err)
			}
			var de *damper.Error
			if !errors.As(err, &de) || de.Report == nil || de.Report.Outcome != damper.OutcomeAmbiguous {
				t.Fatalf("error %#v carries no ambiguous report", err)
			}
			checkEvents(t, evs, seen(st, at), string(partial))
			if n := r.srv.Count("s"); n != 1 {
				t.Fatalf("server got %d requests, want 1", n)
			}
			if rep.Outcome != damper.OutcomeAmbiguous || rep.Attempts != 1 ||
				rep.AttemptLog[0].Class != damper.Ambiguous || rep.AttemptLog[0].Kind != tt.kind {
				t.Fatalf("report: outcome %q, %d attempts, %+v", rep.Outcome, rep.Attempts, rep.AttemptLog)
			}
		})
	}
}

// A stream that fails before content on every attempt ends with the last
// attempt's error and no event.
func TestStreamFailsBeforeContentOnEveryAttempt(t *testing.T) {
	st := dampertest.Stream{Text: firstText}
	tests := []struct {
		name     string
		step     dampertest.Step
		attempts int
		outcome  damper.Outcome
		errType  string
	}{
		{"overloaded every time", streamStep(st, dampertest.FaultErrorEvent, 1, ""), 3, damper.OutcomeAttemptsExhausted, "overloaded_error"},
		{"invalid request event", streamStep(st, dampertest.FaultErrorEvent, 1, "invalid_request_error"), 1, damper.OutcomeError, "invalid_request_error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newStreamRig(t, damper.Policy{})
			r.srv.Script("s", tt.step)
			var rep damper.Report
			evs, err := drain(r.client.Messages.NewStreaming(context.Background(), streamParams(),
				dampertest.Scenario("s"), damper.ReportInto(&rep)))
			var apiErr *anthropic.Error
			if !errors.As(err, &apiErr) || string(apiErr.Type()) != tt.errType || errors.Is(err, damper.ErrAmbiguous) {
				t.Fatalf("stream error %v, want the %s event's error", err, tt.errType)
			}
			if len(evs) != 0 {
				t.Fatalf("caller saw %d events, want none:\n%s", len(evs), rawEvents(evs))
			}
			if rep.Attempts != tt.attempts || rep.Outcome != tt.outcome || r.srv.Count("s") != tt.attempts {
				t.Fatalf("report %d attempts, outcome %q, server %d; want %d, %q", rep.Attempts, rep.Outcome, r.srv.Count("s"), tt.attempts, tt.outcome)
			}
		})
	}
}

// A server that sends more than MaxHoldBack before content is cut off and
// the call fails, not retried; under the bound the stream goes through.
func TestStreamHoldBackBound(t *testing.T) {
	r := newStreamRig(t, damper.Policy{MaxHoldBack: 64 << 10})
	big := dampertest.Stream{Text: firstText, PreContentBytes: 100 << 10}
	small := dampertest.Stream{Text: secondText, PreContentBytes: 32 << 10}
	r.srv.Script("big", dampertest.OK().WithStream(big))
	r.srv.Script("small", dampertest.OK().WithStream(small))

	var rep damper.Report
	evs, err := drain(r.client.Messages.NewStreaming(context.Background(), streamParams(),
		dampertest.Scenario("big"), damper.ReportInto(&rep)))
	if !errors.Is(err, damper.ErrHoldBackExceeded) || len(evs) != 0 {
		t.Fatalf("got %d events, error %v; want none, ErrHoldBackExceeded", len(evs), err)
	}
	if rep.Attempts != 1 || rep.Outcome != damper.OutcomeError || rep.AttemptLog[0].Kind != "hold_back_exceeded" {
		t.Fatalf("report %d attempts, outcome %q, %+v", rep.Attempts, rep.Outcome, rep.AttemptLog)
	}

	evs, err = drain(r.client.Messages.NewStreaming(context.Background(), streamParams(), dampertest.Scenario("small")))
	if err != nil {
		t.Fatal(err)
	}
	checkEvents(t, evs, seen(small, len(small.Events())), secondText)
}

// The report is written when the stream is handed over, with no outcome
// yet, and again when it ends; a caller that closes the stream early ends
// it as canceled.
func TestStreamReportAtEnd(t *testing.T) {
	r := newStreamRig(t, damper.Policy{})
	st := dampertest.Stream{Text: strings.Repeat(secondText, 1000)} // far more than one read
	r.srv.Script("s", dampertest.OK().WithStream(st))

	var rep damper.Report
	stream := r.client.Messages.NewStreaming(context.Background(), streamParams(),
		dampertest.Scenario("s"), damper.ReportInto(&rep))
	if !stream.Next() {
		t.Fatalf("no first event: %v", stream.Err())
	}
	if rep.Outcome != "" || rep.Attempts != 1 || !rep.Stream {
		t.Fatalf("report at first content: %+v", rep)
	}
	r.clock.Advance(3 * time.Second)
	if err := stream.Close(); err != nil {
		t.Fatal(err)
	}
	if rep.Outcome != damper.OutcomeCanceled || rep.Duration != 3*time.Second || rep.FirstContent != 0 {
		t.Fatalf("report after an early Close: outcome %q, duration %v, first content %v", rep.Outcome, rep.Duration, rep.FirstContent)
	}
}

// The Beta streaming call is retried the same way.
func TestBetaStreamRetriesBeforeContent(t *testing.T) {
	r := newStreamRig(t, damper.Policy{})
	first := dampertest.Stream{Text: firstText}
	second := dampertest.Stream{Text: secondText}
	r.srv.Script("s", streamStep(first, dampertest.FaultErrorEvent, 1, ""), dampertest.OK().WithStream(second))
	stream := r.client.Beta.Messages.NewStreaming(context.Background(), anthropic.BetaMessageNewParams{
		Model:     dampertest.DefaultModel,
		MaxTokens: 256,
		Messages:  []anthropic.BetaMessageParam{anthropic.NewBetaUserMessage(anthropic.NewBetaTextBlock("hi"))},
	}, dampertest.Scenario("s"))
	defer stream.Close()
	var msg anthropic.BetaMessage
	for stream.Next() {
		if err := msg.Accumulate(stream.Current()); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if len(msg.Content) != 1 || msg.Content[0].Text != secondText || r.srv.Count("s") != 2 {
		t.Fatalf("message %+v after %d requests; want %q after 2", msg.Content, r.srv.Count("s"), secondText)
	}
}

func TestStreamPolicyValidation(t *testing.T) {
	for p, want := range map[*damper.Policy]string{
		{MaxHoldBack: -1}:                 "Policy.MaxHoldBack = -1",
		{StreamIdleTimeout: -time.Second}: "Policy.StreamIdleTimeout = -1s",
	} {
		if _, err := damper.New(*p); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("New(%+v) error %v, want one naming %q", *p, err, want)
		}
	}
	d, err := damper.New(damper.Policy{})
	if err != nil || d.Policy().MaxHoldBack != 1<<20 || d.Policy().StreamIdleTimeout != 0 {
		t.Fatalf("defaults: %+v, %v", d.Policy(), err)
	}
}

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

// A stream with no first content within PerAttemptTimeout is retried.
func TestStreamStallBeforeContentIsRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		first := dampertest.Stream{Text: firstText, Fault: dampertest.FaultStall, At: 1}
		second := dampertest.Stream{Text: secondText}
		srv := &planServer{plans: []dampertest.Stream{first, second}}
		client := memClient(newDamper(t, damper.Policy{PerAttemptTimeout: 5 * time.Second}), srv)

		var rep damper.Report
		start := time.Now()
		evs, err := drain(client.Messages.NewStreaming(context.Background(), streamParams(), damper.ReportInto(&rep)))
		if err != nil {
			t.Fatal(err)
		}
		checkEvents(t, evs, seen(second, len(second.Events())), secondText)
		// 5 s of timeout, then half of the 1 s backoff.
		if rep.Attempts != 2 || rep.AttemptLog[0].Kind != "timeout" || rep.FirstContent != 5500*time.Millisecond || time.Since(start) != 5500*time.Millisecond {
			t.Fatalf("report %+v after %v", rep, time.Since(start))
		}
	})
}

// A stall after content is an ambiguous error once StreamIdleTimeout has
// passed; without the limit, only the caller's context ends it.
func TestStreamStallAfterContent(t *testing.T) {
	st := dampertest.Stream{Text: firstText, ChunkSize: 4, Fault: dampertest.FaultStall}
	st.At = st.ContentIndex() + 2
	want := seen(st, st.At)
	synctest.Test(t, func(t *testing.T) {
		srv := &planServer{plans: []dampertest.Stream{st}}
		client := memClient(newDamper(t, damper.Policy{StreamIdleTimeout: 10 * time.Second}), srv)
		var rep damper.Report
		start := time.Now()
		evs, err := drain(client.Messages.NewStreaming(context.Background(), streamParams(), damper.ReportInto(&rep)))
		if !errors.Is(err, damper.ErrAmbiguous) || !strings.Contains(err.Error(), "stalled") {
			t.Fatalf("error %v, want an ambiguous stall", err)
		}
		checkEvents(t, evs, want, firstText[:8])
		if time.Since(start) != 10*time.Second || rep.Outcome != damper.OutcomeAmbiguous || rep.AttemptLog[0].Kind != "stall" || srv.count() != 1 {
			t.Fatalf("after %v: report %+v, %d requests", time.Since(start), rep, srv.count())
		}
	})
	synctest.Test(t, func(t *testing.T) {
		srv := &planServer{plans: []dampertest.Stream{st}}
		client := memClient(newDamper(t, damper.Policy{}), srv)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
		defer cancel()
		var rep damper.Report
		evs, err := drain(client.Messages.NewStreaming(ctx, streamParams(), damper.ReportInto(&rep)))
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, damper.ErrAmbiguous) {
			t.Fatalf("error %v, want the context's", err)
		}
		checkEvents(t, evs, want, firstText[:8])
		if rep.Outcome != damper.OutcomeCanceled || rep.Duration != 30*time.Minute {
			t.Fatalf("report %+v", rep)
		}
	})
}

// A server that sends pre-content data without end is read up to
// MaxHoldBack and no further, and the call is not retried.
func TestStreamHoldBackCutsOffUnboundedData(t *testing.T) {
	const bound = 64 << 10
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		written, requests := 0, 0
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			requests++
			mu.Unlock()
			w.Header().Set("Content-Type", "text/event-stream")
			start := dampertest.Stream{}.Events()[0].String()
			pad := ": " + strings.Repeat("x", 1021) + "\n"
			for i := 0; ; i++ {
				chunk := pad
				if i == 0 {
					chunk = start
				}
				n, err := io.WriteString(w, chunk)
				mu.Lock()
				written += n
				mu.Unlock()
				if err != nil {
					return
				}
			}
		})
		client := memClient(newDamper(t, damper.Policy{MaxHoldBack: bound}), h)
		var rep damper.Report
		evs, err := drain(client.Messages.NewStreaming(context.Background(), streamParams(), damper.ReportInto(&rep)))
		if !errors.Is(err, damper.ErrHoldBackExceeded) || len(evs) != 0 {
			t.Fatalf("%d events, error %v; want none, ErrHoldBackExceeded", len(evs), err)
		}
		synctest.Wait() // the handler has seen the connection close
		mu.Lock()
		defer mu.Unlock()
		if written != bound || requests != 1 || rep.Attempts != 1 {
			t.Fatalf("server wrote %d bytes in %d requests (%d attempts); want %d in 1", written, requests, rep.Attempts, bound)
		}
	})
}
