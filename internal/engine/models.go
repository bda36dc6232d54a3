package engine

import (
	"strings"

	"github.com/damper-ai/damper-go/internal/core"
)

// The model IDs of each platform. Bedrock and Vertex name the same models
// differently: claude-sonnet-4-5-20250929 is
// anthropic.claude-sonnet-4-5-20250929-v1:0 on Bedrock (served on demand
// through the global.-prefixed cross-region inference profile) and
// claude-sonnet-4-5@20250929 on Vertex.

// platformModel is one model's IDs.
type platformModel struct {
	alias, dated string // first-party: claude-sonnet-4-5, claude-sonnet-4-5-20250929
	// bedrock is the Bedrock model ID, with the prefix of the cross-region
	// inference profile it is served on demand through, if any.
	bedrock, vertex string
}

// platformModels is the default table, for models that every platform
// serves under a published ID. Models missing from it need Backend.Models
// on Bedrock and Vertex; a first-party backend takes them as named.
var platformModels = []platformModel{
	{"claude-opus-4-5", "claude-opus-4-5-20251101", "global.anthropic.claude-opus-4-5-20251101-v1:0", "claude-opus-4-5@20251101"},
	{"claude-opus-4-1", "claude-opus-4-1-20250805", "us.anthropic.claude-opus-4-1-20250805-v1:0", "claude-opus-4-1@20250805"},
	{"claude-opus-4", "claude-opus-4-20250514", "us.anthropic.claude-opus-4-20250514-v1:0", "claude-opus-4@20250514"},
	{"claude-sonnet-4-5", "claude-sonnet-4-5-20250929", "global.anthropic.claude-sonnet-4-5-20250929-v1:0", "claude-sonnet-4-5@20250929"},
	{"claude-sonnet-4", "claude-sonnet-4-20250514", "global.anthropic.claude-sonnet-4-20250514-v1:0", "claude-sonnet-4@20250514"},
	{"claude-3-7-sonnet", "claude-3-7-sonnet-20250219", "us.anthropic.claude-3-7-sonnet-20250219-v1:0", "claude-3-7-sonnet@20250219"},
	{"claude-haiku-4-5", "claude-haiku-4-5-20251001", "global.anthropic.claude-haiku-4-5-20251001-v1:0", "claude-haiku-4-5@20251001"},
	{"claude-3-5-haiku", "claude-3-5-haiku-20241022", "us.anthropic.claude-3-5-haiku-20241022-v1:0", "claude-3-5-haiku@20241022"},
}

// modelIndex finds a table entry by any of its IDs; a Bedrock ID also
// without its profile prefix, or with another.
var modelIndex = func() map[string]*platformModel {
	m := make(map[string]*platformModel, 5*len(platformModels))
	for i := range platformModels {
		p := &platformModels[i]
		for _, id := range []string{p.alias, p.dated, p.bedrock, bedrockBase(p.bedrock), p.vertex} {
			m[id] = p
		}
	}
	return m
}()

// bedrockBase is a Bedrock model ID without its inference profile's
// geography prefix (us., eu., apac., global., ...).
func bedrockBase(id string) string {
	if i := strings.Index(id, "anthropic."); i > 0 {
		return id[i:]
	}
	return id
}

// DefaultModelID returns the ID that the platform provider (ProviderAnthropic,
// ProviderBedrock, ProviderVertex) gives model, which may be named as any
// platform names it, or false when it has none for it.
//
// The first-party API takes a model as the caller names it: a model of
// the table below named as Bedrock or Vertex names it becomes its
// first-party ID, and any other model passes as it is, unless it is in a
// platform's own form (Bedrock's anthropic. prefix or an ARN, Vertex's
// @date), which the first-party API does not serve.
//
// Bedrock and Vertex IDs come from the table alone, never guessed from the
// first-party ID: a guess the platform does not serve would end the call
// there with a 4xx, which no backend after it gets. A model the table
// lacks has no default ID on them, and needs Backend.Models. The table:
//
//	first-party                 Bedrock                                             Vertex
//	claude-opus-4-5-20251101    global.anthropic.claude-opus-4-5-20251101-v1:0      claude-opus-4-5@20251101
//	claude-opus-4-1-20250805    us.anthropic.claude-opus-4-1-20250805-v1:0          claude-opus-4-1@20250805
//	claude-opus-4-20250514      us.anthropic.claude-opus-4-20250514-v1:0            claude-opus-4@20250514
//	claude-sonnet-4-5-20250929  global.anthropic.claude-sonnet-4-5-20250929-v1:0    claude-sonnet-4-5@20250929
//	claude-sonnet-4-20250514    global.anthropic.claude-sonnet-4-20250514-v1:0      claude-sonnet-4@20250514
//	claude-3-7-sonnet-20250219  us.anthropic.claude-3-7-sonnet-20250219-v1:0        claude-3-7-sonnet@20250219
//	claude-haiku-4-5-20251001   global.anthropic.claude-haiku-4-5-20251001-v1:0     claude-haiku-4-5@20251001
//	claude-3-5-haiku-20241022   us.anthropic.claude-3-5-haiku-20241022-v1:0         claude-3-5-haiku@20241022
//
// Each model is looked up by its alias (claude-sonnet-4-5) too. On
// Bedrock the IDs are those of the cross-region inference profiles the
// models are served on demand through: global where there is one, else
// the United States'. Give Backend.Models for another geography (eu.,
// apac.), a provisioned model's ARN, or a model the table lacks: the
// models newer than the table (claude-sonnet-4-6, claude-opus-4-6 and
// after) among them.
func DefaultModelID(provider, model string) (string, bool) {
	p, ok := modelIndex[model]
	if !ok {
		p, ok = modelIndex[bedrockBase(model)]
	}
	switch {
	case !ok && provider == ProviderAnthropic && firstPartyForm(model):
		return model, true
	case !ok:
		return "", false
	}
	switch provider {
	case ProviderAnthropic:
		if model == p.alias || model == p.dated {
			return model, true
		}
		return p.dated, true
	case ProviderBedrock:
		if bedrockBase(model) == bedrockBase(p.bedrock) {
			return model, true // the caller's own profile
		}
		return p.bedrock, true
	case ProviderVertex:
		return p.vertex, true
	}
	return "", false
}

// firstPartyForm reports whether model may be a first-party model ID: not
// empty, and in neither Bedrock's form (anthropic., an ARN) nor Vertex's
// (@date).
func firstPartyForm(model string) bool {
	return model != "" && !strings.Contains(model, "anthropic.") &&
		!strings.HasPrefix(model, "arn:") && !strings.Contains(model, "@")
}

// MaxModelID bounds a model ID wherever Damper keeps or checks one.
const MaxModelID = core.MaxModelID

// IsModelByte reports whether b is a character of model IDs.
func IsModelByte(b byte) bool { return core.IsModelByte(b) }
