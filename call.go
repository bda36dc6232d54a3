package damper

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/tidwall/gjson"
)

const (
	// minAttempt is the least time worth giving another attempt: a retry
	// whose wait leaves less than this before the deadline is not started.
	minAttempt = 500 * time.Millisecond
	// maxErrorBody bounds what Damper reads of an error response.
	maxErrorBody = 1 << 20
	// maxResponseBody bounds what Damper buffers of a successful plain
	// response, far above any Messages answer (128k output tokens are a
	// few MiB), so that a body without end fails instead of filling memory.
	maxResponseBody = 64 << 20
)

// errResponseTooLarge is a plain response longer than maxResponseBody.
var errResponseTooLarge = fmt.Errorf("damper: response body exceeds %d MiB", maxResponseBody>>20)

// callKey marks the context of each attempt with its logical call.
type callKey struct{}

// call is one logical request: the state of Damper's retry loop for it.
// The loop runs in one goroutine; mu guards only what a stream read or
// ReportInto may touch from elsewhere.
type call struct {
	d     *Damper
	ctx   context.Context
	req   *http.Request
	body  []byte
	start time.Time

	stream      bool
	inputTokens int
	maxTokens   int
	price       Price

	mu        sync.Mutex
	report    Report
	sink      *Report
	stopWatch func() bool // stops the watch on ctx of an answered call; requires mu

	ending sync.Once // see end

	tel callTelemetry // spans and timings of this call, see telemetry.go
}

func (d *Damper) newCall(req *http.Request) (*call, error) {
	body, err := requestBody(req)
	if err != nil {
		return nil, err
	}
	c := &call{d: d, ctx: req.Context(), req: req, body: body, start: d.clock.Now()}
	if sink, ok := c.ctx.Value(reportSinkKey{}).(*Report); ok {
		c.sink = sink
	}
	fields := gjson.GetManyBytes(body, "model", "max_tokens", "stream")
	c.report.Provider = providerOf(req)
	c.report.Model = fields[0].Str
	c.maxTokens = int(fields[1].Int())
	c.stream = fields[2].Bool()
	c.report.Stream = c.stream
	c.inputTokens = EstimateInputTokens(body)
	if p, ok := d.policy.PriceTable.Lookup(c.report.Model); ok {
		c.price = p
		c.report.Priced = true
		c.report.EstimatedCostUSD = attemptCost(p, c.inputTokens, c.maxTokens)
	}
	return c, nil
}

// requestBody reads the body of req without consuming it: every attempt
// sends its own copy.
func requestBody(req *http.Request) ([]byte, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, nil
	}
	if req.GetBody == nil {
		return nil, errors.New("damper: the Messages request body cannot be resent (no GetBody)")
	}
	rc, err := req.GetBody()
	if err != nil {
		return nil, fmt.Errorf("damper: copying the request body: %w", err)
	}
	defer rc.Close()
	_ = req.Body.Close()
	return io.ReadAll(rc)
}

