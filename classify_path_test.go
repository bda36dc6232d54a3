package damper_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// seenFailures records what a Policy.Classifier is shown, and renames the kind
// so that its verdict is seen to be the one acted on.
type seenFailures struct {
	mu   sync.Mutex
	seen []damper.Failure
}

func (v *seenFailures) classify(f damper.Failure, builtin damper.Classification) damper.Classification {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.seen = append(v.seen, f)
	builtin.Kind = "mine_" + builtin.Kind
	return builtin
}

// A stream's failure after content goes through the Policy's Classifier
// like any other; it stays ambiguous whatever the verdict, and the
// attempt's record carries the verdict.
func TestClassifierSeesStreamFailureAfterContent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := &seenFailures{}
		st := dampertest.Stream{Text: firstText, ChunkSize: 4, Fault: dampertest.FaultReset}
		st.At = len(st.Events()) - 2 // after several deltas
		srv := &planServer{plans: []dampertest.Stream{st}}
		client := memClient(newDamper(t, damper.Policy{Classifier: v.classify}), srv)
		var rep damper.Report
		_, err := drain(client.Messages.NewStreaming(context.Background(), streamParams(), damper.ReportInto(&rep)))
		if !errors.Is(err, damper.ErrAmbiguous) {
			t.Fatalf("err = %v, want ErrAmbiguous", err)
		}
		if len(v.seen) != 1 || !v.seen[0].AfterContent {
			t.Fatalf("the classifier saw %+v, want the one failure after content", v.seen)
		}
		last := rep.AttemptLog[len(rep.AttemptLog)-1]
		if rep.Outcome != damper.OutcomeAmbiguous || rep.Attempts != 1 || last.Class != damper.Ambiguous || last.Kind != "mine_transport" {
			t.Fatalf("report %+v, want one ambiguous attempt of kind mine_transport", rep)
		}
	})
}

// A caller's deadline that ends an attempt is the caller's: recorded as
// canceled, never shown to a classifier as a failure of the provider's,
// never heard by the budget as one.
func TestCallerDeadlineDuringAttemptIsTheCallers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := &seenFailures{}
		b := &storeBudget{grant: true}
		srv := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			<-r.Context().Done() // never answers
		})
		d, err := damper.New(damper.Policy{PerAttemptTimeout: time.Minute, Classifier: v.classify}, damper.WithBudget(b))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		var rep damper.Report
		client := memClient(d, srv)
		_, err = client.Messages.New(ctx, params("claude-sonnet-4-5"), damper.ReportInto(&rep))
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want context.DeadlineExceeded", err)
		}
		if rep.Outcome != damper.OutcomeCanceled || rep.Attempts != 1 || rep.AttemptLog[0].Kind != "canceled" || rep.AttemptLog[0].Class != damper.NotRetryable {
			t.Fatalf("report %+v, want one attempt of kind canceled", rep)
		}
		if len(v.seen) != 0 {
			t.Errorf("the classifier saw %+v, want nothing", v.seen)
		}
		if len(b.observed) != 1 || b.observed[0] != (damper.AttemptOutcome{First: true}) {
			t.Errorf("the budget heard %+v, want one first attempt without a signal", b.observed)
		}
	})
}
