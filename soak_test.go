package damper_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// The chaos soak drives thousands of logical requests, plain and streaming,
// from many goroutines through several Dampers, against a server that fails
// each attempt in a randomly drawn way, and checks after every call and at
// the end the invariants of docs/RELIABILITY.md.
//
// The in-memory half runs in a synctest bubble on dampertest.Transport: the
// bubble's clock is the Damper's, the server's and the caller's deadlines',
// so stalls, slow headers, backoffs and timeouts cost no real time and every
// duration is exact. The loopback half (soak_loopback_test.go) runs fewer
// requests over real sockets against dampertest.Server.
//
// go test -run Soak -soak.long (or DAMPER_SOAK=long) runs the long form;
// -soak.seed=N replays a draw.
var (
	soakLong = flag.Bool("soak.long", false, "run the long chaos soak (at least 100,000 logical requests)")
	soakSeed = flag.Uint64("soak.seed", 0, "seed of the chaos soak's draw; 0 picks one from the time")
)

func soakIsLong() bool { return *soakLong || os.Getenv("DAMPER_SOAK") == "long" }

func soakSeedFor(t *testing.T) uint64 {
	seed := *soakSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("chaos soak seed %d: rerun with -soak.seed=%d", seed, seed)
		}
	})
	return seed
}

// Secrets the soak's clients send; no output may contain them.
const (
	soakAPIKey    = "sk-ant-api03-SOAKSECRETKEY-7f3a9c1e5b2d4f6a8c0e"
	soakAuthToken = "soak-auth-token-SECRETBEARER-0b1c2d3e4f5a6b7c"
)

// faultKind is how one attempt goes wrong.
type faultKind int

const (
	fOK                faultKind = iota
	fStatusHint                  // a retryable status with retry-after or retry-after-ms within MaxRetryAfter
	fStatusNoHint                // a retryable status without a hint
	fStatusLongHint              // a retryable status whose hint exceeds MaxRetryAfter
	fStatusFinal                 // 4xx, a spend limit, or x-should-retry: false
	fDropBeforeHeaders           // the connection closes before any byte
	fDropMidBody                 // half the body, then the connection closes
	fSlowHeaders                 // headers after a delay, sometimes past PerAttemptTimeout
	fStall                       // the body stops (a plain call: half the body; a stream: at a random event) and never ends
	fSSEError                    // a stream's `event: error` at a random event
	fReset                       // a stream's connection reset at a random event
	fTruncate                    // a stream ends cleanly at a random event, without message_stop
	fHoldBack                    // a stream sends more than MaxHoldBack before its content
	nFaultKinds
)

var faultNames = [nFaultKinds]string{
	"ok", "status with hint", "status without hint", "status with too long a hint", "final status",
	"drop before headers", "drop mid-body", "slow headers", "stall", "SSE error event",
	"reset mid-stream", "truncated stream", "hold-back overflow",
}

// attemptPlan is the scripted answer to one attempt.
type attemptPlan struct {
	kind    faultKind
	status  int
	header  http.Header
	errType string
	errCode string
	delay   time.Duration
	msgID   string            // unique per attempt, so that events of two attempts never look alike
	text    string            // the answer of a plain call
	st      dampertest.Stream // the stream of a streaming call
}

// reqPlan is one logical request.
type reqPlan struct {
	id       int
	damper   int
	stream   bool
	deadline time.Duration
	cancelAt time.Duration // 0: the caller does not cancel
	sdkLimit time.Duration // option.WithRequestTimeout given to the call; 0: none
	attempts []attemptPlan // one per attempt the Damper may make
}

// limit is when the caller stops waiting: its deadline or its cancellation.
func (p reqPlan) limit() time.Duration {
	if p.cancelAt > 0 {
		return min(p.deadline, p.cancelAt)
	}
	return p.deadline
}

// firstEnd is when the first context of the call ends: the caller's, or the
// SDK's request timeout, which wraps Damper's loop.
func (p reqPlan) firstEnd() time.Duration {
	if p.sdkLimit > 0 {
		return min(p.limit(), p.sdkLimit)
	}
	return p.limit()
}

