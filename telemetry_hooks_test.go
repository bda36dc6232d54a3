package damper

import (
	"context"
	"net/http"
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
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "https://api.anthropic.com/v1/messages", nil)
	b.ReportAllocs()
	for b.Loop() {
		c := &call{d: d, ctx: ctx, req: req, start: d.clock.Now()}
		c.report.Provider, c.report.Model = "anthropic", "claude-sonnet-4-5"
		d.tel.requestStart(c)
		_ = d.tel.attemptStart(ctx, c, 1)
		d.tel.attemptEnd(c, 1, AttemptReport{StatusCode: 200})
		c.report.Outcome = OutcomeSuccess
		d.tel.requestEnd(c, nil)
	}
}
