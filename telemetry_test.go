package damper_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/damper-ai/damper-go/fleet"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// Models of the telemetry tests: one with a price, one without.
const (
	pricedModel   = "claude-sonnet-4-5"
	unpricedModel = dampertest.DefaultModel
)

// telRig is a Damper on a virtual clock in front of the fake API, whose
// spans, metrics and log lines are kept in memory.
type telRig struct {
	start  time.Time
	clock  *dampertest.Clock
	srv    *dampertest.Server
	d      *damper.Damper
	client anthropic.Client
	tp     *sdktrace.TracerProvider
	spans  *tracetest.InMemoryExporter
	reader *sdkmetric.ManualReader
	logs   *bytes.Buffer
}

// newTelRig builds a rig; clientOpts go to the client after Damper's
// option and the fake server's.
func newTelRig(t *testing.T, p damper.Policy, settings []damper.Setting, clientOpts ...option.RequestOption) *telRig {
	t.Helper()
	// The virtual clock starts at the next whole minute: close to the real
	// time, since the SDK's request timeout is a real deadline that Damper
	// checks its waits against, and at the start of a budget window, so
	// that a test's few virtual seconds never straddle two windows.
	r := &telRig{start: time.Now().Truncate(time.Minute).Add(time.Minute), spans: tracetest.NewInMemoryExporter(), reader: sdkmetric.NewManualReader(), logs: &bytes.Buffer{}}
	r.clock = dampertest.NewClock(r.start)
	r.srv = dampertest.NewServer(dampertest.WithClock(r.clock))
	t.Cleanup(r.srv.Close)
	r.tp = sdktrace.NewTracerProvider(sdktrace.WithSyncer(r.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r.reader))
	t.Cleanup(func() {
		_ = r.tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	logger := slog.New(slog.NewJSONHandler(r.logs, &slog.HandlerOptions{
		Level: slog.LevelDebug,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey && len(groups) == 0 {
				return slog.Attr{} // real time: not part of what is asserted
			}
			return a
		},
	}))
	all := append([]damper.Setting{
		damper.WithClock(r.clock), damper.WithRand(func() float64 { return 0.5 }),
		damper.WithTracerProvider(r.tp), damper.WithMeterProvider(mp), damper.WithLogger(logger),
	}, settings...)
	d, err := damper.New(p, all...)
	if err != nil {
		t.Fatal(err)
	}
	r.d = d
	opts := append(append([]option.RequestOption{d.Option()}, r.srv.Options()...), clientOpts...)
	r.client = anthropic.NewClient(opts...)
	return r
}

func telParams(model string) anthropic.MessageNewParams {
	return anthropic.MessageNewParams{
		Model:     anthropic.Model(model),
		MaxTokens: 1024,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Explain retry storms"))},
	}
}

// call makes one Messages.New call in scenario, returning its report.
func (r *telRig) call(t *testing.T, scenario, model string, steps ...dampertest.Step) (damper.Report, error) {
	t.Helper()
	r.srv.Script(scenario, steps...)
	var rep damper.Report
	_, err := r.client.Messages.New(context.Background(), telParams(model), dampertest.Scenario(scenario), damper.ReportInto(&rep))
	return rep, err
}

// wantSpan is an exported span as a test expects it. Start and End are
// offsets from the rig's start on the virtual clock.
type wantSpan struct {
	Name       string
	Parent     string // the parent's name, "" for a root
	Start, End time.Duration
	Status     codes.Code
	Attrs      map[attribute.Key]attribute.Value
}

func attrs(kvs ...attribute.KeyValue) map[attribute.Key]attribute.Value {
	m := make(map[attribute.Key]attribute.Value, len(kvs))
	for _, kv := range kvs {
		m[kv.Key] = kv.Value
	}
	return m
}

// checkSpans asserts the exported spans, in the order they ended, with
// every attribute, their parents, times and statuses, and that they form
// one trace.
func (r *telRig) checkSpans(t *testing.T, want []wantSpan) {
	t.Helper()
	got := r.spans.GetSpans()
	names := map[[8]byte]string{}
	for _, s := range got {
		names[s.SpanContext.SpanID()] = s.Name
	}
	if len(got) != len(want) {
		var gotNames []string
		for _, s := range got {
			gotNames = append(gotNames, s.Name)
		}
		t.Fatalf("spans: got %d %v, want %d", len(got), gotNames, len(want))
	}
	for i, w := range want {
		s := got[i]
		if s.Name != w.Name {
			t.Errorf("span %d: name %q, want %q", i, s.Name, w.Name)
		}
		parent := ""
		if s.Parent.IsValid() {
			parent = names[s.Parent.SpanID()]
			if parent == "" {
				parent = "<unknown>"
			}
		}
		if parent != w.Parent {
			t.Errorf("span %d %s: parent %q, want %q", i, w.Name, parent, w.Parent)
		}
		if s.SpanContext.TraceID() != got[0].SpanContext.TraceID() {
			t.Errorf("span %d %s: not in the trace of the others", i, w.Name)
		}
		if start, end := s.StartTime.Sub(r.start), s.EndTime.Sub(r.start); start != w.Start || end != w.End {
			t.Errorf("span %d %s: from %v to %v, want %v to %v", i, w.Name, start, end, w.Start, w.End)
		}
		if s.Status.Code != w.Status {
			t.Errorf("span %d %s: status %v, want %v", i, w.Name, s.Status.Code, w.Status)
		}
		if s.SpanKind != trace.SpanKindInternal {
			t.Errorf("span %d %s: kind %v, want internal", i, w.Name, s.SpanKind)
		}
		if ga := attrs(s.Attributes...); !reflect.DeepEqual(ga, w.Attrs) {
			t.Errorf("span %d %s: attributes\n got %v\nwant %v", i, w.Name, sortedAttrs(ga), sortedAttrs(w.Attrs))
		}
	}
}

func sortedAttrs(m map[attribute.Key]attribute.Value) []string {
	var out []string
	for k, v := range m {
		out = append(out, fmt.Sprintf("%s=%s(%s)", k, v.String(), v.Type()))
	}
	slices.Sort(out)
	return out
}

// metricValues collects the rig's metrics as name{attributes} → value;
// a histogram gives name{attributes}.count and .sum.
func (r *telRig) metricValues(t *testing.T) map[string]float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			key := func(s attribute.Set) string {
				return m.Name + "{" + s.Encoded(attribute.DefaultEncoder()) + "}"
			}
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range data.DataPoints {
					out[key(p.Attributes)] = float64(p.Value)
				}
			case metricdata.Sum[float64]:
				for _, p := range data.DataPoints {
					out[key(p.Attributes)] = p.Value
				}
			case metricdata.Gauge[float64]:
				for _, p := range data.DataPoints {
					out[key(p.Attributes)] = p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range data.DataPoints {
					out[key(p.Attributes)+".count"] = float64(p.Count)
					out[key(p.Attributes)+".sum"] = p.Sum
				}
			case metricdata.Histogram[int64]:
				for _, p := range data.DataPoints {
					out[key(p.Attributes)+".count"] = float64(p.Count)
					out[key(p.Attributes)+".sum"] = float64(p.Sum)
				}
			default:
				t.Fatalf("metric %s: unexpected data %T", m.Name, m.Data)
			}
		}
	}
	return out
}