// soakProfile is one Damper of the soak, with what its draw needs to know:
// the model its calls name, the deadlines its callers set and how late a
// caller may cancel.
type soakProfile struct {
	name      string
	policy    damper.Policy
	model     string
	deadlines []time.Duration
	cancelBy  time.Duration
}

// soakProfiles are the Dampers of the in-memory soak: defaults with limits
// on stalls; many cheap retries under a cost ceiling and a small, fast
// budget window; two attempts, a small hold-back and no idle limit.
func soakProfiles() []soakProfile {
	deadlines := []time.Duration{20 * time.Second, 45 * time.Second, 2 * time.Minute, 5 * time.Minute, 9 * time.Minute}
	return []soakProfile{
		{"defaults", damper.Policy{PerAttemptTimeout: 10 * time.Second, StreamIdleTimeout: 20 * time.Second},
			dampertest.DefaultModel, deadlines, time.Minute},
		{"ceiling", damper.Policy{
			MaxAttempts: 5, PerAttemptTimeout: 5 * time.Second, StreamIdleTimeout: 5 * time.Second,
			BackoffBase: 200 * time.Millisecond, BackoffMax: 5 * time.Second, MaxRetryAfter: 3 * time.Second,
			MaxRetryCostUSD: 0.005, RetryBudgetWindow: 10 * time.Second, RetryBudgetMinTokens: 2, RetryBudgetRatio: 0.2,
			OnBudgetExhausted: damper.PassthroughBudgetExhausted,
		}, "claude-sonnet-4-5", deadlines, time.Minute},
		{"small", damper.Policy{MaxAttempts: 2, PerAttemptTimeout: 30 * time.Second, MaxHoldBack: 4 << 10, RetryBudgetWindow: time.Hour},
			dampertest.DefaultModel, deadlines, time.Minute},
	}
}

// faultRate is the share of attempts that fail: the soak alternates calm
// spells of requests, where the budget covers every retry, with storms,
// where it runs out.
func faultRate(id, spell int) float64 {
	if id/spell%2 == 0 {
		return 0.1
	}
	return 0.6
}

