package engine

import (
	"context"
	"sync"
	"time"
)

// reportSinkKey carries the destination of [ContextWithReport].
type reportSinkKey struct{}

// ContextWithReport returns a copy of ctx that makes Damper write the
// [Report] of a call made with it into dst, as [ReportInto] does, for
// every call, including one refused before its first attempt. Give each
// call its own destination.
func ContextWithReport(ctx context.Context, dst *Report) context.Context {
	return context.WithValue(ctx, reportSinkKey{}, dst)
}

// callReport is the report of one call and its one writer: the rest of the
// engine hands it facts, and it alone copies the report to the caller's
// destination (sink: [ReportInto], [ContextWithReport]). The Report is
// embedded so that the loop reads its fields in place; only the methods
// below write them. The loop writes from its goroutine; a stream's end, a
// Read or a Close write from the caller's, so every write after the call
// has begun takes mu, and so does every read off the loop.
type callReport struct {
	mu sync.Mutex
	Report
	sink     *Report
	firstLog [1]AttemptReport // the log of a call with one attempt, in the call itself
	// decided is 1 + the index in the log of the last record that did not
	// lose a race, 0 while there is none, and decidedN that attempt's
	// number: the attempt that decided what followed. A lost attempt is
	// ended once its race is decided, so its record may come after.
	decided, decidedN int
}

// begin starts the report of a call of model, on the primary backend of
// provider, before anyone else may read it. sink is the caller's
// destination, if any: it is set now, and never after.
func (r *callReport) begin(provider, model, tenant string, stream bool, sink *Report) {
	r.AttemptLog = r.firstLog[:0]
	r.Provider, r.Backend, r.Model, r.Tenant, r.Stream = provider, PrimaryBackend, model, tenant, stream
	r.sink = sink
}

// priced notes the estimated cost of one attempt of a priced model; before
// the call begins.
func (r *callReport) priced(cost float64) {
	r.Priced, r.EstimatedCostUSD = true, cost
}

// skipped notes a backend the call cannot move to; before the call begins.
func (r *callReport) skipped(s Skip) {
	r.Skipped = append(r.Skipped, s)
}

// started notes attempt n, sent after waiting queued in the rate limiter's
// line; hedge when it is sent beside another.
func (r *callReport) started(n int, queued time.Duration, hedge bool) {
	r.mu.Lock()
	r.Attempts = n
	r.RateLimitWait += queued
	if hedge {
		r.Hedges++
	}
	r.mu.Unlock()
}

// queued adds the wait in the rate limiter's line of an attempt not sent.
func (r *callReport) queued(d time.Duration) {
	if d > 0 {
		r.mu.Lock()
		r.RateLimitWait += d
		r.mu.Unlock()
	}
}

// note notes what a gate says in the report (core.Note).
func (r *callReport) note(n gateNote) {
	r.mu.Lock()
	n.NoteReport(&r.Report)
	r.mu.Unlock()
}

// routed notes where spread routing starts the call, before it begins:
// on backend, of provider, when it is not the primary (backend ""), and
// what cache affinity did ("" when it had no say).
func (r *callReport) routed(backend, provider, affinity string) {
	if backend != "" {
		r.Backend, r.Provider = backend, provider
	}
	r.CacheAffinity = affinity
}

// moved notes the call's move fb, to a backend of provider.
func (r *callReport) moved(fb Fallback, provider string) {
	r.mu.Lock()
	r.Fallbacks = append(r.Fallbacks, fb)
	r.Backend, r.Provider = fb.To, provider
	r.mu.Unlock()
}

// retryCost notes the summed estimated cost of the attempts beyond the
// first.
func (r *callReport) retryCost(usd float64) {
	r.mu.Lock()
	r.RetryCostUSD = usd
	r.mu.Unlock()
}

// backoff notes the wait after the last attempt logged that did not lose a
// race, and returns that attempt's record.
func (r *callReport) backoff(wait time.Duration) AttemptReport {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.decided == 0 {
		return AttemptReport{}
	}
	last := &r.AttemptLog[r.decided-1]
	last.Backoff = wait
	return *last
}

// usage notes the usage of the answer the caller got.
func (r *callReport) usage(u usage) {
	r.mu.Lock()
	r.Usage = Usage{InputTokens: u.input, CacheCreationInputTokens: u.cacheCreation,
		CacheReadInputTokens: u.cacheRead, OutputTokens: u.output, Known: u.known}
	r.mu.Unlock()
}

// firstContent notes when a stream's first content came, from the start
// of the call.
func (r *callReport) firstContent(d time.Duration) {
	r.mu.Lock()
	r.FirstContent = d
	r.mu.Unlock()
}

// hedgeWon notes that a hedge gave the answer.
func (r *callReport) hedgeWon() {
	r.mu.Lock()
	r.HedgeWon = true
	r.mu.Unlock()
}

// record appends the record ar of attempt n, which has ended, to the log.
func (r *callReport) record(n int, ar AttemptReport) {
	r.mu.Lock()
	r.AttemptLog = append(r.AttemptLog, ar)
	if !ar.Lost {
		r.decided, r.decidedN = len(r.AttemptLog), n
	}
	r.mu.Unlock()
}

// settle notes how the call ended ("" while an answered call's body is
// open), its duration, and the budget's balance.
func (r *callReport) settle(outcome Outcome, d time.Duration, balance float64) {
	r.mu.Lock()
	r.Outcome, r.Duration, r.BudgetBalance = outcome, d, balance
	r.mu.Unlock()
}

// hasSink reports whether the caller has a destination for the report.
func (r *callReport) hasSink() bool {
	return r.sink != nil // set before the call begins, never after
}

// final returns the report, without its log, and the record and number of
// the attempt the call ended on: the last that did not lose a race, as a
// lost attempt says nothing of how the call ended (zero when none ended).
func (r *callReport) final() (rep Report, last AttemptReport, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rep = r.Report
	rep.AttemptLog = nil
	if r.decided > 0 {
		last, n = r.AttemptLog[r.decided-1], r.decidedN
	}
	return rep, last, n
}

// publish copies the report to the caller's destination, if any. Only the
// caller's own goroutines call it (the loop, a Read or a Close), so that
// what the caller reads is never written under it.
func (r *callReport) publish() {
	if r.sink == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	*r.sink = r.Report
	r.sink.AttemptLog = append([]AttemptReport(nil), r.AttemptLog...)
}

// snapshot returns a copy of the report.
func (r *callReport) snapshot() *Report {
	r.mu.Lock()
	defer r.mu.Unlock()
	rep := r.Report
	rep.AttemptLog = append([]AttemptReport(nil), r.AttemptLog...)
	return &rep
}