// run is the retry loop of one logical request.
func (c *call) run(next option.MiddlewareNext) (*http.Response, error) {
	p := &c.d.policy
	c.d.tel.requestStart(c)
	var retryCost float64
	for n := 1; ; n++ {
		a := c.attempt(next, n)
		if a.failure == nil {
			c.logSuccess(a)
			c.observe(AttemptOutcome{First: n == 1, Success: true})
			// The call ends with its body (see answerBody): the report is
			// written now, without an outcome, and again then.
			body, ok := a.res.Body.(answerBody)
			if !ok {
				return a.res, c.finish(OutcomeSuccess, nil)
			}
			c.settle("")
			c.mu.Lock()
			c.stopWatch = context.AfterFunc(c.ctx, body.contextDone)
			c.mu.Unlock()
			return a.res, nil
		}
		cls := Classify(*a.failure)
		if p.Classifier != nil {
			cls = p.Classifier(*a.failure, cls)
		}
		c.logAttempt(a, cls)
		c.observe(AttemptOutcome{First: n == 1, Signal: cls.Signal})

		if c.ctx.Err() != nil {
			return c.surface(a, OutcomeCanceled, nil)
		}
		if cls.Class == Ambiguous {
			return c.surface(a, OutcomeAmbiguous, nil)
		}
		if cls.Class != Retryable {
			return c.surface(a, OutcomeError, nil)
		}
		if n >= p.MaxAttempts {
			return c.surface(a, OutcomeAttemptsExhausted, nil)
		}

		now := c.d.clock.Now()
		wait, outcome, refusal := c.plan(n, a.failure, now, retryCost, c.d.rand())
		if refusal != nil {
			return c.surface(a, outcome, refusal)
		}
		granted, err := c.d.budget.Acquire(c.ctx, now)
		c.budgetError("acquire", err)
		if !granted {
			if p.OnBudgetExhausted == PassthroughBudgetExhausted {
				return c.surface(a, OutcomeBudgetExhausted, nil)
			}
			return c.surface(a, OutcomeBudgetExhausted, &Error{Reason: ErrRetryBudgetExhausted})
		}
		retryCost += c.report.EstimatedCostUSD
		c.mu.Lock()
		c.report.RetryCostUSD = retryCost
		c.report.AttemptLog[len(c.report.AttemptLog)-1].Backoff = wait
		c.mu.Unlock()
		c.d.tel.retry(c, n, cls, wait)
		closeBody(a.res)

		if err := c.d.clock.Sleep(c.ctx, wait); err != nil {
			return c.surface(a, OutcomeCanceled, nil)
		}
	}
}

// observe tells the budget how an attempt ended. The budget's books are
// kept whatever becomes of the caller, hence a context without its cancel.
func (c *call) observe(a AttemptOutcome) {
	c.budgetError("observe", c.d.budget.Observe(context.WithoutCancel(c.ctx), c.d.clock.Now(), a))
}

// budgetError logs a failure of the budget's store, if any.
func (c *call) budgetError(op string, err error) {
	if err != nil {
		c.d.tel.logBudgetError(c.ctx, op, err)
	}
}

// plan returns the wait before the retry that follows failed attempt n,
// or the outcome and error of the gate that refuses it. It runs every gate
// but the budget, which goes last so that no unit is spent on a retry that
// another gate refuses.
func (c *call) plan(n int, f *Failure, now time.Time, retryCost, rnd float64) (time.Duration, Outcome, *Error) {
	p := &c.d.policy
	var hint time.Duration
	hasHint := false
	if !p.IgnoreRetryAfter && f.Header != nil {
		hint, hasHint = ParseRetryAfter(f.Header, now)
	}
	wait := backoff(n, p.BackoffBase, p.BackoffMax, min(hint, p.MaxRetryAfter), hasHint, p.MaxRetryAfter, rnd)
	// A delay past MaxRetryAfter is refused first, whatever the deadline:
	// it is the more useful reason, since a queue can reschedule on it.
	if hasHint && hint > p.MaxRetryAfter {
		return 0, OutcomeRetryAfterTooLong, &Error{Reason: ErrRetryAfterTooLong, RetryAfter: hint}
	}
	if deadline, ok := c.ctx.Deadline(); ok && now.Add(wait+minAttempt).After(deadline) {
		return 0, OutcomeDeadline, &Error{Reason: ErrDeadline, RetryAfter: hint}
	}
	if p.MaxRetryCostUSD > 0 && (!c.report.Priced || retryCost+c.report.EstimatedCostUSD > p.MaxRetryCostUSD) {
		return 0, OutcomeCostCeiling, &Error{Reason: ErrRetryCostCeiling}
	}
	return wait, "", nil
}

// attemptResult is the end of one attempt: a response to hand to the SDK,
// a failure to classify, or both (an error status).
type attemptResult struct {
	res      *http.Response
	err      error // the transport error, as the SDK would return it
	failure  *Failure
	start    time.Time
	duration time.Duration
}

