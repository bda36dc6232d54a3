package engine

import (
	"context"
	"net/url"
	"testing"
)

// BenchmarkTelemetryHooksNoProvider measures what telemetry adds to one
// logical request of one successful attempt when no provider is
// configured: the hooks the retry loop calls, on the global no-op
// providers.
func BenchmarkTelemetryHooksNoProvider(b *testing.B) {
	d, err := New(Policy{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	u := &url.URL{Scheme: "https", Host: "api.anthropic.com", Path: "/v1/messages"}
	b.ReportAllocs()
	for b.Loop() {
		ct := new(callTrace)
		d.tel.startCall(ct, ctx, callFacts{provider: "anthropic", model: "claude-sonnet-4-5", start: d.clock.Now()}, u)
		_, span := ct.attemptStart(ctx, d.clock.Now(), 1, false)
		ct.attemptEnd(span, AttemptReport{StatusCode: 200})
		rep := Report{Provider: "anthropic", Model: "claude-sonnet-4-5", Attempts: 1, Outcome: OutcomeSuccess}
		ct.end(&rep, AttemptReport{StatusCode: 200}, 1, d.clock.Now())
	}
}
