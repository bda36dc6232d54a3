package engine

import (
	"context"
	"errors"
	"math"
	"net/http"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/core"

	"github.com/damper-ai/damper-go/dampertest"
)

// FuzzPlan: whatever the provider's headers, the retry number and the
// random draw, a wait the retry gates admit is never negative, never longer
// than the longest wait the policy allows, and never runs past the
// deadline.
func FuzzPlan(f *testing.F) {
	f.Add("2", "", 1, 0.5, int64(10*time.Second))
	f.Add("", "300", 2, 0.99, int64(time.Second))
	f.Add("1e308", "", 60, 0.0, int64(time.Hour))
	f.Add("NaN", "-5", 1000, -3.0, int64(0))
	f.Add("Sun, 30 Nov 2026 12:00:30 GMT", "", 3, 1.5, int64(90*time.Second))
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	p, err := Policy{}.withDefaults()
	if err != nil {
		f.Fatal(err)
	}
	p.MaxAttempts = math.MaxInt // every retry number reaches the other gates
	longest := max(p.MaxRetryAfter, p.BackoffMax)
	budget, err := fleet.NewWindowBudget(0, time.Hour, math.MaxInt32)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, retryAfter, retryAfterMs string, n int, rnd float64, untilDeadline int64) {
		ctx := context.Background()
		if untilDeadline > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, now.Add(time.Duration(untilDeadline)))
			defer cancel()
		}
		h := http.Header{}
		h.Set("retry-after", retryAfter)
		h.Set("retry-after-ms", retryAfterMs)
		c := &call{d: &Damper{policy: p, backoff: backoffOf(&p)}, ctx: ctx}
		c.first.b = &backend{name: PrimaryBackend, budget: budget}
		c.route = &c.first
		wait, refused := admitRetry(c, n, &Failure{StatusCode: 429, Header: h}, now, 0, func() float64 { return rnd })
		if refused != nil {
			if wait != 0 || !isDenial(refused.Gate.Outcome) {
				t.Fatalf("refused (%v) with wait %v", refused.Gate.Outcome, wait)
			}
			return
		}
		if wait < 0 || wait > longest {
			t.Fatalf("wait %v outside [0, %v]", wait, longest)
		}
		if d, ok := ctx.Deadline(); ok && now.Add(wait).After(d) {
			t.Fatalf("wait %v runs past the deadline %v", wait, d.Sub(now))
		}
	})
}

// testGate is an attempt gate that refuses attempt refuseAt, asks for wait
// before every later attempt, and may end the call's context as it does.
type testGate struct {
	refuseAt int
	wait     time.Duration
	cancel   context.CancelFunc // called before a wait, when set
	seen     []int
	settled  []attemptEvent // what the passes it gave heard, in order
}

var errTestRefused = errors.New("test gate: refused")

func (g *testGate) AdmitAttempt(c core.Call, a core.Attempt, now time.Time) admission {
	n := a.N
	g.seen = append(g.seen, n)
	if n == g.refuseAt {
		return admission{Refused: &denial{Gate: &gate{Outcome: "test_refused", Reason: errTestRefused}}}
	}
	if n > 1 && g.cancel != nil {
		g.cancel()
	}
	adm := admission{Pass: testPass{g}}
	if n > 1 && g.wait > 0 {
		adm.Refused, adm.Canceled = c.Wait(g, now.Add(g.wait))
	}
	return adm
}

func (g *testGate) RefusesAt(_ core.Call, _, _ time.Time) *denial { return nil }

// testPass records what it is settled with in its gate.
type testPass struct{ g *testGate }

func (p testPass) Settle(_ time.Time, e attemptEvent) { p.g.settled = append(p.g.settled, e) }

// testObserver records every attempt's end.
type testObserver struct{ events []attemptEvent }

func (o *testObserver) ObserveAttempt(_ context.Context, _ time.Time, e attemptEvent) {
	o.events = append(o.events, e)
}

