package engine

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/damper-ai/damper-go/internal/core"
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

	keyAttempts       = attribute.Key("damper.attempts")
	keyOutcome        = attribute.Key("damper.outcome")
	keyBudgetBalance  = attribute.Key("damper.retry_budget.balance")
	keyBudgetRatio    = attribute.Key("damper.retry_budget.ratio")
	keyCostEstimate   = attribute.Key("damper.cost.estimate_usd")
	keyCostRetry      = attribute.Key("damper.cost.retry_usd")
	keyErrorClass     = attribute.Key("damper.attempt.error_class")
	keyBackoff        = attribute.Key("damper.attempt.backoff_s")
	keyProvider       = attribute.Key("damper.provider")
	keyModel          = attribute.Key("damper.model")
	keyTenant         = attribute.Key("damper.tenant")
	keyStream         = attribute.Key("damper.stream")
	keyDenialReason   = attribute.Key("damper.denial.reason")
	keyName           = attribute.Key("damper.name")
	keyHedge          = attribute.Key("damper.hedge")
	keyHedgeLost      = attribute.Key("damper.hedge.lost")
	keyHedgeResult    = attribute.Key("damper.hedge.result")
	keyStorePart      = attribute.Key("damper.store.part")
	keyStoreOp        = attribute.Key("damper.store.op")
	keyBackend        = attribute.Key("damper.backend")
	keyFallbacks      = attribute.Key("damper.fallbacks")
	keyFallbackFrom   = attribute.Key("damper.fallback.from")
	keyFallbackTo     = attribute.Key("damper.fallback.to")
	keyFallbackReason = attribute.Key("damper.fallback.reason")

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
		d.telCfg.tracerProvider = tp
		return nil
	}
}

// WithMeterProvider makes the Damper create its metric instruments with mp
// instead of the provider registered with otel.SetMeterProvider. The
// instruments are created once, by [New]: Damper's own damper.* metrics and
// the client metrics of the OpenTelemetry GenAI semantic conventions
// (gen_ai.client.operation.duration, gen_ai.client.token.usage and
// gen_ai.client.operation.time_to_first_chunk, as of v1.41.0); see the
// README's Telemetry section for their names, units and attributes. A
// caller can name any model, and an upstream any answering model, so a
// model reaches a metric only in the first 8 combinations of models,
// server and provider (and the first 4 with each failure) of the models
// the price table prices, and apart of the others; a limit group only if
// the price table's models or the rate limiter's configuration name it,
// or among the first 8 others seen. Any other is "other".
func WithMeterProvider(mp metric.MeterProvider) Setting {
	return func(d *Damper) error {
		if mp == nil {
			return fmt.Errorf("damper: WithMeterProvider(nil): a meter provider is required (leave the setting out to use the global one)")
		}
		d.telCfg.meterProvider = mp
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
		d.telCfg.logger = l
		return nil
	}
}

// WithName names the Damper in its telemetry: every metric it records and
// every damper.request span carry damper.name, and every log line a
// "damper" field, so that two Dampers on one MeterProvider (one per tenant,
// say) keep separate series. Without it they carry none. The name must be
// 1 to 64 printable ASCII characters: it is a label, not a free text.
func WithName(name string) Setting {
	return func(d *Damper) error {
		if len(name) == 0 || len(name) > 64 {
			return fmt.Errorf("damper: WithName(%q): the name must be 1 to 64 characters", name)
		}
		for _, r := range name {
			if r < 0x21 || r > 0x7e {
				return fmt.Errorf("damper: WithName(%q): the name must be printable ASCII without spaces", name)
			}
		}
		d.telCfg.name = name
		return nil
	}
}

// telemetryConfig is what the telemetry Settings chose.
type telemetryConfig struct {
	tracerProvider trace.TracerProvider
	meterProvider  metric.MeterProvider
	logger         *slog.Logger
	name           string // WithName; "" for none
}

