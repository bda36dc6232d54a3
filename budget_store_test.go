package damper_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// storeBudget is a budget whose store can fail: it records what it hears
// and answers Acquire with grant and err.
type storeBudget struct {
	mu       sync.Mutex
	observed []damper.AttemptOutcome
	grant    bool
	err      error
}

func (b *storeBudget) Observe(_ context.Context, _ time.Time, a damper.AttemptOutcome) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.observed = append(b.observed, a)
	return b.err
}

func (b *storeBudget) Acquire(context.Context, time.Time) (bool, error) { return b.grant, b.err }

func (b *storeBudget) Available(context.Context, time.Time) (float64, error) { return 0, b.err }

// The budget hears every attempt, failed ones with their signal, not only
// a successful first attempt.
func TestBudgetHearsEveryAttempt(t *testing.T) {
	b := &storeBudget{grant: true}
	r := newRig(t, damper.Policy{}, damper.WithBudget(b))
	r.srv.Script("", dampertest.Status(529), dampertest.Status(429), dampertest.OK())
	if _, err := r.client.Messages.New(context.Background(), params("claude-sonnet-4-6")); err != nil {
		t.Fatal(err)
	}
	want := []damper.AttemptOutcome{
		{First: true, Signal: damper.ProviderHealth},
		{Signal: damper.CallerTraffic},
		{Success: true},
	}
	if len(b.observed) != len(want) {
		t.Fatalf("observed %+v, want %+v", b.observed, want)
	}
	for i := range want {
		if b.observed[i] != want[i] {
			t.Errorf("attempt %d: observed %+v, want %+v", i+1, b.observed[i], want[i])
		}
	}
}

// A budget whose store fails still decides, fail open or fail closed as
// it was built; Damper follows the decision and logs the error.
func TestBudgetStoreErrorIsLoggedAndDecisionKept(t *testing.T) {
	errStore := errors.New("store: i/o timeout")
	for _, grant := range []bool{true, false} {
		var logs bytes.Buffer
		b := &storeBudget{grant: grant, err: errStore}
		r := newRig(t, damper.Policy{}, damper.WithBudget(b), damper.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))))
		r.srv.Script("", dampertest.Status(529), dampertest.OK())
		var rep damper.Report
		_, err := r.client.Messages.New(context.Background(), params("claude-sonnet-4-6"), damper.ReportInto(&rep))
		if grant && (err != nil || rep.Attempts != 2) {
			t.Errorf("fail open: err %v, %d attempts; want a retried success", err, rep.Attempts)
		}
		if !grant && (!errors.Is(err, damper.ErrRetryBudgetExhausted) || rep.Attempts != 1) {
			t.Errorf("fail closed: err %v, %d attempts; want the budget's refusal", err, rep.Attempts)
		}
		for _, op := range []string{`"op":"observe"`, `"op":"acquire"`, `"op":"available"`} {
			if !strings.Contains(logs.String(), `"msg":"damper: retry budget error",`+op) || !strings.Contains(logs.String(), errStore.Error()) {
				t.Errorf("grant %v: no log line for %s with the store's error in:\n%s", grant, op, logs.String())
			}
		}
	}
}