func checkMetrics(t *testing.T, got, want map[string]float64) {
	t.Helper()
	if !maps.Equal(got, want) {
		t.Errorf("metrics:\n got %v\nwant %v", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)))
		for _, k := range slices.Sorted(maps.Keys(want)) {
			if got[k] != want[k] {
				t.Errorf("  %s = %v, want %v", k, got[k], want[k])
			}
		}
		for _, k := range slices.Sorted(maps.Keys(got)) {
			if _, ok := want[k]; !ok {
				t.Errorf("  %s = %v, not wanted", k, got[k])
			}
		}
	}
}

// logLines returns the rig's log lines, decoded.
func (r *telRig) logLines(t *testing.T) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(r.logs.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

func checkLogs(t *testing.T, got, want []map[string]any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("log lines:\n got %v\nwant %v", got, want)
	}
}

const (
	ms       = time.Millisecond
	anth     = "damper.provider=anthropic"
	reqSpan  = "damper.request"
	tryoSpan = "damper.attempt"
)

// durKey is the key of the request duration histogram's count or sum.
func durKey(outcome string, stream bool, field string) string {
	return fmt.Sprintf("damper.request.duration{damper.outcome=%s,%s,damper.stream=%t}.%s", outcome, anth, stream, field)
}

// genAI names the series of the GenAI metrics that a rig's calls record:
// every one carries the operation, the provider, the request's model, the
// answer's model when an answer came, and the server's address and port.
type genAI struct {
	provider string
	server   string
	port     int
	extra    []attribute.KeyValue // on every series: damper.name, when named
}

// genAI returns the GenAI series of calls to the rig's fake API.
func (r *telRig) genAI(t *testing.T) genAI {
	t.Helper()
	u, err := url.Parse(r.srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		t.Fatal(err)
	}
	return genAI{provider: "anthropic", server: u.Hostname(), port: port}
}

// key returns the key, as metricValues has it, of metric's series for a
// call to model ("" for a series without the models) answered by response
// ("" when no answer came), with more.
func (g genAI) key(metric, model, response string, more ...attribute.KeyValue) string {
	kvs := append([]attribute.KeyValue{
		attribute.String("gen_ai.operation.name", "chat"),
		attribute.String("gen_ai.provider.name", g.provider),
		attribute.String("server.address", g.server),
		attribute.Int("server.port", g.port),
	}, g.extra...)
	if model != "" {
		kvs = append(kvs, attribute.String("gen_ai.request.model", model))
	}
	if response != "" {
		kvs = append(kvs, attribute.String("gen_ai.response.model", response))
	}
	set := attribute.NewSet(append(kvs, more...)...)
	return metric + "{" + set.Encoded(attribute.DefaultEncoder()) + "}"
}

// histogram adds to m the count and sum of a histogram's series.
func histogram(m map[string]float64, key string, count, sum float64) map[string]float64 {
	m[key+".count"] += count
	m[key+".sum"] += sum
	return m
}

// duration adds to m n calls that took secs each and failed with errType
// ("" for none).
func (g genAI) duration(m map[string]float64, model, response, errType string, n int, secs float64) map[string]float64 {
	var more []attribute.KeyValue
	if errType != "" {
		more = append(more, attribute.String("error.type", errType))
	}
	return histogram(m, g.key("gen_ai.client.operation.duration", model, response, more...), float64(n), float64(n)*secs)
}

// firstChunk adds to m a stream that reached its caller after secs.
func (g genAI) firstChunk(m map[string]float64, model, response string, secs float64) map[string]float64 {
	return histogram(m, g.key("gen_ai.client.operation.time_to_first_chunk", model, response), 1, secs)
}

// tokens adds to m the usage of n answers, each of in input tokens (cache
// read and creation included: cacheRead and cacheCreation of them) and,
// when out >= 0, out output tokens.
func (g genAI) tokens(m map[string]float64, model, response string, n int, in, cacheRead, cacheCreation, out int) map[string]float64 {
	tok := func(typ string) string {
		return g.key("gen_ai.client.token.usage", model, response, attribute.String("gen_ai.token.type", typ))
	}
	// The cache's breakdown is Damper's own metric: no model.
	cache := func(c string) string {
		return g.key("damper.token.cache_usage", "", "", attribute.String("damper.token.cache", c))
	}
	histogram(m, tok("input"), float64(n), float64(n*in))
	if out >= 0 {
		histogram(m, tok("output"), float64(n), float64(n*out))
	}
	histogram(m, cache("read"), float64(n), float64(n*cacheRead))
	return histogram(m, cache("creation"), float64(n), float64(n*cacheCreation))
}

// requestAttrs are the attributes of a damper.request span.
func requestAttrs(rep damper.Report, extra ...attribute.KeyValue) map[attribute.Key]attribute.Value {
	kvs := []attribute.KeyValue{
		attribute.String("damper.provider", "anthropic"),
		attribute.String("damper.model", rep.Model),
		attribute.Float64("damper.retry_budget.ratio", 0.1),
		attribute.Int("damper.attempts", rep.Attempts),
		attribute.String("damper.outcome", string(rep.Outcome)),
		attribute.Float64("damper.retry_budget.balance", rep.BudgetBalance),
	}
	if rep.Priced {
		kvs = append(kvs,
			attribute.Float64("damper.cost.estimate_usd", rep.EstimatedCostUSD),
			attribute.Float64("damper.cost.retry_usd", rep.RetryCostUSD))
	}
	return attrs(append(kvs, extra...)...)
}

