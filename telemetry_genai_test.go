package damper_test

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// The bucket boundaries the GenAI conventions (v1.41.0) give their
// duration and token histograms.
var (
	genAIDurationBounds = []float64{0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92}
	genAITokenBounds    = []float64{1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864}
)

// genAIShapes are the unit and bucket boundaries of each GenAI metric.
var genAIShapes = map[string]struct {
	unit   string
	bounds []float64
}{
	"gen_ai.client.operation.duration":            {"s", genAIDurationBounds},
	"gen_ai.client.operation.time_to_first_chunk": {"s", genAIDurationBounds},
	"gen_ai.client.token.usage":                   {"{token}", genAITokenBounds},
	"damper.token.cache_usage":                    {"{token}", genAITokenBounds},
}

// genAIValues collects the rig's GenAI metrics as metricValues does, after
// checking that each is a histogram with its convention's unit and bucket
// boundaries; the damper.* metrics are left out.
func (r *telRig) genAIValues(t *testing.T) map[string]float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != "github.com/damper-ai/damper-go" {
			t.Errorf("scope %q", sm.Scope.Name)
		}
		for _, m := range sm.Metrics {
			shape, ok := genAIShapes[m.Name]
			if !ok {
				if strings.HasPrefix(m.Name, "gen_ai.") {
					t.Errorf("unexpected GenAI metric %s", m.Name)
				}
				continue
			}
			if m.Unit != shape.unit || m.Description == "" {
				t.Errorf("%s: unit %q, description %q; want unit %q and a description", m.Name, m.Unit, m.Description, shape.unit)
			}
			var bounds [][]float64
			switch data := m.Data.(type) {
			case metricdata.Histogram[float64]:
				for _, p := range data.DataPoints {
					bounds = append(bounds, p.Bounds)
				}
			case metricdata.Histogram[int64]:
				for _, p := range data.DataPoints {
					bounds = append(bounds, p.Bounds)
				}
			default:
				t.Errorf("%s: %T, want a histogram", m.Name, m.Data)
			}
			for _, b := range bounds {
				if !slices.Equal(b, shape.bounds) {
					t.Errorf("%s: bucket boundaries %v, want %v", m.Name, b, shape.bounds)
				}
			}
		}
	}
	out := map[string]float64{}
	for k, v := range r.metricValues(t) {
		if strings.HasPrefix(k, "gen_ai.") || strings.HasPrefix(k, "damper.token.") {
			out[k] = v
		}
	}
	return out
}

// A plain answer: the operation's duration, and its usage as the answer
// reports it, the prompt cache's tokens counted among the input tokens and
// broken out in damper.token.cache_usage; the answer's model is the
// response model.
func TestGenAIMetricsPlain(t *testing.T) {
	r := newTelRig(t, damper.Policy{}, nil)
	const dated = "claude-sonnet-4-5-20250929"
	body := `{"id":"msg_1","type":"message","role":"assistant","model":"` + dated + `",` +
		`"content":[{"type":"text","text":"hello"}],"stop_reason":"end_turn","stop_sequence":null,` +
		`"usage":{"input_tokens":5,"cache_creation_input_tokens":20,"cache_read_input_tokens":100,"output_tokens":7}}`
	rep, err := r.call(t, "cached", pricedModel, dampertest.Status(529), dampertest.OK().WithBody([]byte(body)))
	noError(t, err)
	if rep.Attempts != 2 || rep.Duration != 500*ms {
		t.Fatalf("report: %+v", rep)
	}
	g := r.genAI(t)
	want := map[string]float64{}
	g.duration(want, pricedModel, dated, "", 1, 0.5)
	g.tokens(want, pricedModel, dated, 1, 125, 100, 20, 7)
	checkMetrics(t, r.genAIValues(t), want)
}

