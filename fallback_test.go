package damper_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// fbRig is a Damper on a virtual clock whose client reaches a primary fake
// API, with a second fake API, "second", to fall back to.
type fbRig struct {
	clk             *dampertest.Clock
	primary, second *dampertest.Server
	d               *damper.Damper
	client          anthropic.Client

	mu   sync.Mutex
	keys []string // the authorization of every request the second API got
}

func newFallbackRig(t *testing.T, p damper.Policy, backend func(opts []option.RequestOption) damper.Backend, primary ...dampertest.ServerOption) *fbRig {
	t.Helper()
	r := &fbRig{clk: dampertest.NewClock(time.Now().Truncate(time.Minute).Add(time.Minute))}
	r.primary = dampertest.NewServer(append([]dampertest.ServerOption{dampertest.WithClock(r.clk)}, primary...)...)
	r.second = dampertest.NewServer(dampertest.WithClock(r.clk), dampertest.InMemory())
	t.Cleanup(r.primary.Close)
	t.Cleanup(r.second.Close)
	seen := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.keys = append(r.keys, req.Header.Get("Authorization"))
		r.mu.Unlock()
		r.second.Handler().ServeHTTP(w, req)
	})
	opts := []option.RequestOption{
		option.WithBaseURL(dampertest.MemoryURL), option.WithAPIKey("second-key"),
		option.WithHTTPClient(&http.Client{Transport: dampertest.Transport(seen)}),
	}
	b := damper.Backend{Name: "second", Provider: damper.ProviderAnthropic, Options: opts}
	if backend != nil {
		b = backend(opts)
	}
	d, err := damper.New(p, damper.WithClock(r.clk), damper.WithRand(half), damper.WithBackends(b))
	if err != nil {
		t.Fatal(err)
	}
	r.d = d
	r.client = anthropic.NewClient(append([]option.RequestOption{d.Option()}, r.primary.Options()...)...)
	return r
}

func (r *fbRig) call(t *testing.T, model string) (damper.Report, error) {
	t.Helper()
	var rep damper.Report
	_, err := r.client.Messages.New(context.Background(), params(model), damper.ReportInto(&rep))
	return rep, err
}

// backends lists the backend of each attempt of rep.
func backends(rep damper.Report) string {
	var b []string
	for _, a := range rep.AttemptLog {
		b = append(b, a.Backend)
	}
	return strings.Join(b, ",")
}

// In a full outage of the primary every call is answered by the second
// backend: first once the primary's retries end, then, once its breaker
// opens, with no attempt at the primary at all. When the primary recovers,
// the breaker's probe finds it and the traffic goes back.
func TestFallbackThroughAnOutage(t *testing.T) {
	r := newFallbackRig(t, damper.Policy{
		Breaker: &damper.BreakerPolicy{MinAttempts: 4, OpenFor: 10 * time.Second},
	}, nil)
	r.primary.Script("", dampertest.Status(529))

	want := []struct {
		backends string
		reason   string
	}{
		// Three 529s use the primary's attempts; the fourth opens its
		// breaker, which then refuses the retry, and then every attempt.
		{"primary,primary,primary,second", "attempts_exhausted"},
		{"primary,second", "circuit_open"},
		{"second", "circuit_open"},
		{"second", "circuit_open"},
	}
	for i, w := range want {
		rep, err := r.call(t, "claude-sonnet-4-5")
		if err != nil {
			t.Fatalf("call %d: %v", i+1, err)
		}
		if got := backends(rep); got != w.backends || rep.Backend != "second" || rep.Outcome != damper.OutcomeSuccess {
			t.Fatalf("call %d: attempts on %s, answered by %q (%s); want %s, answered by second", i+1, got, rep.Backend, rep.Outcome, w.backends)
		}
		wantFb := []damper.Fallback{{From: "primary", To: "second", Model: "claude-sonnet-4-5", Reason: w.reason}}
		if !slices.Equal(rep.Fallbacks, wantFb) {
			t.Fatalf("call %d: fallbacks %+v, want %+v", i+1, rep.Fallbacks, wantFb)
		}
	}
	if n := r.primary.Count(""); n != 4 {
		t.Fatalf("primary got %d attempts, want 4", n)
	}
	if n := r.second.Count(""); n != len(want) {
		t.Fatalf("second got %d attempts, want %d", n, len(want))
	}
	// Each backend's own credentials: the caller's key never leaves for
	// the second backend.
	for _, k := range r.keys {
		if k != "Bearer second-key" {
			t.Fatalf("second backend got authorization %q, want its own (%q)", k, r.keys)
		}
	}

	// The primary recovers; once the breaker's open period is over, its
	// probe is answered and the calls stay there.
	r.primary.Script("", dampertest.OK())
	r.clk.Advance(10 * time.Second)
	for i := range 3 {
		rep, err := r.call(t, "claude-sonnet-4-5")
		if err != nil || backends(rep) != "primary" || rep.Backend != "primary" || len(rep.Fallbacks) != 0 {
			t.Fatalf("after recovery, call %d: %v, attempts on %s, fallbacks %+v; want the primary alone", i+1, err, backends(rep), rep.Fallbacks)
		}
		if probe := rep.AttemptLog[0].Probe; probe != (i == 0) {
			t.Fatalf("after recovery, call %d: probe %v", i+1, probe)
		}
	}
	if n := r.second.Count(""); n != len(want) {
		t.Fatalf("second got %d attempts after the recovery, want none", n-len(want))
	}
}

