package damper_test

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/tidwall/gjson"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// parityRig is a first-party primary (the telemetry rig's server) with
// Bedrock, Vertex and a second first-party backend to fall back to, in that
// order.
type parityRig struct {
	*telRig
	bedrock, vertex, second *dampertest.Server
	n                       int // calls made, each its own scenario
}

func newParityRig(t *testing.T) *parityRig {
	t.Helper()
	t.Setenv("AWS_BEARER_TOKEN_BEDROCK", "")
	r := &parityRig{
		bedrock: dampertest.NewServer(dampertest.InMemory(), dampertest.Bedrock("us-east-1")),
		vertex:  dampertest.NewServer(dampertest.InMemory(), dampertest.Vertex("us-east5", "parity-test")),
		second:  dampertest.NewServer(dampertest.InMemory()),
	}
	for _, s := range []*dampertest.Server{r.bedrock, r.vertex, r.second} {
		t.Cleanup(s.Close)
	}
	r.telRig = newTelRig(t, damper.Policy{MaxAttempts: 1}, []damper.Setting{damper.WithBackends(
		damper.Backend{Name: "bedrock", Provider: damper.ProviderBedrock, Options: r.bedrock.Options()},
		damper.Backend{Name: "vertex", Provider: damper.ProviderVertex, Options: r.vertex.Options()},
		damper.Backend{Name: "second", Provider: damper.ProviderAnthropic, Options: []option.RequestOption{
			option.WithBaseURL(dampertest.MemoryURL), option.WithAPIKey("second-key"),
			option.WithHTTPClient(&http.Client{Transport: dampertest.Transport(r.second.Handler())}),
		}},
	)})
	return r
}

// overloaded makes one call of claude-sonnet-4-5 with opts that the primary
// answers 529 and every backend it reaches with its first attempt fails
// with 503 but the one named answer, and returns its report and what each
// backend got of it.
func (r *parityRig) overloaded(t *testing.T, answer string, opts ...option.RequestOption) (damper.Report, map[string][]dampertest.Request) {
	t.Helper()
	r.n++
	scenario := fmt.Sprintf("parity-%d", r.n)
	r.srv.Script(scenario, dampertest.Status(529))
	servers := map[string]*dampertest.Server{"bedrock": r.bedrock, "vertex": r.vertex, "second": r.second}
	for name, s := range servers {
		if name == answer {
			s.Script(scenario, dampertest.OK())
		} else {
			s.Script(scenario, dampertest.Status(503))
		}
	}
	var rep damper.Report
	opts = append(opts, dampertest.Scenario(scenario), damper.ReportInto(&rep))
	_, _ = r.client.Messages.New(context.Background(), telParams("claude-sonnet-4-5"), opts...)
	got := map[string][]dampertest.Request{}
	for name, s := range servers {
		for _, q := range s.Requests() {
			if q.Scenario == scenario {
				got[name] = append(got[name], q)
			}
		}
	}
	return rep, got
}

// lacking is the Skips of a call of claude-sonnet-4-5 whose feature the
// named backends' platforms lack, for reason.
func lacking(reason, feature string, backends ...string) []damper.Skip {
	var out []damper.Skip
	for _, b := range backends {
		out = append(out, damper.Skip{Backend: b, Model: "claude-sonnet-4-5", Reason: reason, Feature: feature})
	}
	return out
}

