package core

import (
	"regexp"
	"strings"
	"unicode/utf8"
)

// MaxModelID bounds a model ID wherever Damper keeps or checks one (a
// request's model at the proxy's door, a model named in a Policy): the
// longest real IDs, Bedrock inference-profile ARNs, are about half of it.
const MaxModelID = 256

// IsModelByte reports whether b is a character of model IDs: first-party
// ("claude-sonnet-4-5-20250929"), Bedrock ("us.anthropic.claude-...-v1:0",
// ARNs with ":" and "/") and Vertex ("claude-sonnet-4-5@20250929").
func IsModelByte(b byte) bool {
	return b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' ||
		b == '-' || b == '.' || b == '_' || b == ':' || b == '@' || b == '/'
}

// BoundedName reports whether a model named in a Policy is short, valid
// text: it becomes a map key, and may reach a log line.
func BoundedName(s string) bool {
	return len(s) <= MaxModelID && utf8.ValidString(s)
}

var (
	bedrockPrefix = regexp.MustCompile(`^(?:[a-z]{2,6}\.)?anthropic\.`)
	modelSuffix   = regexp.MustCompile(`(?:-v\d+(?::\d+)?|-latest|[-@]\d{8})+$`)
)

// ModelFamily returns the family of a model ID: "claude-sonnet-4-5" for
// "claude-sonnet-4-5-20250929", "claude-sonnet-4-5@20250929" and
// "us.anthropic.claude-sonnet-4-5-20250929-v1:0".
func ModelFamily(model string) string {
	m := strings.ToLower(strings.TrimSpace(model))
	m = bedrockPrefix.ReplaceAllString(m, "")
	return modelSuffix.ReplaceAllString(m, "")
}
