// Package dashboards_test checks damper.json, the Grafana dashboard over
// Damper's metrics, against the metrics a Damper really emits.
//
// The metric names a panel may use are not written down here: the test
// runs calls through a Damper with every feature that records metrics on
// (a breaker, a throttle, a rate limiter; a retried call, a stream, a
// refused call) against dampertest, exports them with the OpenTelemetry
// Prometheus exporter at its default settings, as `damper proxy` serves
// them, and reads the series names and labels from its registry. A panel
// that names any other metric, or filters or groups by a label that its
// metrics do not carry, fails the test.
package dashboards_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
	"unicode"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/damper-ai/damper-go/fleet"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

const dashboardFile = "damper.json"

// ---------------------------------------------------------------------------
// What a Damper emits
// ---------------------------------------------------------------------------

// series is one Prometheus series name a Damper emits.
type series struct {
	family string // the metric family: a histogram's three series share one
	kind   dto.MetricType
	labels map[string]bool
}

// emitted runs calls through a Damper with every metric-recording feature
// on, and returns the Prometheus series names of what it recorded. With
// tracing, the Damper also has a recording TracerProvider; without, only
// the MeterProvider, as a service that exports metrics alone has.
func emitted(t *testing.T, tracing bool) map[string]*series {
	t.Helper()
	clock := dampertest.NewClock(time.Now().Truncate(time.Minute).Add(time.Minute))
	api := dampertest.NewServer(dampertest.WithClock(clock),
		dampertest.WithRateLimits(dampertest.RateLimits{RequestsPerMinute: 50, InputTokensPerMinute: 40_000, OutputTokensPerMinute: 8_000}))
	t.Cleanup(api.Close)
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })

	settings := []damper.Setting{damper.WithClock(clock), damper.WithRand(func() float64 { return 0.5 }),
		damper.WithMeterProvider(mp), damper.WithName("dashboard")}
	if tracing {
		tp := sdktrace.NewTracerProvider()
		t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		settings = append(settings, damper.WithTracerProvider(tp))
	}
	d, err := damper.New(damper.Policy{
		MaxAttempts: 2,
		Breaker:     &damper.BreakerPolicy{MinAttempts: 4, OpenFor: time.Minute},
		Throttle:    &damper.ThrottlePolicy{},
		RateLimit:   &damper.RateLimitPolicy{},
	}, settings...)
	if err != nil {
		t.Fatal(err)
	}
	client := anthropic.NewClient(append([]option.RequestOption{d.Option()}, api.Options()...)...)
	params := anthropic.MessageNewParams{
		Model:     "claude-sonnet-4-5", // priced, for damper.retry.cost
		MaxTokens: 256,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Explain retry storms"))},
	}
	ctx := context.Background()

	// A retried call: 529, then an answer.
	api.Script("retried", dampertest.Status(529), dampertest.OK())
	if _, err := client.Messages.New(ctx, params, dampertest.Scenario("retried")); err != nil {
		t.Fatalf("retried call: %v", err)
	}
	// A stream, read to its end.
	stream := client.Messages.NewStreaming(ctx, params, dampertest.Scenario("stream"))
	for stream.Next() {
	}
	if err := errors.Join(stream.Err(), stream.Close()); err != nil {
		t.Fatalf("stream: %v", err)
	}
	// Failures until the breaker opens (4 attempts, half failed), and a
	// call it refuses.
	api.Script("failing", dampertest.Status(529), dampertest.Status(529))
	if _, err := client.Messages.New(ctx, params, dampertest.Scenario("failing")); err == nil {
		t.Fatal("failing call: no error")
	}
	api.Script("refused", dampertest.OK())
	if _, err := client.Messages.New(ctx, params, dampertest.Scenario("refused")); !errors.Is(err, damper.ErrCircuitOpen) {
		t.Fatalf("refused call: err = %v, want ErrCircuitOpen", err)
	}

	hedgedCall(t, mp)
	storeFailing(t, mp, api, params)

	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	// A Damper's gauges go when it is unreachable, and its client is what
	// holds it: until here, or a collection that runs first drops them.
	runtime.KeepAlive(client)
	out := map[string]*series{}
	for _, f := range families {
		if f.GetName() == "target_info" {
			continue // the exporter's resource, not a metric of Damper's
		}
		labels := map[string]bool{}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = true
			}
		}
		name := f.GetName()
		switch f.GetType() {
		case dto.MetricType_HISTOGRAM:
			out[name+"_bucket"] = &series{name, f.GetType(), withKeys(labels, "le")}
			out[name+"_sum"] = &series{name, f.GetType(), labels}
			out[name+"_count"] = &series{name, f.GetType(), labels}
		case dto.MetricType_COUNTER, dto.MetricType_GAUGE:
			out[name] = &series{name, f.GetType(), labels}
		default:
			t.Fatalf("metric %s: type %v has no series in this test", name, f.GetType())
		}
	}
	if len(out) == 0 {
		t.Fatal("the exporter's registry holds no metric")
	}
	return out
}

