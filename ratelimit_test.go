package damper_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
	"github.com/damper-ai/damper-go/fleet"
)

// limitAPI answers Messages requests as its answer function says, and
// records when each arrived.
type limitAPI struct {
	answer func(n int, w http.ResponseWriter, r *http.Request)

	mu  sync.Mutex
	got []time.Time
}

func (a *limitAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	a.mu.Lock()
	a.got = append(a.got, time.Now())
	n := len(a.got)
	a.mu.Unlock()
	a.answer(n, w, r)
}

func (a *limitAPI) arrivals() []time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]time.Time(nil), a.got...)
}

// buckets are numbers for the three buckets: requests, input tokens,
// output tokens.
type buckets [3]int

// setRateHeaders writes the anthropic-ratelimit-* headers of limits and
// remaining; a zero limit leaves its bucket's headers out.
func setRateHeaders(h http.Header, limits, remaining buckets) {
	for k, name := range []string{"requests", "input-tokens", "output-tokens"} {
		if limits[k] > 0 {
			h.Set("anthropic-ratelimit-"+name+"-limit", strconv.Itoa(limits[k]))
			h.Set("anthropic-ratelimit-"+name+"-remaining", strconv.Itoa(remaining[k]))
			h.Set("anthropic-ratelimit-"+name+"-reset", "2030-01-01T00:00:00Z")
		}
	}
}

// answerPlain writes a plain answer with the usage given.
func answerPlain(w http.ResponseWriter, in, cacheRead, cacheCreation, out int) {
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-6","content":[{"type":"text","text":"ok"}],`+
		`"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":%d,"cache_read_input_tokens":%d,"cache_creation_input_tokens":%d,"output_tokens":%d}}`,
		in, cacheRead, cacheCreation, out)
}

// answerStream writes a stream whose message_start reports in input
// tokens and whose final message_delta reports out output tokens.
func answerStream(w http.ResponseWriter, in, out int) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	fmt.Fprintf(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-sonnet-4-6\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":%d,\"output_tokens\":1}}}\n\n", in)
	io.WriteString(w, "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n")
	io.WriteString(w, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n")
	io.WriteString(w, "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n")
	fmt.Fprintf(w, "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":%d}}\n\n", out)
	io.WriteString(w, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
}

// answerRateLimited writes a rate-limit 429 with retry-after.
func answerRateLimited(w http.ResponseWriter, retryAfter string) {
	w.Header().Set("Content-Type", "application/json")
	if retryAfter != "" {
		w.Header().Set("retry-after", retryAfter)
	}
	w.WriteHeader(http.StatusTooManyRequests)
	io.WriteString(w, `{"type":"error","error":{"type":"rate_limit_error","message":"This request would exceed the rate limit for your organization of 5 requests per minute."}}`)
}

// rlRig is a Damper with a rate limiter in front of a limitAPI in memory.
// The tests run in synctest bubbles, on the real clock: time moves only
// when every goroutine of the test waits, so many callers can wait in line
// together and their waits are exact.
type rlRig struct {
	api    *limitAPI
	d      *damper.Damper
	client anthropic.Client
}

func newRLRig(t *testing.T, p damper.Policy, answer func(n int, w http.ResponseWriter, r *http.Request)) *rlRig {
	t.Helper()
	api := &limitAPI{answer: answer}
	d, err := damper.New(p, damper.WithRand(half))
	if err != nil {
		t.Fatal(err)
	}
	return &rlRig{api: api, d: d, client: memClient(d, api)}
}

// call makes one plain call in ctx with maxTokens, returning its report.
func (r *rlRig) call(ctx context.Context, maxTokens int64) (damper.Report, error) {
	p := params("claude-sonnet-4-6")
	p.MaxTokens = maxTokens
	var rep damper.Report
	_, err := r.client.Messages.New(ctx, p, damper.ReportInto(&rep))
	var de *damper.Error
	if rep.Outcome == "" && errors.As(err, &de) && de.Report != nil {
		rep = *de.Report
	}
	return rep, err
}