// attempt sends one attempt and, for a plain call, reads its whole body
// inside the attempt's timeout, so that a connection that drops part-way
// through the body is a retryable failure rather than the caller's problem.
func (c *call) attempt(next option.MiddlewareNext, n int) attemptResult {
	p := &c.d.policy
	start := c.d.clock.Now()
	actx, cancel := context.WithCancelCause(context.WithValue(c.ctx, callKey{}, c))
	actx = c.d.tel.attemptStart(actx, c, n)
	timeout := attemptTimeoutError{d: p.PerAttemptTimeout}
	stop := c.d.clock.AfterFunc(p.PerAttemptTimeout, func() { cancel(timeout) })
	// cause turns the transport's "context canceled" into a timeout when
	// it was this attempt's timer, not the caller, that ended it.
	cause := func(err error) error {
		if err != nil && c.ctx.Err() == nil && errors.Is(context.Cause(actx), ErrAttemptTimeout) {
			return timeout
		}
		return err
	}
	done := func(a attemptResult) attemptResult {
		a.start = start
		a.duration = c.d.clock.Now().Sub(start)
		return a
	}

	areq := c.req.Clone(actx)
	if c.body != nil {
		areq.Body = io.NopCloser(bytes.NewReader(c.body))
		areq.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(c.body)), nil }
		areq.ContentLength = int64(len(c.body))
	}
	res, err := next(areq)
	if err != nil {
		stop()
		err = cause(err)
		cancel(nil)
		closeBody(res)
		return done(attemptResult{err: err, failure: &Failure{Err: err}})
	}
	if c.stream && res.StatusCode < 400 {
		return done(c.streamAttempt(res, stop, cancel, cause))
	}

	limit := int64(maxResponseBody + 1)
	if res.StatusCode >= 400 {
		limit = maxErrorBody
	}
	body, readErr := readAll(res.Body, limit)
	if readErr != nil {
		readErr = bodyError{readErr}
	}
	cut := false
	switch {
	case readErr != nil:
	case res.StatusCode >= 400 && len(body) == maxErrorBody:
		cut = true // the body may go on: not all of it is read
	case len(body) > maxResponseBody:
		readErr = errResponseTooLarge
	}
	stop()
	cancel(nil)
	if readErr != nil {
		readErr = cause(readErr)
		return done(attemptResult{err: readErr, failure: &Failure{Header: res.Header, Err: readErr}})
	}
	if res.StatusCode >= 400 {
		if cut {
			body = cutErrorBody(body)
		}
		res.Body = io.NopCloser(bytes.NewReader(body))
		return done(attemptResult{res: res, failure: &Failure{StatusCode: res.StatusCode, Header: res.Header, Body: body}})
	}
	if !json.Valid(body) {
		// The SDK cannot decode it: an answer the caller cannot use.
		res.Body = io.NopCloser(bytes.NewReader(body))
		return done(attemptResult{res: res, failure: &Failure{StatusCode: res.StatusCode, Header: res.Header, Body: body, Err: errInvalidJSON}})
	}
	res.Body = &plainBody{r: bytes.NewReader(body), c: c}
	return done(attemptResult{res: res})
}

// answerBody is the body of a successful attempt, handed to the SDK. The
// call ends with it: when it is read to its end or closed, or when the
// call's context ends first, whichever comes first. contextDone is called
// on a goroutine of its own when the context ends.
type answerBody interface {
	io.ReadCloser
	contextDone()
}

// plainBody is the answer of a plain call, read whole within its attempt.
// The SDK reads it and closes it before it looks at the caller's context
// again, so the call ends at Close with the outcome the caller gets: a
// success, or canceled when the context ended first. From a context's end
// that comes first, Read returns the context's error, as the SDK would.
type plainBody struct {
	r        *bytes.Reader
	c        *call
	canceled atomic.Bool
}

func (b *plainBody) Read(p []byte) (int, error) {
	if b.canceled.Load() {
		return 0, b.c.ctx.Err()
	}
	return b.r.Read(p)
}

func (b *plainBody) Close() error {
	if b.c.ctx.Err() != nil {
		b.contextDone()
	} else {
		b.c.end(OutcomeSuccess, nil, nil)
	}
	b.c.publish()
	return nil
}

func (b *plainBody) contextDone() {
	if b.c.end(OutcomeCanceled, b.c.ctx.Err(), nil) {
		b.canceled.Store(true)
	}
}

// errInvalidJSON is a plain call's 2xx whose body is not JSON.
var errInvalidJSON = errors.New("damper: the response body is not valid JSON")