// telemetry records spans, metrics and log lines for the calls of one
// Damper. It is built once, by New, and is safe for concurrent use by many
// calls; what it keeps of one call is that call's callTrace.
type telemetry struct {
	tracer trace.Tracer
	// placeholder is the global tracer provider as OpenTelemetry starts it,
	// when the Damper uses the global one: until a provider is registered,
	// its spans are no-ops that cost allocations, and calls open none.
	placeholder trace.TracerProvider
	log         *slog.Logger // nil: silent
	m           metrics
	ratio       float64
	clock       Clock
	name        attribute.KeyValue // damper.name, when the Damper has one
	named       bool
	models      *labelSet // the labels of models
	groups      *labelSet // the labels of limit groups
	// virtualTime is whether the clock is not the real one: spans then
	// take their times from it.
	virtualTime bool

	// A failing store fails every operation: the errors of each part are
	// logged once per storeLogEvery, with the count of those left out.
	storeErrs []storeErrors // by storePart

	// gauges are the callbacks of the Damper's gauges, registered as New
	// makes it, which Damper.Close unregisters (keepGauges).
	gauges     []metric.Registration
	gaugesGone sync.Once
}

// storeErrors paces the log lines of one part's store errors.
type storeErrors struct {
	next   atomic.Int64 // when the next line may be written (UnixNano)
	errors atomic.Int64 // errors since the last line
}

// newTelemetry builds the telemetry of a Damper with policy p and clock
// from cfg; the gates' own instruments come once its backends are wired
// (metrics.registerGates).
func newTelemetry(cfg telemetryConfig, p *Policy, clock Clock) *telemetry {
	tp := cfg.tracerProvider
	var placeholder trace.TracerProvider
	if tp == nil {
		// The global provider delegates to whatever is registered later.
		tp = otel.GetTracerProvider()
		placeholder = placeholderOf(tp)
	}
	mp := cfg.meterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	_, real := clock.(realClock)
	t := &telemetry{
		storeErrs:   make([]storeErrors, len(core.StoreParts())),
		tracer:      tp.Tracer(instrumentationName),
		placeholder: placeholder,
		log:         cfg.logger,
		ratio:       p.RetryBudgetRatio,
		clock:       clock,
		virtualTime: !real,
	}
	if cfg.name != "" {
		t.name, t.named = keyName.String(cfg.name), true
		if t.log != nil {
			t.log = t.log.With(slog.String("damper", cfg.name))
		}
	}
	t.models, t.groups = policyLabels(p)
	t.m = newMetrics(mp.Meter(instrumentationName), t.name, t.named, t.models, t.groups)
	return t
}

// policyLabels returns the label sets of a Damper with policy p: its price
// table's models are known, and every model it prices has a pool of its
// own; the groups of those models and the rate limiter's configured groups
// are known.
func policyLabels(p *Policy) (models, groups *labelSet) {
	table := p.PriceTable
	keys := table.Models()
	groupNames := make([]string, 0, len(keys))
	for _, k := range keys {
		groupNames = append(groupNames, LimitGroup(k))
	}
	if p.RateLimit != nil {
		for g := range p.RateLimit.Limits {
			groupNames = append(groupNames, g)
		}
	}
	priced := func(m string) bool {
		_, ok := table.Lookup(m)
		return ok
	}
	return newLabelSet(keys, priced, maxLabels), newLabelSet(groupNames, nil, maxGroupLabels)
}

// placeholderOf returns tp when it is OpenTelemetry's own global provider
// from before any is registered, else nil. A registered provider is what
// otel.GetTracerProvider returns from then on.
func placeholderOf(tp trace.TracerProvider) trace.TracerProvider {
	if t := reflect.TypeOf(tp); t.Kind() == reflect.Pointer && t.Elem().PkgPath() == "go.opentelemetry.io/otel/internal/global" {
		return tp
	}
	return nil
}

// untraced reports whether no tracer provider is registered yet, when the
// Damper uses the global one: a span would be a no-op.
func (t *telemetry) untraced() bool {
	return t.placeholder != nil && otel.GetTracerProvider() == t.placeholder
}

// callFacts are what telemetry labels a call with, known from its start.
type callFacts struct {
	provider, model string
	tenant          string // a configured name, or "" (front.tenant)
	stream, priced  bool
	estimateUSD     float64 // one attempt's estimated cost, when priced
	start           time.Time
	routing         string // a spread call's basis of choice (routing.go); "" under failover
	affinity        string // a spread call's cache affinity result (affinity.go); "" when none
}