// A request that uses a feature a platform is documented to lack never
// reaches that platform's backend: the call moves on to the next one that
// serves it, and its report says why. A request that every platform serves
// falls back as before.
func TestParitySkipsAPlatformThatLacksAFeature(t *testing.T) {
	r := newParityRig(t)
	ephemeral := option.WithJSONSet("cache_control", map[string]string{"type": "ephemeral"})
	tool := func(typ, name string) option.RequestOption {
		return option.WithJSONSet("tools", []map[string]string{{"type": typ, "name": name}})
	}
	for _, tc := range []struct {
		name     string
		opts     []option.RequestOption
		answer   string // the backend that answers
		backends string // the attempts
		skipped  []damper.Skip
	}{
		{"no feature", nil, "bedrock", "primary,bedrock", nil},
		{"a beta every platform serves", []option.RequestOption{option.WithHeader("anthropic-beta", "context-1m-2025-08-07")},
			"vertex", "primary,bedrock,vertex", nil},
		{"a beta neither cloud serves", []option.RequestOption{option.WithHeader("anthropic-beta", "context-1m-2025-08-07, files-api-2025-04-14")},
			"second", "primary,second", lacking("unsupported_beta", "files-api-2025-04-14", "bedrock", "vertex")},
		{"a beta Vertex alone serves", []option.RequestOption{option.WithHeader("anthropic-beta", "web-search-2025-03-05")},
			"vertex", "primary,vertex", lacking("unsupported_beta", "web-search-2025-03-05", "bedrock")},
		{"a beta Bedrock alone serves", []option.RequestOption{option.WithHeaderAdd("anthropic-beta", "structured-outputs-2025-11-13")},
			"bedrock", "primary,bedrock", lacking("unsupported_beta", "structured-outputs-2025-11-13", "vertex")},
		{"a top-level cache_control", []option.RequestOption{ephemeral},
			"second", "primary,second", lacking("top_level_cache_control", "cache_control", "bedrock", "vertex")},
		{"inference_geo", []option.RequestOption{option.WithJSONSet("inference_geo", "us")},
			"second", "primary,second", lacking("inference_geo", "inference_geo", "bedrock", "vertex")},
		{"web fetch", []option.RequestOption{tool("web_fetch_20250910", "web_fetch")},
			"second", "primary,second", lacking("unsupported_server_tool", "web_fetch", "bedrock", "vertex")},
		{"web search", []option.RequestOption{tool("web_search_20250305", "web_search")},
			"vertex", "primary,vertex", lacking("unsupported_server_tool", "web_search", "bedrock")},
		{"code execution", []option.RequestOption{tool("code_execution_20250825", "code_execution")},
			"second", "primary,second", lacking("unsupported_server_tool", "code_execution", "bedrock", "vertex")},
		{"a client tool", []option.RequestOption{option.WithJSONSet("tools", []map[string]any{{"name": "get_weather", "input_schema": map[string]string{"type": "object"}}})},
			"bedrock", "primary,bedrock", nil},
		{"a null cache_control", []option.RequestOption{option.WithJSONSet("cache_control", nil)},
			"bedrock", "primary,bedrock", nil},
	} {
		rep, got := r.overloaded(t, tc.answer, tc.opts...)
		if backends(rep) != tc.backends || !slices.Equal(rep.Skipped, tc.skipped) {
			t.Errorf("%s: attempts on %s, skipped %+v; want attempts on %s, skipped %+v", tc.name, backends(rep), rep.Skipped, tc.backends, tc.skipped)
		}
		for _, sk := range tc.skipped {
			if n := len(got[sk.Backend]); n != 0 {
				t.Errorf("%s: %s got %d requests, want none", tc.name, sk.Backend, n)
			}
		}
	}

	// The counter by backend and reason, and a Warn line once per backend
	// and feature: the same request again adds to the one, not the other.
	r.overloaded(t, "second", ephemeral)
	m := r.metricValues(t)
	for key, want := range map[string]float64{
		"damper.fallback.skipped{damper.backend=bedrock,damper.fallback.reason=top_level_cache_control}": 2,
		"damper.fallback.skipped{damper.backend=vertex,damper.fallback.reason=top_level_cache_control}":  2,
		"damper.fallback.skipped{damper.backend=bedrock,damper.fallback.reason=unsupported_beta}":        2,
		"damper.fallback.skipped{damper.backend=vertex,damper.fallback.reason=unsupported_beta}":         2,
		"damper.fallback.skipped{damper.backend=bedrock,damper.fallback.reason=unsupported_server_tool}": 3,
		"damper.fallback.skipped{damper.backend=vertex,damper.fallback.reason=unsupported_server_tool}":  2,
		"damper.fallback.skipped{damper.backend=bedrock,damper.fallback.reason=inference_geo}":           1,
		"damper.fallback.skipped{damper.backend=vertex,damper.fallback.reason=inference_geo}":            1,
	} {
		if m[key] != want {
			t.Errorf("%s = %v, want %v", key, m[key], want)
		}
	}
	if n := len(keysWith(m, "fallback.skipped")); n != 8 {
		t.Errorf("damper.fallback.skipped has %d series, want 8: %v", n, keysWith(m, "fallback.skipped"))
	}
	lines := map[string]int{}
	for _, l := range r.logLines(t) {
		if l["msg"] == "damper: cannot fall back to a backend whose platform lacks a feature the request uses" {
			if l["level"] != "WARN" || l["model"] != "claude-sonnet-4-5" || l["fix"] == nil {
				t.Errorf("line %v", l)
			}
			lines[fmt.Sprintf("%s %s %s %s", l["backend"], l["provider"], l["reason"], l["feature"])]++
		}
	}
	want := map[string]int{}
	for _, tc := range []struct{ backend, provider, reason, feature string }{
		{"bedrock", damper.ProviderBedrock, "unsupported_beta", "files-api-2025-04-14"},
		{"vertex", damper.ProviderVertex, "unsupported_beta", "files-api-2025-04-14"},
		{"bedrock", damper.ProviderBedrock, "unsupported_beta", "web-search-2025-03-05"},
		{"vertex", damper.ProviderVertex, "unsupported_beta", "structured-outputs-2025-11-13"},
		{"bedrock", damper.ProviderBedrock, "top_level_cache_control", "cache_control"},
		{"vertex", damper.ProviderVertex, "top_level_cache_control", "cache_control"},
		{"bedrock", damper.ProviderBedrock, "inference_geo", "inference_geo"},
		{"vertex", damper.ProviderVertex, "inference_geo", "inference_geo"},
		{"bedrock", damper.ProviderBedrock, "unsupported_server_tool", "web_fetch"},
		{"vertex", damper.ProviderVertex, "unsupported_server_tool", "web_fetch"},
		{"bedrock", damper.ProviderBedrock, "unsupported_server_tool", "web_search"},
		{"bedrock", damper.ProviderBedrock, "unsupported_server_tool", "code_execution"},
		{"vertex", damper.ProviderVertex, "unsupported_server_tool", "code_execution"},
	} {
		want[fmt.Sprintf("%s %s %s %s", tc.backend, tc.provider, tc.reason, tc.feature)] = 1
	}
	if !maps.Equal(lines, want) {
		t.Errorf("Warn lines %v\nwant %v", lines, want)
	}
}