// The caller's own errors never move a call; a spend limit moves it only
// with OnSpendLimit.
func TestFallbackNotOnCallerErrors(t *testing.T) {
	tests := []struct {
		name  string
		step  dampertest.Step
		onSL  bool
		moves bool
	}{
		{"400", dampertest.Status(400).WithError("invalid_request_error", ""), false, false},
		{"401", dampertest.Status(401).WithError("authentication_error", ""), false, false},
		{"404", dampertest.Status(404).WithError("not_found_error", ""), false, false},
		{"413", dampertest.Status(413).WithError("request_too_large", ""), false, false},
		{"x-should-retry false on a 529", dampertest.Status(529).ShouldRetry(false), false, false},
		{"spend limit", dampertest.SpendLimit(), false, false},
		{"spend limit, OnSpendLimit", dampertest.SpendLimit(), true, true},
		{"400, OnSpendLimit", dampertest.Status(400).WithError("invalid_request_error", ""), true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newFallbackRig(t, damper.Policy{Fallback: &damper.FallbackPolicy{OnSpendLimit: tt.onSL}}, nil)
			r.primary.Script("", tt.step)
			rep, err := r.call(t, "claude-sonnet-4-5")
			if tt.moves {
				if err != nil || backends(rep) != "primary,second" || rep.Fallbacks[0].Reason != "spend_limit" {
					t.Fatalf("%v, attempts on %s, fallbacks %+v; want an answer from second after a spend_limit move", err, backends(rep), rep.Fallbacks)
				}
				return
			}
			var apiErr *anthropic.Error
			if !errors.As(err, &apiErr) || apiErr.StatusCode != tt.step.Status {
				t.Fatalf("err %v, want the primary's %d", err, tt.step.Status)
			}
			if r.second.Count("") != 0 || len(rep.Fallbacks) != 0 || backends(rep) != "primary" {
				t.Fatalf("second got %d requests, fallbacks %+v: want none", r.second.Count(""), rep.Fallbacks)
			}
		})
	}
}