// storeFailing makes a call through a Damper named like the others whose
// store's throttle fails every operation, as a Redis that is down does,
// recording on mp.
func storeFailing(t *testing.T, mp *sdkmetric.MeterProvider, api *dampertest.Server, params anthropic.MessageNewParams) {
	t.Helper()
	d, err := damper.New(damper.Policy{Throttle: &damper.ThrottlePolicy{}}, damper.WithMeterProvider(mp),
		damper.WithName("dashboard"), damper.WithStore(failingThrottleStore{}))
	if err != nil {
		t.Fatal(err)
	}
	client := anthropic.NewClient(append([]option.RequestOption{d.Option()}, api.Options()...)...)
	if _, err := client.Messages.New(context.Background(), params, dampertest.Scenario("store")); err != nil {
		t.Fatalf("call with a failing store: %v", err)
	}
}

// failingThrottleStore keeps its parts in memory, but its throttle's every
// operation fails (and still decides).
type failingThrottleStore struct{ fleet.MemoryStore }

func (s failingThrottleStore) Throttle(p fleet.ThrottleSettings) (fleet.Throttle, error) {
	t, err := s.MemoryStore.Throttle(p)
	return failingThrottle{t}, err
}

type failingThrottle struct{ fleet.Throttle }

var errStoreDown = errors.New("store: connection refused")

func (f failingThrottle) Add(ctx context.Context, delta int64) error {
	_ = f.Throttle.Add(ctx, delta)
	return errStoreDown
}

func (f failingThrottle) Tokens(ctx context.Context) (int64, error) {
	n, _ := f.Throttle.Tokens(ctx)
	return n, errStoreDown
}

// hedgedCall makes a hedged call through a Damper named like the others,
// recording on mp: its first attempt is slow and its hedge answers first.
// It runs in a synctest bubble, so that the race takes no real time.
func hedgedCall(t *testing.T, mp *sdkmetric.MeterProvider) {
	synctest.Test(t, func(t *testing.T) {
		d, err := damper.New(damper.Policy{Hedge: &damper.HedgePolicy{Delay: time.Second}},
			damper.WithMeterProvider(mp), damper.WithName("dashboard"))
		if err != nil {
			t.Fatal(err)
		}
		var requests atomic.Int32
		api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if requests.Add(1) == 1 {
				select {
				case <-r.Context().Done():
					return
				case <-time.After(time.Minute):
				}
			}
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","usage":{"input_tokens":5,"output_tokens":1}}`)
		})
		client := anthropic.NewClient(d.Option(), option.WithBaseURL("http://api.invalid"), option.WithAPIKey("test-key"),
			option.WithHTTPClient(&http.Client{Transport: dampertest.Transport(api)}))
		var rep damper.Report
		_, err = client.Messages.New(context.Background(), anthropic.MessageNewParams{
			Model: "claude-sonnet-4-5", MaxTokens: 16,
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))},
		}, damper.ReportInto(&rep))
		if err != nil || !rep.HedgeWon {
			t.Fatalf("hedged call: %v, report %+v", err, rep)
		}
	})
}

// withKeys returns a copy of m with the keys more added.
func withKeys(m map[string]bool, more ...string) map[string]bool {
	c := make(map[string]bool, len(m)+len(more))
	for k := range m {
		c[k] = true
	}
	for _, k := range more {
		c[k] = true
	}
	return c
}

// ---------------------------------------------------------------------------
// PromQL: the metric and label names of an expression
// ---------------------------------------------------------------------------

// promqlWords are the PromQL words that are not metric names: keywords,
// aggregation operators and set operators. A function is recognized by the
// "(" after it instead, so the list of functions need not be complete.
var promqlWords = map[string]bool{
	"and": true, "or": true, "unless": true, "bool": true, "offset": true, "atan2": true,
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
	"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true, "limitk": true, "limit_ratio": true,
	"inf": true, "nan": true, "start": true, "end": true,
}