// bodyError is a failure to read a response body once its headers had come:
// the connection dropped, or the body's framing or encoding was corrupt
// (chunked encoding, a gzip checksum). Before content it is a transport
// failure, whatever its cause.
type bodyError struct{ err error }

func (e bodyError) Error() string { return e.err.Error() }
func (e bodyError) Unwrap() error { return e.err }

// cutErrorBody turns the first maxErrorBody bytes of a longer error body
// into a whole JSON error with what they hold of the error's type, message
// (cut where the body was), details and request ID, so that the SDK still
// builds an *anthropic.Error that says what went wrong.
func cutErrorBody(prefix []byte) []byte {
	r := gjson.ParseBytes(prefix)
	msg := r.Get("error.message").String()
	if msg == "" {
		msg = cutString(prefix, `"message"`)
	}
	e := map[string]any{
		"type":    cmpOr(r.Get("error.type").String(), "api_error"),
		"message": msg + " [error body cut at 1 MiB by damper]",
	}
	if d := r.Get("error.details"); d.IsObject() && json.Valid([]byte(d.Raw)) {
		e["details"] = json.RawMessage(d.Raw)
	}
	out := map[string]any{"type": "error", "error": e}
	if id := r.Get("request_id").String(); id != "" {
		out["request_id"] = id
	}
	b, err := json.Marshal(out)
	if err != nil {
		return prefix
	}
	return b
}