// stream makes one streaming call and reads it to its end, checking the
// limiter's state (through check) while the stream is open.
func (r *rlRig) stream(t *testing.T, maxTokens int64, check func()) damper.Report {
	t.Helper()
	p := params("claude-sonnet-4-6")
	p.MaxTokens = maxTokens
	var rep damper.Report
	s := r.client.Messages.NewStreaming(context.Background(), p, damper.ReportInto(&rep))
	if !s.Next() {
		t.Fatalf("stream: no event: %v", s.Err())
	}
	check()
	for s.Next() {
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	return rep
}

// bucketState returns the limiter's state of one bucket of the group of
// claude-sonnet-4-6.
func (r *rlRig) bucketState(t *testing.T, bucket string) fleet.RateLimitState {
	t.Helper()
	for _, s := range r.d.RateLimits() {
		if s.Group == "claude-sonnet-4" && s.Bucket == bucket {
			return s
		}
	}
	t.Fatalf("no bucket %s in %+v", bucket, r.d.RateLimits())
	return fleet.RateLimitState{}
}

// With no configuration, the first response sizes the buckets; later ones
// follow the limit as it is raised and lowered. The fake API counts as the
// real one: each request and its 100 input tokens when it arrives, its
// max_tokens as output until it is answered with 10, and a raised or
// lowered limit moves what remains by as much.
func TestRateLimitLearnsFromHeaders(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		limits := []buckets{{50, 20000, 4000}, {100, 40000, 8000}, {10, 5000, 2000}}
		r := newRLRig(t, damper.Policy{RateLimit: &damper.RateLimitPolicy{}}, func(n int, w http.ResponseWriter, _ *http.Request) {
			l := limits[n-1]
			setRateHeaders(w.Header(), l, buckets{l[0] - n, l[1] - 100*n, l[2] - 10*(n-1) - 1024})
			answerPlain(w, 100, 0, 0, 10)
		})
		if got := r.d.RateLimits(); len(got) != 0 {
			t.Fatalf("before any call: %+v, want no group", got)
		}
		for i, l := range limits {
			rep, err := r.call(context.Background(), 1024)
			if err != nil {
				t.Fatal(err)
			}
			if rep.LimitGroup != "claude-sonnet-4" || rep.RateLimitWait != 0 {
				t.Fatalf("call %d: report %+v", i, rep)
			}
			n := i + 1
			for k, bucket := range []string{"requests", "input_tokens", "output_tokens"} {
				s := r.bucketState(t, bucket)
				want := []float64{float64(l[0] - n), float64(l[1] - 100*n), float64(l[2] - 10*n)}[k]
				if !s.Learned || s.Limit != float64(l[k]) || s.Remaining != want {
					t.Errorf("call %d, %s: %+v, want limit %d learned, remaining %v", n, bucket, s, l[k], want)
				}
			}
		}
	})
}

// A configured limit is kept whatever the headers say; they only lower
// its level.
func TestRateLimitConfiguredKeepsItsLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRLRig(t, damper.Policy{RateLimit: &damper.RateLimitPolicy{
			Limits: map[string]damper.RateLimits{"claude-sonnet-4": {RequestsPerMinute: 30}},
		}}, func(n int, w http.ResponseWriter, _ *http.Request) {
			setRateHeaders(w.Header(), buckets{1000, 0, 0}, buckets{[]int{999, 10}[n-1], 0, 0})
			answerPlain(w, 1, 0, 0, 1)
		})
		if _, err := r.call(context.Background(), 16); err != nil {
			t.Fatal(err)
		}
		if s := r.bucketState(t, "requests"); s.Learned || s.Limit != 30 || s.Remaining != 29 {
			t.Fatalf("after a response with more room: %+v, want limit 30, 29 left", s)
		}
		if _, err := r.call(context.Background(), 16); err != nil {
			t.Fatal(err)
		}
		if s := r.bucketState(t, "requests"); s.Limit != 30 || s.Remaining != 10 {
			t.Fatalf("after a response with less room: %+v, want limit 30, 10 left", s)
		}
	})
}