// labelListWords are the words followed by a parenthesized list of labels.
var labelListWords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}

// names returns the metric names and the label names in a PromQL
// expression, each sorted and without repeats. It is a tokenizer, not a
// parser, and knows this much:
//
//   - strings ("...", '...', `...`) are label values or function
//     arguments: skipped;
//   - $name and ${name} are Grafana variables; [...] is a range or a
//     subquery's duration: skipped;
//   - inside {...}, the identifier before a matcher (=, !=, =~, !~) is a
//     label name;
//   - after by, without, on, ignoring, group_left and group_right, the
//     identifiers in the parentheses are label names;
//   - an identifier followed by "(" is a function or an aggregation;
//   - a number (1, 0.99, 1e3, 0x1f) is skipped, as are the words of
//     promqlWords, case insensitively;
//   - every other identifier ([a-zA-Z_:][a-zA-Z0-9_:]*) is a metric name.
func names(expr string) (metrics, labels []string, err error) {
	ms, ls := map[string]bool{}, map[string]bool{}
	rs := []rune(expr)
	isIdentStart := func(r rune) bool { return r == '_' || r == ':' || (r < unicode.MaxASCII && unicode.IsLetter(r)) }
	isIdent := func(r rune) bool { return isIdentStart(r) || (r >= '0' && r <= '9') }
	ident := func(i int) (string, int) {
		j := i
		for j < len(rs) && isIdent(rs[j]) {
			j++
		}
		return string(rs[i:j]), j
	}
	skipSpace := func(i int) int {
		for i < len(rs) && unicode.IsSpace(rs[i]) {
			i++
		}
		return i
	}
	skipString := func(i int) (int, error) {
		q := rs[i]
		for j := i + 1; j < len(rs); j++ {
			if rs[j] == '\\' && q != '`' {
				j++
				continue
			}
			if rs[j] == q {
				return j + 1, nil
			}
		}
		return 0, fmt.Errorf("unterminated string at %d in %q", i, expr)
	}
	skipVariable := func(i int) (int, error) { // rs[i] == '$'
		i++
		if i < len(rs) && rs[i] == '{' {
			end := strings.IndexRune(string(rs[i:]), '}')
			if end < 0 {
				return 0, fmt.Errorf("unterminated ${ at %d in %q", i, expr)
			}
			return i + len([]rune(string(rs[i:])[:end])) + 1, nil
		}
		_, j := ident(i)
		return j, nil
	}
	prevLabelList := false // the last word was by, without, ...
	for i := 0; i < len(rs); {
		r := rs[i]
		switch {
		case unicode.IsSpace(r):
			i++
			continue // a label list may follow by after spaces
		case r == '"' || r == '\'' || r == '`':
			j, err := skipString(i)
			if err != nil {
				return nil, nil, err
			}
			i = j
		case r == '$':
			j, err := skipVariable(i)
			if err != nil {
				return nil, nil, err
			}
			i = j
		case r == '[':
			end := strings.IndexRune(string(rs[i:]), ']')
			if end < 0 {
				return nil, nil, fmt.Errorf("unterminated [ at %d in %q", i, expr)
			}
			i += len([]rune(string(rs[i:])[:end])) + 1
		case r == '{':
			// A selector's matchers: label op value, separated by commas.
			i++
			for {
				i = skipSpace(i)
				if i >= len(rs) {
					return nil, nil, fmt.Errorf("unterminated { in %q", expr)
				}
				if rs[i] == '}' {
					i++
					break
				}
				if rs[i] == ',' {
					i++
					continue
				}
				if rs[i] == '"' { // a quoted metric name or label (UTF-8 names)
					return nil, nil, fmt.Errorf("quoted names in a selector are not supported: %q", expr)
				}
				if !isIdentStart(rs[i]) {
					return nil, nil, fmt.Errorf("unexpected %q at %d in %q", rs[i], i, expr)
				}
				var l string
				l, i = ident(i)
				ls[l] = true
				i = skipSpace(i)
				for i < len(rs) && strings.ContainsRune("=!~", rs[i]) {
					i++
				}
				i = skipSpace(i)
				if i >= len(rs) {
					return nil, nil, fmt.Errorf("unterminated { in %q", expr)
				}
				switch rs[i] {
				case '"', '\'', '`':
					j, err := skipString(i)
					if err != nil {
						return nil, nil, err
					}
					i = j
				default:
					return nil, nil, fmt.Errorf("label %s has no quoted value in %q", l, expr)
				}
			}
		case r >= '0' && r <= '9' || r == '.' && i+1 < len(rs) && rs[i+1] >= '0' && rs[i+1] <= '9':
			// A number: digits, letters (1e3, 0x1f, 5m), dots and an
			// exponent's sign.
			j := i + 1
			for j < len(rs) && (isIdent(rs[j]) || rs[j] == '.' || (rs[j] == '+' || rs[j] == '-') && (rs[j-1] == 'e' || rs[j-1] == 'E')) {
				j++
			}
			i = j
		case isIdentStart(r):
			var w string
			w, i = ident(i)
			next := skipSpace(i)
			lower := strings.ToLower(w)
			switch {
			case labelListWords[lower]:
				prevLabelList = true
				continue
			case promqlWords[lower]:
			case next < len(rs) && rs[next] == '(':
			default:
				ms[w] = true
			}
		case r == '(' && prevLabelList:
			// by (a, b): a list of labels.
			end := strings.IndexRune(string(rs[i:]), ')')
			if end < 0 {
				return nil, nil, fmt.Errorf("unterminated ( at %d in %q", i, expr)
			}
			for _, l := range strings.Split(string(rs[i:])[1:end], ",") {
				if l = strings.TrimSpace(l); l != "" {
					ls[l] = true
				}
			}
			i += len([]rune(string(rs[i:])[:end])) + 1
		default:
			i++ // an operator or a parenthesis
		}
		prevLabelList = false
	}
	return sortedKeys(ms), sortedKeys(ls), nil
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func TestNames(t *testing.T) {
	for _, tt := range []struct {
		expr            string
		metrics, labels []string
	}{
		{`damper_retry_budget_balance`, []string{"damper_retry_budget_balance"}, nil},
		{`sum by (damper_denial_reason) (rate(damper_retry_denials_total{damper_name=~"$damper_name"}[$__rate_interval]))`,
			[]string{"damper_retry_denials_total"}, []string{"damper_denial_reason", "damper_name"}},
		{`histogram_quantile(0.99, sum without(le2) (rate(a_bucket{x="}", y!~'z'}[5m:1m] offset 1h)))`,
			[]string{"a_bucket"}, []string{"le2", "x", "y"}},
		{`SUM(rate(a_total[${__range}])) / on(job) group_left(instance) b * 3600 > bool 1e3 and c unless d or count_values("v", e)`,
			[]string{"a_total", "b", "c", "d", "e"}, []string{"instance", "job"}},
		{`label_replace(up, "dst", "$1", "src", "(.*)") + 0x1F + .5 + Inf + -NaN`, []string{"up"}, nil},
	} {
		ms, ls, err := names(tt.expr)
		if err != nil {
			t.Errorf("names(%q): %v", tt.expr, err)
			continue
		}
		if !slices.Equal(ms, tt.metrics) || !slices.Equal(ls, tt.labels) {
			t.Errorf("names(%q) = %q, %q; want %q, %q", tt.expr, ms, ls, tt.metrics, tt.labels)
		}
	}
	for _, bad := range []string{`a{b="c"`, `a{b=c}`, `a[5m`, `"open`} {
		if _, _, err := names(bad); err == nil {
			t.Errorf("names(%q): no error", bad)
		}
	}
}

// ---------------------------------------------------------------------------
// The dashboard
// ---------------------------------------------------------------------------

type datasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type target struct {
	RefID      string         `json:"refId"`
	Expr       string         `json:"expr"`
	Datasource *datasourceRef `json:"datasource"`
}

type panel struct {
	ID         int            `json:"id"`
	Type       string         `json:"type"`
	Title      string         `json:"title"`
	Datasource *datasourceRef `json:"datasource"`
	Targets    []target       `json:"targets"`
	Panels     []panel        `json:"panels"` // a collapsed row's
}

type variable struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	Query      json.RawMessage `json:"query"`
	Definition string          `json:"definition"`
	Datasource *datasourceRef  `json:"datasource"`
}