// telCase is one call through a rig and every output it must leave: the
// caller's error and report, the spans, metrics and log lines.
type telCase struct {
	name     string
	policy   damper.Policy
	settings []damper.Setting
	scenario string
	model    string
	steps    []dampertest.Step
	stream   bool
	// beforeRead runs once a stream is open, before the caller reads it.
	beforeRead func(t *testing.T, r *telRig)

	err    func(t *testing.T, err error)
	report func(rep damper.Report, text string) bool // nil: not checked
	spans  func(rep damper.Report) []wantSpan
	// metrics are all the metrics, exactly; if nil, only that none starts
	// with one of noMetrics is checked.
	metrics   func(rep damper.Report, g genAI) map[string]float64
	noMetrics []string
	// logs are all the log lines, exactly; if nil and logLine is set, there
	// is one line, holding logLine's fields.
	logs    func(rep damper.Report) []map[string]any
	logLine map[string]any
}

// run makes tc's call and returns the report, for a stream the text the
// caller read, and the error.
func (tc telCase) run(t *testing.T, r *telRig) (damper.Report, string, error) {
	t.Helper()
	if !tc.stream {
		rep, err := r.call(t, tc.scenario, tc.model, tc.steps...)
		return rep, "", err
	}
	r.srv.Script(tc.scenario, tc.steps...)
	var rep damper.Report
	stream := r.client.Messages.NewStreaming(context.Background(), telParams(tc.model), dampertest.Scenario(tc.scenario), damper.ReportInto(&rep))
	if tc.beforeRead != nil {
		tc.beforeRead(t, r)
	}
	var text strings.Builder
	for stream.Next() {
		if ev := stream.Current(); ev.Type == "content_block_delta" {
			text.WriteString(ev.Delta.Text)
		}
	}
	err := stream.Err()
	_ = stream.Close()
	return rep, text.String(), err
}