// hookRig is a Damper with g as its one attempt gate and o among its
// observers, before a fake API that fails once with 529 and then answers.
func hookRig(t *testing.T, g *testGate, o *testObserver) (*dampertest.Clock, *dampertest.Server, anthropic.Client) {
	t.Helper()
	clk := dampertest.NewClock(time.Now().Truncate(time.Minute).Add(time.Minute))
	srv := dampertest.NewServer(dampertest.WithClock(clk))
	t.Cleanup(srv.Close)
	srv.Script("", dampertest.Status(529), dampertest.OK())
	d, err := New(Policy{}, WithClock(clk), WithRand(func() float64 { return 0.5 }))
	if err != nil {
		t.Fatal(err)
	}
	d.primary.attemptGates = []attemptGate{g}
	d.primary.observers = append(d.primary.observers, o)
	return clk, srv, anthropic.NewClient(append([]option.RequestOption{d.Option()}, srv.Options()...)...)
}

func hookParams() anthropic.MessageNewParams {
	return anthropic.MessageNewParams{
		Model: "claude-sonnet-4-6", MaxTokens: 64,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))},
	}
}

// A gate that refuses the first attempt: nothing is sent, the call ends
// with the gate's outcome and sentinel, and its report rides on the error.
func TestAttemptGateRefusesFirstAttempt(t *testing.T) {
	g, o := &testGate{refuseAt: 1}, &testObserver{}
	_, srv, client := hookRig(t, g, o)
	_, err := client.Messages.New(context.Background(), hookParams())
	var derr *Error
	if !errors.Is(err, errTestRefused) || !errors.As(err, &derr) || derr.Report == nil {
		t.Fatalf("err = %v, want the gate's refusal with its report", err)
	}
	if n, rep := srv.Count(""), derr.Report; n != 0 || rep.Attempts != 0 || rep.Outcome != "test_refused" || len(o.events) != 0 {
		t.Fatalf("server %d requests, report %+v, %d observed; want nothing sent", n, rep, len(o.events))
	}
}

// A gate's wait comes before the attempt it admits, on the Damper's clock,
// after the retry's backoff; observers hear both attempts' ends.
func TestAttemptGateWaitsAndObserversHear(t *testing.T) {
	g, o := &testGate{wait: 3 * time.Second}, &testObserver{}
	clk, srv, client := hookRig(t, g, o)
	var rep Report
	if _, err := client.Messages.New(context.Background(), hookParams(), ReportInto(&rep)); err != nil {
		t.Fatal(err)
	}
	if got, want := clk.Sleeps(), []time.Duration{500 * time.Millisecond, 3 * time.Second}; !slices.Equal(got, want) {
		t.Errorf("waits %v, want the backoff then the gate's %v", got, want)
	}
	if !slices.Equal(g.seen, []int{1, 2}) || srv.Count("") != 2 || rep.Attempts != 2 {
		t.Errorf("gate saw %v, server %d, report %d attempts; want both attempts admitted and sent", g.seen, srv.Count(""), rep.Attempts)
	}
	if len(o.events) != 2 ||
		o.events[0].Outcome != (fleet.AttemptOutcome{First: true, Signal: ProviderHealth}) || o.events[0].Failure == nil || o.events[0].Failure.StatusCode != 529 ||
		o.events[1].Outcome != (fleet.AttemptOutcome{Success: true}) || o.events[1].Failure != nil || o.events[1].Header.Get("request-id") == "" {
		t.Errorf("observed %+v, want the 529 then the answer, with their headers", o.events)
	}
	if len(g.settled) != 2 || g.settled[0].Class != Retryable || g.settled[0].Failure == nil || !g.settled[1].Outcome.Success {
		t.Errorf("passes settled with %+v, want the 529 then the answer", g.settled)
	}
}

// The caller's context ending during a gate's wait ends the call as
// canceled, without another attempt.
func TestAttemptGateWaitEndsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g, o := &testGate{wait: time.Minute, cancel: cancel}, &testObserver{}
	_, srv, client := hookRig(t, g, o)
	var rep Report
	_, err := client.Messages.New(ctx, hookParams(), ReportInto(&rep))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if srv.Count("") != 1 || rep.Attempts != 1 || rep.Outcome != OutcomeCanceled {
		t.Fatalf("server %d, report %+v; want one attempt, canceled", srv.Count(""), rep)
	}
	// The second attempt's pass, never sent, is given back with nothing.
	if len(g.settled) != 2 || g.settled[0].Failure == nil || !reflect.DeepEqual(g.settled[1], attemptEvent{}) {
		t.Errorf("passes settled with %+v, want the 529, then a zero event", g.settled)
	}
}