// A stream: its time to first chunk is from the call's start to the
// release of its first content (after a retry's backoff, on the virtual
// clock), and its duration lasts until the caller has read it; its usage
// comes from message_start and the final message_delta.
func TestGenAIMetricsStream(t *testing.T) {
	r := newTelRig(t, damper.Policy{}, nil)
	text := "a stream long enough for several deltas"
	tc := telCase{
		scenario: "stream", model: pricedModel, stream: true,
		steps: []dampertest.Step{dampertest.Status(529), dampertest.OK().WithStream(dampertest.Stream{Text: text, ChunkSize: 5})},
		beforeRead: func(t *testing.T, r *telRig) {
			r.clock.Advance(3 * time.Second)
		},
	}
	rep, got, err := tc.run(t, r)
	noError(t, err)
	if got != text || rep.FirstContent != 500*ms || rep.Duration != 3500*ms {
		t.Fatalf("text %q, report %+v", got, rep)
	}
	g := r.genAI(t)
	want := map[string]float64{}
	g.duration(want, pricedModel, pricedModel, "", 1, 3.5)
	g.firstChunk(want, pricedModel, pricedModel, 0.5)
	// dampertest counts a token per four characters.
	g.tokens(want, pricedModel, pricedModel, 1, 10, 0, 0, (len(text)+3)/4)
	checkMetrics(t, r.genAIValues(t), want)
}

// A failed call has error.type (the status the API answered with, or the
// gate that refused a retry), no response model, and no usage; a stream
// that fails before its first content has no time to first chunk.
func TestGenAIMetricsFailed(t *testing.T) {
	r := newTelRig(t, damper.Policy{MaxAttempts: 2}, nil)
	_, err := r.call(t, "bad", pricedModel, dampertest.Status(400))
	if err == nil {
		t.Fatal("want the 400")
	}
	rep, err := r.call(t, "busy", pricedModel, dampertest.Status(529))
	var de *damper.Error
	if err == nil || rep.Outcome == "" && errors.As(err, &de) && de.Report != nil {
		rep = *de.Report
	}
	if err == nil || rep.Outcome != damper.OutcomeAttemptsExhausted {
		t.Fatalf("err %v, outcome %q; want the retries spent", err, rep.Outcome)
	}
	tc := telCase{
		scenario: "broken", model: pricedModel, stream: true,
		steps: []dampertest.Step{dampertest.OK().WithStream(dampertest.Stream{Fault: dampertest.FaultErrorEvent, At: 1}), dampertest.Status(400)},
	}
	if _, _, err := tc.run(t, r); err == nil {
		t.Fatal("want the stream to fail")
	}
	g := r.genAI(t)
	want := map[string]float64{}
	g.duration(want, pricedModel, "", "400", 1, 0)
	g.duration(want, pricedModel, "", "400", 1, 0.5) // the stream's retry waited 0.5 s
	g.duration(want, pricedModel, "", "attempts_exhausted", 1, 0.5)
	checkMetrics(t, r.genAIValues(t), want)
}

// A client pointed at Bedrock or Vertex names the provider as the SDK's
// own gen_ai spans do, and the platform's host as the server; a named
// Damper's series carry damper.name.
func TestGenAIMetricsPlatforms(t *testing.T) {
	for _, tc := range []struct {
		base, provider, host string
	}{
		{"https://bedrock-runtime.us-east-1.amazonaws.com", "aws.bedrock", "bedrock-runtime.us-east-1.amazonaws.com"},
		{"https://us-east5-aiplatform.googleapis.com:8443/", "gcp.vertex_ai", "us-east5-aiplatform.googleapis.com"},
		{"http://api.invalid", "anthropic", "api.invalid"},
	} {
		t.Run(tc.provider, func(t *testing.T) {
			r := newTelRig(t, damper.Policy{}, []damper.Setting{damper.WithName("tenant-a")})
			client := anthropic.NewClient(r.d.Option(), option.WithBaseURL(tc.base), option.WithAPIKey("test-key"),
				option.WithHTTPClient(&http.Client{Transport: dampertest.Transport(r.srv.Handler())}))
			var rep damper.Report
			if _, err := client.Messages.New(context.Background(), telParams(pricedModel), damper.ReportInto(&rep)); err != nil {
				t.Fatal(err)
			}
			if rep.Provider != tc.provider {
				t.Fatalf("Report.Provider %q, want %q", rep.Provider, tc.provider)
			}
			port := map[string]int{"aws.bedrock": 443, "gcp.vertex_ai": 8443, "anthropic": 80}[tc.provider]
			g := genAI{provider: tc.provider, server: tc.host, port: port, extra: []attribute.KeyValue{attribute.String("damper.name", "tenant-a")}}
			want := map[string]float64{}
			g.duration(want, pricedModel, pricedModel, "", 1, 0)
			g.tokens(want, pricedModel, pricedModel, 1, 10, 0, 0, 1)
			checkMetrics(t, r.genAIValues(t), want)
		})
	}
}
