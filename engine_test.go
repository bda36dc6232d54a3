package damper_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// TestFailureCatalog runs every situation of the SDK retry article through
// the real SDK against the fake API, with the default policy on a virtual
// clock, and checks attempts, waits, outcome and error for each.
func TestFailureCatalog(t *testing.T) {
	const ms = time.Millisecond
	tests := []struct {
		name     string
		policy   damper.Policy
		steps    []dampertest.Step
		attempts int
		waits    []time.Duration
		outcome  damper.Outcome
		status   int   // the *anthropic.Error status reachable with errors.As, 0 for none
		is       error // a sentinel errors.Is must match, nil for none
		ok       bool
	}{
		{
			name:     "429 always",
			steps:    []dampertest.Step{dampertest.Status(429)},
			attempts: 3, waits: []time.Duration{500 * ms, 1000 * ms},
			outcome: damper.OutcomeAttemptsExhausted, status: 429,
		},
		{
			name:     "429 retry-after 2",
			steps:    []dampertest.Step{dampertest.Status(429).RetryAfter("2"), dampertest.OK()},
			attempts: 2, waits: []time.Duration{2100 * ms}, // 2 s plus half of a tenth
			outcome: damper.OutcomeSuccess, ok: true,
		},
		{
			name:     "429 retry-after-ms 300",
			steps:    []dampertest.Step{dampertest.Status(429).RetryAfterMs("300"), dampertest.OK()},
			attempts: 2, waits: []time.Duration{315 * ms},
			outcome: damper.OutcomeSuccess, ok: true,
		},
		{
			name:     "429 retry-after 120",
			steps:    []dampertest.Step{dampertest.Status(429).RetryAfter("120"), dampertest.OK()},
			attempts: 1, waits: nil,
			outcome: damper.OutcomeRetryAfterTooLong, status: 429, is: damper.ErrRetryAfterTooLong,
		},
		{
			name:     "529 twice",
			steps:    []dampertest.Step{dampertest.Status(529), dampertest.Status(529), dampertest.OK()},
			attempts: 3, waits: []time.Duration{500 * ms, 1000 * ms},
			outcome: damper.OutcomeSuccess, ok: true,
		},
		{
			name:     "400 invalid request",
			steps:    []dampertest.Step{dampertest.Status(400)},
			attempts: 1, outcome: damper.OutcomeError, status: 400,
		},
		{
			name:     "500 with x-should-retry false",
			steps:    []dampertest.Step{dampertest.Status(500).ShouldRetry(false)},
			attempts: 1, outcome: damper.OutcomeError, status: 500,
		},
		{
			name:     "400 with x-should-retry true",
			steps:    []dampertest.Step{dampertest.Status(400).ShouldRetry(true), dampertest.OK()},
			attempts: 2, waits: []time.Duration{500 * ms},
			outcome: damper.OutcomeSuccess, ok: true,
		},
		{
			name:     "spend limit 429",
			steps:    []dampertest.Step{dampertest.SpendLimit()},
			attempts: 1, outcome: damper.OutcomeError, status: 429,
		},
		{
			name:     "dropped connection",
			steps:    []dampertest.Step{dampertest.OK().WithDrop(dampertest.DropBeforeHeaders)},
			attempts: 3, waits: []time.Duration{500 * ms, 1000 * ms},
			outcome: damper.OutcomeAttemptsExhausted,
		},
		{
			name:     "body dropped mid-way, then success",
			steps:    []dampertest.Step{dampertest.OK().WithDrop(dampertest.DropMidBody), dampertest.OK()},
			attempts: 2, waits: []time.Duration{500 * ms},
			outcome: damper.OutcomeSuccess, ok: true,
		},
		{
			name:     "3 s response past a 1 s attempt timeout",
			policy:   damper.Policy{PerAttemptTimeout: time.Second},
			steps:    []dampertest.Step{dampertest.OK().WithDelay(3 * time.Second)},
			attempts: 3, waits: []time.Duration{500 * ms, 1000 * ms},
			outcome: damper.OutcomeAttemptsExhausted, is: context.DeadlineExceeded,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, tt.policy)
			r.srv.Script("", tt.steps...)
			var rep damper.Report
			msg, err := r.client.Messages.New(context.Background(), params("claude-sonnet-4-6"), damper.ReportInto(&rep))

			if got := r.srv.Count(""); got != tt.attempts {
				t.Errorf("provider attempts = %d, want %d", got, tt.attempts)
			}
			if rep.Attempts != tt.attempts {
				t.Errorf("report attempts = %d, want %d", rep.Attempts, tt.attempts)
			}
			if got := r.clock.Sleeps(); !slices.Equal(got, tt.waits) {
				t.Errorf("waits = %v, want %v", got, tt.waits)
			}
			if rep.Outcome != tt.outcome {
				t.Errorf("outcome = %q, want %q", rep.Outcome, tt.outcome)
			}
			if tt.ok {
				if err != nil || msg == nil || msg.Content[0].Text != "ok" {
					t.Fatalf("got (%v, %v), want the message", msg, err)
				}
				return
			}
			if err == nil {
				t.Fatal("got no error")
			}
			var apiErr *anthropic.Error
			if got := errors.As(err, &apiErr); got != (tt.status != 0) {
				t.Fatalf("errors.As(*anthropic.Error) = %v for %v", got, err)
			}
			if apiErr != nil && apiErr.StatusCode != tt.status {
				t.Errorf("status = %d, want %d", apiErr.StatusCode, tt.status)
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("error %v is not %v", err, tt.is)
			}
		})
	}
}