// The answer's usage settles the reservation: for a plain answer when it
// is read, for a stream at its end (max_tokens stays reserved while it is
// open). Cache reads do not count against a cache-aware group's input
// limit.
func TestRateLimitSettlesFromUsage(t *testing.T) {
	p := damper.Policy{RateLimit: &damper.RateLimitPolicy{Limits: map[string]damper.RateLimits{
		"claude-sonnet-4": {RequestsPerMinute: 100, InputTokensPerMinute: 10000, OutputTokensPerMinute: 10000},
	}}}
	t.Run("plain", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := newRLRig(t, p, func(_ int, w http.ResponseWriter, _ *http.Request) { answerPlain(w, 30, 500, 20, 100) })
			if _, err := r.call(context.Background(), 1024); err != nil {
				t.Fatal(err)
			}
			if in, out := r.bucketState(t, "input_tokens"), r.bucketState(t, "output_tokens"); in.Remaining != 10000-50 || out.Remaining != 10000-100 {
				t.Fatalf("input %+v, output %+v; want 9950 and 9900 left", in, out)
			}
		})
	})
	t.Run("stream", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := newRLRig(t, p, func(_ int, w http.ResponseWriter, _ *http.Request) { answerStream(w, 40, 200) })
			r.stream(t, 1024, func() {
				if out := r.bucketState(t, "output_tokens"); out.Remaining != 10000-1024 {
					t.Errorf("while the stream is open: %+v, want max_tokens reserved (8976 left)", out)
				}
			})
			if in, out := r.bucketState(t, "input_tokens"), r.bucketState(t, "output_tokens"); in.Remaining != 10000-40 || out.Remaining != 10000-200 {
				t.Fatalf("after the stream: input %+v, output %+v; want 9960 and 9800 left", in, out)
			}
		})
	})
}

// A rate-limit 429 empties the bucket it names until its retry-after:
// every goroutine waits for it, and none is sent before.
func TestRateLimit429PausesEveryGoroutine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRLRig(t, damper.Policy{MaxAttempts: 2, RateLimit: &damper.RateLimitPolicy{}}, func(n int, w http.ResponseWriter, _ *http.Request) {
			if n == 1 {
				setRateHeaders(w.Header(), buckets{50, 0, 0}, buckets{0, 0, 0})
				answerRateLimited(w, "10")
				return
			}
			setRateHeaders(w.Header(), buckets{50, 0, 0}, buckets{40, 0, 0})
			answerPlain(w, 1, 0, 0, 1)
		})
		start := time.Now()
		const others = 5
		var wg sync.WaitGroup
		errs := make(chan error, others+1)
		wg.Go(func() {
			_, err := r.call(context.Background(), 16)
			errs <- err
		})
		synctest.Wait() // the first call's retry waits out retry-after
		if s := r.bucketState(t, "requests"); !s.PausedUntil.Equal(start.Add(10*time.Second)) || s.Remaining != 0 {
			t.Fatalf("after the 429: %+v, want paused for 10s", s)
		}
		for range others {
			wg.Go(func() {
				_, err := r.call(context.Background(), 16)
				errs <- err
			})
		}
		synctest.Wait()
		if n := len(r.api.arrivals()); n != 1 {
			t.Fatalf("%d requests sent during the pause, want only the first", n)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		got := r.api.arrivals()
		if len(got) != 2+others {
			t.Fatalf("%d requests, want %d", len(got), 2+others)
		}
		// The others go as the pause ends; the first call's retry waits
		// out retry-after and its jitter (a tenth of it, half drawn).
		for i, at := range got[1:] {
			want := 10 * time.Second
			if i == others {
				want += 500 * time.Millisecond
			}
			if at.Sub(start) != want {
				t.Fatalf("arrivals %v, want the others at +10s and the retry at +10.5s", got)
			}
		}
	})
}

// A spend-limit 429 is no rate limit: nothing is paused.
func TestRateLimitSpendLimitDoesNotPause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRLRig(t, damper.Policy{RateLimit: &damper.RateLimitPolicy{}}, func(_ int, w http.ResponseWriter, _ *http.Request) {
			setRateHeaders(w.Header(), buckets{50, 0, 0}, buckets{49, 0, 0})
			w.Header().Set("retry-after", "30")
			w.WriteHeader(http.StatusTooManyRequests)
			io.WriteString(w, `{"type":"error","error":{"type":"rate_limit_error","message":"spend","details":{"error_code":"enforced_spend_limit_reached"}}}`)
		})
		if _, err := r.call(context.Background(), 16); err == nil {
			t.Fatal("want the spend limit's error")
		}
		if s := r.bucketState(t, "requests"); !s.PausedUntil.IsZero() || s.Remaining != 49 {
			t.Fatalf("after a spend limit: %+v, want no pause", s)
		}
	})
}

