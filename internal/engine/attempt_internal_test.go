package engine

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// FuzzCutErrorBody: whatever prefix of an error body is cut, the body
// handed to the SDK is valid JSON, an error with a type and a message.
func FuzzCutErrorBody(f *testing.F) {
	for _, s := range []string{
		`{"type":"error","error":{"type":"rate_limit_error","message":"slow \u00e9 down \"now\"`,
		`{"type":"error","error":{"type":"api_error","message":"ok"},"request_id":"req_1","pad":"ppp`,
		`{"type":"error","error":{"type":"overloaded_error","details":{"error_code":"x"},"message":"a\`,
		`<html>`, ``, `"message":"\u12`, `{"message":`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, prefix []byte) {
		out := cutErrorBody(prefix)
		if !json.Valid(out) {
			t.Fatalf("cutErrorBody(%q) = %q, not JSON", prefix, out)
		}
		r := gjson.ParseBytes(out)
		if r.Get("type").Str != "error" || r.Get("error.type").Str == "" || !strings.HasSuffix(r.Get("error.message").Str, "[error body cut at 1 MiB by damper]") {
			t.Fatalf("cutErrorBody(%q) = %s, want an error with a type and a marked message", prefix, out)
		}
	})
}
