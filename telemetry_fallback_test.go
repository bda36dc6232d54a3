package damper_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"go.opentelemetry.io/otel/attribute"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// A call that moves says so in its spans, metrics and log: the backend of
// each attempt, the backend that answered, and the move with its reason.
func TestTelemetryFallback(t *testing.T) {
	second := dampertest.NewServer(dampertest.InMemory())
	t.Cleanup(second.Close)
	backend := damper.Backend{Name: "second", Provider: damper.ProviderAnthropic, Options: []option.RequestOption{
		option.WithBaseURL(dampertest.MemoryURL), option.WithAPIKey("second-key"),
		option.WithHTTPClient(&http.Client{Transport: dampertest.Transport(second.Handler())}),
	}}
	r := newTelRig(t, damper.Policy{MaxAttempts: 1}, []damper.Setting{damper.WithBackends(backend)})
	rep, err := r.call(t, "fb", "claude-sonnet-4-5", dampertest.Status(529))
	if err != nil || rep.Backend != "second" {
		t.Fatalf("err %v, answered by %q; want second", err, rep.Backend)
	}

	m := r.metricValues(t)
	for _, key := range []string{
		"damper.fallbacks{damper.fallback.from=primary,damper.fallback.reason=attempts_exhausted,damper.fallback.to=second}",
		"damper.attempts{damper.attempt.error_class=overloaded,damper.backend=primary,damper.provider=anthropic}",
		"damper.attempts{damper.backend=second,damper.provider=anthropic}",
		"damper.request.duration{damper.backend=second,damper.outcome=success,damper.provider=anthropic,damper.stream=false}.count",
	} {
		if m[key] != 1 {
			t.Errorf("%s = %v, want 1; have %v", key, m[key], strings.Join(keysWith(m, "backend"), " "))
		}
	}

	spans := r.spans.GetSpans()
	var sawAttempts []string
	for _, s := range spans {
		a := attribute.NewSet(s.Attributes...)
		backend, _ := a.Value("damper.backend")
		switch s.Name {
		case "damper.attempt":
			model, _ := a.Value("damper.model")
			sawAttempts = append(sawAttempts, backend.AsString()+":"+model.AsString())
		case "damper.request":
			moves, _ := a.Value("damper.fallbacks")
			if backend.AsString() != "second" || moves.AsInt64() != 1 {
				t.Errorf("request span: backend %q, fallbacks %d; want second, 1", backend.AsString(), moves.AsInt64())
			}
		}
	}
	if got := strings.Join(sawAttempts, " "); got != "primary:claude-sonnet-4-5 second:claude-sonnet-4-5" {
		t.Errorf("attempt spans %s, want the primary's then the second's", got)
	}

	var moved bool
	for _, l := range r.logLines(t) {
		if l["msg"] == "damper: falling back" {
			moved = l["from"] == "primary" && l["to"] == "second" && l["reason"] == "attempts_exhausted" && l["level"] == "WARN"
		}
	}
	if !moved {
		t.Errorf("no Warn line for the move in %v", r.logLines(t))
	}
}

func keysWith(m map[string]float64, part string) []string {
	var out []string
	for k := range m {
		if strings.Contains(k, part) {
			out = append(out, k)
		}
	}
	return out
}