// Batch calls leave a fifth of each bucket: once they have filled the
// rest they wait, and interactive calls still go at once.
func TestRateLimitInteractiveGetsThroughBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRLRig(t, damper.Policy{RateLimit: &damper.RateLimitPolicy{
			Limits: map[string]damper.RateLimits{"claude-sonnet-4": {RequestsPerMinute: 60}},
		}}, func(_ int, w http.ResponseWriter, _ *http.Request) { answerPlain(w, 1, 0, 0, 1) })
		start := time.Now()
		batch := damper.ContextWithPriority(context.Background(), damper.Batch)
		for i := range 48 {
			if _, err := r.call(batch, 16); err != nil {
				t.Fatalf("batch call %d: %v", i, err)
			}
		}
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(func() {
				if _, err := r.call(batch, 16); err != nil {
					t.Error(err)
				}
			})
		}
		synctest.Wait() // the three wait in the batch line
		for i := range 12 {
			rep, err := r.call(context.Background(), 16)
			if err != nil || rep.RateLimitWait != 0 {
				t.Fatalf("interactive call %d: %v, waited %v; want it sent at once", i, err, rep.RateLimitWait)
			}
		}
		if n := len(r.api.arrivals()); n != 60 || time.Since(start) != 0 {
			t.Fatalf("%d sent by +%v, want 48 batch and 12 interactive at once", n, time.Since(start))
		}
		// The interactive calls took the reserve: each batch call waits for
		// the bucket to hold a fifth of it plus its own request again, 13
		// requests at one a second, in line one second apart.
		wg.Wait()
		got := r.api.arrivals()[60:]
		for i, at := range got {
			if want := time.Duration(13+i) * time.Second; at.Sub(start) != want {
				t.Errorf("batch call %d sent at +%v, want +%v", i, at.Sub(start), want)
			}
		}
	})
}

// An attempt that cannot be admitted before the caller's deadline (less
// half a second) or MaxWait fails at once with ErrRateLimited, sends
// nothing, and takes nothing from any bucket.
func TestRateLimitRefusesBeyondDeadlineAndMaxWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRLRig(t, damper.Policy{RateLimit: &damper.RateLimitPolicy{
			MaxWait: 20 * time.Second,
			Limits:  map[string]damper.RateLimits{"claude-sonnet-4": {RequestsPerMinute: 1, OutputTokensPerMinute: 100000}},
		}}, func(_ int, w http.ResponseWriter, _ *http.Request) { answerPlain(w, 1, 0, 0, 1) })
		if _, err := r.call(context.Background(), 16); err != nil {
			t.Fatal(err)
		}
		out := r.bucketState(t, "output_tokens")
		start := time.Now()
		deadline, cancel := context.WithDeadline(context.Background(), start.Add(45*time.Second))
		defer cancel()
		for name, ctx := range map[string]context.Context{"deadline": deadline, "max wait": context.Background()} {
			rep, err := r.call(ctx, 16)
			var de *damper.Error
			if !errors.Is(err, damper.ErrRateLimited) || !errors.As(err, &de) {
				t.Fatalf("%s: err = %v, want ErrRateLimited", name, err)
			}
			if !de.AdmitAt.Equal(start.Add(time.Minute)) || de.RetryAfter != time.Minute {
				t.Errorf("%s: admit at +%v, retry after %v; want in one minute", name, de.AdmitAt.Sub(start), de.RetryAfter)
			}
			if rep.Attempts != 0 || rep.Outcome != damper.OutcomeRateLimited {
				t.Errorf("%s: report %+v, want no attempt, rate_limited", name, rep)
			}
			if s := r.bucketState(t, "output_tokens"); s.Remaining != out.Remaining {
				t.Errorf("%s: output bucket %+v, want untouched (%v)", name, s, out.Remaining)
			}
		}
		if n := len(r.api.arrivals()); n != 1 || time.Since(start) != 0 {
			t.Fatalf("%d sent, %v waited; want nothing more, no wait", n, time.Since(start))
		}
	})
}