// drawPlan draws request id's plan: each attempt fails with probability
// faultRate(id, spell), in a way drawn uniformly from the fault kinds.
func drawPlan(rng *rand.Rand, id, spell int, profiles []soakProfile) reqPlan {
	p := reqPlan{id: id, damper: rng.IntN(len(profiles)), stream: rng.IntN(2) == 0}
	pol := profiles[p.damper].policy
	maxAttempts := cmpOr(pol.MaxAttempts, damper.DefaultMaxAttempts)
	perAttempt := pol.PerAttemptTimeout
	maxAfter := cmpOr(pol.MaxRetryAfter, damper.DefaultMaxRetryAfter)
	pr := profiles[p.damper]
	p.deadline = pr.deadlines[rng.IntN(len(pr.deadlines))]
	if rng.IntN(100) < 15 {
		// An odd number of nanoseconds, so that a cancellation never falls
		// on the instant a scripted delay ends.
		p.cancelAt = time.Duration(rng.Int64N(int64(pr.cancelBy))) | 1
	}
	if rng.IntN(100) < 10 {
		// The SDK's own request timeout, which wraps Damper's whole loop.
		p.sdkLimit = time.Duration(rng.Int64N(int64(pr.cancelBy))) | 1
	}
	for k := range maxAttempts {
		a := attemptPlan{msgID: fmt.Sprintf("msg_soak_%d_%d", id, k+1)}
		a.text = fmt.Sprintf("r%d a%d: %s", id, k+1, strings.Repeat("é-ü ", rng.IntN(12)))
		a.st = dampertest.Stream{Text: a.text, ChunkSize: 12 + rng.IntN(8), Pings: rng.IntN(3)}
		if rng.Float64() < faultRate(id, spell) {
			a.kind = faultKind(1 + rng.IntN(int(nFaultKinds)-1))
		}
		if !p.stream && a.kind >= fSSEError {
			a.kind = fDropMidBody
		}
		if a.kind == fHoldBack && pol.MaxHoldBack == 0 {
			a.kind = fStall
		}
		events := len(a.st.Events())
		switch a.kind {
		case fStatusHint:
			a.status = []int{429, 503, 529}[rng.IntN(3)]
			if maxAfter >= time.Second && rng.IntN(2) == 0 {
				a.header = http.Header{"Retry-After": {strconv.Itoa(1 + rng.IntN(int(maxAfter/time.Second)))}}
			} else {
				a.header = http.Header{"Retry-After-Ms": {strconv.Itoa(1 + rng.IntN(int(maxAfter/time.Millisecond)))}}
			}
		case fStatusNoHint:
			a.status = []int{429, 500, 502, 503, 504, 529}[rng.IntN(6)]
		case fStatusLongHint:
			a.status = []int{429, 529}[rng.IntN(2)]
			a.header = http.Header{"Retry-After": {strconv.Itoa(int(maxAfter/time.Second) + 1 + rng.IntN(600))}}
		case fStatusFinal:
			switch rng.IntN(4) {
			case 0:
				a.status = []int{400, 401, 403, 404, 413}[rng.IntN(5)]
			case 1:
				a.status, a.errCode = 429, "enforced_spend_limit_reached"
			case 2:
				a.status, a.header = 529, http.Header{"X-Should-Retry": {"false"}}
			default:
				a.status, a.header = 400, http.Header{"X-Should-Retry": {"true"}} // the API's word: retryable
			}
		case fSlowHeaders:
			a.delay = time.Duration(rng.Int64N(int64(perAttempt * 3 / 2)))
		case fStall, fSSEError, fReset, fTruncate:
			a.st.At = rng.IntN(events + 1)
			a.st.Fault = map[faultKind]dampertest.Fault{
				fStall: dampertest.FaultStall, fSSEError: dampertest.FaultErrorEvent,
				fReset: dampertest.FaultReset, fTruncate: dampertest.FaultTruncate,
			}[a.kind]
			if a.kind == fSSEError {
				a.st.ErrorType = []string{"overloaded_error", "api_error", "rate_limit_error", "invalid_request_error"}[rng.IntN(4)]
			}
		case fHoldBack:
			a.st.PreContentBytes = pol.MaxHoldBack + 1 + rng.IntN(4096)
		}
		p.attempts = append(p.attempts, a)
	}
	return p
}

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// events returns the scripted events of a stream attempt, its message ID
// made unique, and the data of those a caller sees (the SDK skips pings).
func (a attemptPlan) events() (all []dampertest.Event, seen []string) {
	all = a.st.Events()
	all[0].Data = bytes.Replace(all[0].Data, []byte(`"msg_dampertest"`), []byte(strconv.Quote(a.msgID)), 1)
	for _, e := range all {
		if e.Name != "ping" {
			seen = append(seen, string(e.Data))
		}
	}
	return all, seen
}

// chaosServer answers request id's n-th attempt with plans[id].attempts[n-1].
// Its waits are on time, the synctest bubble's clock, and its stalls end
// with the request's context only, as a bubble requires.
type chaosServer struct {
	plans  []reqPlan
	counts []atomic.Int32
	extra  atomic.Int64              // attempts beyond a plan: more than MaxAttempts
	served [nFaultKinds]atomic.Int64 // attempts served, by fault
}

func newChaosServer(plans []reqPlan) *chaosServer {
	return &chaosServer{plans: plans, counts: make([]atomic.Int32, len(plans))}
}

func (s *chaosServer) total() int64 {
	var n int64
	for i := range s.counts {
		n += int64(s.counts[i].Load())
	}
	return n
}

func (s *chaosServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	id, err := strconv.Atoi(r.Header.Get(dampertest.ScenarioHeader))
	if err != nil || id < 0 || id >= len(s.plans) {
		http.Error(w, "no such plan", http.StatusTeapot)
		return
	}
	n := int(s.counts[id].Add(1))
	p := s.plans[id]
	if n > len(p.attempts) {
		s.extra.Add(1)
		n = len(p.attempts)
	}
	a := p.attempts[n-1]
	s.served[a.kind].Add(1)
	serveAttempt(w, r, p.stream, a, fmt.Sprintf("req_soak_%d_%d", id, n))
}