func noError(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func errorIs(target error) func(*testing.T, error) {
	return func(t *testing.T, err error) {
		t.Helper()
		if !errors.Is(err, target) {
			t.Fatalf("err = %v, want %v", err, target)
		}
	}
}

// TestTelemetry checks, per kind of call, the spans (every attribute,
// parent, time and status), the metrics and the log lines it leaves.
func TestTelemetry(t *testing.T) {
	cut := dampertest.Stream{Text: "a long enough answer to span several deltas", Fault: dampertest.FaultReset}
	cut.At = cut.ContentIndex() + 1
	cases := []telCase{{
		name: "first try success", scenario: "ok", model: pricedModel,
		steps: []dampertest.Step{dampertest.OK()},
		err:   noError,
		report: func(rep damper.Report, _ string) bool {
			return rep.Attempts == 1 && rep.Outcome == damper.OutcomeSuccess && rep.Priced && rep.EstimatedCostUSD > 0 && rep.BudgetBalance == 10.1
		},
		spans: func(rep damper.Report) []wantSpan {
			return []wantSpan{
				{Name: tryoSpan, Parent: reqSpan, Attrs: attrs(attribute.Int("http.response.status_code", 200))},
				{Name: reqSpan, Attrs: requestAttrs(rep)},
			}
		},
		metrics: func(_ damper.Report, g genAI) map[string]float64 {
			m := map[string]float64{
				"damper.attempts{" + anth + "}":   1,
				durKey("success", false, "count"): 1,
				durKey("success", false, "sum"):   0,
				"damper.retry_budget.balance{}":   10.1,
			}
			// The fake answers with the model asked for, 10 input tokens
			// and 1 output token ("ok").
			g.duration(m, pricedModel, pricedModel, "", 1, 0)
			return g.tokens(m, pricedModel, pricedModel, 1, 10, 0, 0, 1)
		},
		logs: func(damper.Report) []map[string]any { return nil },
	}, {
		name: "retry then success", scenario: "busy", model: pricedModel,
		steps: []dampertest.Step{dampertest.Status(529), dampertest.OK()},
		err:   noError,
		report: func(rep damper.Report, _ string) bool {
			return rep.Attempts == 2 && rep.RetryCostUSD == rep.EstimatedCostUSD && rep.BudgetBalance == 9
		},
		spans: func(rep damper.Report) []wantSpan {
			return []wantSpan{
				{Name: tryoSpan, Parent: reqSpan, Status: codes.Error, Attrs: attrs(
					attribute.Int("http.response.status_code", 529),
					attribute.String("damper.attempt.error_class", "overloaded"),
					attribute.String("error.type", "529"),
					attribute.Float64("damper.attempt.backoff_s", 0.5),
				)},
				{Name: tryoSpan, Parent: reqSpan, Start: 500 * ms, End: 500 * ms, Attrs: attrs(
					attribute.Int("http.response.status_code", 200),
					attribute.Int("http.request.resend_count", 1),
				)},
				{Name: reqSpan, End: 500 * ms, Attrs: requestAttrs(rep)},
			}
		},
		metrics: func(rep damper.Report, g genAI) map[string]float64 {
			m := map[string]float64{
				"damper.attempts{" + anth + "}":                                       1,
				"damper.attempts{damper.attempt.error_class=overloaded," + anth + "}": 1,
				"damper.retries{damper.attempt.error_class=overloaded," + anth + "}":  1,
				"damper.retry.cost{" + anth + "}":                                     rep.EstimatedCostUSD,
				"damper.retry.backoff{" + anth + "}.count":                            1,
				"damper.retry.backoff{" + anth + "}.sum":                              0.5,
				durKey("success", false, "count"):                                     1,
				durKey("success", false, "sum"):                                       0.5,
				"damper.retry_budget.balance{}":                                       9,
			}
			// One operation, its retry and backoff included.
			g.duration(m, pricedModel, pricedModel, "", 1, 0.5)
			return g.tokens(m, pricedModel, pricedModel, 1, 10, 0, 0, 1)
		},
		logs: func(rep damper.Report) []map[string]any {
			return []map[string]any{{
				"level": "INFO", "msg": "damper: retrying", "decision": "retry",
				"attempt": 1.0, "provider": "anthropic", "model": pricedModel, "status": 529.0,
				"class": "retryable", "kind": "overloaded", "signal": "provider_health",
				"attempt_duration": 0.0, "request_id": "req_dampertest_busy_1",
				"backoff": float64(500 * ms), "retry_cost_usd": rep.EstimatedCostUSD,
			}}
		},
	}, {
		name: "budget denial", scenario: "busy", model: pricedModel,
		settings: []damper.Setting{damper.WithBudget(denyBudget{})},
		steps:    []dampertest.Step{dampertest.Status(529)},
		err:      errorIs(damper.ErrRetryBudgetExhausted),
		report: func(rep damper.Report, _ string) bool {
			return rep.Attempts == 1 && rep.Outcome == damper.OutcomeBudgetExhausted && rep.RetryCostUSD == 0
		},
		spans: func(rep damper.Report) []wantSpan {
			return []wantSpan{
				{Name: tryoSpan, Parent: reqSpan, Status: codes.Error, Attrs: attrs(
					attribute.Int("http.response.status_code", 529),
					attribute.String("damper.attempt.error_class", "overloaded"),
					attribute.String("error.type", "529"),
				)},
				{Name: reqSpan, Status: codes.Error, Attrs: requestAttrs(rep, attribute.String("error.type", "budget_exhausted"))},
			}
		},
		metrics: func(_ damper.Report, g genAI) map[string]float64 {
			m := map[string]float64{
				"damper.attempts{damper.attempt.error_class=overloaded," + anth + "}":      1,
				"damper.retry.denials{damper.denial.reason=budget_exhausted," + anth + "}": 1,
				durKey("budget_exhausted", false, "count"):                                 1,
				durKey("budget_exhausted", false, "sum"):                                   0,
				"damper.retry_budget.balance{}":                                            0,
			}
			// No answer: no response model, no tokens.
			return g.duration(m, pricedModel, "", "budget_exhausted", 1, 0)
		},
		logs: func(damper.Report) []map[string]any {
			return []map[string]any{{
				"level": "WARN", "msg": "damper: not retrying", "decision": "no_retry", "reason": "budget_exhausted",
				"attempt": 1.0, "provider": "anthropic", "model": pricedModel, "status": 529.0,
				"class": "retryable", "kind": "overloaded", "attempt_duration": 0.0,
				"request_id": "req_dampertest_busy_1", "budget_balance": 0.0,
			}}
		},
	}, {
		// A model with no price, under a ceiling: the retry is refused, and
		// the spans carry no cost at all.
		name: "cost ceiling denial", scenario: "busy", model: unpricedModel,
		policy: damper.Policy{MaxRetryCostUSD: 0.05},
		steps:  []dampertest.Step{dampertest.Status(500)},
		err:    errorIs(damper.ErrRetryCostCeiling),
		report: func(rep damper.Report, _ string) bool {
			return rep.Attempts == 1 && rep.Outcome == damper.OutcomeCostCeiling && !rep.Priced
		},
		spans: func(rep damper.Report) []wantSpan {
			return []wantSpan{
				{Name: tryoSpan, Parent: reqSpan, Status: codes.Error, Attrs: attrs(
					attribute.Int("http.response.status_code", 500),
					attribute.String("damper.attempt.error_class", "server_error"),
					attribute.String("error.type", "500"),
				)},
				{Name: reqSpan, Status: codes.Error, Attrs: requestAttrs(rep, attribute.String("error.type", "cost_ceiling"))},
			}
		},
		metrics: func(_ damper.Report, g genAI) map[string]float64 {
			m := map[string]float64{
				"damper.attempts{damper.attempt.error_class=server_error," + anth + "}": 1,
				"damper.retry.denials{damper.denial.reason=cost_ceiling," + anth + "}":  1,
				durKey("cost_ceiling", false, "count"):                                  1,
				durKey("cost_ceiling", false, "sum"):                                    0,
				"damper.retry_budget.balance{}":                                         10,
			}
			return g.duration(m, unpricedModel, "", "cost_ceiling", 1, 0)
		},
		logLine: map[string]any{"reason": "cost_ceiling", "level": "WARN"},
	}, {
		name: "retry after too long", scenario: "later", model: pricedModel,
		steps: []dampertest.Step{dampertest.Status(429).RetryAfter("120"), dampertest.OK()},
		err: func(t *testing.T, err error) {
			var de *damper.Error
			if !errors.As(err, &de) || !errors.Is(err, damper.ErrRetryAfterTooLong) || de.RetryAfter != 120*time.Second {
				t.Fatalf("err = %v, want ErrRetryAfterTooLong with the delay", err)
			}
		},
		spans: func(rep damper.Report) []wantSpan {
			return []wantSpan{
				{Name: tryoSpan, Parent: reqSpan, Status: codes.Error, Attrs: attrs(
					attribute.Int("http.response.status_code", 429),
					attribute.String("damper.attempt.error_class", "rate_limited"),
					attribute.String("error.type", "429"),
				)},
				{Name: reqSpan, Status: codes.Error, Attrs: requestAttrs(rep, attribute.String("error.type", "retry_after_too_long"))},
			}
		},
		metrics: func(_ damper.Report, g genAI) map[string]float64 {
			m := map[string]float64{
				"damper.attempts{damper.attempt.error_class=rate_limited," + anth + "}":        1,
				"damper.retry.denials{damper.denial.reason=retry_after_too_long," + anth + "}": 1,
				durKey("retry_after_too_long", false, "count"):                                 1,
				durKey("retry_after_too_long", false, "sum"):                                   0,
				"damper.retry_budget.balance{}":                                                10,
			}
			return g.duration(m, pricedModel, "", "retry_after_too_long", 1, 0)
		},
		logLine: map[string]any{"reason": "retry_after_too_long", "status": 429.0},
	}, {
		// A failure that is not retried is an error on both spans, with the
		// attempt's own error.type, and is no denial.
		name: "not retryable", scenario: "bad", model: pricedModel,
		steps: []dampertest.Step{dampertest.Status(400)},
		err: func(t *testing.T, err error) {
			var apiErr *anthropic.Error
			if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 {
				t.Fatalf("err = %v, want a 400", err)
			}
		},
		spans: func(rep damper.Report) []wantSpan {
			return []wantSpan{
				{Name: tryoSpan, Parent: reqSpan, Status: codes.Error, Attrs: attrs(
					attribute.Int("http.response.status_code", 400),
					attribute.String("damper.attempt.error_class", "client_error"),
					attribute.String("error.type", "400"),
				)},
				{Name: reqSpan, Status: codes.Error, Attrs: requestAttrs(rep, attribute.String("error.type", "400"))},
			}
		},
		noMetrics: []string{"damper.retry.denials", "damper.retries"},
		logLine:   map[string]any{"reason": "error", "level": "INFO"},
	}, {
		// A stream that fails after its first content is surfaced as
		// ambiguous, never retried, and is no denial.
		name: "ambiguous stream", scenario: "cut", model: pricedModel, stream: true,
		steps: []dampertest.Step{dampertest.OK().WithStream(cut)},
		err:   errorIs(damper.ErrAmbiguous),
		report: func(rep damper.Report, _ string) bool {
			return rep.Attempts == 1 && rep.Outcome == damper.OutcomeAmbiguous
		},
		// The connection reset after content is a transport failure,
		// surfaced as ambiguous; the attempt span stays open while the
		// caller reads.
		spans: func(rep damper.Report) []wantSpan {
			return []wantSpan{
				{Name: tryoSpan, Parent: reqSpan, Status: codes.Error, Attrs: attrs(
					attribute.Int("http.response.status_code", 200),
					attribute.String("damper.attempt.error_class", "transport"),
					attribute.String("error.type", "transport"),
				)},
				{Name: reqSpan, Status: codes.Error, Attrs: requestAttrs(rep, attribute.String("error.type", "ambiguous"))},
			}
		},
		metrics: func(_ damper.Report, g genAI) map[string]float64 {
			m := map[string]float64{
				"damper.attempts{damper.attempt.error_class=transport," + anth + "}": 1,
				durKey("ambiguous", true, "count"):                                   1,
				durKey("ambiguous", true, "sum"):                                     0,
				// The first attempt delivered content: a first-attempt
				// success for the budget.
				"damper.retry_budget.balance{}": 10.1,
			}
			// message_start named the model and the input; the stream was
			// cut before its final message_delta, so its output is unknown.
			g.duration(m, pricedModel, pricedModel, "ambiguous", 1, 0)
			g.firstChunk(m, pricedModel, pricedModel, 0)
			return g.tokens(m, pricedModel, pricedModel, 1, 10, 0, 0, -1)
		},
		logs: func(damper.Report) []map[string]any {
			return []map[string]any{{
				"level": "INFO", "msg": "damper: not retrying", "decision": "no_retry", "reason": "ambiguous",
				"attempt": 1.0, "provider": "anthropic", "model": pricedModel, "status": 200.0,
				"class": "ambiguous", "kind": "transport", "attempt_duration": 0.0,
				"request_id": "req_dampertest_cut_1", "budget_balance": 10.1,
			}}
		},
	}, {
		// A stream that fails before its first content is retried; the
		// retried attempt's span, and the request's, end when the caller
		// has read the stream to its end.
		name: "stream retried before content", scenario: "flaky", model: pricedModel, stream: true,
		steps: []dampertest.Step{
			dampertest.OK().WithStream(dampertest.Stream{Fault: dampertest.FaultErrorEvent, At: 1}),
			dampertest.OK().WithStream(dampertest.Stream{Text: "fine"}),
		},
		beforeRead: func(t *testing.T, r *telRig) {
			if len(r.spans.GetSpans()) != 1 {
				t.Errorf("before the stream is read: %d spans ended, want 1 (the failed attempt)", len(r.spans.GetSpans()))
			}
			r.clock.Advance(2 * time.Second) // the caller takes its time reading
		},
		err: noError,
		report: func(rep damper.Report, text string) bool {
			return text == "fine" && rep.Attempts == 2 && rep.Outcome == damper.OutcomeSuccess
		},
		spans: func(rep damper.Report) []wantSpan {
			end := 500*ms + 2*time.Second
			return []wantSpan{
				// A stream that fails after its 200 header has no status of
				// its own.
				{Name: tryoSpan, Parent: reqSpan, Status: codes.Error, Attrs: attrs(
					attribute.String("damper.attempt.error_class", "sse_error"),
					attribute.String("error.type", "sse_error"),
					attribute.Float64("damper.attempt.backoff_s", 0.5),
				)},
				{Name: tryoSpan, Parent: reqSpan, Start: 500 * ms, End: end, Attrs: attrs(
					attribute.Int("http.response.status_code", 200),
					attribute.Int("http.request.resend_count", 1),
				)},
				{Name: reqSpan, End: end, Attrs: requestAttrs(rep)},
			}
		},
		metrics: func(rep damper.Report, g genAI) map[string]float64 {
			m := map[string]float64{
				"damper.attempts{" + anth + "}":                                      1,
				"damper.attempts{damper.attempt.error_class=sse_error," + anth + "}": 1,
				"damper.retries{damper.attempt.error_class=sse_error," + anth + "}":  1,
				"damper.retry.cost{" + anth + "}":                                    rep.EstimatedCostUSD,
				"damper.retry.backoff{" + anth + "}.count":                           1,
				"damper.retry.backoff{" + anth + "}.sum":                             0.5,
				durKey("success", true, "count"):                                     1,
				durKey("success", true, "sum"):                                       2.5,
				"damper.retry_budget.balance{}":                                      9,
			}
			// The first chunk reached the caller after the backoff; the
			// operation lasted until the caller had read the stream.
			g.duration(m, pricedModel, pricedModel, "", 1, 2.5)
			g.firstChunk(m, pricedModel, pricedModel, 0.5)
			return g.tokens(m, pricedModel, pricedModel, 1, 10, 0, 0, 1)
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newTelRig(t, tc.policy, tc.settings)
			rep, text, err := tc.run(t, r)
			tc.err(t, err)
			if tc.report != nil && !tc.report(rep, text) {
				t.Fatalf("text %q, report: %+v", text, rep)
			}
			r.checkSpans(t, tc.spans(rep))
			if tc.metrics != nil {
				checkMetrics(t, r.metricValues(t), tc.metrics(rep, r.genAI(t)))
			} else {
				got := r.metricValues(t)
				for k := range got {
					for _, prefix := range tc.noMetrics {
						if strings.HasPrefix(k, prefix) {
							t.Errorf("unexpected %s = %v", k, got[k])
						}
					}
				}
			}
			switch {
			case tc.logs != nil:
				checkLogs(t, r.logLines(t), tc.logs(rep))
			case tc.logLine != nil:
				lines := r.logLines(t)
				if len(lines) != 1 {
					t.Errorf("log lines: %v", lines)
					break
				}
				for k, v := range tc.logLine {
					if lines[0][k] != v {
						t.Errorf("log lines: %v", lines)
						break
					}
				}
			}
		})
	}
}

// denyBudget is a retry budget with nothing left.
type denyBudget struct{}

func (denyBudget) Observe(context.Context, time.Time, fleet.AttemptOutcome) error { return nil }
func (denyBudget) Acquire(context.Context, time.Time) (bool, error)               { return false, nil }
func (denyBudget) Available(context.Context, time.Time) (float64, error)          { return 0, nil }

// TestTelemetrySDKSpanTree runs a retried call with the SDK's own tracing
// on the same provider: the SDK's anthropic.messages.create span is the
// root, damper.request its child, one damper.attempt per attempt under
// that, and the SDK counts no attempt of its own.
func TestTelemetrySDKSpanTree(t *testing.T) {
	r := newTelRig(t, damper.Policy{}, nil)
	r.srv.Script("busy", dampertest.Status(529), dampertest.Status(503), dampertest.OK())
	var rep damper.Report
	_, err := r.client.Messages.New(context.Background(), telParams(pricedModel),
		dampertest.Scenario("busy"), option.WithTracerProvider(r.tp), damper.ReportInto(&rep))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Attempts != 3 || r.srv.Count("busy") != 3 {
		t.Fatalf("attempts: report %d, server %d, want 3", rep.Attempts, r.srv.Count("busy"))
	}
	spans := r.spans.GetSpans()
	var names []string
	for _, s := range spans {
		names = append(names, s.Name)
	}
	want := []string{tryoSpan, tryoSpan, tryoSpan, reqSpan, "anthropic.messages.create"}
	if !slices.Equal(names, want) {
		t.Fatalf("spans, in the order they ended: %v, want %v", names, want)
	}
	sdk, request := spans[4], spans[3]
	if sdk.Parent.IsValid() || sdk.SpanKind != trace.SpanKindClient {
		t.Errorf("SDK span: parent %v, kind %v; want a root client span", sdk.Parent, sdk.SpanKind)
	}
	// The SDK saw three requests go out, Damper's attempts, and made one
	// call of its own loop: its resend count is Damper's retries.
	if resent := attrs(sdk.Attributes...)["http.request.resend_count"]; resent.AsInt64() != 2 {
		t.Errorf("SDK span http.request.resend_count = %v, want 2", resent.String())
	}
	if sdk.Status.Code != codes.Ok {
		t.Errorf("SDK span status %v, want Ok", sdk.Status.Code)
	}
	if request.Parent.SpanID() != sdk.SpanContext.SpanID() {
		t.Errorf("damper.request's parent is %v, want the SDK span %v", request.Parent.SpanID(), sdk.SpanContext.SpanID())
	}
	if got := attrs(request.Attributes...)["damper.attempts"].AsInt64(); got != 3 {
		t.Errorf("damper.attempts = %d, want 3", got)
	}
	for i, s := range spans[:3] {
		if s.Parent.SpanID() != request.SpanContext.SpanID() {
			t.Errorf("attempt span %d: parent %v, want damper.request", i, s.Parent.SpanID())
		}
		resend, ok := attrs(s.Attributes...)["http.request.resend_count"]
		if (i == 0) == ok || (ok && resend.AsInt64() != int64(i)) {
			t.Errorf("attempt span %d: resend count %v (set %v)", i, resend.String(), ok)
		}
	}
	for _, s := range spans {
		if s.SpanContext.TraceID() != sdk.SpanContext.TraceID() {
			t.Errorf("span %q is in another trace", s.Name)
		}
	}
}

// TestTelemetryNoSecrets runs calls that retry, fail and succeed with an
// API key and an auth token set, with every kind of telemetry on, and
// checks that neither appears in any span, metric, log line or error.
func TestTelemetryNoSecrets(t *testing.T) {
	const apiKey = "sk-ant-secret-api03-abcdefghijklmnop"
	const token = "secret-auth-token-qrstuvwxyz"
	var sent []string
	seen := option.WithMiddleware(func(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		sent = append(sent, req.Header.Get("Authorization"))
		return next(req)
	})
	r := newTelRig(t, damper.Policy{}, nil)
	sdk := []option.RequestOption{option.WithTracerProvider(r.tp), option.WithOpenTelemetryTracesContentMode(option.OpenTelemetryContentModeContent)}

	// A client has one credential, so each secret gets its own client.
	var errs []error
	for _, cred := range []option.RequestOption{option.WithAPIKey(apiKey), option.WithAuthToken(token)} {
		client := anthropic.NewClient(r.d.Option(), option.WithBaseURL(r.srv.URL()), cred, seen)
		for _, sc := range []struct {
			name  string
			steps []dampertest.Step
		}{
			{"retried", []dampertest.Step{dampertest.Status(529), dampertest.OK()}},
			{"denied", []dampertest.Step{dampertest.Status(429).RetryAfter("600")}},
			{"failed", []dampertest.Step{dampertest.Status(401)}},
			{"exhausted", []dampertest.Step{dampertest.Status(500)}},
		} {
			r.srv.Script(sc.name, sc.steps...)
			_, err := client.Messages.New(context.Background(), telParams(pricedModel), append(sdk, dampertest.Scenario(sc.name))...)
			if (err == nil) != (sc.name == "retried") {
				t.Fatalf("%s: err = %v", sc.name, err)
			}
			if err != nil {
				errs = append(errs, err)
			}
		}
	}
	if len(sent) != 2*(2+1+1+3) || !slices.Contains(sent, "Bearer "+apiKey) || !slices.Contains(sent, "Bearer "+token) {
		t.Fatalf("the secrets did not reach the transport: %q", sent)
	}

	var all strings.Builder
	spans := r.spans.GetSpans()
	if len(spans) == 0 {
		t.Fatal("no spans")
	}
	for _, s := range spans {
		fmt.Fprintf(&all, "%+v\n", s)
	}
	var rm metricdata.ResourceMetrics
	if err := r.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(&all, "%+v\n", rm)
	if r.logs.Len() == 0 {
		t.Fatal("no log lines")
	}
	all.WriteString(r.logs.String())
	for _, err := range errs {
		fmt.Fprintf(&all, "%v\n%+v\n%#v\n", err, err, err)
		var de *damper.Error
		if errors.As(err, &de) && de.Report != nil {
			fmt.Fprintf(&all, "%+v\n", *de.Report)
		}
	}
	for _, secret := range []string{apiKey, token, "sk-ant-secret", "secret-auth-token"} {
		if strings.Contains(all.String(), secret) {
			t.Errorf("%q appears in the telemetry or errors", secret)
		}
	}
}

// TestTelemetrySettingsRefuseNil: each telemetry Setting names itself
// when given nil.
func TestTelemetrySettingsRefuseNil(t *testing.T) {
	for _, tc := range []struct {
		s    damper.Setting
		name string
	}{
		{damper.WithTracerProvider(nil), "WithTracerProvider(nil)"},
		{damper.WithMeterProvider(nil), "WithMeterProvider(nil)"},
		{damper.WithLogger(nil), "WithLogger(nil)"},
	} {
		_, err := damper.New(damper.Policy{}, tc.s)
		if err == nil || !strings.Contains(err.Error(), tc.name) {
			t.Errorf("New with %s: err = %v", tc.name, err)
		}
	}
}

// TestTelemetrySilentByDefault: without WithLogger, Damper writes nothing
// to the default logger, even for decisions.
func TestTelemetrySilentByDefault(t *testing.T) {
	var buf bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	defer slog.SetDefault(prev)

	clk := dampertest.NewClock(time.Now())
	srv := dampertest.NewServer(dampertest.WithClock(clk))
	defer srv.Close()
	d, err := damper.New(damper.Policy{}, damper.WithClock(clk), damper.WithRand(func() float64 { return 0.5 }))
	if err != nil {
		t.Fatal(err)
	}
	client := anthropic.NewClient(append([]option.RequestOption{d.Option()}, srv.Options()...)...)
	srv.Script("busy", dampertest.Status(529), dampertest.Status(400))
	if _, err := client.Messages.New(context.Background(), telParams(pricedModel), dampertest.Scenario("busy")); err == nil {
		t.Fatal("want the 400")
	}
	if srv.Count("busy") != 2 {
		t.Fatalf("attempts = %d, want 2", srv.Count("busy"))
	}
	if buf.Len() != 0 {
		t.Errorf("default logger got %q", buf.String())
	}
}

// Two Dampers on one MeterProvider, one per tenant, keep their series
// apart when named, and their request spans say which is which.
func TestWithNameKeepsSeriesApart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reader := sdkmetric.NewManualReader()
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		spans := tracetest.NewInMemoryExporter()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
		// A Damper dropped is collected with its metric callbacks: both
		// are kept alive until the collection.
		var dampers []*damper.Damper
		for name, calls := range map[string]int{"tenant-a": 1, "tenant-b": 2} {
			d, err := damper.New(damper.Policy{}, damper.WithName(name), damper.WithMeterProvider(mp), damper.WithTracerProvider(tp))
			if err != nil {
				t.Fatal(err)
			}
			dampers = append(dampers, d)
			client := memClient(d, http.HandlerFunc(okHandler))
			for range calls {
				if _, err := client.Messages.New(context.Background(), params("claude-sonnet-4-5")); err != nil {
					t.Fatal(err)
				}
			}
		}
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(context.Background(), &rm); err != nil {
			t.Fatal(err)
		}
		runtime.KeepAlive(dampers)
		got := map[string]uint64{}
		balances := map[string]bool{}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				switch data := m.Data.(type) {
				case metricdata.Histogram[float64]:
					if m.Name == "damper.request.duration" {
						for _, p := range data.DataPoints {
							v, _ := p.Attributes.Value(attribute.Key("damper.name"))
							got[v.AsString()] += p.Count
						}
					}
				case metricdata.Gauge[float64]:
					for _, p := range data.DataPoints {
						v, _ := p.Attributes.Value(attribute.Key("damper.name"))
						balances[v.AsString()] = true
					}
				}
			}
		}
		if got["tenant-a"] != 1 || got["tenant-b"] != 2 || len(got) != 2 {
			t.Errorf("requests by damper.name %v, want tenant-a 1, tenant-b 2", got)
		}
		if !balances["tenant-a"] || !balances["tenant-b"] || len(balances) != 2 {
			t.Errorf("budget balance series %v, want one per name", balances)
		}
		named := map[string]int{}
		for _, s := range spans.GetSpans() {
			for _, kv := range s.Attributes {
				if s.Name == "damper.request" && kv.Key == "damper.name" {
					named[kv.Value.AsString()]++
				}
			}
		}
		if named["tenant-a"] != 1 || named["tenant-b"] != 2 {
			t.Errorf("damper.request spans by name %v", named)
		}
	})
}

