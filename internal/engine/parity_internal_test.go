package engine

import (
	"bytes"
	"net/http"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// FuzzParityFeatures: the one-pass read of a body's features agrees with
// gjson's look-up of each member (the first of duplicates counting), and
// never panics, whatever the body.
func FuzzParityFeatures(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","cache_control":{"type":"ephemeral"},"messages":[]}`,
		`{"cache_control":null,"inference_geo":"us","mcp_servers":[{"url":"https://x"}]}`,
		`{"tools":[{"type":"web_search_20250305","name":"web_search"},{"type":"code_execution_20250825"}]}`,
		`{"tools":[{"type":"web\u005ffetch_20250910"}],"tools":[{"type":"code_execution_1"}]}`,
		`{"cache\u005fcontrol":{},"model":"m"}`,
		`{"tools":{"type":"web_fetch_20250910"}}`, `{"tools":[1,"web_fetch_x",{"type":7},{"type":["web_fetch_x"]}]}`,
		`{"cache_control":null,"cache_control":{}}`, `{"tools":[` + strings.Repeat(`[`, 64) + `]}`,
		`[{"cache_control":{}}]`, `{"tools":`, ``, `{}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got := readBodyFacts(body, true)
		if off := readBodyFacts(body, false); off.features != 0 {
			t.Fatalf("readBodyFacts(%q, false) read features %b", body, off.features)
		}
		if !gjson.ValidBytes(body) || !gjson.ParseBytes(body).IsObject() {
			return // only that it does not panic
		}
		if want := slowFacts(body, true); got.features != want.features {
			t.Fatalf("readBodyFacts(%q) features %b; gjson says %b", body, got.features, want.features)
		}
	})
}

// The features read from bodies as callers send them, hostile ones among
// them.
func TestParityFeaturesOfBodies(t *testing.T) {
	deep := `{"tools":[{"type":"custom","input_schema":` + strings.Repeat(`{"a":`, 10000) + `1` + strings.Repeat(`}`, 10000) + `}],"model":"m"}`
	many := `{"tools":[` + strings.Repeat(`{"type":"custom","name":"t"},`, 20000) + `{"type":"web_fetch_20250910"}]}`
	for _, tc := range []struct {
		name, body string
		want       bodyFeature
	}{
		{"plain", `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`, 0},
		{"automatic caching", `{"model":"m","cache_control":{"type":"ephemeral"}}`, featCacheControl},
		{"a block's cache_control is no top-level one", `{"system":[{"type":"text","text":"x","cache_control":{"type":"ephemeral"}}]}`, 0},
		{"null members", `{"cache_control":null,"inference_geo":null,"mcp_servers":null}`, 0},
		{"inference_geo and mcp_servers", `{"inference_geo":"us","mcp_servers":[]}`, featInferenceGeo | featMCPServers},
		{"server tools", `{"tools":[{"name":"web_search","type":"web_search_20260209"},{"type":"web_fetch_20260209"},{"type":"code_execution_20260120"}]}`,
			featWebSearch | featWebFetch | featCodeExecution},
		{"client tools", `{"tools":[{"name":"web_fetch_20250910","input_schema":{"type":"object"}},{"type":"text_editor_20250728"}]}`, 0},
		{"a tool type in a message is no tool", `{"messages":[{"role":"user","content":"{\"type\":\"web_fetch_20250910\"}"}]}`, 0},
		{"escaped key (gjson's read)", `{"cache\u005fcontrol":{"type":"ephemeral"}}`, featCacheControl},
		{"escaped type", `{"tools":[{"type":"web\u005ffetch_20250910"}]}`, featWebFetch},
		{"tools not an array", `{"tools":{"type":"web_fetch_20250910"}}`, 0},
		{"deeply nested schema", deep, 0},
		{"a server tool after 20,000 others", many, featWebFetch},
		{"cut short: gjson reads the member begun", `{"cache_control":{"type":`, featCacheControl},
		{"not an object", `["cache_control"]`, 0},
	} {
		if got := readBodyFacts([]byte(tc.body), true).features; got != tc.want {
			t.Errorf("%s: features %b, want %b", tc.name, got, tc.want)
		}
	}
}

// needs.gap reads the anthropic-beta header's values, trimmed, across
// lines and commas; the first-party API lacks none of them; at most
// maxBetasRead values are read.
func TestParityGapOfBetas(t *testing.T) {
	h := http.Header{}
	h.Add("Anthropic-Beta", "context-1m-2025-08-07 ,  ")
	h.Add("Anthropic-Beta", " interleaved-thinking-2025-05-14, files-api-2025-04-14")
	need := needsOf(&http.Request{Header: h}, 0)
	for provider, want := range map[string]string{ProviderBedrock: "files-api-2025-04-14", ProviderVertex: "files-api-2025-04-14", ProviderAnthropic: ""} {
		if reason, feature := need.gap(provider); feature != want || (want != "") != (reason == skipUnsupportedBeta) {
			t.Errorf("%s: gap %q %q, want %q", provider, reason, feature, want)
		}
	}
	long := strings.Repeat("x,", maxBetasRead) + "files-api-2025-04-14"
	need = needsOf(&http.Request{Header: http.Header{"Anthropic-Beta": {long}}}, 0)
	if reason, _ := need.gap(ProviderBedrock); reason != "" {
		t.Errorf("a beta after %d others: %q, want it unread", maxBetasRead, reason)
	}
	need = needsOf(&http.Request{Header: http.Header{}}, featWebSearch)
	if reason, feature := need.gap(ProviderVertex); reason != "" {
		t.Errorf("web search on Vertex: %q %q, want served", reason, feature)
	}
	if reason, feature := need.gap(ProviderBedrock); reason != skipServerTool || feature != "web_search" {
		t.Errorf("web search on Bedrock: %q %q", reason, feature)
	}
}

// Each row of the table names a feature once, its reason is one of the
// Skip reasons, and the first-party API serves it; each body feature has
// its row.
func TestParityTable(t *testing.T) {
	seen := map[string]bool{}
	var bodies bodyFeature
	for _, r := range parityTable {
		switch {
		case seen[r.feature]:
			t.Errorf("%s: listed twice", r.feature)
		case !bool(r.firstParty):
			t.Errorf("%s: the first-party API serves every feature", r.feature)
		case r.body == 0 && r.reason != skipUnsupportedBeta, r.body != 0 && r.reason == skipUnsupportedBeta:
			t.Errorf("%s: reason %q", r.feature, r.reason)
		}
		seen[r.feature] = true
		bodies |= r.body
	}
	if all := featCacheControl | featInferenceGeo | featMCPServers | featWebSearch | featWebFetch | featCodeExecution; bodies != all {
		t.Errorf("body features with rows %b, want %b", bodies, all)
	}
	for from, to := range betaRenames {
		if r := parityIndex.betas[from]; r == nil || !bool(r.bedrock) || !bool(r.vertex) || parityIndex.betas[to] == nil {
			t.Errorf("%s → %s: want both in the table, served on the clouds", from, to)
		}
	}
}

// betasFor renames tool search's beta for the clouds alone, and hands
// back the header's own slice when nothing is renamed.
func TestParityBetasFor(t *testing.T) {
	v := []string{"context-1m-2025-08-07", " advanced-tool-use-2025-11-20,files-api-2025-04-14"}
	if got := betasFor(ProviderAnthropic, v); &got[0] != &v[0] {
		t.Error("first-party: a copy")
	}
	got := betasFor(ProviderVertex, v)
	if strings.Join(got, "|") != "context-1m-2025-08-07|tool-search-tool-2025-10-19,files-api-2025-04-14" || v[1] != " advanced-tool-use-2025-11-20,files-api-2025-04-14" {
		t.Errorf("Vertex: %q (the caller's %q)", got, v)
	}
	plain := []string{"context-1m-2025-08-07"}
	if got := betasFor(ProviderBedrock, plain); &got[0] != &plain[0] {
		t.Error("Bedrock, nothing to rename: a copy")
	}
}

// With no backends to fall back to, a call reads no feature: the read of
// its body allocates nothing more than before.
func TestParityReadsNothingWithoutFallbacks(t *testing.T) {
	if raceEnabled {
		t.Skip("allocations are counted without -race")
	}
	body := []byte(`{"model":"claude-sonnet-4-5","max_tokens":8,"cache_control":{"type":"ephemeral"},` +
		`"tools":[{"type":"web_fetch_20250910","name":"web_fetch"}],"messages":[{"role":"user","content":"` + strings.Repeat("x", 4096) + `"}]}`)
	if n := testing.AllocsPerRun(100, func() { readBodyFacts(body, false) }); n != 0 {
		t.Errorf("readBodyFacts without parity: %v allocations, want 0", n)
	}
	if f := readBodyFacts(body, true); f.features != featCacheControl|featWebFetch || !bytes.Contains(body, []byte("web_fetch")) {
		t.Errorf("with parity: features %b", f.features)
	}
}
