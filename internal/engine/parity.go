package engine

import (
	"context"
	"log/slog"
	"net/http"
	"strings"

	"github.com/tidwall/gjson"
)

// Feature parity: what each platform serves of what a request may use, so
// that a call never moves to a backend whose platform is documented to
// refuse it, and the translations a platform needs.
//
// Only fallback backends are checked. The primary is the caller's own
// choice (the SDK adapter's client chain, whatever platform it reaches), so
// its answer, even a refusal, is the caller's to see; the proxy's primary
// is the first-party API, which serves every feature below.

// The Reasons of a Skip for a platform gap; Skip.Feature names the feature.
const (
	skipUnsupportedBeta = "unsupported_beta"        // an anthropic-beta value
	skipTopLevelCache   = "top_level_cache_control" // automatic prompt caching
	skipInferenceGeo    = "inference_geo"           // data residency
	skipMCPServers      = "mcp_servers"             // the MCP connector
	skipServerTool      = "unsupported_server_tool" // a server tool, by its type's family
)

// onPlatform is whether a platform serves a feature.
type onPlatform bool

const (
	yes onPlatform = true
	no  onPlatform = false
)

// parityRow is one feature and the platforms that serve it.
type parityRow struct {
	feature                     string // as Skip.Feature names it
	reason                      string // the Skip's Reason where it is refused
	body                        bodyFeature
	firstParty, bedrock, vertex onPlatform
}

// parityTable says, per feature a request may use, which platforms serve
// it. Bedrock is its InvokeModel API, which the SDK's bedrock package
// calls; Vertex is its rawPredict API, which the SDK's vertex package calls.
// A row says "no" only where the platform's gap is documented (sources
// below); a feature the table lacks, or whose support is not documented
// either way, is left to the platform: the call may go there.
//
// Sources: Anthropic's "Features overview" (its availability column per
// platform), "Prompt caching" (automatic caching: the Claude API and
// Microsoft Foundry; "Bedrock and Vertex AI do not support automatic
// caching", and the Bedrock InvokeModel integration answers 400 to a
// top-level cache_control), "Data residency" (inference_geo: "only
// available on the Claude API"), "Tool search tool" (its beta header per
// platform), and Google Cloud's "Web search with Anthropic Claude models"
// (Vertex serves web search).
//
// Left out as undocumented or contradicted between sources, so allowed
// everywhere: the 1-hour cache TTL (extended-cache-ttl-2025-04-11) on
// Bedrock, fast mode, prompt-caching-scope, effort, interleaved thinking,
// token-efficient tools, output-128k.
var parityTable = []parityRow{
	// {feature, Skip.Reason, body feature (0: a beta value), first-party, Bedrock, Vertex}
	{"cache_control", skipTopLevelCache, featCacheControl, yes, no, no},
	{"inference_geo", skipInferenceGeo, featInferenceGeo, yes, no, no},
	{"mcp_servers", skipMCPServers, featMCPServers, yes, no, no},
	{"web_search", skipServerTool, featWebSearch, yes, no, yes},
	{"web_fetch", skipServerTool, featWebFetch, yes, no, no},
	{"code_execution", skipServerTool, featCodeExecution, yes, no, no},

	// anthropic-beta values
	{"files-api-2025-04-14", skipUnsupportedBeta, 0, yes, no, no},            // Files API
	{"mcp-client-2025-04-04", skipUnsupportedBeta, 0, yes, no, no},           // MCP connector
	{"mcp-client-2025-11-20", skipUnsupportedBeta, 0, yes, no, no},           // MCP connector
	{"skills-2025-10-02", skipUnsupportedBeta, 0, yes, no, no},               // Agent Skills
	{"code-execution-2025-05-22", skipUnsupportedBeta, 0, yes, no, no},       // code execution
	{"code-execution-2025-08-25", skipUnsupportedBeta, 0, yes, no, no},       // code execution
	{"web-fetch-2025-09-10", skipUnsupportedBeta, 0, yes, no, no},            // web fetch
	{"web-search-2025-03-05", skipUnsupportedBeta, 0, yes, no, yes},          // web search
	{"advisor-tool-2026-03-01", skipUnsupportedBeta, 0, yes, no, no},         // advisor tool
	{"structured-outputs-2025-11-13", skipUnsupportedBeta, 0, yes, yes, no},  // structured outputs
	{"context-1m-2025-08-07", skipUnsupportedBeta, 0, yes, yes, yes},         // 1M-token context window
	{"context-management-2025-06-27", skipUnsupportedBeta, 0, yes, yes, yes}, // context editing
	{"compact-2026-01-12", skipUnsupportedBeta, 0, yes, yes, yes},            // compaction
	{"computer-use-2025-01-24", skipUnsupportedBeta, 0, yes, yes, yes},       // computer use
	{"computer-use-2025-11-24", skipUnsupportedBeta, 0, yes, yes, yes},       // computer use
	{"advanced-tool-use-2025-11-20", skipUnsupportedBeta, 0, yes, yes, yes},  // tool search: renamed on Bedrock and Vertex (betaRenames)
	{"tool-search-tool-2025-10-19", skipUnsupportedBeta, 0, yes, yes, yes},   // tool search, the clouds' name
}