// A wait in line ends when the bucket has room, and with the caller's
// context, which gives back what the call took.
func TestRateLimitWaitEndsOnTimeAndOnCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRLRig(t, damper.Policy{RateLimit: &damper.RateLimitPolicy{
			MaxWait: 2 * time.Minute,
			Limits:  map[string]damper.RateLimits{"claude-sonnet-4": {RequestsPerMinute: 2}},
		}}, func(_ int, w http.ResponseWriter, _ *http.Request) { answerPlain(w, 1, 0, 0, 1) })
		for range 2 {
			if _, err := r.call(context.Background(), 16); err != nil {
				t.Fatal(err)
			}
		}
		start := time.Now()

		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			_, err := r.call(ctx, 16)
			done <- err
		}()
		synctest.Wait()
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("canceled wait: %v", err)
		}
		if time.Since(start) != 0 {
			t.Fatalf("the canceled wait took %v", time.Since(start))
		}
		// The canceled call's request went back: the next is due in 30 s.
		rep, err := r.call(context.Background(), 16)
		if err != nil || rep.RateLimitWait != 30*time.Second || len(rep.AttemptLog) != 1 || rep.AttemptLog[0].RateLimitWait != 30*time.Second {
			t.Fatalf("err %v, report %+v; want a 30 s wait in line", err, rep)
		}
		if got := r.api.arrivals(); len(got) != 3 || got[2].Sub(start) != 30*time.Second {
			t.Fatalf("arrivals %v, want the third at +30s", got)
		}
	})
}

// Bad limiter settings are refused with the field and its value.
func TestRateLimitPolicyErrors(t *testing.T) {
	for _, tc := range []struct {
		p    damper.RateLimitPolicy
		want string
	}{
		{damper.RateLimitPolicy{MaxWait: -2}, "RateLimit.MaxWait = -2ns"},
		{damper.RateLimitPolicy{BatchShare: 1.5}, "RateLimit.BatchShare = 1.5"},
		{damper.RateLimitPolicy{Priority: 7}, "RateLimit.Priority = Priority(7)"},
		{damper.RateLimitPolicy{Limits: map[string]damper.RateLimits{"claude-opus-4": {InputTokensPerMinute: -5}}}, `RateLimit.Limits["claude-opus-4"].InputTokensPerMinute = -5`},
		{damper.RateLimitPolicy{Limits: map[string]damper.RateLimits{"": {}}}, "RateLimit.Limits"},
	} {
		_, err := damper.New(damper.Policy{RateLimit: &tc.p})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: err = %v, want it to name %s", tc.p, err, tc.want)
		}
	}
}

func TestLimitGroup(t *testing.T) {
	for model, want := range map[string]string{
		"claude-sonnet-4-5-20250929":                 "claude-sonnet-4",
		"claude-sonnet-4-6":                          "claude-sonnet-4",
		"us.anthropic.claude-opus-4-1-20250805-v1:0": "claude-opus-4",
		"claude-haiku-4-5@20251001":                  "claude-haiku-4",
		"claude-3-5-haiku-20241022":                  "claude-3-5-haiku",
		"my-model":                                   "my-model",
		"My-Model@20250101":                          "my-model",
		"":                                           "(other)",
		"bad\xff\xfe":                                "(other)",
		"a model":                                    "(other)",
		"claude-\xff-4-5":                            "(other)",
		strings.Repeat("m", 128):                     strings.Repeat("m", 128),
		strings.Repeat("m", 129):                     "(other)",
		strings.Repeat("m", 1<<20):                   "(other)",
		"claude-sonnet-4-" + strings.Repeat("9", 300): "(other)",
	} {
		if got := damper.LimitGroupForTest(model); got != want {
			t.Errorf("LimitGroup(%q) = %q, want %q", model, got, want)
		}
		// A group's name is its own group: a key of Limits may be either.
		if got := damper.LimitGroupForTest(want); got != want {
			t.Errorf("LimitGroup(%q) = %q, want it unchanged", want, got)
		}
	}
}

