// Package globaltrace_test checks that a Damper made before a global tracer
// provider is registered traces its calls once one is. It is a package of
// its own because registering a global provider cannot be undone.
package globaltrace_test

import (
	"context"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// registered is set once the test has registered its provider: run again
// in the same process (-count), it would find that one registered before
// New, which the Damper then uses, and is skipped.
var registered bool

func TestProviderRegisteredAfterNew(t *testing.T) {
	if registered {
		t.Skip("a global tracer provider is registered already: this test runs once per process")
	}
	clk := dampertest.NewClock(time.Now().Truncate(time.Minute).Add(time.Minute))
	d, err := damper.New(damper.Policy{}, damper.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	srv := dampertest.NewServer(dampertest.InMemory())
	defer srv.Close()
	srv.Script("", dampertest.Status(529), dampertest.OK(), dampertest.Status(529), dampertest.OK())
	client := anthropic.NewClient(append([]option.RequestOption{d.Option()}, srv.Options()...)...)
	params := anthropic.MessageNewParams{Model: "claude-sonnet-4-5", MaxTokens: 8,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}}

	// Before any provider: nothing to record, and nothing fails.
	if _, err := client.Messages.New(context.Background(), params); err != nil {
		t.Fatal(err)
	}

	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	otel.SetTracerProvider(tp)
	registered = true
	if _, err := client.Messages.New(context.Background(), params); err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, s := range exp.GetSpans() {
		count[s.Name]++
	}
	if count["damper.request"] != 1 || count["damper.attempt"] != 2 {
		t.Errorf("spans after the provider was registered: %v, want one damper.request and two damper.attempt", count)
	}
}
