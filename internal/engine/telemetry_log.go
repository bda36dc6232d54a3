package engine

import (
	"context"
	"log/slog"
	"time"

	"github.com/damper-ai/damper-go/internal/core"
	"go.opentelemetry.io/otel/trace"
)

// logRetry writes the line of a retry authorized after attempt n, whose
// record is a.
func (ct *callTrace) logRetry(n int, a AttemptReport, cls Classification, wait time.Duration, retryCostUSD float64) {
	log := ct.t.log
	ctx := ct.logContext()
	if log == nil || !log.Enabled(ctx, slog.LevelInfo) {
		return
	}
	attrs := append(ct.logAttrs(n, a),
		slog.String("decision", "retry"),
		slog.String("signal", cls.Signal.String()),
		slog.Duration("backoff", wait),
	)
	if ct.facts.priced {
		attrs = append(attrs, slog.Float64("retry_cost_usd", retryCostUSD))
	}
	log.LogAttrs(ctx, slog.LevelInfo, "damper: retrying", attrs...)
}

// logFallback writes the line of a call's move f, at Warn: the backend
// left could not answer.
func (ct *callTrace) logFallback(f Fallback) {
	log := ct.t.log
	ctx := ct.logContext()
	if log == nil || !log.Enabled(ctx, slog.LevelWarn) {
		return
	}
	log.LogAttrs(ctx, slog.LevelWarn, "damper: falling back",
		slog.String("from", f.From), slog.String("to", f.To),
		slog.String("model", BoundedText(f.Model)), slog.String("reason", f.Reason))
}

// logNoRetry writes the line of a call that ends on failed attempt n, whose
// record is last, without a retry: a gate refused one (at Warn), or the
// failure is not one to retry (at Info).
func (ct *callTrace) logNoRetry(rep *Report, last AttemptReport, n int) {
	level := slog.LevelInfo
	if isDenial(rep.Outcome) {
		level = slog.LevelWarn
	}
	log := ct.t.log
	ctx := ct.logContext()
	if log == nil || !log.Enabled(ctx, level) {
		return
	}
	attrs := append(ct.logAttrs(n, last),
		slog.String("decision", "no_retry"),
		slog.String("reason", string(rep.Outcome)),
		slog.Float64("budget_balance", rep.BudgetBalance),
	)
	log.LogAttrs(ctx, level, "damper: not retrying", attrs...)
}

// logAttrs are the fields every decision line has: which call, which
// attempt, and how that attempt failed. The attempt's error text is left
// out: the kind and status say what happened, and the text may quote more
// of the request than a log should hold.
func (ct *callTrace) logAttrs(n int, a AttemptReport) []slog.Attr {
	attrs := make([]slog.Attr, 0, 12)
	attrs = append(attrs,
		slog.Int("attempt", n),
		slog.String("provider", ct.facts.provider),
	)
	if ct.facts.model != "" {
		attrs = append(attrs, slog.String("model", BoundedText(ct.facts.model)))
	}
	if a.StatusCode > 0 {
		attrs = append(attrs, slog.Int("status", a.StatusCode))
	}
	attrs = append(attrs,
		slog.String("class", a.Class.String()),
		slog.String("kind", a.Kind),
		slog.Duration("attempt_duration", a.Duration),
	)
	if a.RequestID != "" {
		attrs = append(attrs, slog.String("request_id", BoundedText(a.RequestID)))
	}
	return attrs
}

// logContext is the context a decision line is logged with: the caller's,
// holding the damper.request span, so that a handler that adds trace IDs
// to its lines ties them to the trace.
func (ct *callTrace) logContext() context.Context {
	if ct.t.log == nil || ct.request == nil {
		return ct.ctx
	}
	return trace.ContextWithSpan(ct.ctx, ct.request)
}

// logStoreError counts a failure of a part's store in damper.store.errors
// and logs it, at Warn: the part still decided, as its store was built to
// (on state kept in memory, or refusing). A store that is down fails every
// call, so each part writes at most one line per storeLogEvery, with the
// count of errors since the last.
func (t *telemetry) logStoreError(ctx context.Context, part storePart, op string, err error) {
	if err == nil {
		return
	}
	t.m.storeError(ctx, part, op)
	if t.log == nil || !t.log.Enabled(ctx, slog.LevelWarn) {
		return
	}
	pe := &t.storeErrs[part]
	n := pe.errors.Add(1)
	now := t.clock.Now().UnixNano()
	next := pe.next.Load()
	if now < next || !pe.next.CompareAndSwap(next, now+int64(storeLogEvery)) {
		return
	}
	pe.errors.Add(-n)
	t.log.LogAttrs(ctx, slog.LevelWarn, core.StoreParts()[part].Message, slog.String("op", op), slog.String("error", err.Error()),
		slog.Int64("errors", n))
}

// storeLogEvery is the least time between two lines about one part's
// store errors.
const storeLogEvery = 10 * time.Second