// enforcingAPI is a fake API that enforces 10 requests a minute, and a
// call through a Damper with policy p that has made one call already, so
// that a learning limiter knows the limit.
func enforcingAPI(t *testing.T, p damper.Policy) (*dampertest.Server, func() error) {
	t.Helper()
	srv := dampertest.NewServer(dampertest.InMemory(),
		dampertest.WithRateLimits(dampertest.RateLimits{RequestsPerMinute: 10, OutputTokensPerMinute: 100000}))
	t.Cleanup(srv.Close)
	d, err := damper.New(p, damper.WithRand(half))
	if err != nil {
		t.Fatal(err)
	}
	client := anthropic.NewClient(append([]option.RequestOption{d.Option()}, srv.Options()...)...)
	call := func() error {
		_, err := client.Messages.New(context.Background(), params("claude-sonnet-4-6"))
		return err
	}
	if err := call(); err != nil {
		t.Fatal(err)
	}
	return srv, call
}

// Against a fake API that enforces its limits, a limiter that learned them
// from one response keeps every goroutine under them: no 429 at all, calls
// spaced as the bucket refills, and those that could not start within
// MaxWait refused before they were sent.
func TestRateLimitAgainstEnforcingAPI(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv, call := enforcingAPI(t, damper.Policy{RateLimit: &damper.RateLimitPolicy{}})
		start := time.Now()
		var wg sync.WaitGroup
		var mu sync.Mutex
		var admitted, refused int
		// The callers come one after another at the same instant, each once
		// the one before it has been answered or waits in line: which
		// requests a response's count includes is then known exactly.
		for range 16 {
			wg.Go(func() {
				err := call()
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					admitted++
				case errors.Is(err, damper.ErrRateLimited):
					refused++
				default:
					t.Error(err)
				}
			})
			synctest.Wait()
		}
		wg.Wait()
		// 9 requests are left after the first; then one every 6 s, the
		// last of them at the 30 s MaxWait.
		st := srv.RateLimitStats()
		if admitted != 14 || refused != 2 || st.Limited != 0 || st.Admitted != 15 {
			t.Fatalf("%d admitted, %d refused; server admitted %d, sent %d 429s; want 14, 2, 15, 0", admitted, refused, st.Admitted, st.Limited)
		}
		var at []time.Duration
		for _, r := range srv.Requests()[1:] {
			at = append(at, r.At.Sub(start))
		}
		want := []time.Duration{0, 0, 0, 0, 0, 0, 0, 0, 0, 6 * time.Second, 12 * time.Second, 18 * time.Second, 24 * time.Second, 30 * time.Second}
		if !slices.Equal(at, want) {
			t.Fatalf("sent at %v, want %v", at, want)
		}
	})
}

// Callers that come all at once, their responses interleaved with their
// reservations in any order, still never meet a 429: a response to a later
// request may lower a bucket but never raise it while an earlier request
// is unanswered, since the API may not have counted that one yet. The
// price is a request or two refused that could have waited.
func TestRateLimitBurstNever429(t *testing.T) {
	for range 20 {
		synctest.Test(t, func(t *testing.T) {
			srv, call := enforcingAPI(t, damper.Policy{MaxAttempts: 1, RateLimit: &damper.RateLimitPolicy{}})
			var wg sync.WaitGroup
			for range 16 {
				wg.Go(func() {
					if err := call(); err != nil && !errors.Is(err, damper.ErrRateLimited) {
						t.Error(err)
					}
				})
			}
			wg.Wait()
			if st := srv.RateLimitStats(); st.Limited != 0 || st.Admitted < 13 {
				t.Fatalf("server admitted %d, sent %d 429s; want no 429 and at least 13 (of 15 possible)", st.Admitted, st.Limited)
			}
		})
	}
}