// A stream moves before its first content, and the caller reads only the
// second backend's events; after content it never moves.
func TestFallbackStreams(t *testing.T) {
	t.Run("before content", func(t *testing.T) {
		r := newFallbackRig(t, damper.Policy{MaxAttempts: 1}, nil)
		r.primary.Script("", dampertest.OK().WithStream(dampertest.Stream{Text: "primary", Fault: dampertest.FaultErrorEvent, At: 2}))
		r.second.Script("", dampertest.OK().WithStream(dampertest.Stream{Text: "from the second backend"}))
		var rep damper.Report
		msg := streamWhole(t, r.client, "claude-sonnet-4-5", &rep)
		if got := msg.Content[0].Text; got != "from the second backend" || len(msg.Content) != 1 {
			t.Fatalf("caller read %q, want the second backend's events alone", got)
		}
		if backends(rep) != "primary,second" || rep.Fallbacks[0].Reason != "attempts_exhausted" || rep.Outcome != damper.OutcomeSuccess {
			t.Fatalf("attempts on %s, fallbacks %+v, outcome %s", backends(rep), rep.Fallbacks, rep.Outcome)
		}
	})
	t.Run("after content", func(t *testing.T) {
		r := newFallbackRig(t, damper.Policy{}, nil)
		r.primary.Script("", dampertest.OK().WithStream(dampertest.Stream{Text: "a long answer from the primary", Fault: dampertest.FaultErrorEvent, At: 4}))
		var rep damper.Report
		s := r.client.Messages.NewStreaming(context.Background(), params("claude-sonnet-4-5"), damper.ReportInto(&rep))
		for s.Next() {
		}
		if !errors.Is(s.Err(), damper.ErrAmbiguous) {
			t.Fatalf("stream error %v, want ErrAmbiguous", s.Err())
		}
		_ = s.Close()
		if r.second.Count("") != 0 || len(rep.Fallbacks) != 0 || rep.Outcome != damper.OutcomeAmbiguous {
			t.Fatalf("second got %d requests, fallbacks %+v, outcome %s: want none, ambiguous", r.second.Count(""), rep.Fallbacks, rep.Outcome)
		}
	})
}

// A sibling model is tried once every backend has been tried with the
// model itself, and the cost ceiling covers every attempt of the call, at
// each model's price.
func TestFallbackToSiblingModel(t *testing.T) {
	opusThenSonnet := func(req dampertest.Request) dampertest.Step {
		if strings.Contains(string(req.Body), "claude-opus-4-5") {
			return dampertest.Status(529)
		}
		return dampertest.OK()
	}
	siblings := &damper.FallbackPolicy{Models: map[string][]string{"claude-opus-4-5": {"claude-sonnet-4-5"}}}
	tests := []struct {
		name     string
		ceiling  float64
		backends string
		err      bool
	}{
		// Opus's 1,024 output tokens cost $0.0256 an attempt, Sonnet's
		// $0.01536: after one failed Opus attempt on each backend, the
		// ceiling must hold one Opus and one Sonnet attempt.
		{"no ceiling", 0, "primary,second,primary", false},
		{"ceiling holds both", 0.042, "primary,second,primary", false},
		{"ceiling holds the second backend only", 0.03, "primary,second", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newFallbackRig(t, damper.Policy{MaxAttempts: 1, MaxRetryCostUSD: tt.ceiling, Fallback: siblings}, nil,
				dampertest.WithStepFunc(opusThenSonnet))
			r.second.Script("", dampertest.Status(529))
			rep, err := r.call(t, "claude-opus-4-5")
			if got := backends(rep); got != tt.backends || (err != nil) != tt.err {
				t.Fatalf("attempts on %s, err %v; want %s, error %v", got, err, tt.backends, tt.err)
			}
			if tt.err {
				return
			}
			last := rep.AttemptLog[len(rep.AttemptLog)-1]
			wantFb := []damper.Fallback{
				{From: "primary", To: "second", Model: "claude-opus-4-5", Reason: "attempts_exhausted"},
				{From: "second", To: "primary", Model: "claude-sonnet-4-5", Reason: "attempts_exhausted"},
			}
			if last.Model != "claude-sonnet-4-5" || !slices.Equal(rep.Fallbacks, wantFb) {
				t.Fatalf("last attempt sent %q, fallbacks %+v; want claude-sonnet-4-5 after %+v", last.Model, rep.Fallbacks, wantFb)
			}
			if want := 0.0256 + 0.01536; rep.RetryCostUSD < want-1e-4 || rep.RetryCostUSD > want+1e-3 {
				t.Fatalf("retry cost %v, want about %v (one Opus and one Sonnet attempt)", rep.RetryCostUSD, want)
			}
		})
	}
}