// cutString returns the value of the JSON string that follows key in b
// and runs past its end, unescaped as far as it goes.
func cutString(b []byte, key string) string {
	i := bytes.Index(b, []byte(key))
	if i < 0 {
		return ""
	}
	rest := bytes.TrimLeft(b[i+len(key):], " \t\r\n:")
	if len(rest) == 0 || rest[0] != '"' {
		return ""
	}
	rest = rest[1:]
	end := 0 // the end of the last whole character or escape
	for k := 0; k < len(rest) && rest[k] != '"'; {
		step := 1
		if rest[k] == '\\' {
			step = 2
			if k+1 < len(rest) && rest[k+1] == 'u' {
				step = 6
			}
		}
		if k+step > len(rest) {
			break
		}
		k += step
		end = k
	}
	var out string
	if json.Unmarshal(append(append([]byte{'"'}, rest[:end]...), '"'), &out) != nil {
		return ""
	}
	return strings.TrimRight(out, "\uFFFD") // a character cut in two
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// readAll reads body to its end, or to limit bytes, and closes it.
func readAll(body io.ReadCloser, limit int64) ([]byte, error) {
	defer body.Close()
	return io.ReadAll(io.LimitReader(body, limit))
}

func closeBody(res *http.Response) {
	if res != nil && res.Body != nil {
		_ = res.Body.Close()
	}
}

// logAttempt adds a failed attempt to the report.
func (c *call) logAttempt(a attemptResult, cls Classification) {
	ar := AttemptReport{Class: cls.Class, Kind: cls.Kind, Duration: a.duration}
	if a.failure.StatusCode > 0 {
		ar.StatusCode = a.failure.StatusCode
	}
	if a.failure.Header != nil {
		ar.RequestID = a.failure.Header.Get("request-id")
	}
	if a.failure.Err != nil {
		ar.Err = a.failure.Err.Error()
	}
	c.record(ar)
}

// logSuccess adds a successful attempt to the report.
func (c *call) logSuccess(a attemptResult) {
	ar := AttemptReport{Duration: a.duration}
	if a.res != nil {
		ar.StatusCode = a.res.StatusCode
		ar.RequestID = a.res.Header.Get("request-id")
	}
	c.record(ar)
}

// record appends an attempt to the report and ends its telemetry.
func (c *call) record(ar AttemptReport) {
	c.mu.Lock()
	c.report.AttemptLog = append(c.report.AttemptLog, ar)
	n := len(c.report.AttemptLog)
	c.report.Attempts = n
	c.mu.Unlock()
	c.d.tel.attemptEnd(c, n, ar)
}

// surface ends the call with the failure of attempt a. With refusal nil the
// caller gets exactly what the SDK alone would give for that attempt; else
// an *Error with the refusal's reason, wrapping the attempt's error.
func (c *call) surface(a attemptResult, outcome Outcome, refusal *Error) (*http.Response, error) {
	var err error
	switch {
	case outcome == OutcomeCanceled:
		err = c.ctx.Err()
	case refusal != nil:
		refusal.Last = a.providerError(c.req)
		err = refusal
	default:
		err = a.err
	}
	err = c.finish(outcome, err)
	if refusal != nil {
		refusal.Report = c.snapshot()
	} else if e, ok := err.(*Error); ok && e.Report == nil {
		e.Report = c.snapshot() // an *Error of the attempt, such as ErrHoldBackExceeded
	}
	if err != nil || a.res == nil {
		closeBody(a.res)
		return noRetry(c.req), err
	}
	// An error status: the SDK turns it into its own *anthropic.Error.
	a.res.Header.Set("X-Should-Retry", "false")
	return a.res, nil
}

// noRetry is the response that goes with an error Damper returns: the SDK
// does not retry an attempt whose response says x-should-retry: false, and
// returns the error as it is.
func noRetry(req *http.Request) *http.Response {
	return &http.Response{
		Status:  "damper: no response",
		Header:  http.Header{"X-Should-Retry": {"false"}},
		Request: req,
	}
}

// providerError is the error the SDK would have returned for a.
func (a attemptResult) providerError(req *http.Request) error {
	if a.failure == nil || a.failure.StatusCode == 0 {
		return a.err
	}
	apiErr := &anthropic.Error{
		Request:     req,
		Response:    a.res,
		StatusCode:  a.failure.StatusCode,
		RequestID:   a.failure.Header.Get("request-id"),
		WorkspaceID: a.failure.Header.Get("anthropic-workspace-id"),
	}
	_ = apiErr.UnmarshalJSON(a.failure.Body)
	return apiErr
}

// finish ends the call and writes the report to the caller's sink. err is
// returned for convenience.
func (c *call) finish(outcome Outcome, err error) error {
	c.end(outcome, err, nil)
	c.publish()
	return err
}

// end ends the call, once: the first end stops the watch on the call's
// context, runs cleanup (when not nil), records the outcome in the report
// and ends the request's telemetry, and reports true. Any other end waits
// until the first is over and changes nothing. end does not write the
// caller's sink: only the caller's own goroutines do (publish), so that
// what the caller reads is never written under it.
func (c *call) end(outcome Outcome, err error, cleanup func()) (first bool) {
	c.ending.Do(func() {
		first = true
		c.mu.Lock()
		stop := c.stopWatch
		c.stopWatch = nil
		c.mu.Unlock()
		if stop != nil {
			stop()
		}
		if cleanup != nil {
			cleanup()
		}
		c.recordOutcome(outcome)
		c.d.tel.requestEnd(c, err)
	})
	return first
}

// settle records the outcome so far and writes the report to the caller's
// sink: an answered call settles with no outcome, and ends with its body.
func (c *call) settle(outcome Outcome) {
	c.recordOutcome(outcome)
	c.publish()
}

// recordOutcome sets the outcome, duration and budget balance of the report.
func (c *call) recordOutcome(outcome Outcome) {
	now := c.d.clock.Now()
	balance, err := c.d.budget.Available(context.WithoutCancel(c.ctx), now)
	c.budgetError("available", err)
	c.mu.Lock()
	c.report.Outcome = outcome
	c.report.Duration = now.Sub(c.start)
	c.report.BudgetBalance = balance
	c.mu.Unlock()
}

// publish copies the report to the ReportInto destination, if any.
func (c *call) publish() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sink != nil {
		*c.sink = c.report
		c.sink.AttemptLog = append([]AttemptReport(nil), c.report.AttemptLog...)
	}
}

// snapshot returns a copy of the report.
func (c *call) snapshot() *Report {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.report
	r.AttemptLog = append([]AttemptReport(nil), c.report.AttemptLog...)
	return &r
}

func (c *call) setSink(dst *Report) {
	c.mu.Lock()
	c.sink = dst
	c.mu.Unlock()
}