// An attempt is not sent from the line so close to the caller's deadline
// that an attempt of its group, as long as they have been taking, would
// not end before it: it would be counted by the API and cut off.
func TestRateLimitLeavesRoomForTheAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRLRig(t, damper.Policy{RateLimit: &damper.RateLimitPolicy{
			Limits: map[string]damper.RateLimits{"claude-sonnet-4": {RequestsPerMinute: 12}},
		}}, func(_ int, w http.ResponseWriter, _ *http.Request) {
			time.Sleep(2 * time.Second)
			answerPlain(w, 1, 0, 0, 1)
		})
		var wg sync.WaitGroup
		for range 12 {
			wg.Go(func() {
				if _, err := r.call(context.Background(), 16); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		// The bucket has room again in 3 s; attempts take 2 s, and the
		// room kept for one is 2 s plus four deviations (1 s at first, a
		// quarter less with each steady sample since): about 2.2 s.
		start := time.Now()
		ctx, cancel := context.WithDeadline(context.Background(), start.Add(4*time.Second))
		defer cancel()
		rep, err := r.call(ctx, 16)
		if !errors.Is(err, damper.ErrRateLimited) || rep.Attempts != 0 || time.Since(start) != 0 {
			t.Fatalf("err %v, %d attempts after %v; want ErrRateLimited at once", err, rep.Attempts, time.Since(start))
		}
		ctx, cancel = context.WithDeadline(context.Background(), start.Add(6*time.Second))
		defer cancel()
		if rep, err := r.call(ctx, 16); err != nil || rep.RateLimitWait != 3*time.Second {
			t.Fatalf("err %v, waited %v; want it sent after 3 s in line", err, rep.RateLimitWait)
		}
	})
}

// With MaxWait None an attempt never waits in line: one that finds room is
// sent, the next fails at once with ErrRateLimited.
func TestRateLimitNeverWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRLRig(t, damper.Policy{RateLimit: &damper.RateLimitPolicy{MaxWait: damper.None,
			Limits: map[string]damper.RateLimits{"claude-sonnet-4": {RequestsPerMinute: 1}}}},
			func(_ int, w http.ResponseWriter, _ *http.Request) { answerPlain(w, 1, 0, 0, 1) })
		if got := r.d.Policy().RateLimit.MaxWait; got != 0 {
			t.Fatalf("filled-in MaxWait = %v, want 0", got)
		}
		if _, err := r.call(context.Background(), 16); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if _, err := r.call(context.Background(), 16); !errors.Is(err, damper.ErrRateLimited) || time.Since(start) != 0 {
			t.Fatalf("err %v after %v, want ErrRateLimited at once", err, time.Since(start))
		}
	})
}

// One call whose max_tokens is far beyond the output bucket (1e12) takes
// no more than the bucket while it is in flight: ten ordinary calls made
// meanwhile wait only for their own tokens, 16 each at 8000 a minute,
// 120 ms apart, instead of being refused for years.
func TestRateLimitHugeMaxTokensHoldsOneBucket(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRLRig(t, damper.Policy{RateLimit: &damper.RateLimitPolicy{
			Limits: map[string]damper.RateLimits{"claude-sonnet-4": {OutputTokensPerMinute: 8000}},
		}}, func(n int, w http.ResponseWriter, _ *http.Request) {
			if n == 1 {
				time.Sleep(30 * time.Second) // the huge call, in flight
				answerPlain(w, 1, 0, 0, 100)
				return
			}
			answerPlain(w, 1, 0, 0, 1)
		})
		start := time.Now()
		huge := make(chan error, 1)
		go func() {
			_, err := r.call(context.Background(), 1e12)
			huge <- err
		}()
		synctest.Wait()
		var mu sync.Mutex
		var waits []time.Duration
		var wg sync.WaitGroup
		for range 10 {
			wg.Go(func() {
				rep, err := r.call(context.Background(), 16)
				if err != nil {
					t.Errorf("ordinary call: %v", err)
					return
				}
				mu.Lock()
				waits = append(waits, rep.RateLimitWait)
				mu.Unlock()
			})
		}
		wg.Wait()
		if err := <-huge; err != nil {
			t.Fatal(err)
		}
		slices.Sort(waits)
		var want []time.Duration
		for i := range 10 {
			want = append(want, time.Duration(i+1)*120*time.Millisecond)
		}
		if !slices.Equal(waits, want) {
			t.Fatalf("waits %v, want %v", waits, want)
		}
		// Settled by its usage: the bucket is full a minute after it
		// answered, less nothing.
		if s := r.bucketState(t, "output_tokens"); time.Since(start) != 30*time.Second || s.Remaining < 8000-100-10 {
			t.Fatalf("at +%v output bucket %+v", time.Since(start), s)
		}
	})
}