// A move needs room before the caller's deadline for an attempt.
func TestFallbackKeepsTheDeadline(t *testing.T) {
	r := newFallbackRig(t, damper.Policy{MaxAttempts: 1}, nil)
	r.primary.Script("", dampertest.Status(529).WithDelay(900*time.Millisecond))
	ctx, cancel := context.WithDeadline(context.Background(), r.clk.Now().Add(time.Second))
	defer cancel()
	var rep damper.Report
	_, err := r.client.Messages.New(ctx, params("claude-sonnet-4-5"), damper.ReportInto(&rep))
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 529 || r.second.Count("") != 0 {
		t.Fatalf("err %v, second got %d: want the primary's 529 and no move", err, r.second.Count(""))
	}
}

// A model the second backend has no ID for does not move to it, and the
// report says why; Backend.Models gives one.
func TestFallbackNeedsAModelID(t *testing.T) {
	r := newFallbackRig(t, damper.Policy{MaxAttempts: 1}, func(opts []option.RequestOption) damper.Backend {
		return damper.Backend{Name: "second", Provider: damper.ProviderBedrock, Options: opts,
			Models: map[string]string{"claude-sonnet-4-6": "anthropic.claude-sonnet-4-6"}}
	})
	r.primary.Script("", dampertest.Status(529))
	rep, err := r.call(t, "claude-unknown-9")
	wantSkip := []damper.Skip{{Backend: "second", Model: "claude-unknown-9", Reason: damper.SkipNoModelID}}
	if err == nil || r.second.Count("") != 0 || !slices.Equal(rep.Skipped, wantSkip) {
		t.Fatalf("err %v, second got %d, skipped %+v: want the primary's 529, no move, skipped %+v", err, r.second.Count(""), rep.Skipped, wantSkip)
	}
	rep, err = r.call(t, "claude-sonnet-4-6")
	if err != nil || backends(rep) != "primary,second" || rep.AttemptLog[1].Model != "anthropic.claude-sonnet-4-6" || rep.Skipped != nil {
		t.Fatalf("err %v, attempts on %s, skipped %+v: want an answer from second under Models' ID", err, backends(rep), rep.Skipped)
	}
}

func TestWithBackendsErrors(t *testing.T) {
	ok := damper.Backend{Name: "b", Provider: damper.ProviderBedrock}
	tests := []struct {
		name     string
		backends []damper.Backend
		want     string
	}{
		{"no name", []damper.Backend{{Provider: damper.ProviderBedrock}}, `backend 1 (""): Name is required`},
		{"primary", []damper.Backend{{Name: "primary", Provider: damper.ProviderBedrock}}, `Name "primary" is taken`},
		{"twice", []damper.Backend{ok, ok}, `backend 2 ("b"): Name "b" is taken`},
		{"provider", []damper.Backend{{Name: "b", Provider: "bedrock"}}, `Provider "bedrock": must be "anthropic", "aws.bedrock" or "gcp.vertex_ai"`},
		{"empty model", []damper.Backend{{Name: "b", Provider: damper.ProviderVertex, Models: map[string]string{"claude-x": ""}}}, `Models["claude-x"] = "": neither may be empty`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := damper.New(damper.Policy{}, damper.WithBackends(tt.backends...))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err %v, want it to say %q", err, tt.want)
			}
		})
	}
	_, err := damper.New(damper.Policy{Fallback: &damper.FallbackPolicy{Models: map[string][]string{"claude-a": {"claude-a"}}}})
	if err == nil || !strings.Contains(err.Error(), `Fallback.Models["claude-a"]`) {
		t.Fatalf("err %v, want it to name Fallback.Models", err)
	}
}

