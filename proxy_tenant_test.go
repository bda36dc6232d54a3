package damper_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/damper-ai/damper-go"
)

// tenantTelemetry is a proxy in key mode with tenants alpha and beta and a
// proxy in pass-through mode, both with in-memory telemetry, in front of
// one fake API that overloads, at the operator's primary key, a call
// whose message is "overload".
type tenantTelemetry struct {
	spans  *tracetest.InMemoryExporter
	reader *sdkmetric.ManualReader
	keyed  string // the key-mode proxy's URL
	open   string // the pass-through proxy's URL
}

func newTenantTelemetry(t *testing.T) *tenantTelemetry {
	t.Helper()
	r := &tenantTelemetry{spans: tracetest.NewInMemoryExporter(), reader: sdkmetric.NewManualReader()}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(r.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r.reader))
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		if req.Header.Get("X-Api-Key") == authOperator && strings.Contains(string(body), `"overload"`) {
			overloaded(w, req)
			return
		}
		answerText("hi")(w, req)
	}))
	t.Cleanup(api.Close)
	serve := func(d *damper.Damper, cfg damper.ProxyConfig) string {
		cfg.Upstream = api.URL
		px, err := damper.NewProxy(d, cfg)
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(px)
		t.Cleanup(srv.Close)
		return srv.URL
	}
	policy := damper.Policy{MaxAttempts: 1, BackoffBase: damper.None}
	keyed, err := damper.New(policy, damper.WithTracerProvider(tp), damper.WithMeterProvider(mp),
		damper.WithBackends(damper.Backend{
			Name: "second", Provider: damper.ProviderAnthropic,
			Options: []option.RequestOption{option.WithBaseURL(api.URL), option.WithAPIKey(authSecond)},
		}))
	if err != nil {
		t.Fatal(err)
	}
	r.keyed = serve(keyed, damper.ProxyConfig{UpstreamAPIKey: authOperator, Tenants: []damper.Tenant{
		{Name: "alpha", KeySHA256: []string{damper.ClientKeyHash("dk-alpha")}},
		{Name: "beta", KeySHA256: []string{damper.ClientKeyHash("dk-beta")}},
	}})
	open, err := damper.New(policy, damper.WithTracerProvider(tp), damper.WithMeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}
	r.open = serve(open, damper.ProxyConfig{})
	return r
}

// post sends a Messages call to the proxy at url with key, overloaded at
// the primary when overload is set, and wants status.
func (r *tenantTelemetry) post(t *testing.T, url, key string, overload bool, status int) {
	t.Helper()
	body := plainBody
	if overload {
		body = strings.Replace(body, `"hi"`, `"overload"`, 1)
	}
	req, err := http.NewRequest(http.MethodPost, url+"/v1/messages", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Api-Key", key)
	req.Header.Set("Anthropic-Version", "2023-06-01")
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != status {
		t.Fatalf("%s with key %q: status %d, want %d", url, key, res.StatusCode, status)
	}
	for k := range res.Header {
		if strings.Contains(strings.ToLower(k), "tenant") {
			t.Errorf("answer header %s: the proxy reports no tenant to its client", k)
		}
	}
}

// tenantOf returns the damper.tenant of attrs, and whether there is one.
func tenantOf(attrs []attribute.KeyValue) (string, bool) {
	for _, kv := range attrs {
		if kv.Key == "damper.tenant" {
			return kv.Value.AsString(), true
		}
	}
	return "", false
}

// TestProxyTenantTelemetry: in key mode each call's damper.request span
// and its metrics name the tenant whose key it presented; in pass-through
// mode a call has no tenant; the metrics name no tenant but the
// configured ones.
func TestProxyTenantTelemetry(t *testing.T) {
	r := newTenantTelemetry(t)
	r.post(t, r.keyed, "dk-alpha", false, 200)
	r.post(t, r.keyed, "dk-alpha", false, 200)
	r.post(t, r.keyed, "dk-beta", true, 200) // the primary, then the second backend
	r.post(t, r.keyed, "dk-gamma", false, 401)
	r.post(t, r.open, testKey, false, 200)

	spans := map[string]int{}
	for _, s := range r.spans.GetSpans() {
		if s.Name != "damper.request" {
			continue
		}
		tenant, ok := tenantOf(s.Attributes)
		if !ok {
			tenant = "(none)"
		}
		spans[tenant]++
	}
	if want := map[string]int{"alpha": 2, "beta": 1, "(none)": 1}; !reflect.DeepEqual(spans, want) {
		t.Errorf("damper.request spans by tenant: %v, want %v", spans, want)
	}

	var rm metricdata.ResourceMetrics
	if err := r.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	counts := map[string]map[string]int64{} // metric, tenant: count
	add := func(metric string, set attribute.Set, n int64) {
		tenant, ok := set.Value("damper.tenant")
		name := "(none)"
		if ok {
			name = tenant.AsString()
			if name != "alpha" && name != "beta" {
				t.Errorf("%s: damper.tenant %q is not a configured tenant", metric, name)
			}
		}
		if counts[metric] == nil {
			counts[metric] = map[string]int64{}
		}
		counts[metric][name] += n
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range data.DataPoints {
					add(m.Name, p.Attributes, p.Value)
				}
			case metricdata.Sum[float64]:
				for _, p := range data.DataPoints {
					add(m.Name, p.Attributes, 1)
				}
			case metricdata.Gauge[int64]:
				for _, p := range data.DataPoints {
					add(m.Name, p.Attributes, 1)
				}
			case metricdata.Gauge[float64]:
				for _, p := range data.DataPoints {
					add(m.Name, p.Attributes, 1)
				}
			case metricdata.Histogram[float64]:
				for _, p := range data.DataPoints {
					add(m.Name, p.Attributes, int64(p.Count))
				}
			}
		}
	}
	for metric, want := range map[string]map[string]int64{
		"damper.request.duration": {"alpha": 2, "beta": 1, "(none)": 1},
		"damper.attempts":         {"alpha": 2, "beta": 2, "(none)": 1},
		"damper.fallbacks":        {"(none)": 1}, // not by tenant
	} {
		if !reflect.DeepEqual(counts[metric], want) {
			t.Errorf("%s by tenant: %v, want %v", metric, counts[metric], want)
		}
	}
	for metric, byTenant := range counts {
		if strings.HasPrefix(metric, "gen_ai.") && len(byTenant) != 1 {
			t.Errorf("%s is recorded by tenant: %v", metric, byTenant)
		}
	}
}