// betaRenames are the beta values a cloud platform names otherwise:
// tool search is advanced-tool-use-2025-11-20 on the Claude API and
// tool-search-tool-2025-10-19 on Bedrock and Vertex ("Tool search tool").
var betaRenames = map[string]string{
	"advanced-tool-use-2025-11-20": "tool-search-tool-2025-10-19",
}

// bodyFeature is a set of the members of a request body that not every
// platform serves, read once with the body's other facts (readBodyFacts).
type bodyFeature uint8

const (
	featCacheControl  bodyFeature = 1 << iota // a top-level cache_control: automatic caching
	featInferenceGeo                          // inference_geo
	featMCPServers                            // mcp_servers
	featWebSearch                             // a tool of type web_search_*
	featWebFetch                              // a tool of type web_fetch_*
	featCodeExecution                         // a tool of type code_execution_*
)

// serverTools are the server tools' families, by the prefix of their type
// ("web_search_20250305", "web_fetch_20250910", "code_execution_20250825").
var serverTools = [...]struct {
	prefix  string
	feature bodyFeature
}{
	{"web_search_", featWebSearch},
	{"web_fetch_", featWebFetch},
	{"code_execution_", featCodeExecution},
}

// topLevelKey is the feature a top-level member of a body named key is,
// when its value is not null; 0 for any other member.
func topLevelKey(key []byte) bodyFeature {
	switch string(key) {
	case "cache_control":
		return featCacheControl
	case "inference_geo":
		return featInferenceGeo
	case "mcp_servers":
		return featMCPServers
	}
	return 0
}

// toolFeatures is the server tools among types, the tools' types as
// gjson reads "#.type" of a tools array.
func toolFeatures(types gjson.Result) bodyFeature {
	var f bodyFeature
	types.ForEach(func(_, t gjson.Result) bool {
		if t.Type != gjson.String {
			return true
		}
		for _, s := range serverTools {
			if strings.HasPrefix(t.Str, s.prefix) {
				f |= s.feature
			}
		}
		return true
	})
	return f
}

// parityIndex finds a row by its body feature (bit) or beta value.
var parityIndex = func() (ix struct {
	body  [8]*parityRow
	betas map[string]*parityRow
}) {
	ix.betas = make(map[string]*parityRow, len(parityTable))
	for i := range parityTable {
		r := &parityTable[i]
		if r.body == 0 {
			ix.betas[r.feature] = r
			continue
		}
		for bit := range 8 {
			if r.body&(1<<bit) != 0 {
				ix.body[bit] = r
			}
		}
	}
	return ix
}()

