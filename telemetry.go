package damper

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// instrumentationName is the scope of Damper's tracer and meter.
const instrumentationName = "github.com/damper-ai/damper-go"

// Span names and attribute keys. The damper.* names are part of Damper's
// interface: dashboards are built on them, so they never change.
const (
	spanRequest = "damper.request"
	spanAttempt = "damper.attempt"

	keyAttempts      = attribute.Key("damper.attempts")
	keyOutcome       = attribute.Key("damper.outcome")
	keyBudgetBalance = attribute.Key("damper.retry_budget.balance")
	keyBudgetRatio   = attribute.Key("damper.retry_budget.ratio")
	keyCostEstimate  = attribute.Key("damper.cost.estimate_usd")
	keyCostRetry     = attribute.Key("damper.cost.retry_usd")
	keyErrorClass    = attribute.Key("damper.attempt.error_class")
	keyBackoff       = attribute.Key("damper.attempt.backoff_s")
	keyProvider      = attribute.Key("damper.provider")
	keyModel         = attribute.Key("damper.model")
	keyStream        = attribute.Key("damper.stream")
	keyDenialReason  = attribute.Key("damper.denial.reason")

	// Keys of the OpenTelemetry semantic conventions.
	keyErrorType   = attribute.Key("error.type")
	keyStatusCode  = attribute.Key("http.response.status_code")
	keyResendCount = attribute.Key("http.request.resend_count")
)

// WithTracerProvider makes the Damper create its spans with tp instead of
// the provider registered with otel.SetTracerProvider.
//
// Each logical Messages request gets one damper.request span, and each
// provider attempt one damper.attempt span under it. The SDK's own
// anthropic.messages.create span, when the SDK's tracing is on, is the
// parent of damper.request: Damper is middleware inside the SDK's call, so
// the tree is
//
//	anthropic.messages.create        (the SDK: one per method call)
//	└── damper.request               (Damper: one per logical request)
//	    ├── damper.attempt           (one per provider attempt)
//	    │   └── HTTP client span     (your transport's instrumentation, if any)
//	    └── damper.attempt ...
//
// Attempts are counted once, by the damper.attempt spans: the SDK makes one
// call of its own retry loop (Damper switches the SDK's retries off), and
// its http.request.resend_count counts Damper's retries, the same requests
// seen from outside. Without the SDK's span, damper.request is a child of
// whatever span the call's context holds.
//
// Span times come from the Damper's [Clock], so that a virtual clock gives
// exact durations in tests. Spans carry no request or response content and
// no credential.
func WithTracerProvider(tp trace.TracerProvider) Setting {
	return func(d *Damper) error {
		if tp == nil {
			return fmt.Errorf("damper: WithTracerProvider(nil): a tracer provider is required (leave the setting out to use the global one)")
		}
		d.telemetrySettings().tracerProvider = tp
		return nil
	}
}

// WithMeterProvider makes the Damper create its metric instruments with mp
// instead of the provider registered with otel.SetMeterProvider. The
// instruments are created once, by [New]; see the README's Telemetry
// section for their names, units and attributes.
func WithMeterProvider(mp metric.MeterProvider) Setting {
	return func(d *Damper) error {
		if mp == nil {
			return fmt.Errorf("damper: WithMeterProvider(nil): a meter provider is required (leave the setting out to use the global one)")
		}
		d.telemetrySettings().meterProvider = mp
		return nil
	}
}

// WithLogger makes the Damper write one structured line to l for each
// retry decision: an authorized retry at Info, a retry refused by an
// admission gate at Warn, and a failure that is not retried at all
// (not retryable, ambiguous, cancelled) at Info. Without it Damper logs
// nothing.
func WithLogger(l *slog.Logger) Setting {
	return func(d *Damper) error {
		if l == nil {
			return fmt.Errorf("damper: WithLogger(nil): a logger is required (leave the setting out to log nothing)")
		}
		d.telemetrySettings().logger = l
		return nil
	}
}

// telemetryConfig is what the telemetry Settings chose.
type telemetryConfig struct {
	tracerProvider trace.TracerProvider
	meterProvider  metric.MeterProvider
	logger         *slog.Logger
}

// telemetrySettings returns the telemetry configuration being built by
// the Settings given to New.
func (d *Damper) telemetrySettings() *telemetryConfig {
	if d.tel == nil {
		d.tel = &telemetry{}
	}
	return &d.tel.cfg
}