// Batch calls that give up waiting leave the batch line: after twenty of
// them are cancelled, the next batch call waits for its own request to
// refill, one second, not behind twenty empty slots.
func TestRateLimitBatchCallersThatGiveUpLeaveTheLine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRLRig(t, damper.Policy{RateLimit: &damper.RateLimitPolicy{
			Limits: map[string]damper.RateLimits{"claude-sonnet-4": {RequestsPerMinute: 60}},
		}}, func(_ int, w http.ResponseWriter, _ *http.Request) { answerPlain(w, 1, 0, 0, 1) })
		batch := damper.ContextWithPriority(context.Background(), damper.Batch)
		for i := range 48 { // down to the interactive reserve
			if _, err := r.call(batch, 16); err != nil {
				t.Fatalf("batch call %d: %v", i, err)
			}
		}
		start := time.Now()
		var cancels []context.CancelFunc
		var wg sync.WaitGroup
		for range 20 {
			ctx, cancel := context.WithCancel(batch)
			cancels = append(cancels, cancel)
			wg.Go(func() {
				if _, err := r.call(ctx, 16); !errors.Is(err, context.Canceled) {
					t.Errorf("cancelled batch call: %v", err)
				}
			})
			synctest.Wait() // it waits in line
		}
		for _, cancel := range cancels {
			cancel()
		}
		wg.Wait()
		rep, err := r.call(batch, 16)
		if err != nil || rep.RateLimitWait != time.Second || time.Since(start) != time.Second {
			t.Fatalf("err %v, waited %v (at +%v); want one second in line", err, rep.RateLimitWait, time.Since(start))
		}
	})
}

// A key of Limits that is a model ID configures its limit group, in a
// policy file as in Go: "claude-sonnet-4-5" limits every model of
// claude-sonnet-4, and two keys of one group are refused, naming both.
func TestRateLimitLimitsKeyedByModel(t *testing.T) {
	fromFile, err := damper.ParsePolicyYAML([]byte("rate_limit:\n  max_wait: 0\n  limits:\n    claude-sonnet-4-5: {requests_per_minute: 1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	fromGo := damper.Policy{RateLimit: &damper.RateLimitPolicy{MaxWait: damper.None,
		Limits: map[string]damper.RateLimits{"claude-sonnet-4-5-20250929": {RequestsPerMinute: 1}}}}
	for name, p := range map[string]damper.Policy{"file": fromFile, "go": fromGo} {
		synctest.Test(t, func(t *testing.T) {
			r := newRLRig(t, p, func(_ int, w http.ResponseWriter, _ *http.Request) { answerPlain(w, 1, 0, 0, 1) })
			if got := r.d.Policy().RateLimit.Limits; len(got) != 1 || got["claude-sonnet-4"].RequestsPerMinute != 1 {
				t.Fatalf("%s: the Damper's limits %v, want claude-sonnet-4's", name, got)
			}
			// claude-sonnet-4-6 is of the same group: its second call
			// finds the bucket empty.
			if _, err := r.call(context.Background(), 16); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if _, err := r.call(context.Background(), 16); !errors.Is(err, damper.ErrRateLimited) {
				t.Fatalf("%s: second call: %v, want ErrRateLimited", name, err)
			}
			if s := r.bucketState(t, "requests"); s.Limit != 1 || s.Learned {
				t.Fatalf("%s: requests bucket %+v, want the configured limit", name, s)
			}
		})
	}
	_, err = damper.New(damper.Policy{RateLimit: &damper.RateLimitPolicy{Limits: map[string]damper.RateLimits{
		"claude-sonnet-4": {RequestsPerMinute: 5}, "claude-sonnet-4-6": {RequestsPerMinute: 9}}}})
	if err == nil || !strings.Contains(err.Error(), `RateLimit.Limits["claude-sonnet-4-6"] = "claude-sonnet-4-6": names the limit group "claude-sonnet-4", as "claude-sonnet-4" does`) {
		t.Fatalf("two keys of one group: %v", err)
	}
}
