package damper_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"

	"github.com/damper-ai/damper-go"
)

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

// served is what the server got of one call: n attempts, of which the
// latest, by the call's own numbering, was attempt last.
type served struct{ n, last int }

// callEnd is how a call's report stands to what its caller got.
type callEnd int

const (
	endAgreed  callEnd = iota // the report's outcome is what the caller got
	endDropped                // a stream the SDK dropped: no outcome in the report
	endSDKGap                 // a plain call the SDK failed after Damper ended it as a success
)

// checkCall checks the invariants of one finished call: what the caller got
// is exactly one attempt's answer, the last one's; the report agrees with
// the error and the server. It returns how the report stands to the
// caller's result.
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
// that of the latest attempt the server received (got.last): not always
// the last to arrive, as an attempt given up on a busy machine may reach
// the server after the one that replaced it.
func checkCall(ck *checker, p reqPlan, maxAttempts int, res soakResult, got served, evs []anthropic.MessageStreamEventUnion, msg *anthropic.Message, lossy bool) callEnd {
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
	received := got.n
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
		shown = max(got.last, 1)
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
	want := last.events(p.model)
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

// checkDeadlines checks that every call returned by its caller's limit,
// give or take what allowed(i) grants call i.
func checkDeadlines(ck *checker, plans []reqPlan, results []soakResult, allowed func(i int) time.Duration) {
	for i, r := range results {
		if over := r.elapsed - plans[i].limit(); over > allowed(i) {
			ck.failf("request %d (stream %v, damper %d): returned after %v, %v past its limit %v, more than the %v allowed",
				i, plans[i].stream, plans[i].damper, r.elapsed, over, plans[i].limit(), allowed(i))
		}
	}
}

// checkBudget checks the budget rule of one Damper in every window, from
// the reports alone: each call's start and its attempts' durations and
// backoffs date every first-attempt success and every authorized retry
// exactly, on the bubble's clock.
func checkBudget(ck *checker, st *soakStats, name string, pol damper.Policy, results []soakResult) {
	window := cmpOr(pol.RetryBudgetWindow, defaults.RetryBudgetWindow)
	minTokens := float64(cmpOr(pol.RetryBudgetMinTokens, defaults.RetryBudgetMinTokens))
	ratio := cmpOr(pol.RetryBudgetRatio, defaults.RetryBudgetRatio)
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