// telemetry records spans, metrics and log lines for the calls of one
// Damper. Its methods are called from the retry loop, never with a lock
// held; it is safe for concurrent use by many calls.
type telemetry struct {
	cfg    telemetryConfig // as the Settings left it
	tracer trace.Tracer
	log    *slog.Logger // nil: silent
	m      metrics
	ratio  float64
	clock  Clock
	// virtualTime is whether the clock is not the real one: spans then
	// take their times from it.
	virtualTime bool
}

// newTelemetry builds d's telemetry from the Settings given to New. It
// must run after d's budget and clock are set: the budget gauge reads them.
func newTelemetry(d *Damper) *telemetry {
	t := d.tel
	if t == nil {
		t = &telemetry{}
	}
	tp := t.cfg.tracerProvider
	if tp == nil {
		// The global provider delegates to whatever is registered later.
		tp = otel.GetTracerProvider()
	}
	mp := t.cfg.meterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	t.tracer = tp.Tracer(instrumentationName)
	t.log = t.cfg.logger
	t.ratio = d.policy.RetryBudgetRatio
	t.clock = d.clock
	_, real := d.clock.(realClock)
	t.virtualTime = !real
	t.m = newMetrics(d, mp.Meter(instrumentationName))
	return t
}

// callTelemetry is what telemetry keeps of one call. The retry loop's
// goroutine uses it and then, for an answered call, the goroutine that ends
// the call (a Read or Close of its body, or the watch on its context);
// never both at once.
type callTelemetry struct {
	request trace.Span
	// attempt is the attempt span still open, nil when none is. A failed
	// attempt's span stays open until the loop decides whether a retry
	// follows, so that it can carry the backoff.
	attempt    trace.Span
	attemptEnd time.Time // when the open attempt ended; zero while it runs
	retryAt    time.Time // when the pending retry was authorized; zero if none
	ended      bool
}

// requestStart opens the damper.request span of c.
func (t *telemetry) requestStart(c *call) {
	_, span := t.start(c.ctx, spanRequest, c.start)
	c.tel.request = span
	if !span.IsRecording() {
		return
	}
	attrs := make([]attribute.KeyValue, 0, 5)
	attrs = append(attrs, keyBudgetRatio.Float64(t.ratio))
	if c.report.Provider != "" {
		attrs = append(attrs, keyProvider.String(c.report.Provider))
	}
	if c.report.Model != "" {
		attrs = append(attrs, keyModel.String(c.report.Model))
	}
	if c.report.Priced {
		attrs = append(attrs, keyCostEstimate.Float64(c.report.EstimatedCostUSD))
	}
	span.SetAttributes(attrs...)
}

// attemptStart opens the damper.attempt span of attempt n and returns ctx
// carrying it, so that the attempt's HTTP request is its child.
func (t *telemetry) attemptStart(ctx context.Context, c *call, n int) context.Context {
	now := t.clock.Now()
	t.closeAttempt(c, now)
	if !c.tel.retryAt.IsZero() {
		t.m.backoffWaited(ctx, c, now.Sub(c.tel.retryAt))
		c.tel.retryAt = time.Time{}
	}
	req := c.tel.request
	if req == nil || !req.IsRecording() && !req.SpanContext().IsValid() {
		// No tracing at all: an attempt span would be a no-op too.
		return ctx
	}
	ctx, span := t.start(trace.ContextWithSpan(ctx, req), spanAttempt, now)
	if n > 1 && span.IsRecording() {
		span.SetAttributes(keyResendCount.Int(n - 1))
	}
	c.tel.attempt, c.tel.attemptEnd = span, time.Time{}
	return ctx
}

// attemptEnd records the end of attempt n. A successful attempt's span
// ends here; a failed attempt's when the loop has decided what follows it.
func (t *telemetry) attemptEnd(c *call, n int, a AttemptReport) {
	span := c.tel.attempt
	if span == nil {
		return // already ended: an attempt is counted once
	}
	now := t.clock.Now()
	t.recordAttempt(c, span, a)
	if a.Class == 0 {
		endSpan(span, now)
		c.tel.attempt = nil
		return
	}
	c.tel.attemptEnd = now
}