// serveAttempt writes attempt a's scripted answer.
func serveAttempt(w http.ResponseWriter, r *http.Request, stream bool, a attemptPlan, requestID string) {
	ctx := r.Context()
	if a.delay > 0 {
		t := time.NewTimer(a.delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
	h := w.Header()
	h.Set("Request-Id", requestID)
	for k, vs := range a.header {
		h[k] = vs
	}
	switch {
	case a.kind == fDropBeforeHeaders:
		panic(http.ErrAbortHandler)
	case a.status >= 400:
		writeJSON(w, a.status, errorBody(cmpOr(a.errType, dampertest.DefaultErrorType(a.status)), a.errCode, requestID))
	case !stream:
		body, _ := json.Marshal(map[string]any{
			"id": a.msgID, "type": "message", "role": "assistant", "model": dampertest.DefaultModel,
			"content": []map[string]string{{"type": "text", "text": a.text}}, "stop_reason": "end_turn",
			"usage": map[string]int{"input_tokens": 10, "output_tokens": 5},
		})
		switch a.kind {
		case fDropMidBody, fStall:
			h.Set("Content-Type", "application/json")
			h.Set("Content-Length", strconv.Itoa(len(body)))
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write(body[:len(body)/2])
			_ = http.NewResponseController(w).Flush()
			if a.kind == fStall {
				<-ctx.Done()
				return
			}
			panic(http.ErrAbortHandler)
		}
		writeJSON(w, http.StatusOK, body)
	default:
		serveStream(w, r, a, requestID)
	}
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func errorBody(errType, code, requestID string) []byte {
	e := map[string]any{"type": errType, "message": "soak: scripted " + errType}
	if code != "" {
		e["details"] = map[string]string{"error_code": code}
	}
	body, _ := json.Marshal(map[string]any{"type": "error", "error": e, "request_id": requestID})
	return body
}

func serveStream(w http.ResponseWriter, r *http.Request, a attemptPlan, requestID string) {
	all, _ := a.events()
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	if a.kind == fDropMidBody {
		var b bytes.Buffer
		for _, e := range all {
			b.WriteString(e.String())
		}
		_, _ = w.Write(b.Bytes()[:b.Len()/2])
		_ = rc.Flush()
		panic(http.ErrAbortHandler)
	}
	at := len(all) + 1
	if a.st.Fault != dampertest.FaultNone {
		at = min(a.st.At, len(all))
	}
	padAt := 1 + a.st.Pings
	for i := 0; i < len(all) && i < at; i++ {
		if i == padAt && a.st.PreContentBytes > 0 {
			if _, err := io.WriteString(w, ":"+strings.Repeat("x", a.st.PreContentBytes)+"\n\n"); err != nil {
				return
			}
		}
		if _, err := io.WriteString(w, all[i].String()); err != nil {
			return
		}
		_ = rc.Flush()
	}
	switch {
	case at > len(all):
	case a.st.Fault == dampertest.FaultErrorEvent:
		ev := dampertest.Event{Name: "error", Data: errorBody(a.st.ErrorType, "", requestID)}
		_, _ = io.WriteString(w, ev.String())
	case a.st.Fault == dampertest.FaultReset:
		panic(http.ErrAbortHandler)
	case a.st.Fault == dampertest.FaultStall:
		<-r.Context().Done()
	}
}

// soakResult is what one logical request left behind, for the end checks.
type soakResult struct {
	start   time.Time
	report  damper.Report
	err     error
	elapsed time.Duration
}

// soakStats are the figures of a run, logged and recorded in
// docs/RELIABILITY.md.
type soakStats struct {
	requests, streams, cancels int
	sdkLimits                  int // calls given option.WithRequestTimeout
	attempts, served           int64
	lost                       int // attempts cut by the caller before the server saw them
	outcomes                   map[damper.Outcome]int
	faults                     [nFaultKinds]int64
	retries                    int
	windows, bindingWindows    int
	stopped                    int    // calls the caller's deadline or cancellation ended, at that instant
	ends                       [3]int // by callEnd: agreed, streams dropped by the SDK, plain calls failed by the SDK after their end
}

// count adds one call's plan and result to the totals both soaks keep.
func (st *soakStats) count(p reqPlan, r soakResult) {
	st.attempts += int64(r.report.Attempts)
	st.outcomes[r.report.Outcome]++
	if p.stream {
		st.streams++
	}
	if p.cancelAt > 0 {
		st.cancels++
	}
	if p.sdkLimit > 0 {
		st.sdkLimits++
	}
}

func (st *soakStats) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d logical requests (%d streams, %d cancelled by the caller, %d with an SDK request timeout), %d attempts sent, %d received, %d cut before the server\n",
		st.requests, st.streams, st.cancels, st.sdkLimits, st.attempts, st.served, st.lost)
	fmt.Fprintf(&b, "retries authorized %d; budget windows %d, %d of them filled to the rule's limit; %d calls ended by their deadline or cancellation\n",
		st.retries, st.windows, st.bindingWindows, st.stopped)
	fmt.Fprintf(&b, "reports that are the caller's result %d; streams the SDK dropped as its context ended %d; plain calls the SDK failed as their context ended after Damper's success %d\n",
		st.ends[endAgreed], st.ends[endDropped], st.ends[endSDKGap])
	outcomes := make([]string, 0, len(st.outcomes))
	for o, n := range st.outcomes {
		outcomes = append(outcomes, fmt.Sprintf("%s %d", o, n))
	}
	sort.Strings(outcomes)
	fmt.Fprintf(&b, "outcomes: %s\nattempts served by fault:", strings.Join(outcomes, ", "))
	for k, n := range st.faults {
		fmt.Fprintf(&b, " %s %d;", faultNames[k], n)
	}
	return b.String()
}

// checker collects invariant violations; the first few fail the test.
type checker struct {
	mu   sync.Mutex
	errs []string
}

func (c *checker) failf(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.errs = append(c.errs, fmt.Sprintf(format, args...))
}

func (c *checker) report(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.errs) == 0 {
		return
	}
	shown := c.errs[:min(len(c.errs), 20)]
	t.Fatalf("%d invariant violations; the first:\n%s", len(c.errs), strings.Join(shown, "\n"))
}

