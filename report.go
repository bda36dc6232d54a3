package damper

import (
	"context"
	"sync"
	"time"
)

// Outcome is how a logical request ended.
type Outcome string

// Outcomes of a logical request that no gate decided. The outcomes of the
// admission gates, which refuse a retry, are declared with the gates
// (gates.go).
const (
	OutcomeSuccess   Outcome = "success"
	OutcomeError     Outcome = "error"    // a failure that is not retried
	OutcomeCanceled  Outcome = "canceled" // the caller's context ended
	OutcomeAmbiguous Outcome = "ambiguous"
)

// Report is the account of one logical request: what Damper tried, what it
// cost, and why it stopped. It is filled in when the call returns; a
// stream's is filled in when the stream is handed over, with no Outcome
// yet, and again when it ends (see the package documentation, Streams).
type Report struct {
	// Provider is the platform of the backend the last attempt went to:
	// for the client's own, "anthropic" or the platform it is pointed at.
	Provider string
	// Model is the model the caller asked for; each attempt's record says
	// what it sent.
	Model  string
	Stream bool
	// Tenant is the tenant the call was made for: in [Proxy]'s key mode,
	// the configured [Tenant] whose key the client presented; "" when
	// none (pass-through mode, or a call made through the SDK).
	Tenant string
	// Backend is the backend the last attempt went to, the one that
	// answered if any: "primary" for the client's own (see [WithBackends]).
	Backend string
	// Fallbacks lists the call's moves from a backend or a model to the
	// next, in order (see [FallbackPolicy]).
	Fallbacks []Fallback
	// Skipped lists the backends of [WithBackends] the call cannot move
	// to with its model, or with a sibling of [FallbackPolicy].Models, and
	// why: it falls back to the others alone, or not at all. It is known
	// when the call starts, so it is filled in whether or not the call
	// needed to move.
	Skipped []Skip
	// CacheAffinity is what cache affinity did for a call whose prompt has
	// a cache breakpoint, under spread routing (see
	// [FallbackPolicy].CacheAffinity): "hit", it started on the backend
	// that last served the prompt's cached prefix; "moved", that backend
	// lacked headroom or was refused; "new", none had served it. Empty
	// for any other call.
	CacheAffinity string

	Attempts int
	// Outcome is how the call ended; empty while a stream is still open.
	Outcome Outcome

	// EstimatedCostUSD is the estimated cost of one attempt; Priced is
	// false when the model has no price, and the estimate is then 0.
	EstimatedCostUSD float64
	Priced           bool
	// RetryCostUSD is the summed estimated cost of the attempts made
	// beyond the first: retries, hedges and fallbacks.
	RetryCostUSD float64
	// BudgetBalance is the retry budget's balance when the call ended.
	BudgetBalance float64
	// Circuit is the breaker's state when it last admitted or refused an
	// attempt of the call; zero when the Policy has no breaker.
	Circuit CircuitState
	// LimitGroup is the rate limiter's group of the call's model (see
	// [LimitGroup]); empty when the Policy has no rate limiter.
	LimitGroup string
	// RateLimitWait is the time the call's attempts waited in the rate
	// limiter's line, in all.
	RateLimitWait time.Duration
	// Usage is the token usage of the answer the caller got, as the
	// provider reported it (a plain answer's body; a stream's
	// message_start and message_delta events, as far as the stream was
	// read): a plain answer's from its hand-over, a stream's from its end.
	// Attempts that failed or lost a race are not in it. Damper reads it
	// when the call's report has a destination ([ReportInto],
	// [ContextWithReport], the [Proxy]'s), when the Policy has a rate
	// limiter or the token metrics record, and for a [Tenant] with a
	// daily cost ceiling; otherwise, and when the answer reported none,
	// Known is false.
	Usage Usage
	// Hedges is the number of hedges sent (see [HedgePolicy]); HedgeWon is
	// whether one of them gave the answer the caller got.
	Hedges   int
	HedgeWon bool

	// Duration is the time from the first attempt to the end of the call.
	Duration time.Duration
	// FirstContent is, for a stream, the time from the start of the call to
	// the first content reaching the caller.
	FirstContent time.Duration

	// AttemptLog has one entry per attempt that has ended, in order. A
	// stream's last attempt ends with the stream, so while a stream is
	// open its report counts one more attempt than it logs.
	AttemptLog []AttemptReport
}

// Usage is an answer's token usage: the input tokens, those written to
// and read from the prompt cache (apart from InputTokens, as the API
// counts them), and the output tokens.
type Usage struct {
	InputTokens              int64
	CacheCreationInputTokens int64
	CacheReadInputTokens     int64
	OutputTokens             int64
	// Known is whether the answer's usage was read (see [Report].Usage).
	Known bool
}

// AttemptReport describes one provider attempt.
type AttemptReport struct {
	// StatusCode is the HTTP status of the attempt's response: 0 when none
	// arrived, or when a stream's 200 failed before its first content (the
	// failure is its SSE error event or its transport's); a stream that
	// failed after content keeps its 200.
	StatusCode int
	// Class and Kind classify a failed attempt (see [Classification]);
	// both are zero for a success.
	Class Class
	Kind  string
	// Err is the attempt's error text, for failures without a status.
	Err       string
	RequestID string
	// Backend is the backend the attempt went to ("primary" for the
	// client's own) and Model the model it sent, as that backend names it.
	Backend, Model string
	Duration       time.Duration
	// Backoff is the wait before the next attempt, 0 when none followed.
	Backoff time.Duration
	// Probe is true for the attempt a half-open breaker let through.
	Probe bool
	// RateLimitWait is the time the attempt waited in the rate limiter's
	// line before it was sent.
	RateLimitWait time.Duration
	// Hedge is true for an attempt sent beside another (see
	// [HedgePolicy]).
	Hedge bool
	// Lost is true for an attempt its race cancelled, its Kind
	// "hedge_lost": another attempt of its call answered first, or failed
	// with a failure that ends the race. A lost attempt is ended once the
	// race is decided, so its record may follow that of the attempt the
	// call ended on; it says nothing of how the call ended.
	Lost bool
}

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

// circuit notes the breaker's state as it answered the call.
func (r *callReport) circuit(s CircuitState) {
	r.mu.Lock()
	r.Circuit = s
	r.mu.Unlock()
}

// limitGroup notes the rate limiter's group of the call.
func (r *callReport) limitGroup(name string) {
	r.mu.Lock()
	r.LimitGroup = name
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