// A model a platform has no ID for is the first reason a backend is left
// out: a call of a model the clouds lack, with a feature Vertex serves,
// says no_model_id for both, reaches neither, and moves to the first-party
// backend alone.
func TestParityModelAndFeatureGaps(t *testing.T) {
	r := newParityRig(t)
	r.n++
	scenario := "gaps"
	r.srv.Script(scenario, dampertest.Status(529))
	r.second.Script(scenario, dampertest.Status(503))
	var rep damper.Report
	_, err := r.client.Messages.New(context.Background(), telParams("claude-sonnet-4-6"),
		option.WithHeader("anthropic-beta", "web-search-2025-03-05"), dampertest.Scenario(scenario), damper.ReportInto(&rep))
	want := []damper.Skip{
		{Backend: "bedrock", Model: "claude-sonnet-4-6", Reason: damper.SkipNoModelID},
		{Backend: "vertex", Model: "claude-sonnet-4-6", Reason: damper.SkipNoModelID},
	}
	if err == nil || backends(rep) != "primary,second" || !slices.Equal(rep.Skipped, want) {
		t.Fatalf("%v, attempts on %s, skipped %+v; want an error after primary,second, skipped %+v", err, backends(rep), rep.Skipped, want)
	}
	if n := len(r.bedrock.Requests()) + len(r.vertex.Requests()); n != 0 {
		t.Fatalf("the clouds got %d requests, want none", n)
	}
}

// Bedrock takes the betas in the body: the SDK's bedrock package moves the
// anthropic-beta header there, and tool search goes under the clouds' name
// on Bedrock and Vertex, the header's other values unchanged.
func TestParityBetasAsEachPlatformNamesThem(t *testing.T) {
	r := newParityRig(t)
	beta := option.WithHeader("anthropic-beta", "advanced-tool-use-2025-11-20,context-1m-2025-08-07")

	_, got := r.overloaded(t, "bedrock", beta)
	if len(got["bedrock"]) != 1 {
		t.Fatalf("Bedrock got %d requests, want 1", len(got["bedrock"]))
	}
	q := got["bedrock"][0]
	betas := gjson.GetBytes(q.Body, "anthropic_beta").Array()
	if q.AuthError != "" || len(betas) != 2 || betas[0].Str != "tool-search-tool-2025-10-19" || betas[1].Str != "context-1m-2025-08-07" || q.Header.Get("anthropic-beta") != "" {
		t.Fatalf("Bedrock got anthropic_beta %v in the body, header %q (refused: %q); want [tool-search-tool-2025-10-19 context-1m-2025-08-07] and no header",
			betas, q.Header.Get("anthropic-beta"), q.AuthError)
	}

	_, got = r.overloaded(t, "vertex", beta)
	if len(got["vertex"]) != 1 || got["vertex"][0].Header.Get("anthropic-beta") != "tool-search-tool-2025-10-19,context-1m-2025-08-07" {
		t.Fatalf("Vertex got %+v; want one request with anthropic-beta: tool-search-tool-2025-10-19,context-1m-2025-08-07", got["vertex"])
	}

	_, got = r.overloaded(t, "second", beta)
	if len(got["second"]) != 1 || got["second"][0].Header.Get("anthropic-beta") != "advanced-tool-use-2025-11-20,context-1m-2025-08-07" {
		t.Fatalf("the first-party backend got %+v; want the header as the caller sent it", got["second"])
	}
}