func TestRetryAfterTooLongCarriesDelay(t *testing.T) {
	r := newRig(t, damper.Policy{})
	r.srv.Script("", dampertest.Status(429).RetryAfter("120"))
	start := time.Now()
	_, err := r.client.Messages.New(context.Background(), params("claude-sonnet-4-6"))
	if elapsed := time.Since(start); elapsed > time.Second {
		t.Errorf("took %v of real time, want well under a second", elapsed)
	}
	var derr *damper.Error
	if !errors.As(err, &derr) || derr.RetryAfter != 120*time.Second {
		t.Fatalf("err = %v, want a *damper.Error with RetryAfter 2m0s", err)
	}
	if derr.Report == nil || derr.Report.Attempts != 1 {
		t.Errorf("report on the error = %+v, want one attempt", derr.Report)
	}
}

func TestSpendLimitKeepsErrorCode(t *testing.T) {
	r := newRig(t, damper.Policy{})
	r.srv.Script("", dampertest.SpendLimit())
	_, err := r.client.Messages.New(context.Background(), params("claude-sonnet-4-6"))
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.ErrorCode() != "enforced_spend_limit_reached" {
		t.Fatalf("err = %v, want the spend-limit *anthropic.Error", err)
	}
	if apiErr.RequestID == "" {
		t.Error("the request id was lost")
	}
}

// TestSDKRetriesNeverStack: with one attempt allowed, the SDK's own loop
// (two retries by default) must not run either.
func TestSDKRetriesNeverStack(t *testing.T) {
	for _, step := range []dampertest.Step{
		dampertest.Status(529),
		dampertest.Status(429).RetryAfter("1"),
		dampertest.OK().WithDrop(dampertest.DropBeforeHeaders),
	} {
		r := newRig(t, damper.Policy{MaxAttempts: 1})
		r.srv.Script("", step)
		if _, err := r.client.Messages.New(context.Background(), params("claude-sonnet-4-6")); err == nil {
			t.Fatal("want an error")
		}
		if got := r.srv.Count(""); got != 1 {
			t.Errorf("%+v: provider attempts = %d, want 1", step, got)
		}
	}
}