// callTrace is the telemetry of one call: its facts, its spans and the
// times its metrics need. The retry loop's goroutine uses it and then, for
// an answered call, the goroutine that ends the call (a Read or Close of
// its body, or the watch on its context); never both at once. Its methods
// are fed values (an attempt's record, a report), never the call itself.
type callTrace struct {
	t     *telemetry
	ctx   context.Context // the caller's
	facts callFacts
	// request is the damper.request span. attempt is the span of the last
	// failed attempt, still open, nil when none is: it stays open until the
	// loop decides whether a retry follows, so that it can carry the
	// backoff. Each attempt holds its own span while it runs.
	request   trace.Span
	attempt   trace.Span
	attemptAt time.Time // when the open attempt ended
	retryAt   time.Time // when the pending retry was authorized; zero if none
	ended     bool
	gen       *genAICall // the GenAI metrics' view; nil when none records
}

// startCall starts ct, the telemetry of a call made in ctx to the URL u,
// and opens its damper.request span.
func (t *telemetry) startCall(ct *callTrace, ctx context.Context, f callFacts, u *url.URL) {
	*ct = callTrace{t: t, ctx: ctx, facts: f, gen: t.m.gen.start(ctx, u)}
	if t.untraced() {
		return
	}
	_, span := t.start(ctx, spanRequest, f.start)
	ct.request = span
	if !span.IsRecording() {
		return
	}
	attrs := make([]attribute.KeyValue, 0, 9)
	attrs = append(attrs, keyBudgetRatio.Float64(t.ratio))
	if t.named {
		attrs = append(attrs, t.name)
	}
	if f.provider != "" {
		attrs = append(attrs, keyProvider.String(f.provider))
	}
	if f.model != "" {
		attrs = append(attrs, keyModel.String(BoundedText(f.model)))
	}
	if f.tenant != "" {
		attrs = append(attrs, keyTenant.String(f.tenant))
	}
	if f.priced {
		attrs = append(attrs, keyCostEstimate.Float64(f.estimateUSD))
	}
	if f.routing != "" {
		attrs = append(attrs, keyRouting.String(routingSpread), keyRoutingBasis.String(f.routing))
	}
	if f.affinity != "" {
		attrs = append(attrs, keyRoutingAffinity.String(f.affinity))
	}
	span.SetAttributes(attrs...)
}

// attemptStart opens the damper.attempt span of attempt n, started now,
// and returns ctx carrying it, so that the attempt's HTTP request is its
// child, and the span (nil without tracing).
func (ct *callTrace) attemptStart(ctx context.Context, now time.Time, n int, hedge bool) (context.Context, trace.Span) {
	t := ct.t
	ct.closeAttempt(now)
	if !ct.retryAt.IsZero() {
		t.m.backoffWaited(ctx, ct.facts.provider, now.Sub(ct.retryAt))
		ct.retryAt = time.Time{}
	}
	if hedge {
		t.m.hedge(ctx, ct.facts.provider, hedgeSent)
	}
	req := ct.request
	if req == nil || !req.IsRecording() && !req.SpanContext().IsValid() {
		// No tracing at all: an attempt span would be a no-op too.
		return ctx, nil
	}
	ctx, span := t.start(trace.ContextWithSpan(ctx, req), spanAttempt, now)
	if span.IsRecording() {
		if n > 1 {
			span.SetAttributes(keyResendCount.Int(n - 1))
		}
		if hedge {
			span.SetAttributes(keyHedge.Bool(true))
		}
	}
	return ctx, span
}