// callEnd is how a call's report stands to what its caller got.
type callEnd int

const (
	endAgreed  callEnd = iota // the report's outcome is what the caller got
	endDropped                // a stream the SDK dropped: no outcome in the report
	endSDKGap                 // a plain call the SDK failed after Damper ended it as a success
)

// checkCall checks the invariants of one finished call: what the caller got
// is exactly one attempt's answer, the last one's; the report agrees with
// the error and the server; the call ended by its deadline, give or take
// slack. It returns how the report stands to the caller's result.
//
// The report says what the caller got, but in two cases, both when the
// caller's context ends at the very instant Damper answers, and both only
// over a socket (on the bubble's clock a context cannot end between two
// steps that do not block):
//   - the SDK looks at the context as Damper hands it a stream, and drops
//     the stream: nobody reads it, so its report keeps the state it had
//     then, with no outcome (its span and metrics say canceled);
//   - the SDK looks at the context just after it closed a plain answer's
//     body, which ended the call as a success, and returns the context's
//     error instead.
//
// In both, the error is the context's, and the caller's limit or the SDK's
// request timeout has passed.
//
// In memory, only the caller's cancellation can stop an attempt before the
// server has it, and then it is the last one. Over a socket (lossy), a
// per-attempt timeout can too, so the server's count may trail the report
// by the attempts that timed out or were cancelled, and the answer shown is
// that of the last attempt the server received.
func checkCall(ck *checker, p reqPlan, maxAttempts int, res soakResult, received int, evs []anthropic.MessageStreamEventUnion, msg *anthropic.Message, lossy bool, slack time.Duration) callEnd {
	rep, err := res.report, res.err
	where := fmt.Sprintf("request %d (stream %v, damper %d)", p.id, p.stream, p.damper)
	// A report without an outcome, a stream's the SDK dropped, was written
	// as the stream was handed over: its attempt had not ended.
	open := 0
	if rep.Outcome == "" {
		open = 1
	}
	if rep.Attempts < 1 || rep.Attempts > maxAttempts || len(rep.AttemptLog) != rep.Attempts-open {
		ck.failf("%s: report has %d attempts (%d logged), want 1..%d (error %v)", where, rep.Attempts, len(rep.AttemptLog), maxAttempts, err)
		return endAgreed
	}
	lost := rep.Attempts - received
	// Attempts that may have ended before the server had them: timeouts,
	// and the last attempt of a call the caller ended, whatever its kind.
	cut := 0
	for k, a := range rep.AttemptLog {
		if a.Kind == "timeout" || a.Kind == "canceled" || (k == len(rep.AttemptLog)-1 && rep.Outcome == damper.OutcomeCanceled) {
			cut++
		}
	}
	switch {
	case lost < 0, lost > 0 && !lossy && !(lost == 1 && rep.Outcome == damper.OutcomeCanceled), lost > cut:
		ck.failf("%s: report counts %d attempts, server received %d (outcome %s)", where, rep.Attempts, received, rep.Outcome)
		return endAgreed
	}
	shown := rep.Attempts
	if lossy {
		shown = max(received, 1)
	}
	end := endAgreed
	contextEnded := (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) && res.elapsed >= p.firstEnd()
	switch {
	case (err == nil) == (rep.Outcome == damper.OutcomeSuccess) && rep.Outcome != "":
	case lossy && contextEnded && p.stream && rep.Outcome == "":
		end = endDropped
	case lossy && contextEnded && !p.stream && rep.Outcome == damper.OutcomeSuccess:
		end = endSDKGap
	default:
		ck.failf("%s: error %v with outcome %q after %v (first context end %v)", where, err, rep.Outcome, res.elapsed, p.firstEnd())
	}
	if limit := p.limit(); res.elapsed > limit+slack {
		ck.failf("%s: returned after %v, past its deadline %v", where, res.elapsed, limit)
	}
	last := p.attempts[shown-1]
	if !p.stream {
		if err == nil && (msg == nil || msg.ID != last.msgID || len(msg.Content) != 1 || msg.Content[0].Text != last.text) {
			got := "no message"
			if msg != nil {
				got = msg.RawJSON()
			}
			ck.failf("%s: caller got %s, want attempt %d's message %s", where, got, shown, last.text)
		}
		return end
	}
	_, want := last.events()
	if len(evs) > len(want) {
		ck.failf("%s: caller saw %d events, attempt %d has %d:\n%s", where, len(evs), shown, len(want), rawEvents(evs))
		return end
	}
	for i, ev := range evs {
		if ev.RawJSON() != want[i] {
			ck.failf("%s: event %d = %s, want attempt %d's %s", where, i, ev.RawJSON(), shown, want[i])
			return end
		}
	}
	if err == nil && len(evs) != len(want) {
		ck.failf("%s: stream ended without error after %d of %d events", where, len(evs), len(want))
	}
	return end
}

