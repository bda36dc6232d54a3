package engine

import (
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// placeholderOf knows OpenTelemetry's global provider from before any is
// registered (this package's tests register none), and no other.
func TestPlaceholderOf(t *testing.T) {
	if placeholderOf(otel.GetTracerProvider()) == nil {
		t.Error("the global provider, none registered, is not taken for the placeholder: calls would open no-op spans")
	}
	for _, tp := range []trace.TracerProvider{sdktrace.NewTracerProvider(), tracenoop.NewTracerProvider()} {
		if placeholderOf(tp) != nil {
			t.Errorf("placeholderOf(%T) = the provider, want nil", tp)
		}
	}
}
