package damper_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// Adversarial provider delays: every one is either honoured as a hint, read
// as no hint (the 500 ms of full jitter at rand 0.5), or refused as too
// long with the delay in the error; none panics, overflows or waits longer
// than MaxRetryAfter.
func TestAdversarialRetryAfter(t *testing.T) {
	const jitter = 500 * time.Millisecond // no hint: half of BackoffBase
	const clamped = 1000 * 24 * time.Hour // the longest delay a hint is read as
	tests := []struct {
		name   string
		header http.Header
		wait   time.Duration // the wait before the retry; 0 when refused
		refuse time.Duration // the delay ErrRetryAfterTooLong carries
	}{
		{"retry-after -1", http.Header{"Retry-After": {"-1"}}, jitter, 0},
		{"retry-after NaN", http.Header{"Retry-After": {"NaN"}}, jitter, 0},
		{"retry-after Inf", http.Header{"Retry-After": {"Inf"}}, jitter, 0},
		{"retry-after +Infinity", http.Header{"Retry-After": {"+Infinity"}}, jitter, 0},
		{"retry-after -Inf", http.Header{"Retry-After": {"-Inf"}}, jitter, 0},
		{"retry-after 1e400 (overflows float64)", http.Header{"Retry-After": {"1e400"}}, jitter, 0},
		{"retry-after 1e308", http.Header{"Retry-After": {"1e308"}}, 0, clamped},
		{"retry-after date in the past", http.Header{"Retry-After": {"Wed, 21 Oct 2015 07:28:00 GMT"}}, jitter, 0},
		{"retry-after date far in the future", http.Header{"Retry-After": {"Fri, 31 Dec 9999 23:59:59 GMT"}}, 0, clamped},
		{"retry-after empty", http.Header{"Retry-After": {""}}, jitter, 0},
		{"retry-after not a number", http.Header{"Retry-After": {"soon"}}, jitter, 0},
		// net/http's Header.Get: the first value counts, as for the SDK.
		{"retry-after repeated, short first", http.Header{"Retry-After": {"1", "120"}}, time.Second + 50*time.Millisecond, 0},
		{"retry-after repeated, long first", http.Header{"Retry-After": {"120", "1"}}, 0, 120 * time.Second},
		{"retry-after-ms 10^18", http.Header{"Retry-After-Ms": {"1000000000000000000"}}, 0, clamped},
		{"retry-after-ms -5 falls back to retry-after", http.Header{"Retry-After-Ms": {"-5"}, "Retry-After": {"2"}}, 2*time.Second + 100*time.Millisecond, 0},
		{"retry-after-ms NaN and retry-after empty", http.Header{"Retry-After-Ms": {"NaN"}, "Retry-After": {""}}, jitter, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, damper.Policy{})
			r.srv.Script("", dampertest.Step{Status: 429, Header: tt.header}, dampertest.OK())
			var rep damper.Report
			_, err := r.client.Messages.New(context.Background(), params("claude-sonnet-4-5"), damper.ReportInto(&rep))
			sleeps := r.clock.Sleeps()
			if tt.refuse > 0 {
				var de *damper.Error
				if !errors.As(err, &de) || !errors.Is(err, damper.ErrRetryAfterTooLong) || de.RetryAfter != tt.refuse {
					t.Fatalf("err = %v, want ErrRetryAfterTooLong carrying %v", err, tt.refuse)
				}
				if len(sleeps) != 0 || r.srv.Count("") != 1 || rep.Outcome != damper.OutcomeRetryAfterTooLong {
					t.Fatalf("slept %v over %d attempts, outcome %q; want no wait, one attempt", sleeps, r.srv.Count(""), rep.Outcome)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(sleeps) != 1 || sleeps[0] != tt.wait || r.srv.Count("") != 2 {
				t.Fatalf("slept %v over %d attempts; want [%v] over 2", sleeps, r.srv.Count(""), tt.wait)
			}
		})
	}
}

// ParseRetryAfter on its own, for values a server cannot send whole: it
// never reads an adversarial value as a negative or overflowing delay.
func TestAdversarialParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	for _, v := range []string{"-0", "0x7fffffffffffffff", "9223372036854775807", "1e-400", " 3 ", "3;4", strings.Repeat("9", 10000)} {
		for _, name := range []string{"retry-after", "retry-after-ms"} {
			d, ok := damper.ParseRetryAfter(http.Header{http.CanonicalHeaderKey(name): {v}}, now)
			if d < 0 || d > 1000*24*time.Hour || (!ok && d != 0) {
				t.Errorf("%s: %q = %v, %v", name, v, d, ok)
			}
		}
	}
}

// errAs reports whether err reaches an *anthropic.Error of status code.
func apiStatus(err error) int {
	var apiErr *anthropic.Error
	if errors.As(err, &apiErr) {
		return apiErr.StatusCode
	}
	return 0
}

// A request timeout set on the SDK shorter than Damper's loop: when it
// expires, the SDK runs the call again (twice, by default), which Damper
// refuses without a provider attempt, so the attempts stay Damper's alone
// and the report counts all of them.
func TestAdversarialSDKRequestTimeout(t *testing.T) {
	srv := &rawServer{handlers: []http.HandlerFunc{func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	}}}
	synctest.Test(t, func(t *testing.T) {
		client := memClient(newDamper(t, damper.Policy{}), srv)
		var rep damper.Report
		_, err := client.Messages.New(context.Background(), params("claude-sonnet-4-5"),
			damper.ReportInto(&rep), option.WithRequestTimeout(2*time.Second))
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want context.DeadlineExceeded", err)
		}
		if n := srv.requests.Load(); n != 1 || rep.Attempts != 1 || rep.Outcome != damper.OutcomeCanceled || rep.Duration != 2*time.Second {
			t.Fatalf("the server got %d requests; report %+v; want 1 attempt cut at 2s", n, rep)
		}
	})
}
