package damper

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/damper-ai/damper-go/internal/engine"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"
)

// The proxy's door: what is refused before anything of a request is read
// or sent (a protocol upgrade, a dot segment, a body over the limit), and
// the checks of a Messages body before its call starts (checkMessagesBody).

// What the proxy accepts of a Messages request before anything is sent.
const (
	// maxMaxTokens bounds max_tokens, far above any model's output limit.
	maxMaxTokens = 1_000_000
	// initialBodyBuf is the most a request's declared Content-Length sizes
	// its buffer before its bytes arrive; past it, the buffer grows as
	// they do.
	initialBodyBuf = 64 << 10
)

// upgradeAsked describes the header by which h asks to switch protocols
// (an Upgrade header, or "upgrade" among Connection's names), or is ""
// when it asks for none.
func upgradeAsked(h http.Header) string {
	if v, ok := h["Upgrade"]; ok && len(v) > 0 {
		return "header Upgrade is " + excerpt([]byte(v[0]))
	}
	for _, f := range h["Connection"] {
		for name := range strings.SplitSeq(f, ",") {
			if strings.EqualFold(strings.TrimSpace(name), "upgrade") {
				return "header Connection is " + excerpt([]byte(f))
			}
		}
	}
	return ""
}

// hasDotSegment reports whether path, decoded, has a "." or ".." segment,
// which the upstream may resolve to another path than the one judged.
func hasDotSegment(path string) bool {
	if !strings.Contains(path, ".") {
		return false
	}
	for _, seg := range strings.FieldsFunc(path, func(r rune) bool { return r == '/' || r == '\\' }) {
		if seg == "." || seg == ".." {
			return true
		}
	}
	return false
}

func (p *Proxy) tooLarge(w http.ResponseWriter) int {
	return writeAPIError(w, http.StatusRequestEntityTooLarge, "request_too_large",
		fmt.Sprintf("damper proxy: the request body is larger than %d bytes", p.maxBody), nil)
}

// excerpt is b quoted for an error message: its first 64 bytes, escaped
// (invalid UTF-8 and control characters included), and its length when
// longer.
func excerpt(b []byte) string {
	const shown = 64
	if len(b) <= shown {
		return strconv.QuoteToASCII(string(b))
	}
	return fmt.Sprintf("%s… (%d bytes)", strconv.QuoteToASCII(string(b[:shown])), len(b))
}

// The top-level keys of a Messages request the proxy checks.
const (
	checkModelKey = iota
	checkMaxTokensKey
	checkStreamKey
)

var notObject = errors.New("damper proxy: the request body is not a JSON object")

var checkedKeys = [...]string{checkModelKey: "model", checkMaxTokensKey: "max_tokens", checkStreamKey: "stream"}

// checkMessagesBody checks what Damper decides on in a Messages request
// body, body, before anything is sent: see [Proxy]. It reads the body's
// top level once, skipping the values of other keys at the speed of a
// byte search.
func checkMessagesBody(body []byte) error {
	var raw [len(checkedKeys)][]byte
	s := engine.BodyScan{Body: body}
	i := engine.SkipSpace(body, 0)
	if i == len(body) || body[i] != '{' {
		return notObject
	}
	for i = engine.SkipSpace(body, i+1); i < len(body) && body[i] != '}'; {
		if body[i] != '"' {
			return notObject
		}
		end := engine.SkipString(body, i)
		if end < 0 {
			return notObject
		}
		key := body[i+1 : end-1]
		if bytes.IndexByte(key, '\\') >= 0 {
			// "mod\u0065l" is "model" to the API.
			k, ok := unquote(body[i:end])
			if !ok {
				return notObject
			}
			key = []byte(k)
		}
		i = engine.SkipSpace(body, end)
		if i == len(body) || body[i] != ':' {
			return notObject
		}
		start := engine.SkipSpace(body, i+1)
		if i = s.Value(start); i < 0 {
			return notObject
		}
		for k, name := range checkedKeys {
			if string(key) != name {
				continue
			}
			if raw[k] != nil {
				return fmt.Errorf("damper proxy: %s: the key is repeated; send it once (the API might act on another than the one checked)", name)
			}
			raw[k] = body[start:i]
		}
		switch i = engine.SkipSpace(body, i); {
		case i < len(body) && body[i] == ',':
			i = engine.SkipSpace(body, i+1)
		case i < len(body) && body[i] != '}':
			return notObject
		}
	}
	if i == len(body) || engine.SkipSpace(body, i+1) != len(body) {
		return notObject
	}
	if err := checkModel(raw[checkModelKey]); err != nil {
		return err
	}
	if err := checkMaxTokens(raw[checkMaxTokensKey]); err != nil {
		return err
	}
	if v := raw[checkStreamKey]; v != nil && string(v) != "true" && string(v) != "false" {
		return fmt.Errorf("damper proxy: stream %s: want true or false", excerpt(v))
	}
	return nil
}

// checkModel checks a request's model, v as it is in the body.
func checkModel(v []byte) error {
	if v == nil {
		return errors.New("damper proxy: model: required")
	}
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return badModel(v, "want a string")
	}
	sent := v[1 : len(v)-1] // as it was sent, escapes and all
	if !utf8.Valid(sent) {
		return badModel(sent, "is not valid UTF-8")
	}
	model := sent
	if bytes.IndexByte(sent, '\\') >= 0 {
		s, ok := unquote(v)
		if !ok {
			return badModel(sent, "is not a valid JSON string")
		}
		model = []byte(s)
	}
	switch {
	case len(model) == 0:
		return badModel(sent, "is empty")
	case len(model) > engine.MaxModelID:
		return badModel(sent, fmt.Sprintf("is %d bytes long: a model ID has at most %d", len(model), engine.MaxModelID))
	}
	for i, b := range model {
		if !engine.IsModelByte(b) {
			r, _ := utf8.DecodeRune(model[i:])
			return badModel(sent, fmt.Sprintf("holds %q, which no model ID holds: want ASCII letters, digits and -._:@/", r))
		}
	}
	return nil
}

func badModel(shown []byte, why string) error {
	return fmt.Errorf("damper proxy: model %s: %s", excerpt(shown), why)
}

// unquote is the JSON string q, unescaped.
func unquote(q []byte) (string, bool) {
	var s string
	err := json.Unmarshal(q, &s)
	return s, err == nil
}

// checkMaxTokens checks a request's max_tokens, v as it is in the body.
func checkMaxTokens(v []byte) error {
	if v == nil {
		return errors.New("damper proxy: max_tokens: required")
	}
	n := 0
	for i, b := range v {
		if b < '0' || b > '9' || i == 7 || i == 1 && v[0] == '0' {
			n = -1
			break
		}
		n = n*10 + int(b-'0')
	}
	if n < 1 || n > maxMaxTokens {
		return fmt.Errorf("damper proxy: max_tokens %s: want an integer from 1 to %d", excerpt(v), maxMaxTokens)
	}
	return nil
}