// servedOn reports whether the platform provider serves r's feature.
func (r *parityRow) servedOn(provider string) bool {
	switch provider {
	case ProviderBedrock:
		return bool(r.bedrock)
	case ProviderVertex:
		return bool(r.vertex)
	}
	return bool(r.firstParty)
}

// requestNeeds are the features a call's request uses that a platform may
// lack: its body's, and its anthropic-beta header's values (the header's
// own slice, not a copy).
type requestNeeds struct {
	body  bodyFeature
	betas []string
}

// maxBetasRead bounds the anthropic-beta values a call checks: the header
// is the caller's, and real requests carry a handful.
const maxBetasRead = 64

// gap returns the first feature of need that the platform provider lacks,
// and the Reason of its Skip; "" when the platform serves them all.
func (need *requestNeeds) gap(provider string) (reason, feature string) {
	if provider == ProviderAnthropic || provider == "" {
		return "", ""
	}
	for bit := range 8 {
		if need.body&(1<<bit) == 0 {
			continue
		}
		if r := parityIndex.body[bit]; r != nil && !r.servedOn(provider) {
			return r.reason, r.feature
		}
	}
	n := 0
	for _, v := range need.betas {
		for rest := v; rest != "" && n < maxBetasRead; n++ {
			var beta string
			beta, rest, _ = strings.Cut(rest, ",")
			if r := parityIndex.betas[strings.TrimSpace(beta)]; r != nil && !r.servedOn(provider) {
				return r.reason, r.feature
			}
		}
	}
	return "", ""
}

// serves returns the backend's ID for model, or, when the call cannot
// move to the backend with it, the Reason of its Skip and the feature it
// lacks ("" for a missing model ID).
func (b *backend) serves(model string, need *requestNeeds) (id, reason, feature string) {
	id, ok := b.modelID(model)
	if !ok {
		return "", skipNoModelID, ""
	}
	if reason, feature = need.gap(b.provider); reason != "" {
		return "", reason, feature
	}
	return id, "", ""
}

// betasFor is the anthropic-beta header's values v as the platform
// provider names them (betaRenames): v itself when no value needs a
// new name.
func betasFor(provider string, v []string) []string {
	if provider != ProviderBedrock && provider != ProviderVertex {
		return v
	}
	renamed := false
	for _, s := range v {
		for beta := range strings.SplitSeq(s, ",") {
			if _, ok := betaRenames[strings.TrimSpace(beta)]; ok {
				renamed = true
			}
		}
	}
	if !renamed {
		return v
	}
	out := make([]string, len(v))
	for i, s := range v {
		parts := strings.Split(s, ",")
		for j, beta := range parts {
			if to, ok := betaRenames[strings.TrimSpace(beta)]; ok {
				parts[j] = to
			}
		}
		out[i] = strings.Join(parts, ",")
	}
	return out
}

// lacks tells that a call cannot move to backend b because its platform
// lacks feature, for reason: a Warn line the first time b meets the
// feature (the table's features are few, so each is logged).
func (b *backend) lacks(ctx context.Context, t *telemetry, model, reason, feature string) {
	if t.log == nil || !t.log.Enabled(ctx, slog.LevelWarn) || b.gaps.first(feature) != skipFirst {
		return
	}
	t.log.LogAttrs(ctx, slog.LevelWarn, "damper: cannot fall back to a backend whose platform lacks a feature the request uses",
		slog.String("backend", b.name), slog.String("provider", b.provider),
		slog.String("model", cutText(model, maxModelShown)), slog.String("reason", reason), slog.String("feature", feature),
		slog.String("fix", "leave the feature out of requests that must fall back, or give a backend whose platform serves it"))
}

// needsOf reads what req uses that a platform may lack, beside the body's
// features the call read with its facts.
func needsOf(req *http.Request, body bodyFeature) requestNeeds {
	return requestNeeds{body: body, betas: req.Header["Anthropic-Beta"]}
}