// recordAttempt counts attempt a and sets its attributes on span.
func (t *telemetry) recordAttempt(c *call, span trace.Span, a AttemptReport) {
	t.m.attempt(c, a)
	if !span.IsRecording() {
		return
	}
	if a.StatusCode > 0 {
		span.SetAttributes(keyStatusCode.Int(a.StatusCode))
	}
	if a.Class != 0 {
		span.SetAttributes(keyErrorClass.String(a.Kind), keyErrorType.String(attemptErrorType(a)))
		span.SetStatus(codes.Error, a.Kind)
	}
}

// retry records that a retry was authorized after attempt n, which failed
// as cls, with wait before the next attempt.
func (t *telemetry) retry(c *call, n int, cls Classification, wait time.Duration) {
	now := t.clock.Now()
	if span := c.tel.attempt; span != nil {
		if span.IsRecording() {
			span.SetAttributes(keyBackoff.Float64(wait.Seconds()))
		}
		t.closeAttempt(c, now)
	}
	c.tel.retryAt = now
	t.m.retry(c, cls)
	t.logRetry(c, n, cls, wait)
}

// requestEnd ends the damper.request span of c, once, with the outcome in
// c's report.
func (t *telemetry) requestEnd(c *call, err error) {
	if c.tel.ended {
		return
	}
	c.tel.ended = true
	now := t.clock.Now()

	c.mu.Lock()
	rep := c.report
	var last AttemptReport
	if n := len(c.report.AttemptLog); n > 0 {
		last = c.report.AttemptLog[n-1]
	}
	c.mu.Unlock()
	rep.AttemptLog = nil
	t.closeAttempt(c, now)

	if !c.tel.retryAt.IsZero() {
		// The wait was cut short: the caller's context ended during it.
		t.m.backoffWaited(c.ctx, c, now.Sub(c.tel.retryAt))
		c.tel.retryAt = time.Time{}
	}
	t.m.request(c, &rep)
	if last.Class != 0 && last.Backoff == 0 {
		t.logNoRetry(c, &rep, last)
	}

	span := c.tel.request
	if span == nil {
		return
	}
	if span.IsRecording() {
		attrs := []attribute.KeyValue{
			keyAttempts.Int(rep.Attempts),
			keyOutcome.String(string(rep.Outcome)),
			keyBudgetBalance.Float64(rep.BudgetBalance),
		}
		if rep.Priced {
			attrs = append(attrs, keyCostRetry.Float64(rep.RetryCostUSD))
		}
		span.SetAttributes(attrs...)
		if typ := requestErrorType(rep.Outcome, last); typ != "" {
			span.SetAttributes(keyErrorType.String(typ))
			span.SetStatus(codes.Error, string(rep.Outcome))
		}
	}
	endSpan(span, now)
}

// start starts a span at the time at. On the real clock the tracer's own
// time is the same, and passing none saves an allocation per span.
func (t *telemetry) start(ctx context.Context, name string, at time.Time) (context.Context, trace.Span) {
	if t.virtualTime {
		return t.tracer.Start(ctx, name, trace.WithTimestamp(at))
	}
	return t.tracer.Start(ctx, name)
}

// endSpan ends span at the time at; a span that records nothing is ended
// without the cost of an option.
func endSpan(span trace.Span, at time.Time) {
	if span.IsRecording() {
		span.End(trace.WithTimestamp(at))
		return
	}
	span.End()
}

// closeAttempt ends c's open attempt span, at the time its attempt ended.
func (t *telemetry) closeAttempt(c *call, now time.Time) {
	span := c.tel.attempt
	if span == nil {
		return
	}
	end := c.tel.attemptEnd
	if end.IsZero() {
		end = now
	}
	endSpan(span, end)
	c.tel.attempt, c.tel.attemptEnd = nil, time.Time{}
}

// attemptErrorType is the error.type of a failed attempt: its HTTP status,
// as the HTTP conventions have it, else its kind (transport, timeout, ...).
func attemptErrorType(a AttemptReport) string {
	if a.StatusCode >= 400 {
		return strconv.Itoa(a.StatusCode)
	}
	return a.Kind
}

// requestErrorType is the error.type of a logical request that ended with
// outcome, or "" when it did not fail. A cancelled context is the caller's
// doing, not a failure, as the SDK's spans also treat it. A failure that is
// not retried has the type of its attempt; a refused retry is named after
// the gate that refused it.
func requestErrorType(outcome Outcome, last AttemptReport) string {
	switch outcome {
	case OutcomeSuccess, OutcomeCanceled, "":
		return ""
	case OutcomeError:
		return attemptErrorType(last)
	}
	return string(outcome)
}
