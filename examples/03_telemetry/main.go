// Command 03_telemetry prints, with OpenTelemetry's stdout exporter, the
// spans of one Messages call that Damper retries twice before it succeeds.
//
// It runs offline, against the fake API of package dampertest, on a
// virtual clock, so the backoffs take no real time:
//
//	go run ./examples/03_telemetry
//
// The SDK's anthropic.messages.create span is the root; Damper's
// damper.request span is its child, with one damper.attempt span per
// attempt under it. Damper's retry decisions go to stderr through slog.
package main

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	ctx := context.Background()

	// The fake API: overloaded, then rate limited with a 200 ms delay,
	// then an answer.
	clock := dampertest.NewClock(time.Now())
	srv := dampertest.NewServer(dampertest.WithClock(clock))
	defer srv.Close()
	srv.Script("busy",
		dampertest.Status(529),
		dampertest.Status(429).RetryAfterMs("200"),
		dampertest.OK().WithText("Retry storms happen when every client retries on its own."),
	)

	// One tracer provider for the SDK's span and Damper's, printing each
	// span as it ends.
	exporter, err := stdouttrace.New(stdouttrace.WithPrettyPrint())
	if err != nil {
		return err
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))
	defer func() { _ = tp.Shutdown(ctx) }()

	d, err := damper.New(damper.Policy{},
		damper.WithClock(clock),
		damper.WithTracerProvider(tp),
		damper.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, nil))),
	)
	if err != nil {
		return err
	}
	opts := append([]option.RequestOption{d.Option(), option.WithTracerProvider(tp)}, srv.Options()...)
	client := anthropic.NewClient(opts...)

	var rep damper.Report
	msg, err := client.Messages.New(ctx, anthropic.MessageNewParams{
		Model:     anthropic.ModelClaudeSonnet5_5,
		MaxTokens: 512,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Why do retry storms happen?"))},
	}, dampertest.Scenario("busy"), damper.ReportInto(&rep))
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "answer: %s\n", msg.Content[0].Text)
	fmt.Fprintf(os.Stderr, "attempts: %d, outcome: %s, retry cost: $%.6f, took: %v (virtual clock)\n",
		rep.Attempts, rep.Outcome, rep.RetryCostUSD, rep.Duration)
	if rep.Attempts != 3 {
		return fmt.Errorf("want 3 attempts, got %d", rep.Attempts)
	}
	return nil
}
