package engine

import (
	"context"
	"errors"
	"runtime"
	"time"

	"github.com/damper-ai/damper-go/internal/core"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// Metric names. Like the span attributes, they never change.
const (
	metricAttempts        = "damper.attempts"
	metricRetries         = "damper.retries"
	metricDenials         = "damper.retry.denials"
	metricBackoff         = "damper.retry.backoff"
	metricRetryCost       = "damper.retry.cost"
	metricRequestDuration = "damper.request.duration"
	metricHedges          = "damper.hedges"
	metricStoreErrors     = "damper.store.errors"
	metricFallbacks       = "damper.fallbacks"
	metricFallbackSkips   = "damper.fallback.skipped"
)

// The results of a hedge, in damper.hedges.
const (
	hedgeSent     = "sent"     // a hedge left
	hedgeWon      = "won"      // a hedge answered first
	hedgeCanceled = "canceled" // a hedge was cancelled: the attempt it hedged answered first
	hedgeRefused  = "refused"  // a hedge was due, and a gate refused it
)

// metrics are the instruments of one Damper, created once by New. Every
// attribute of the damper.* metrics has a handful of values: provider,
// outcome, failure kind, gate. The model is left out of them, as a caller
// can name any model; the GenAI metrics carry it, as their conventions
// require, and the rate limiter's the limit group, each through a labelSet.
type metrics struct {
	name      attribute.KeyValue // damper.name, recorded with every value when named
	named     bool
	models    *labelSet // the labels of models, for the GenAI metrics
	groups    *labelSet // the labels of limit groups
	attempts  metric.Int64Counter
	retries   metric.Int64Counter
	denials   metric.Int64Counter
	backoff   metric.Float64Histogram
	retryCost metric.Float64Counter
	duration  metric.Float64Histogram
	hedges    metric.Int64Counter
	storeErrs metric.Int64Counter
	fallbacks metric.Int64Counter
	// fallbackSkips counts the backends a call cannot move to (fallback.go).
	fallbackSkips metric.Int64Counter
	// routingChoices counts spread calls by their first backend
	// (routing.go); nil but with spread routing.
	routingChoices metric.Int64Counter
	// routingAffinity counts spread calls with a cached prefix by the
	// affinity table's answer (affinity.go); nil but with cache affinity.
	routingAffinity metric.Int64Counter
	// backends is whether the Damper has backends to fall back to: the
	// attempts, durations and breaker changes then name theirs.
	backends bool
	// env is what the gates see of the Damper, for their records.
	env *core.Env
	// gates are the gates' own instruments, made on meter once the
	// backends are wired (registerGates).
	gates []gateInstruments
	meter metric.Meter
	gen   genAIMetrics // the GenAI semantic conventions' (telemetry_genai.go)
	// The options of the values every call records, per combination of
	// their attributes (optionCache).
	// Each is a slice of one option, passed to Add or Record as it is: a
	// slice made for the call would escape to the heap.
	attemptOpts *optionCache[attemptSeries, []metric.AddOption]
	requestOpts *optionCache[requestSeries, []metric.RecordOption]
}

// newMetrics creates a Damper's instruments on meter, but the gates' own
// (registerGates). An instrument the meter refuses is replaced by a no-op
// one and the error goes to otel.Handle, as telemetry must never fail a
// call.
func newMetrics(meter metric.Meter, name attribute.KeyValue, named bool, models, groups *labelSet) metrics {
	var none noop.Meter
	m := metrics{
		meter:       meter,
		attemptOpts: &optionCache[attemptSeries, []metric.AddOption]{},
		requestOpts: &optionCache[requestSeries, []metric.RecordOption]{},
		name:        name,
		named:       named,
		models:      models,
		groups:      groups,
		attempts: instrument(meter.Int64Counter(metricAttempts, metric.WithUnit("{attempt}"),
			metric.WithDescription("Provider attempts made for Messages calls, first attempts included.")))(none.Int64Counter(metricAttempts)),
		retries: instrument(meter.Int64Counter(metricRetries, metric.WithUnit("{retry}"),
			metric.WithDescription("Retries authorized by every admission gate.")))(none.Int64Counter(metricRetries)),
		denials: instrument(meter.Int64Counter(metricDenials, metric.WithUnit("{request}"),
			metric.WithDescription("Requests ended by an admission gate's refusal (of a retry, or of a first attempt by an open breaker), by gate.")))(none.Int64Counter(metricDenials)),
		backoff: instrument(meter.Float64Histogram(metricBackoff, metric.WithUnit("s"),
			metric.WithDescription("Time waited before a retry, on the Damper's clock."),
			metric.WithExplicitBucketBoundaries(0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60)))(none.Float64Histogram(metricBackoff)),
		retryCost: instrument(meter.Float64Counter(metricRetryCost, metric.WithUnit("USD"),
			metric.WithDescription("Estimated cost of the retries authorized, for priced models.")))(none.Float64Counter(metricRetryCost)),
		duration: instrument(meter.Float64Histogram(metricRequestDuration, metric.WithUnit("s"),
			metric.WithDescription("Duration of logical Messages requests, retries and waits included."),
			metric.WithExplicitBucketBoundaries(0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 60, 120, 300, 600)))(none.Float64Histogram(metricRequestDuration)),
		hedges: instrument(meter.Int64Counter(metricHedges, metric.WithUnit("{hedge}"),
			metric.WithDescription("Hedges of Messages calls by result: sent, won (answered first), canceled (the attempt hedged answered first), refused (by a gate).")))(none.Int64Counter(metricHedges)),
		storeErrs: instrument(meter.Int64Counter(metricStoreErrors, metric.WithUnit("{error}"),
			metric.WithDescription("Operations of a Store's part (budget, throttle, breaker, limiter) that failed, such as Redis being unreachable: the part decided without it.")))(none.Int64Counter(metricStoreErrors)),
		fallbacks: instrument(meter.Int64Counter(metricFallbacks, metric.WithUnit("{fallback}"),
			metric.WithDescription("Moves of Messages calls from a backend or model to the next, by the backends left and entered and the reason.")))(none.Int64Counter(metricFallbacks)),
		fallbackSkips: instrument(meter.Int64Counter(metricFallbackSkips, metric.WithUnit("{skip}"),
			metric.WithDescription("Backends a Messages call cannot fall back to with its model, once per call, backend and model, by backend and reason (no_model_id: give Backend.Models; unsupported_beta, top_level_cache_control, inference_geo, mcp_servers, unsupported_server_tool: the backend's platform lacks a feature the request uses).")))(none.Int64Counter(metricFallbackSkips)),
	}
	m.gen = newGenAIMetrics(meter)
	return m
}

// attrs returns the option recording kvs, and the Damper's name if any.
func (m *metrics) attrs(kvs ...attribute.KeyValue) metric.MeasurementOption {
	if m.named {
		kvs = append(kvs, m.name)
	}
	return metric.WithAttributes(kvs...)
}

// with returns the options of a value recorded with no attribute but the
// Damper's name, if any.
func (m *metrics) with() []metric.ObserveOption {
	if !m.named {
		return nil
	}
	return []metric.ObserveOption{metric.WithAttributes(m.name)}
}

// withTenant returns kvs and, for a call made for a tenant, its name. A
// tenant is one of the proxy's configured names, at most maxTenants of
// validated characters, so it is a label as it is; a call with none adds
// no attribute, not a series of its own.
func withTenant(kvs []attribute.KeyValue, tenant string) []attribute.KeyValue {
	if tenant == "" {
		return kvs
	}
	return append(kvs, keyTenant.String(tenant))
}

// attempt counts one attempt, a, of a call whose facts are f.
func (m *metrics) attempt(ctx context.Context, f *callFacts, a AttemptReport) {
	if !m.attempts.Enabled(ctx) {
		return
	}
	k := attemptSeries{provider: f.provider, tenant: f.tenant}
	if m.backends {
		k.backend = a.Backend
	}
	if a.Class != 0 {
		k.kind, k.failed = a.Kind, true
	}
	o, ok := m.attemptOpts.load(k)
	if !ok {
		kvs := make([]attribute.KeyValue, 1, 5)
		kvs[0] = keyProvider.String(k.provider)
		kvs = withTenant(kvs, k.tenant)
		if m.backends {
			kvs = append(kvs, keyBackend.String(k.backend))
		}
		if k.failed {
			kvs = append(kvs, keyErrorClass.String(k.kind))
		}
		o = []metric.AddOption{m.attrs(kvs...)}
		m.attemptOpts.store(k, o)
	}
	m.attempts.Add(ctx, 1, o...)
}

// attemptSeries is the combination of attributes an attempt is counted
// with.
type attemptSeries struct {
	provider, tenant, backend, kind string
	failed                          bool // kind is recorded
}

// requestSeries is the combination of attributes a call's duration is
// recorded with.
type requestSeries struct {
	provider, outcome, tenant, backend string
	stream                             bool
}

// fallback counts a call's move from a backend to the next.
func (m *metrics) fallback(ctx context.Context, f Fallback) {
	if m.fallbacks.Enabled(ctx) {
		m.fallbacks.Add(ctx, 1, m.attrs(keyFallbackFrom.String(f.From), keyFallbackTo.String(f.To), keyFallbackReason.String(f.Reason)))
	}
}

// hedge counts a hedge of a call to provider, by its result.
func (m *metrics) hedge(ctx context.Context, provider, result string) {
	if m.hedges.Enabled(ctx) {
		m.hedges.Add(ctx, 1, m.attrs(keyProvider.String(provider), keyHedgeResult.String(result)))
	}
}

// retry counts a retry authorized after a failure classified cls, and its
// estimated cost.
func (m *metrics) retry(ctx context.Context, f callFacts, cls Classification) {
	if m.retries.Enabled(ctx) {
		m.retries.Add(ctx, 1, m.attrs(withTenant([]attribute.KeyValue{keyProvider.String(f.provider), keyErrorClass.String(cls.Kind)}, f.tenant)...))
	}
	if f.priced && m.retryCost.Enabled(ctx) {
		m.retryCost.Add(ctx, f.estimateUSD, m.attrs(withTenant([]attribute.KeyValue{keyProvider.String(f.provider)}, f.tenant)...))
	}
}

// backoffWaited records a wait before a retry.
func (m *metrics) backoffWaited(ctx context.Context, provider string, d time.Duration) {
	if m.backoff.Enabled(ctx) {
		m.backoff.Record(ctx, d.Seconds(), m.attrs(keyProvider.String(provider)))
	}
}

// request records the end of a call whose report is rep: its duration and,
// when a gate refused a retry, the denial.
func (m *metrics) request(ctx context.Context, rep *Report) {
	if isDenial(rep.Outcome) && m.denials.Enabled(ctx) {
		m.denials.Add(ctx, 1, m.attrs(withTenant([]attribute.KeyValue{keyProvider.String(rep.Provider), keyDenialReason.String(string(rep.Outcome))}, rep.Tenant)...))
	}
	m.recordGates(ctx, rep)
	if m.duration.Enabled(ctx) {
		k := requestSeries{provider: rep.Provider, outcome: string(rep.Outcome), tenant: rep.Tenant, stream: rep.Stream}
		if m.backends {
			k.backend = rep.Backend
		}
		o, ok := m.requestOpts.load(k)
		if !ok {
			kvs := []attribute.KeyValue{keyProvider.String(k.provider), keyOutcome.String(k.outcome), keyStream.Bool(k.stream)}
			kvs = withTenant(kvs, k.tenant)
			if m.backends {
				kvs = append(kvs, keyBackend.String(k.backend))
			}
			o = []metric.RecordOption{m.attrs(kvs...)}
			m.requestOpts.store(k, o)
		}
		m.duration.Record(ctx, rep.Duration.Seconds(), o...)
	}
}

// storeError counts an operation op of part's store that failed.
func (m *metrics) storeError(ctx context.Context, part storePart, op string) {
	if m.storeErrs.Enabled(ctx) {
		m.storeErrs.Add(ctx, 1, m.attrs(keyStorePart.String(core.StoreParts()[part].Name), keyStoreOp.String(op)))
	}
}

// instrument returns the instrument a meter created or, when the meter
// refused it, hands the error to otel.Handle and returns the fallback.
func instrument[T any](inst T, err error) func(fallback T, _ error) T {
	return func(fallback T, _ error) T {
		if err != nil {
			otel.Handle(err)
			return fallback
		}
		return inst
	}
}

// keepGauges keeps reg, the callback of a gauge of d, for Damper.Close,
// and unregisters it once d is collected: the callback holds d's parts,
// never d itself.
func (t *telemetry) keepGauges(d *Damper, reg metric.Registration) {
	t.gauges = append(t.gauges, reg)
	runtime.AddCleanup(d, func(r metric.Registration) { _ = r.Unregister() }, reg)
}

// unregisterGauges unregisters the callbacks keepGauges kept, once.
func (t *telemetry) unregisterGauges() error {
	var err error
	t.gaugesGone.Do(func() {
		for _, r := range t.gauges {
			err = errors.Join(err, r.Unregister())
		}
	})
	return err
}
