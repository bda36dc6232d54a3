// Example 04_streaming streams two answers through Damper and prints the
// report of each. It runs offline, against dampertest's fake Messages API
// on loopback:
//
//	go run ./examples/04_streaming
//
// The first stream is overloaded right after message_start, before any
// content: Damper retries it, and the caller sees one clean stream, the
// second attempt's. The second stream fails after some text has reached the
// caller: Damper does not retry it, since the caller may already have shown
// that text, and stream.Err() matches damper.ErrAmbiguous. The program exits
// with status 1 if either did not happen.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"strings"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	srv := dampertest.NewServer()
	defer srv.Close()

	// Before content: an overloaded_error event in place of event 1, just
	// after message_start, then a clean stream. The bare SDK would hand the
	// caller that error; nothing usable had arrived, so Damper can retry.
	answer := "Retry storms start when every client retries on its own."
	srv.Script("before-content",
		dampertest.OK().WithStream(dampertest.Stream{
			Text: "This attempt never reaches the caller.", Fault: dampertest.FaultErrorEvent, At: 1,
		}),
		dampertest.OK().WithStream(dampertest.Stream{Text: answer}),
	)
	// After content: the same error event, three text deltas in.
	partial := dampertest.Stream{
		Text:      "A long answer that the provider gives up on halfway through.",
		ChunkSize: 8,
		Fault:     dampertest.FaultErrorEvent,
	}
	partial.At = partial.ContentIndex() + 3
	srv.Script("after-content", dampertest.OK().WithStream(partial))

	// Short backoffs keep the example quick; the defaults start at 1 s.
	d, err := damper.New(damper.Policy{BackoffBase: 50 * time.Millisecond, BackoffMax: time.Second})
	if err != nil {
		return err
	}
	// In a real service: anthropic.NewClient(d.Option()).
	client := anthropic.NewClient(append([]option.RequestOption{d.Option()}, srv.Options()...)...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	fmt.Println("1. a stream overloaded before its first content")
	text, rep, err := stream(ctx, client, "before-content")
	fmt.Printf("   text:   %q\n", text)
	printReport(rep)
	if err != nil || text != answer || rep.Attempts != 2 || rep.Outcome != damper.OutcomeSuccess {
		return fmt.Errorf("want the answer of a second attempt; got err = %v", err)
	}

	fmt.Println("\n2. a stream that fails after content reached the caller")
	text, rep, err = stream(ctx, client, "after-content")
	fmt.Printf("   text:   %q (all the caller got)\n", text)
	printReport(rep)
	fmt.Printf("   error:  %v\n", err)
	// The provider's own error is still inside, for errors.As.
	var apiErr *anthropic.Error
	if errors.As(err, &apiErr) {
		fmt.Printf("   cause:  %s, sent as an SSE error event\n", apiErr.Type())
	}
	if !errors.Is(err, damper.ErrAmbiguous) || rep.Attempts != 1 || text == "" {
		return fmt.Errorf("want an ambiguous failure after one attempt; got err = %v", err)
	}
	// A caller that can use half an answer keeps it; others start over, or
	// tell the user, knowing the provider did fail mid-answer.
	return nil
}

// stream reads one streaming call to its end and returns the text it
// delivered, Damper's report and the stream's error.
func stream(ctx context.Context, client anthropic.Client, scenario string) (string, damper.Report, error) {
	var rep damper.Report
	s := client.Messages.NewStreaming(ctx, anthropic.MessageNewParams{
		Model:     anthropic.ModelClaudeSonnet5_5,
		MaxTokens: 1024,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Why do retry storms happen?"))},
	}, damper.ReportInto(&rep), dampertest.Scenario(scenario))

	var text strings.Builder
	for s.Next() {
		if ev := s.Current(); ev.Type == "content_block_delta" {
			text.WriteString(ev.Delta.Text)
		}
	}
	err := s.Err()
	// Damper writes the report's outcome once the caller has seen the end:
	// read it after Close.
	s.Close()
	return text.String(), rep, err
}

func printReport(rep damper.Report) {
	fmt.Printf("   report: %d attempt(s), first content after %v, outcome %s\n",
		rep.Attempts, rep.FirstContent.Round(time.Millisecond), rep.Outcome)
	for i, a := range rep.AttemptLog {
		line := fmt.Sprintf("     attempt %d: HTTP %d", i+1, a.StatusCode)
		if a.Kind != "" {
			line += ", " + a.Kind
		}
		if a.Backoff > 0 {
			line += fmt.Sprintf(", then waited %v", a.Backoff.Round(time.Millisecond))
		}
		fmt.Println(line)
	}
}