type dashboard struct {
	Title         string  `json:"title"`
	UID           string  `json:"uid"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []variable `json:"list"`
	} `json:"templating"`
}

// allPanels returns the dashboard's panels, those of collapsed rows
// included.
func (d *dashboard) allPanels() []panel {
	var out []panel
	for _, p := range d.Panels {
		out = append(out, p)
		out = append(out, p.Panels...)
	}
	return out
}

// query is one PromQL expression of the dashboard and where it is.
type query struct {
	where, expr string
}

// queries returns every PromQL expression of the dashboard: its panels'
// targets and its query variables' (label_values(metric, label) stands for
// metric{label!=""}).
func (d *dashboard) queries(t *testing.T) []query {
	t.Helper()
	var out []query
	for _, p := range d.allPanels() {
		for _, tg := range p.Targets {
			out = append(out, query{fmt.Sprintf("panel %q target %s", p.Title, tg.RefID), tg.Expr})
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q := v.Definition
		var obj struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &obj); err == nil && obj.Query != "" {
			q = obj.Query
		} else if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Fatalf("variable %s: query is neither a string nor an object: %s", v.Name, v.Query)
		}
		inner, ok := strings.CutPrefix(q, "label_values(")
		inner, ok2 := strings.CutSuffix(inner, ")")
		metric, label, ok3 := strings.Cut(inner, ",")
		if !ok || !ok2 || !ok3 {
			t.Fatalf("variable %s: query %q is not label_values(metric, label)", v.Name, q)
		}
		out = append(out, query{fmt.Sprintf("variable %s", v.Name),
			fmt.Sprintf(`%s{%s!=""}`, strings.TrimSpace(metric), strings.TrimSpace(label))})
	}
	return out
}

func loadDashboard(t *testing.T) (*dashboard, []byte) {
	t.Helper()
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	dec := json.NewDecoder(strings.NewReader(string(data)))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("%s is not valid JSON: %v", dashboardFile, err)
	}
	if dec.More() {
		t.Fatalf("%s has more than one JSON value", dashboardFile)
	}
	return &d, data
}

// check returns what is wrong with the queries: a metric that emit does not
// hold, a label that none of the query's metrics carries, or a query that
// cannot be read.
func check(qs []query, emit map[string]*series) []string {
	var problems []string
	for _, q := range qs {
		ms, ls, err := names(q.expr)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", q.where, err))
			continue
		}
		if len(ms) == 0 {
			problems = append(problems, fmt.Sprintf("%s: names no metric: %s", q.where, q.expr))
		}
		carried := map[string]bool{}
		for _, m := range ms {
			s, ok := emit[m]
			if !ok {
				problems = append(problems, fmt.Sprintf("%s: metric %s is not emitted by Damper", q.where, m))
				continue
			}
			for l := range s.labels {
				carried[l] = true
			}
		}
		for _, l := range ls {
			if !carried[l] {
				problems = append(problems, fmt.Sprintf("%s: label %s is on none of its metrics %q", q.where, l, ms))
			}
		}
	}
	return problems
}

func TestDashboardIsValid(t *testing.T) {
	d, data := loadDashboard(t)
	var obj map[string]any
	if err := json.Unmarshal(data, &obj); err != nil || !json.Valid(data) {
		t.Fatalf("%s is not a JSON object: %v", dashboardFile, err)
	}
	if d.Title == "" || d.UID == "" {
		t.Errorf("title %q, uid %q: want both", d.Title, d.UID)
	}
	if d.SchemaVersion < 39 {
		t.Errorf("schemaVersion %d, want at least 39", d.SchemaVersion)
	}

	vars := map[string]variable{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v
	}
	var dsQuery string
	if v, ok := vars["datasource"]; !ok || v.Type != "datasource" || json.Unmarshal(v.Query, &dsQuery) != nil || dsQuery != "prometheus" {
		t.Errorf("no datasource variable of type datasource over prometheus: %+v", v)
	}
	if v, ok := vars["damper_name"]; !ok || v.Type != "query" || !strings.Contains(string(v.Query), "damper_name)") ||
		v.Datasource == nil || v.Datasource.UID != "${datasource}" {
		t.Errorf("no damper_name query variable over the damper_name label, on ${datasource}: %+v", v)
	}

	ids := map[int]string{}
	panels := d.allPanels()
	if len(panels) == 0 {
		t.Fatal("no panels")
	}
	isDS := func(ds *datasourceRef) bool { return ds != nil && ds.Type == "prometheus" && ds.UID == "${datasource}" }
	for _, p := range panels {
		if strings.TrimSpace(p.Title) == "" {
			t.Errorf("panel %d (%s) has no title", p.ID, p.Type)
		}
		if !isDS(p.Datasource) {
			t.Errorf("panel %q: datasource %+v, want prometheus ${datasource}", p.Title, p.Datasource)
		}
		if other, dup := ids[p.ID]; dup || p.ID == 0 {
			t.Errorf("panel %q: id %d (also %q)", p.Title, p.ID, other)
		}
		ids[p.ID] = p.Title
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" || !isDS(tg.Datasource) {
				t.Errorf("panel %q target %s: expr %q, datasource %+v", p.Title, tg.RefID, tg.Expr, tg.Datasource)
			}
			if tg.Expr != "" && !strings.Contains(tg.Expr, `damper_name=~"$damper_name"`) {
				t.Errorf("panel %q target %s does not follow the damper_name variable: %s", p.Title, tg.RefID, tg.Expr)
			}
		}
	}
}

// Every query of the dashboard names metrics and labels that Damper emits,
// whether the service exports traces too or metrics alone.
func TestDashboardNamesEmittedMetrics(t *testing.T) {
	d, _ := loadDashboard(t)
	for _, tracing := range []bool{false, true} {
		name := "metrics only"
		if tracing {
			name = "metrics and traces"
		}
		t.Run(name, func(t *testing.T) { checkDashboard(t, d, emitted(t, tracing)) })
	}
}

func checkDashboard(t *testing.T, d *dashboard, emit map[string]*series) {
	for _, p := range check(d.queries(t), emit) {
		t.Error(p)
	}
	if t.Failed() {
		var have []string
		for n, s := range emit {
			have = append(have, fmt.Sprintf("%s (%s %s) labels %q", n, s.kind, s.family, sortedKeys(s.labels)))
		}
		sort.Strings(have)
		t.Logf("Damper emits:\n  %s", strings.Join(have, "\n  "))
	}

	// Every metric Damper emits has a panel, so that a new one is not
	// forgotten.
	used := map[string]bool{}
	for _, q := range d.queries(t) {
		ms, _, _ := names(q.expr)
		for _, m := range ms {
			if s, ok := emit[m]; ok {
				used[s.family] = true
			}
		}
	}
	for _, s := range emit {
		if !used[s.family] {
			t.Errorf("metric %s (%s) has no panel", s.family, s.kind)
			used[s.family] = true
		}
	}
}

// The check fails on a name Damper does not emit, under the OpenTelemetry
// name, the wrong suffix or the old exporter's name, and on a label that
// the metric does not carry.
func TestDashboardCheckCatchesWrongNames(t *testing.T) {
	emit := emitted(t, true)
	if p := check([]query{{"good", `sum by (damper_denial_reason) (rate(damper_retry_denials_total[5m]))`}}, emit); len(p) != 0 {
		t.Fatalf("a correct query is reported: %q", p)
	}
	for _, tt := range []struct{ expr, want string }{
		{`rate(damper_attempt_total[5m])`, "metric damper_attempt_total is not emitted"},
		{`rate(damper_attempts[5m])`, "metric damper_attempts is not emitted"},
		{`histogram_quantile(0.99, rate(damper_request_duration_bucket[5m]))`, "metric damper_request_duration_bucket is not emitted"},
		{`rate(damper_retry_cost_total[5m])`, "metric damper_retry_cost_total is not emitted"},
		{`damper_retry_budget_balance_total`, "metric damper_retry_budget_balance_total is not emitted"},
		{`sum by (damper_denial_reasons) (rate(damper_retry_denials_total[5m]))`, "label damper_denial_reasons is on none"},
		{`damper_retry_budget_balance{damper_provider="anthropic"}`, "label damper_provider is on none"},
		{`sum(rate(damper_attempts_total{`, "unterminated"},
	} {
		p := check([]query{{"bad", tt.expr}}, emit)
		if len(p) == 0 || !strings.Contains(strings.Join(p, "\n"), tt.want) {
			t.Errorf("check(%q) = %q, want a problem containing %q", tt.expr, p, tt.want)
		}
	}

	// And through the dashboard: one panel renamed is reported, by title.
	d, _ := loadDashboard(t)
	for i := range d.Panels {
		if len(d.Panels[i].Targets) > 0 {
			d.Panels[i].Targets = append(d.Panels[i].Targets, target{RefID: "Z", Expr: `rate(damper_denials_total[5m])`})
			break
		}
	}
	before := len(check(func() []query { d, _ := loadDashboard(t); return d.queries(t) }(), emit))
	p := check(d.queries(t), emit)
	if len(p) != before+1 || !strings.Contains(strings.Join(p, "\n"), "target Z: metric damper_denials_total is not emitted") {
		t.Errorf("a wrong name added to the dashboard: problems %q", p)
	}
}