// checkBudget checks the budget rule of one Damper in every window, from
// the reports alone: each call's start and its attempts' durations and
// backoffs date every first-attempt success and every authorized retry
// exactly, on the bubble's clock.
func checkBudget(ck *checker, st *soakStats, name string, pol damper.Policy, results []soakResult) {
	window := cmpOr(pol.RetryBudgetWindow, damper.DefaultRetryBudgetWindow)
	minTokens := float64(cmpOr(pol.RetryBudgetMinTokens, damper.DefaultRetryBudgetMinTokens))
	ratio := cmpOr(pol.RetryBudgetRatio, damper.DefaultRetryBudgetRatio)
	type counts struct{ successes, retries int }
	windows := map[int64]*counts{}
	at := func(t time.Time) *counts {
		id := t.UnixNano() / int64(window)
		if windows[id] == nil {
			windows[id] = &counts{}
		}
		return windows[id]
	}
	for _, r := range results {
		log := r.report.AttemptLog
		if r.report.Outcome == "" && r.report.Attempts == 1 {
			// A stream the SDK dropped, answered on its first attempt,
			// which had not ended when the report was written.
			at(r.start.Add(r.report.FirstContent)).successes++
		}
		if len(log) == 0 {
			continue
		}
		// A first attempt succeeded when it is logged without a class, or
		// as ambiguous: a stream that failed after its content was released.
		// The budget hears of it when the answer is handed over: a plain
		// attempt's end, a stream's first content (its attempt goes on
		// while the caller reads it).
		if log[0].Class == 0 || log[0].Class == damper.Ambiguous {
			answered := log[0].Duration
			if r.report.Stream {
				answered = r.report.FirstContent
			}
			at(r.start.Add(answered)).successes++
		}
		t := r.start
		for k, a := range log {
			t = t.Add(a.Duration)
			if k < len(log)-1 || a.Backoff > 0 {
				at(t).retries++
				st.retries++
			}
			t = t.Add(a.Backoff)
		}
	}
	for id, c := range windows {
		limit := minTokens + ratio*float64(c.successes)
		if float64(c.retries) > limit+1e-9 {
			ck.failf("damper %s: window %d authorized %d retries, the rule allows %.1f (%d first-attempt successes)", name, id, c.retries, limit, c.successes)
		}
		st.windows++
		if c.retries == int(limit+1e-9) {
			st.bindingWindows++
		}
	}
}

