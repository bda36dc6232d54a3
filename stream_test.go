package damper_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
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