func TestDefaultModelID(t *testing.T) {
	tests := []struct {
		provider, model, want string
	}{
		{damper.ProviderAnthropic, "claude-sonnet-4-5", "claude-sonnet-4-5"},
		{damper.ProviderAnthropic, "claude-sonnet-4-5@20250929", "claude-sonnet-4-5-20250929"},
		{damper.ProviderAnthropic, "global.anthropic.claude-sonnet-4-5-20250929-v1:0", "claude-sonnet-4-5-20250929"},
		{damper.ProviderBedrock, "claude-sonnet-4-5", "global.anthropic.claude-sonnet-4-5-20250929-v1:0"},
		{damper.ProviderBedrock, "claude-opus-4-1-20250805", "us.anthropic.claude-opus-4-1-20250805-v1:0"},
		{damper.ProviderBedrock, "eu.anthropic.claude-sonnet-4-5-20250929-v1:0", "eu.anthropic.claude-sonnet-4-5-20250929-v1:0"},
		{damper.ProviderBedrock, "claude-haiku-4-5@20251001", "global.anthropic.claude-haiku-4-5-20251001-v1:0"},
		{damper.ProviderVertex, "claude-haiku-4-5", "claude-haiku-4-5@20251001"},
		{damper.ProviderVertex, "anthropic.claude-3-5-haiku-20241022-v1:0", "claude-3-5-haiku@20241022"},
		{damper.ProviderVertex, "claude-sonnet-4-6", ""},
		{damper.ProviderBedrock, "claude-opus-5-5", ""},
		{"openai", "claude-sonnet-4-5", ""},
		// The first-party API takes a model as it is named, unless it is
		// in a platform's form.
		{damper.ProviderAnthropic, "claude-sonnet-4-6", "claude-sonnet-4-6"},
		{damper.ProviderAnthropic, "claude-opus-5-5", "claude-opus-5-5"},
		{damper.ProviderAnthropic, "claude-sonnet-4-6-20260101", "claude-sonnet-4-6-20260101"},
		{damper.ProviderAnthropic, "global.anthropic.claude-sonnet-4-6", ""},
		{damper.ProviderAnthropic, "anthropic.claude-opus-4-6-v1", ""},
		{damper.ProviderAnthropic, "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/abc", ""},
		{damper.ProviderAnthropic, "claude-sonnet-4-6@20260101", ""},
		{damper.ProviderAnthropic, "", ""},
	}
	for _, tt := range tests {
		got, ok := damper.DefaultModelIDForTest(tt.provider, tt.model)
		if got != tt.want || ok != (tt.want != "") {
			t.Errorf("DefaultModelID(%q, %q) = %q, %v; want %q", tt.provider, tt.model, got, ok, tt.want)
		}
	}
}

// TestFallbackGuideModelTable: the fallback guide's table of platform IDs
// is the one Damper looks models up in, row by row, by each of its IDs.
func TestFallbackGuideModelTable(t *testing.T) {
	guide, err := os.ReadFile("docs/guide/fallback.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^ *\\| `(claude-[^`]+)` \\| `([^`]+)` \\| `([^`]+)` \\|$")
	rows := row.FindAllStringSubmatch(string(guide), -1)
	if len(rows) != 8 {
		t.Fatalf("%d rows of model IDs in the guide, want 8", len(rows))
	}
	for _, r := range rows {
		for _, named := range r[1:] {
			for i, provider := range []string{damper.ProviderAnthropic, damper.ProviderBedrock, damper.ProviderVertex} {
				if got, ok := damper.DefaultModelIDForTest(provider, named); !ok || got != r[1+i] {
					t.Errorf("%s's ID of %s: %q, %v; the guide says %q", provider, named, got, ok, r[1+i])
				}
			}
		}
	}
}

// streamWhole makes one streaming call and returns the message its events
// build, failing the test on any error.
func streamWhole(t *testing.T, client anthropic.Client, model string, rep *damper.Report) anthropic.Message {
	t.Helper()
	s := client.Messages.NewStreaming(context.Background(), params(model), damper.ReportInto(rep))
	defer func() { _ = s.Close() }()
	var msg anthropic.Message
	for s.Next() {
		if err := msg.Accumulate(s.Current()); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	return msg
}