// TestSoakInMemory is the chaos soak on dampertest.Transport in a synctest
// bubble: see the comment at the top of this file.
func TestSoakInMemory(t *testing.T) {
	requests, workers := 3000, 16
	if testing.Short() {
		requests = 600
	}
	if soakIsLong() {
		requests = 100_000
	}
	seed := soakSeedFor(t)
	rng := rand.New(rand.NewPCG(seed, 0x50a4))
	profiles := soakProfiles()
	plans := make([]reqPlan, requests)
	for i := range plans {
		plans[i] = drawPlan(rng, i, 500, profiles)
	}
	tel := newSoakTelemetry(t)
	before := heapAfterGC()

	var st soakStats
	ck := &checker{}
	synctest.Test(t, func(t *testing.T) {
		srv := newChaosServer(plans)
		clients := soakClients(t, profiles, tel, rand.NewPCG(seed, 0x7a11),
			option.WithBaseURL("http://api.invalid"), option.WithHTTPClient(&http.Client{Transport: dampertest.Transport(srv)}))
		results := make([]soakResult, len(plans))
		ends := make([]callEnd, len(plans))
		next := make(chan int)
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for i := range next {
					p := plans[i]
					pr := profiles[p.damper]
					res, evs, msg := soakCall(clients[p.damper][i%2], p, pr.model)
					results[i] = res
					ends[i] = checkCall(ck, p, cmpOr(pr.policy.MaxAttempts, damper.DefaultMaxAttempts), res, int(srv.counts[i].Load()), evs, msg, false, 0)
					tel.check(ck, fmt.Sprintf("request %d", i), res)
				}
			})
		}
		for i := range plans {
			next <- i
			if i%2000 == 1999 {
				tel.flush(ck) // keeps memory flat over the long form
			}
		}
		close(next)
		wg.Wait()
		synctest.Wait() // calls ended on a goroutine of their own, by their context
		tel.flush(ck)
		tel.checkOutcomes(ck, results)

		st.requests, st.outcomes = len(plans), map[damper.Outcome]int{}
		for i, r := range results {
			p := plans[i]
			st.count(p, r)
			st.ends[ends[i]]++
			if r.elapsed == p.limit() {
				st.stopped++
			}
			st.lost += r.report.Attempts - int(srv.counts[i].Load())
		}
		st.served = srv.total()
		for k := range st.faults {
			st.faults[k] = srv.served[k].Load()
		}
		if n := srv.extra.Load(); n > 0 {
			ck.failf("the server received %d attempts beyond MaxAttempts", n)
		}
		if st.attempts != st.served+int64(st.lost) {
			ck.failf("reports add up to %d attempts; the server received %d and %d were cut before it", st.attempts, st.served, st.lost)
		}
		for i, pr := range profiles {
			var mine []soakResult
			for k, r := range results {
				if plans[k].damper == i {
					mine = append(mine, r)
				}
			}
			checkBudget(ck, &st, pr.name, pr.policy, mine)
		}
	})
	ck.report(t)
	after := heapAfterGC()
	runtime.KeepAlive(plans) // measured in both, so not part of the difference
	t.Logf("seed %d: %s\nheap %d KiB before, %d KiB after", seed, &st, before>>10, after>>10)
	if !testing.Short() {
		checkSoakCoverage(t, &st) // 600 requests may miss a rare outcome
	}
	if grown := int64(after) - int64(before); grown > 64<<20 {
		t.Errorf("the heap grew by %d MiB over the soak, want at most 64", grown>>20)
	}
}

