package damper_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
	"github.com/damper-ai/damper-go/internal/syncbuf"
)

// echoModel answers every Messages request 200 with a message that names,
// as the model that answered, the request's model as it came: a hostile
// upstream's answer as well as a hostile client's request.
func echoModel(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	model := body
	if i := bytes.Index(body, []byte(`"model":"`)); i >= 0 {
		model = body[i+len(`"model":"`):]
		model = model[:bytes.IndexByte(model, '"')]
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("anthropic-ratelimit-requests-limit", "1000")
	w.Header().Set("anthropic-ratelimit-requests-remaining", "999")
	_, _ = fmt.Fprintf(w, `{"id":"msg_1","type":"message","role":"assistant","model":"%s","content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","usage":{"input_tokens":3,"output_tokens":1}}`, model)
}

// promRig is an SDK client through a Damper whose metrics are scraped as
// `damper proxy` serves them: the OpenTelemetry Prometheus exporter and
// promhttp. Its calls send raw bodies, so that any bytes reach the engine
// (the proxy refuses such a model at its door; the engine must not rely on
// that).
type promRig struct {
	client anthropic.Client
	scrape http.Handler
	logs   *syncbuf.Buffer
}

func newPromRig(t *testing.T, p damper.Policy) *promRig {
	t.Helper()
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	logs := &syncbuf.Buffer{}
	logger := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	d, err := damper.New(p, damper.WithMeterProvider(mp), damper.WithLogger(logger),
		damper.WithClock(dampertest.NewClock(time.Now())))
	if err != nil {
		t.Fatal(err)
	}
	client := anthropic.NewClient(d.Option(),
		option.WithBaseURL("http://api.invalid"), option.WithAPIKey("test-key"),
		option.WithHTTPClient(&http.Client{Transport: dampertest.Transport(http.HandlerFunc(echoModel))}))
	return &promRig{client: client, scrape: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), logs: logs}
}

// send posts a Messages body whose model is model, as raw bytes.
func (r *promRig) send(t *testing.T, model string) {
	t.Helper()
	body := `{"model":"` + model + `","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`
	var rep damper.Report
	_, err := r.client.Messages.New(context.Background(), anthropic.MessageNewParams{},
		option.WithRequestBody("application/json", bytes.NewReader([]byte(body))), damper.ReportInto(&rep))
	if err != nil || rep.Outcome != damper.OutcomeSuccess {
		t.Fatalf("the call ended %q: %v", rep.Outcome, err)
	}
}

// metrics scrapes /metrics, failing the test unless the scrape succeeds.
func (r *promRig) metrics(t *testing.T) string {
	t.Helper()
	w := httptest.NewRecorder()
	r.scrape.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if w.Code != http.StatusOK {
		t.Fatalf("/metrics answered %d: %.300s", w.Code, w.Body)
	}
	return w.Body.String()
}

// labelValues returns the distinct values of label in the series of
// metric in a scrape.
func labelValues(scrape, metric, label string) map[string]bool {
	out := map[string]bool{}
	for line := range strings.Lines(scrape) {
		if !strings.HasPrefix(line, metric+"{") {
			continue
		}
		_, rest, ok := strings.Cut(line, label+`="`)
		if !ok {
			continue
		}
		v, _, _ := strings.Cut(rest, `"`)
		out[v] = true
	}
	return out
}

// A model of invalid UTF-8, from a client or echoed by the upstream, never
// reaches a label: the scrape succeeds, then and later, and the model is
// labelled "other".
func TestMetricsScrapeSurvivesInvalidModel(t *testing.T) {
	r := newPromRig(t, damper.Policy{RateLimit: &damper.RateLimitPolicy{}})
	r.send(t, "claude-sonnet-4-5")
	r.send(t, "bad\xff\xfe-model")
	for range 2 {
		scrape := r.metrics(t)
		if !utf8.ValidString(scrape) {
			t.Fatal("the scrape is not valid UTF-8")
		}
		models := labelValues(scrape, "gen_ai_client_operation_duration_seconds_count", "gen_ai_request_model")
		if !models["other"] || !models["claude-sonnet-4-5"] || len(models) != 2 {
			t.Errorf("gen_ai.request.model values %v, want claude-sonnet-4-5 and other", models)
		}
		responses := labelValues(scrape, "gen_ai_client_operation_duration_seconds_count", "gen_ai_response_model")
		if !responses["other"] || len(responses) != 2 {
			t.Errorf("gen_ai.response.model values %v, want claude-sonnet-4-5 and other", responses)
		}
		// A model of characters no model ID uses has the shared group.
		groups := labelValues(scrape, "damper_ratelimit_wait_seconds_count", "damper_ratelimit_group")
		if !groups["(other)"] || !groups["claude-sonnet-4"] || len(groups) != 2 {
			t.Errorf("damper.ratelimit.group values %v, want claude-sonnet-4 and (other)", groups)
		}
	}
}

// Distinct models beyond the bound share one series, "other", and so
// leave /metrics and the log lines bounded; a model the price table prices
// keeps its own series however many unknown models came first. The GenAI
// metrics give the first 8 combinations of each pool of models (priced or
// not) a series of their own, the rate limiter's metrics the first 8
// groups beyond those its price table knows.
func TestModelLabelsBounded(t *testing.T) {
	r := newPromRig(t, damper.Policy{RateLimit: &damper.RateLimitPolicy{}})
	const distinct = 100
	long := strings.Repeat("m", 64<<10)
	for i := range distinct {
		// Every other model is too long to be an ID.
		r.send(t, fmt.Sprintf("%s-%d", long[:10+i%2*(64<<10-20)], i))
	}
	r.send(t, "claude-sonnet-4-5-20250929") // priced by its family
	r.send(t, "claude-haiku-4-5")           // a key of the price table
	scrape := r.metrics(t)
	models := labelValues(scrape, "gen_ai_client_operation_duration_seconds_count", "gen_ai_request_model")
	// Of the 50 short models, the first 8; then other and the priced two.
	if n := len(models); n != 8+3 {
		t.Errorf("%d values of gen_ai.request.model, want 8 unknown, other and the two priced: %v", n, models)
	}
	if !models["other"] || !models["claude-sonnet-4-5-20250929"] || !models["claude-haiku-4-5"] || !models["mmmmmmmmmm-14"] || models["mmmmmmmmmm-16"] {
		t.Errorf("gen_ai.request.model lacks other or a priced model, or holds a short model beyond the 8th: %v", models)
	}
	groups := labelValues(scrape, "damper_ratelimit_wait_seconds_count", "damper_ratelimit_group")
	if n := len(groups); n != 8+3 {
		t.Errorf("%d values of damper.ratelimit.group, want 8, other, claude-sonnet-4 and claude-haiku-4: %v", n, groups)
	}
	if len(scrape) > 2<<20 {
		t.Errorf("/metrics is %d bytes after %d distinct models", len(scrape), distinct)
	}
	for line := range strings.Lines(r.logs.String()) {
		if len(line) > 2<<10 {
			t.Fatalf("a log line of %d bytes: %.200s", len(line), line)
		}
	}
}