// TestOtherEndpointsPassThrough: calls other than Messages are the SDK's,
// retries included. An endpoint that answers 529 is tried again after the
// SDK's own backoff, up to its default two retries, and Damper neither
// counts nor reports those attempts. The bubble's clock makes the backoff
// take no real time and shows its length.
func TestOtherEndpointsPassThrough(t *testing.T) {
	countTokens := func(client anthropic.Client, rep *damper.Report) error {
		res, err := client.Messages.CountTokens(context.Background(), anthropic.MessageCountTokensParams{
			Model:    "claude-sonnet-4-6",
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))},
		}, damper.ReportInto(rep))
		if err == nil && res.InputTokens != 12 {
			return fmt.Errorf("input_tokens = %d, want the last attempt's 12", res.InputTokens)
		}
		return err
	}
	listModels := func(client anthropic.Client, rep *damper.Report) error {
		page, err := client.Models.List(context.Background(), anthropic.ModelListParams{}, damper.ReportInto(rep))
		if err == nil && (len(page.Data) != 1 || page.Data[0].ID != "claude-sonnet-4-6") {
			return fmt.Errorf("models = %+v, want the last attempt's one model", page.Data)
		}
		return err
	}
	for _, tt := range []struct {
		name, method, path, body string
		do                       func(anthropic.Client, *damper.Report) error
	}{
		{"count_tokens", http.MethodPost, "/v1/messages/count_tokens", `{"input_tokens":12}`, countTokens},
		{"models list", http.MethodGet, "/v1/models", `{"data":[{"type":"model","id":"claude-sonnet-4-6","display_name":"Claude Sonnet 4.6","created_at":"2026-01-01T00:00:00Z"}],"has_more":false,"first_id":"claude-sonnet-4-6","last_id":"claude-sonnet-4-6"}`, listModels},
	} {
		for _, run := range []struct {
			name     string
			failures int // 529s the endpoint sends before its answer
		}{{"fails once", 1}, {"keeps failing", math.MaxInt}} {
			failures := run.failures
			t.Run(tt.name+", "+run.name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					var mu sync.Mutex
					var tries []string // X-Stainless-Retry-Count of each attempt
					h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
						mu.Lock()
						tries = append(tries, r.Header.Get("X-Stainless-Retry-Count"))
						n := len(tries)
						mu.Unlock()
						w.Header().Set("Content-Type", "application/json")
						if r.Method != tt.method || r.URL.Path != tt.path {
							w.WriteHeader(http.StatusNotFound)
							w.Write([]byte(`{"type":"error","error":{"type":"not_found_error","message":"` + r.Method + " " + r.URL.Path + `"}}`))
							return
						}
						if n <= failures {
							w.WriteHeader(529)
							w.Write([]byte(`{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`))
							return
						}
						w.Write([]byte(tt.body))
					})
					client := memClient(newDamper(t, damper.Policy{}), h)
					var rep damper.Report
					start := time.Now()
					err := tt.do(client, &rep)
					elapsed := time.Since(start)

					// The SDK waits 0.5 s before its first retry and 1 s
					// before its second, less up to a quarter of jitter.
					wantTries, lo, hi := []string{"0", "1"}, 375*time.Millisecond, 500*time.Millisecond
					var apiErr *anthropic.Error
					if failures > 2 {
						wantTries, lo, hi = []string{"0", "1", "2"}, 1125*time.Millisecond, 1500*time.Millisecond
						if !errors.As(err, &apiErr) || apiErr.StatusCode != 529 {
							t.Fatalf("err = %v, want the SDK's 529 after its retries", err)
						}
					} else if err != nil {
						t.Fatal(err)
					}
					mu.Lock()
					defer mu.Unlock()
					if !slices.Equal(tries, wantTries) {
						t.Errorf("attempts with retry counts %q, want %q", tries, wantTries)
					}
					if elapsed < lo || elapsed > hi {
						t.Errorf("took %v, want the SDK's backoff of %v to %v", elapsed, lo, hi)
					}
					if rep.Attempts != 0 || rep.Outcome != "" {
						t.Errorf("Damper reported %+v on a call it does not own", rep)
					}
				})
			})
		}
	}
}

func TestBetaMessagesNew(t *testing.T) {
	r := newRig(t, damper.Policy{})
	r.srv.Script("", dampertest.Status(529), dampertest.OK())
	var rep damper.Report
	_, err := r.client.Beta.Messages.New(context.Background(), anthropic.BetaMessageNewParams{
		Model:     "claude-sonnet-4-6",
		MaxTokens: 16,
		Messages:  []anthropic.BetaMessageParam{anthropic.NewBetaUserMessage(anthropic.NewBetaTextBlock("hi"))},
	}, damper.ReportInto(&rep))
	if err != nil || rep.Attempts != 2 || rep.Outcome != damper.OutcomeSuccess {
		t.Fatalf("err = %v, report = %+v; want success on attempt 2", err, rep)
	}
}