// checkSoakCoverage fails a run whose draw missed a fault or an outcome
// the invariants are about, so that a soak cannot pass by testing less.
func checkSoakCoverage(t *testing.T, st *soakStats) {
	t.Helper()
	for k, n := range st.faults {
		if n == 0 {
			t.Errorf("no attempt was served with fault %q", faultNames[k])
		}
	}
	for _, o := range []damper.Outcome{damper.OutcomeSuccess, damper.OutcomeError, damper.OutcomeAttemptsExhausted,
		damper.OutcomeBudgetExhausted, damper.OutcomeCostCeiling, damper.OutcomeRetryAfterTooLong,
		damper.OutcomeDeadline, damper.OutcomeCanceled, damper.OutcomeAmbiguous} {
		if st.outcomes[o] == 0 {
			t.Errorf("no call ended %q", o)
		}
	}
	if st.bindingWindows == 0 {
		t.Error("no budget window was filled to its limit: the budget check tested nothing")
	}
}

// soakCall makes p's call and returns what the caller got.
func soakCall(client anthropic.Client, p reqPlan, model string) (soakResult, []anthropic.MessageStreamEventUnion, *anthropic.Message) {
	ctx, cancel := context.WithTimeout(context.Background(), p.deadline)
	defer cancel()
	if p.cancelAt > 0 {
		stop := time.AfterFunc(p.cancelAt, cancel)
		defer stop.Stop()
	}
	params := anthropic.MessageNewParams{
		Model:     anthropic.Model(model),
		MaxTokens: 256,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Explain retry storms"))},
	}
	res := soakResult{start: time.Now()}
	opts := []option.RequestOption{dampertest.Scenario(strconv.Itoa(p.id)), damper.ReportInto(&res.report)}
	if p.sdkLimit > 0 {
		opts = append(opts, option.WithRequestTimeout(p.sdkLimit))
	}
	var evs []anthropic.MessageStreamEventUnion
	var msg *anthropic.Message
	if p.stream {
		evs, res.err = drain(client.Messages.NewStreaming(ctx, params, opts...))
	} else {
		msg, res.err = client.Messages.New(ctx, params, opts...)
	}
	res.elapsed = time.Since(res.start)
	return res, evs, msg
}

// soakClients builds, for each profile, a Damper with the soak's telemetry
// and jitter drawn from src, and two clients through it: one with an API
// key and one with an auth token (the SDK takes one credential per client).
func soakClients(t *testing.T, profiles []soakProfile, tel *soakTelemetry, src rand.Source, opts ...option.RequestOption) [][2]anthropic.Client {
	t.Helper()
	var mu sync.Mutex
	jitter := rand.New(src)
	random := func() float64 {
		mu.Lock()
		defer mu.Unlock()
		return jitter.Float64()
	}
	clients := make([][2]anthropic.Client, len(profiles))
	for i, pr := range profiles {
		d, err := damper.New(pr.policy, append(tel.settings(), damper.WithRand(random))...)
		if err != nil {
			t.Fatal(err)
		}
		for k, cred := range []option.RequestOption{option.WithAPIKey(soakAPIKey), option.WithAuthToken(soakAuthToken)} {
			clients[i][k] = anthropic.NewClient(append([]option.RequestOption{d.Option(), cred}, opts...)...)
		}
	}
	return clients
}
