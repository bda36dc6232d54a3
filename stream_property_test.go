package damper_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// faults are the ways a planned attempt can go wrong.
var faults = []dampertest.Fault{dampertest.FaultErrorEvent, dampertest.FaultReset, dampertest.FaultTruncate, dampertest.FaultStall}

// randomPlans draws three attempts, each clean or failing at a random event.
func randomPlans(rng *rand.Rand, run int) []dampertest.Stream {
	plans := make([]dampertest.Stream, 3)
	for k := range plans {
		st := dampertest.Stream{
			Text:      fmt.Sprintf("run %d attempt %d: %s", run, k+1, strings.Repeat("é-", rng.IntN(40))),
			ChunkSize: 1 + rng.IntN(12),
			Pings:     rng.IntN(3),
		}
		if rng.IntN(4) > 0 {
			st.Fault = faults[rng.IntN(len(faults))]
			st.At = rng.IntN(len(st.Events()) + 1)
			if st.Fault == dampertest.FaultErrorEvent {
				st.ErrorType = []string{"overloaded_error", "api_error", "rate_limit_error", "invalid_request_error"}[rng.IntN(4)]
			}
		}
		plans[k] = st
	}
	return plans
}

// expectation is what a caller must get from plans under the default
// policy: the attempt whose events it sees (0 for none), how many attempts
// were made, and how the call ends.
type expectation struct {
	attempts int
	shown    int // 1-based attempt whose events reach the caller, 0 for none
	upTo     int // events of that attempt before the fault
	outcome  damper.Outcome
}

func expect(plans []dampertest.Stream) expectation {
	for k, st := range plans {
		n := len(st.Events())
		at := min(st.At, n)
		if st.Fault == dampertest.FaultNone || at == n {
			return expectation{attempts: k + 1, shown: k + 1, upTo: n, outcome: damper.OutcomeSuccess}
		}
		if at > st.ContentIndex() {
			return expectation{attempts: k + 1, shown: k + 1, upTo: at, outcome: damper.OutcomeAmbiguous}
		}
		if st.Fault == dampertest.FaultErrorEvent && st.ErrorType == "invalid_request_error" {
			return expectation{attempts: k + 1, outcome: damper.OutcomeError}
		}
	}
	return expectation{attempts: len(plans), outcome: damper.OutcomeAttemptsExhausted}
}

// Over thousands of random fault points, the caller sees exactly the
// events of one attempt, in order, never one of another attempt or twice,
// and every call ends.
func TestStreamPropertyRandomFaults(t *testing.T) {
	runs := 3000
	if testing.Short() {
		runs = 300
	}
	rng := rand.New(rand.NewPCG(3, 9))
	counts := map[damper.Outcome]int{}
	for run := range runs {
		plans := randomPlans(rng, run)
		want := expect(plans)
		counts[want.outcome]++
		synctest.Test(t, func(t *testing.T) {
			srv := &planServer{plans: plans}
			d := newDamper(t, damper.Policy{PerAttemptTimeout: 5 * time.Second, StreamIdleTimeout: 10 * time.Second})
			var rep damper.Report
			client := memClient(d, srv)
			evs, err := drain(client.Messages.NewStreaming(context.Background(), streamParams(), damper.ReportInto(&rep)))

			var wantEvents []string
			text := ""
			if want.shown > 0 {
				wantEvents = seen(plans[want.shown-1], want.upTo)
				text = shownText(plans[want.shown-1], want.upTo)
			}
			checkEvents(t, evs, wantEvents, text)
			if srv.count() != want.attempts || rep.Attempts != want.attempts || rep.Outcome != want.outcome {
				t.Fatalf("run %d plans %+v: %d requests, report %+v; want %+v", run, plans, srv.count(), rep, want)
			}
			var apiErr *anthropic.Error
			switch want.outcome {
			case damper.OutcomeSuccess:
				if err != nil {
					t.Fatalf("run %d: error %v", run, err)
				}
			case damper.OutcomeAmbiguous:
				if !errors.Is(err, damper.ErrAmbiguous) {
					t.Fatalf("run %d: error %v, want ErrAmbiguous", run, err)
				}
				if plans[want.shown-1].Fault == dampertest.FaultErrorEvent && !errors.As(err, &apiErr) {
					t.Fatalf("run %d: error %v does not reach the event's *anthropic.Error", run, err)
				}
			default:
				if err == nil || errors.Is(err, damper.ErrAmbiguous) {
					t.Fatalf("run %d: error %v, want the last attempt's", run, err)
				}
			}
		})
	}
	for _, o := range []damper.Outcome{damper.OutcomeSuccess, damper.OutcomeAmbiguous, damper.OutcomeError, damper.OutcomeAttemptsExhausted} {
		if counts[o] == 0 {
			t.Errorf("no run ended %q: the draw does not cover every outcome", o)
		}
	}
}

// shownText is the text a caller holds once the events of st before at have
// arrived, cut from st.Text by the script's own chunking (a delta of
// ChunkSize runes per event from ContentIndex on) rather than taken from
// its events, so that events of the wrong attempt, or text dropped or
// repeated on the way, show in the text as well. st sets Text and
// ChunkSize, as randomPlans does.
func shownText(st dampertest.Stream, at int) string {
	deltas := max(at-st.ContentIndex(), 0)
	r := []rune(st.Text)
	return string(r[:min(deltas*st.ChunkSize, len(r))])
}
