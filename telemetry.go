package damper

import (
	"context"
	"time"
)

// telemetry records spans and metrics for calls. Its methods are called
// from the retry loop, never with a lock held.
type telemetry struct{}

func newTelemetry(_, _ any) *telemetry { return &telemetry{} }

func (t *telemetry) requestStart(c *call) {}

func (t *telemetry) attemptStart(ctx context.Context, c *call, n int) context.Context { return ctx }

func (t *telemetry) attemptEnd(c *call, n int, a AttemptReport) {}

func (t *telemetry) retry(c *call, n int, cls Classification, wait time.Duration) {}

func (t *telemetry) requestEnd(c *call, err error) {}