func TestPassthroughOnBudgetExhausted(t *testing.T) {
	for _, mode := range []damper.BudgetExhaustedAction{damper.RaiseBudgetExhausted, damper.PassthroughBudgetExhausted} {
		t.Run(mode.String(), func(t *testing.T) {
			// A budget that starts empty: the first retry is refused.
			r := newRig(t, damper.Policy{OnBudgetExhausted: mode}, damper.WithBudget(mustBudget(t, 0.1, time.Minute, 0)))
			r.srv.Script("", dampertest.Status(529))
			var rep damper.Report
			_, err := r.client.Messages.New(context.Background(), params("claude-sonnet-4-6"), damper.ReportInto(&rep))
			if rep.Outcome != damper.OutcomeBudgetExhausted || r.srv.Count("") != 1 {
				t.Fatalf("report = %+v after %d attempts; want budget_exhausted after 1", rep, r.srv.Count(""))
			}
			var apiErr *anthropic.Error
			if !errors.As(err, &apiErr) || apiErr.StatusCode != 529 {
				t.Fatalf("err = %v, want the 529 reachable", err)
			}
			if got := errors.Is(err, damper.ErrRetryBudgetExhausted); got != (mode == damper.RaiseBudgetExhausted) {
				t.Errorf("errors.Is(ErrRetryBudgetExhausted) = %v in %s mode", got, mode)
			}
		})
	}
}

// TestDeadline: no wait is started that cannot end, with a minimal
// attempt, before the caller's deadline; and errors.Is still reaches the
// context's error when the caller's own deadline ends an attempt.
func TestDeadline(t *testing.T) {
	t.Run("refused before waiting", func(t *testing.T) {
		r := newRig(t, damper.Policy{})
		r.srv.Script("", dampertest.Status(429).RetryAfter("5"), dampertest.OK())
		ctx, cancel := context.WithDeadline(context.Background(), r.clock.Now().Add(3*time.Second))
		defer cancel()
		var rep damper.Report
		_, err := r.client.Messages.New(ctx, params("claude-sonnet-4-6"), damper.ReportInto(&rep))
		if !errors.Is(err, damper.ErrDeadline) || rep.Outcome != damper.OutcomeDeadline {
			t.Fatalf("err = %v, outcome %q; want ErrDeadline", err, rep.Outcome)
		}
		if len(r.clock.Sleeps()) != 0 || r.srv.Count("") != 1 {
			t.Errorf("waited %v over %d attempts; want no wait, one attempt", r.clock.Sleeps(), r.srv.Count(""))
		}
	})
	t.Run("fits", func(t *testing.T) {
		r := newRig(t, damper.Policy{})
		r.srv.Script("", dampertest.Status(429).RetryAfter("1"), dampertest.OK())
		ctx, cancel := context.WithDeadline(context.Background(), r.clock.Now().Add(3*time.Second))
		defer cancel()
		if _, err := r.client.Messages.New(ctx, params("claude-sonnet-4-6")); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("canceled context", func(t *testing.T) {
		r := newRig(t, damper.Policy{})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := r.client.Messages.New(ctx, params("claude-sonnet-4-6"))
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
	})
}

// TestWaitEndsWithContext: a wait on the real clock ends the moment the
// caller's context does.
func TestWaitEndsWithContext(t *testing.T) {
	srv := dampertest.NewServer()
	defer srv.Close()
	srv.Script("", dampertest.Status(429).RetryAfter("30"))
	failed := make(chan struct{}, 1)
	d, err := damper.New(damper.Policy{Classifier: func(f damper.Failure, c damper.Classification) damper.Classification {
		failed <- struct{}{}
		return c
	}})
	if err != nil {
		t.Fatal(err)
	}
	client := anthropic.NewClient(append([]option.RequestOption{d.Option()}, srv.Options()...)...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var rep damper.Report
	go func() {
		_, err := client.Messages.New(ctx, params("claude-sonnet-4-6"), damper.ReportInto(&rep))
		done <- err
	}()
	<-failed // the first attempt failed; Damper is about to wait 30 s
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if rep.Outcome != damper.OutcomeCanceled || srv.Count("") != 1 {
		t.Errorf("outcome %q after %d attempts; want canceled after 1", rep.Outcome, srv.Count(""))
	}
}

func TestTransportErrorIsReturnedAsIs(t *testing.T) {
	r := newRig(t, damper.Policy{MaxAttempts: 2})
	r.srv.Script("", dampertest.OK().WithDrop(dampertest.DropBeforeHeaders))
	_, err := r.client.Messages.New(context.Background(), params("claude-sonnet-4-6"))
	var derr *damper.Error
	var apiErr *anthropic.Error
	if err == nil || errors.As(err, &derr) || errors.As(err, &apiErr) {
		t.Fatalf("err = %#v; attempts running out should return the transport error as the SDK would", err)
	}
	var netErr net.Error
	if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.As(err, &netErr) {
		t.Fatalf("err = %v, want a transport error", err)
	}
}