func TestWithNameRefusesBadNames(t *testing.T) {
	for _, name := range []string{"", "has space", "tab\tname", strings.Repeat("x", 65), "é"} {
		_, err := damper.New(damper.Policy{}, damper.WithName(name))
		if err == nil || !strings.Contains(err.Error(), "WithName(") {
			t.Errorf("WithName(%q): err %v, want an error naming the setting", name, err)
		}
	}
}

// TestTelemetryCircuit: with a breaker, every request span carries the
// circuit's state, a probe's attempt span damper.circuit.probe, every
// change of state is counted by damper.circuit.changes and logged, and a
// call the breaker refused is a denial with no attempt span.
func TestTelemetryCircuit(t *testing.T) {
	r := newTelRig(t, damper.Policy{MaxAttempts: 1, Breaker: &damper.BreakerPolicy{MinAttempts: 2, OpenFor: 10 * time.Second}}, nil)
	var reps []damper.Report
	call := func(step dampertest.Step) error {
		t.Helper()
		rep, err := r.call(t, "busy", pricedModel, step)
		var de *damper.Error
		if rep.Outcome == "" && errors.As(err, &de) && de.Report != nil {
			rep = *de.Report
		}
		reps = append(reps, rep)
		return err
	}
	state := func(s string) attribute.KeyValue { return attribute.String("damper.circuit.state", s) }
	failed := wantSpan{Name: tryoSpan, Parent: reqSpan, Status: codes.Error, Attrs: attrs(
		attribute.Int("http.response.status_code", 529),
		attribute.String("damper.attempt.error_class", "overloaded"),
		attribute.String("error.type", "529"),
	)}
	// Each call's spans, one trace per call.
	spans := func(want ...wantSpan) {
		t.Helper()
		r.checkSpans(t, want)
		r.spans.Reset()
	}
	for i := range 2 {
		if err := call(dampertest.Status(529)); err == nil || errors.Is(err, damper.ErrCircuitOpen) {
			t.Fatalf("err = %v, want the 529", err)
		}
		spans(failed, wantSpan{Name: reqSpan, Status: codes.Error, Attrs: requestAttrs(reps[i], attribute.String("error.type", "attempts_exhausted"), state("closed"))})
	}
	errorIs(damper.ErrCircuitOpen)(t, call(dampertest.OK()))
	if reps[2].Attempts != 0 || reps[2].Outcome != damper.OutcomeCircuitOpen || reps[2].BudgetBalance != 10 {
		t.Errorf("refused call's report: %+v", reps[2])
	}
	spans(wantSpan{Name: reqSpan, Status: codes.Error, Attrs: requestAttrs(reps[2], attribute.String("error.type", "circuit_open"), state("open"))})

	later := 10 * time.Second
	r.clock.Advance(later)
	noError(t, call(dampertest.OK())) // the probe
	spans(
		wantSpan{Name: tryoSpan, Parent: reqSpan, Start: later, End: later, Attrs: attrs(
			attribute.Int("http.response.status_code", 200),
			attribute.Bool("damper.circuit.probe", true),
		)},
		wantSpan{Name: reqSpan, Start: later, End: later, Attrs: requestAttrs(reps[3], state("half_open"))},
	)
	noError(t, call(dampertest.OK()))
	spans(
		wantSpan{Name: tryoSpan, Parent: reqSpan, Start: later, End: later, Attrs: attrs(attribute.Int("http.response.status_code", 200))},
		wantSpan{Name: reqSpan, Start: later, End: later, Attrs: requestAttrs(reps[4], state("closed"))},
	)

	want := map[string]float64{
		"damper.attempts{" + anth + "}":                                                  2,
		"damper.attempts{damper.attempt.error_class=overloaded," + anth + "}":            2,
		"damper.retry.denials{damper.denial.reason=attempts_exhausted," + anth + "}":     2,
		"damper.retry.denials{damper.denial.reason=circuit_open," + anth + "}":           1,
		durKey("attempts_exhausted", false, "count"):                                     2,
		durKey("attempts_exhausted", false, "sum"):                                       0,
		durKey("circuit_open", false, "count"):                                           1,
		durKey("circuit_open", false, "sum"):                                             0,
		durKey("success", false, "count"):                                                2,
		durKey("success", false, "sum"):                                                  0,
		"damper.circuit.changes{damper.circuit.from=closed,damper.circuit.to=open}":      1,
		"damper.circuit.changes{damper.circuit.from=open,damper.circuit.to=half_open}":   1,
		"damper.circuit.changes{damper.circuit.from=half_open,damper.circuit.to=closed}": 1,
		"damper.retry_budget.balance{}":                                                  10.2,
	}
	g := r.genAI(t)
	g.duration(want, pricedModel, "", "attempts_exhausted", 2, 0)
	g.duration(want, pricedModel, "", "circuit_open", 1, 0)
	g.duration(want, pricedModel, pricedModel, "", 2, 0)
	g.tokens(want, pricedModel, pricedModel, 2, 10, 0, 0, 1)
	checkMetrics(t, r.metricValues(t), want)

	var changes []map[string]any
	for _, line := range r.logLines(t) {
		if msg, _ := line["msg"].(string); strings.HasPrefix(msg, "damper: circuit breaker") {
			changes = append(changes, line)
		}
	}
	checkLogs(t, changes, []map[string]any{
		{"level": "WARN", "msg": "damper: circuit breaker open", "from": "closed", "to": "open", "open_for": float64(10 * time.Second)},
		{"level": "INFO", "msg": "damper: circuit breaker half_open", "from": "open", "to": "half_open"},
		{"level": "INFO", "msg": "damper: circuit breaker closed", "from": "half_open", "to": "closed"},
	})
}