// attemptEnd records the end of an attempt, a, once (attempt.end): its
// count, with or without tracing, and its span. The span of a success, or
// of an attempt that lost its race, ends here; a failed attempt's stays
// open until the loop has decided what follows it, or the next attempt
// starts.
func (ct *callTrace) attemptEnd(span trace.Span, a AttemptReport) {
	ct.t.m.attempt(ct.ctx, &ct.facts, a)
	if a.Lost && a.Hedge {
		ct.t.m.hedge(ct.ctx, ct.facts.provider, hedgeCanceled)
	}
	if span == nil {
		return // no tracing
	}
	now := ct.t.clock.Now()
	if span.IsRecording() {
		if a.StatusCode > 0 {
			span.SetAttributes(keyStatusCode.Int(a.StatusCode))
		}
		for _, g := range gateList {
			if g.Gate.AttemptSpan != nil {
				g.Gate.AttemptSpan(a, span)
			}
		}
		if ct.t.m.backends {
			span.SetAttributes(keyBackend.String(a.Backend), keyModel.String(BoundedText(a.Model)))
		}
		switch {
		case a.Lost:
			span.SetAttributes(keyHedgeLost.Bool(true))
		case a.Class != 0:
			span.SetAttributes(keyErrorClass.String(a.Kind), keyErrorType.String(attemptErrorType(a)))
			span.SetStatus(codes.Error, a.Kind)
		}
	}
	if a.Class == 0 || a.Lost {
		endSpan(span, now)
		return
	}
	ct.closeAttempt(now) // an earlier failure's, whose race went on
	ct.attempt, ct.attemptAt = span, now
}

// fallback records a call's move f, to a backend of provider: the span of
// the failed attempt it follows, if any, ends with no backoff; the metric
// counts it, and a log line says why.
func (ct *callTrace) fallback(f Fallback, provider string) {
	ct.closeAttempt(ct.t.clock.Now())
	ct.facts.provider = provider
	ct.t.m.fallback(ct.ctx, f)
	ct.logFallback(f)
}

// hedgeResult counts a hedge's result: won, or refused by a gate.
func (ct *callTrace) hedgeResult(result string) {
	ct.t.m.hedge(ct.ctx, ct.facts.provider, result)
}

// retry records that a retry was authorized after attempt n, whose record
// is a and which failed as cls, with wait before the next attempt; the
// call's retries have cost retryCostUSD so far.
func (ct *callTrace) retry(n int, a AttemptReport, cls Classification, wait time.Duration, retryCostUSD float64) {
	now := ct.t.clock.Now()
	if span := ct.attempt; span != nil {
		if span.IsRecording() {
			span.SetAttributes(keyBackoff.Float64(wait.Seconds()))
		}
		ct.closeAttempt(now)
	}
	ct.retryAt = now
	ct.t.m.retry(ct.ctx, ct.facts, cls)
	ct.logRetry(n, a, cls, wait, retryCostUSD)
}

// end ends the damper.request span, once, now, with the call's report rep
// and the record of attempt n, last, the one the call ended on.
func (ct *callTrace) end(rep *Report, last AttemptReport, n int, now time.Time) {
	if ct.ended {
		return
	}
	ct.ended = true
	t := ct.t
	ct.closeAttempt(now)
	if !ct.retryAt.IsZero() {
		// The wait was cut short: the caller's context ended during it.
		t.m.backoffWaited(ct.ctx, ct.facts.provider, now.Sub(ct.retryAt))
		ct.retryAt = time.Time{}
	}
	t.m.request(ct.ctx, rep)
	if ct.gen != nil {
		t.m.gen.record(ct.ctx, &t.m, ct.gen, rep, last)
	}
	if last.Class != 0 && last.Backoff == 0 {
		ct.logNoRetry(rep, last, n)
	}

	span := ct.request
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
		for _, g := range gateList {
			if g.Gate.CallSpan != nil {
				attrs = g.Gate.CallSpan(*rep, attrs)
			}
		}
		if t.m.backends || len(rep.Fallbacks) > 0 {
			attrs = append(attrs, keyBackend.String(rep.Backend), keyFallbacks.Int(len(rep.Fallbacks)), keyProvider.String(rep.Provider))
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

// closeAttempt ends the open attempt span, at the time its attempt ended.
func (ct *callTrace) closeAttempt(now time.Time) {
	span := ct.attempt
	if span == nil {
		return
	}
	end := ct.attemptAt
	if end.IsZero() {
		end = now
	}
	endSpan(span, end)
	ct.attempt, ct.attemptAt = nil, time.Time{}
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
