package damper_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// A caller may set any X-Stainless-Retry-Count it likes: Damper tells the
// SDK's own retry by the logical request, not by that header, so every
// value leaves its calls and retries as they are.
func TestCallerRetryCountHeaderChangesNothing(t *testing.T) {
	for _, v := range []string{"0", "1", "5", "not a number"} {
		r := newRig(t, damper.Policy{})
		r.srv.Script("", dampertest.Status(529), dampertest.OK())
		var rep damper.Report
		_, err := r.client.Messages.New(context.Background(), params("claude-sonnet-4-6"),
			option.WithHeader("X-Stainless-Retry-Count", v), damper.ReportInto(&rep))
		if err != nil || rep.Attempts != 2 || rep.Outcome != damper.OutcomeSuccess || r.srv.Count("") != 2 {
			t.Errorf("X-Stainless-Retry-Count %q: err %v, report %d attempts %q, server %d; want a success on the second attempt",
				v, err, rep.Attempts, rep.Outcome, r.srv.Count(""))
		}
	}
}

// With the header set by the caller, the SDK numbers nothing; its own run
// again after its request timeout is still refused without an attempt.
func TestSDKRetryRefusedWhateverTheHeader(t *testing.T) {
	for _, v := range []string{"", "0", "7"} {
		srv := &rawServer{handlers: []http.HandlerFunc{func(w http.ResponseWriter, r *http.Request) {
			<-r.Context().Done() // until the SDK's request timeout
		}}}
		synctest.Test(t, func(t *testing.T) {
			client := memClient(newDamper(t, damper.Policy{}), srv)
			opts := []option.RequestOption{option.WithRequestTimeout(2 * time.Second)}
			if v != "" {
				opts = append(opts, option.WithHeader("X-Stainless-Retry-Count", v))
			}
			_, err := client.Messages.New(context.Background(), params("claude-sonnet-4-5"), opts...)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("header %q: err = %v, want context.DeadlineExceeded", v, err)
			}
			if n := srv.requests.Load(); n != 1 {
				t.Fatalf("header %q: the server got %d requests, want 1: the SDK's runs again reached it", v, n)
			}
		})
	}
}