// The rate limiter's wait is on the attempt and request spans and in its
// histogram; its buckets are gauges, by group and bucket, once learned.
func TestTelemetryRateLimit(t *testing.T) {
	r := newTelRig(t, damper.Policy{RateLimit: &damper.RateLimitPolicy{}}, nil)
	full := dampertest.OK().
		WithHeader("anthropic-ratelimit-requests-limit", "60").
		WithHeader("anthropic-ratelimit-requests-remaining", "0")
	group := attribute.String("damper.ratelimit.group", "claude-sonnet-4")
	ok := attribute.Int("http.response.status_code", 200)
	rep, err := r.call(t, "limited", pricedModel, full)
	noError(t, err)
	r.checkSpans(t, []wantSpan{
		{Name: tryoSpan, Parent: reqSpan, Attrs: attrs(ok)},
		{Name: reqSpan, Attrs: requestAttrs(rep, group, attribute.Float64("damper.ratelimit.wait_s", 0))},
	})
	r.spans.Reset()
	rep, err = r.call(t, "limited", pricedModel, full)
	noError(t, err)
	if rep.RateLimitWait != time.Second {
		t.Fatalf("second call waited %v in line, want 1s (60 a minute, none left)", rep.RateLimitWait)
	}
	r.checkSpans(t, []wantSpan{
		{Name: tryoSpan, Parent: reqSpan, Start: time.Second, End: time.Second, Attrs: attrs(ok, attribute.Float64("damper.ratelimit.wait_s", 1))},
		{Name: reqSpan, End: time.Second, Attrs: requestAttrs(rep, group, attribute.Float64("damper.ratelimit.wait_s", 1))},
	})
	got := r.metricValues(t)
	bucket := "damper.ratelimit.bucket=requests,damper.ratelimit.group=claude-sonnet-4,damper.ratelimit.learned=true"
	for key, want := range map[string]float64{
		"damper.ratelimit.wait{" + anth + ",damper.ratelimit.group=claude-sonnet-4}.count": 2,
		"damper.ratelimit.wait{" + anth + ",damper.ratelimit.group=claude-sonnet-4}.sum":   1,
		"damper.ratelimit.limit{" + bucket + "}":                                           60,
		"damper.ratelimit.remaining{" + bucket + "}":                                       0,
	} {
		if got[key] != want {
			t.Errorf("%s = %v, want %v (all: %v)", key, got[key], want, got)
		}
	}
	for key := range got {
		if strings.Contains(key, "input_tokens") || strings.Contains(key, "output_tokens") {
			t.Errorf("%s: a bucket whose limit is unknown has no gauge", key)
		}
	}
}

// Attempts are counted with metrics alone, no tracer provider registered.
func TestAttemptsCountedWithoutTracing(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	clk := dampertest.NewClock(time.Now().Truncate(time.Minute).Add(time.Minute))
	srv := dampertest.NewServer(dampertest.WithClock(clk))
	defer srv.Close()
	srv.Script("", dampertest.Status(529), dampertest.OK())
	d, err := damper.New(damper.Policy{}, damper.WithClock(clk), damper.WithRand(func() float64 { return 0.5 }),
		damper.WithMeterProvider(mp), damper.WithTracerProvider(tracenoop.NewTracerProvider()))
	if err != nil {
		t.Fatal(err)
	}
	client := anthropic.NewClient(append([]option.RequestOption{d.Option()}, srv.Options()...)...)
	if _, err := client.Messages.New(context.Background(), telParams(pricedModel)); err != nil {
		t.Fatal(err)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var attempts int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "damper.attempts" {
				for _, p := range sum.DataPoints {
					attempts += p.Value
				}
			}
		}
	}
	if attempts != 2 {
		t.Fatalf("damper.attempts = %d, want 2 (the 529 and the answer)", attempts)
	}
}
