package dampertest

import (
	"bufio"
	"bytes"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"
)

// signedWith is a request signed by the real SigV4 signer at now, for the
// model, query, header value and body given, as received by a server.
func signedWith(t *testing.T, model, query, value, body string, now time.Time) (*http.Request, bool) {
	t.Helper()
	if !validValue(value) {
		return nil, false
	}
	u := &url.URL{Scheme: "http", Host: "dampertest.invalid", Path: "/model/" + model + "/invoke",
		RawPath: "/model/" + url.PathEscape(model) + "/invoke", RawQuery: query}
	r, err := http.NewRequest(http.MethodPost, u.String(), strings.NewReader(body))
	if err != nil {
		return nil, false
	}
	r.Header.Set("Content-Type", "application/json")
	r.Header.Add("X-Dampertest-Value", value)
	r.Header.Add("X-Dampertest-Value", "second  value ")
	sign(t, r, body, BedrockSecretKey, "us-east-1", "bedrock", now)
	// What a server sees: the URL as the request line carries it.
	got, err := http.ReadRequest(bufioReader(t, r))
	if err != nil {
		return nil, false
	}
	return got, true
}

// bufioReader holds r as written on the wire, for http.ReadRequest.
func bufioReader(t *testing.T, r *http.Request) *bufio.Reader {
	t.Helper()
	var buf bytes.Buffer
	if err := r.Write(&buf); err != nil {
		t.Fatal(err)
	}
	return bufio.NewReader(&buf)
}

// validValue reports whether v can be sent as a header value as it is.
func validValue(v string) bool {
	for _, c := range []byte(v) {
		if (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// FuzzSigV4MatchesTheSigner: whatever the path, query, header values and
// body, a request signed by the real signer passes the fake's verifier, so
// the two canonicalize alike; with another body, it fails.
func FuzzSigV4MatchesTheSigner(f *testing.F) {
	f.Add(bedrockModel, "", "plain", `{"a":1}`)
	f.Add("arn:aws:bedrock:us-east-1:1:inference-profile/us.anthropic.claude-x-v1:0", "b=2&a=1&a=0", "  spaced   out  ", "")
	f.Add("m ~!*'();@&=+$,", "x=%20y+z&k", "tab\tinside", "\x00\xff")
	f.Add("ünïcødé", "q=ü&=empty", ",,", "{}")
	f.Fuzz(func(t *testing.T, model, query, value, body string) {
		now := time.Now()
		r, ok := signedWith(t, model, query, value, body, now)
		if !ok || model == "" {
			return // not a request net/http would send or read
		}
		got, _, ref := (sigV4{"bedrock", "us-east-1", BedrockAccessKeyID, BedrockSecretKey}).verify(r, []byte(body), now)
		if ref != nil {
			t.Fatalf("a good signature refused: %s %s", ref.kind, ref.message)
		}
		if !got.Equal(now.UTC().Truncate(time.Second)) {
			t.Errorf("signed at %v, want %v", got, now.UTC().Truncate(time.Second))
		}
		if _, _, ref := (sigV4{"bedrock", "us-east-1", BedrockAccessKeyID, BedrockSecretKey}).verify(r, []byte(body+"x"), now); ref == nil {
			t.Error("another body passed")
		}
	})
}

// The verifier refuses a changed request, and says what it expected.
func TestSigV4Verify(t *testing.T) {
	now := time.Now()
	v := sigV4{"bedrock", "us-east-1", BedrockAccessKeyID, BedrockSecretKey}
	for _, tt := range []struct {
		name   string
		change func(r *http.Request)
		kind   string
	}{
		{"unchanged", func(*http.Request) {}, ""},
		{"unsigned header added", func(r *http.Request) { r.Header.Set("Accept-Encoding", "gzip") }, ""},
		{"signed header changed", func(r *http.Request) { r.Header.Set("X-Dampertest-Value", "other") }, "InvalidSignatureException"},
		{"signed header dropped", func(r *http.Request) { r.Header.Del("Content-Type") }, "InvalidSignatureException"},
		{"one of two values dropped", func(r *http.Request) { r.Header["X-Dampertest-Value"] = r.Header["X-Dampertest-Value"][:1] }, "InvalidSignatureException"},
		{"host changed", func(r *http.Request) { r.Host = "other.invalid" }, "InvalidSignatureException"},
		{"query changed", func(r *http.Request) { r.URL.RawQuery = "a=2" }, "InvalidSignatureException"},
		{"method changed", func(r *http.Request) { r.Method = http.MethodPut }, "InvalidSignatureException"},
		{"host unsigned", func(r *http.Request) {
			r.Header.Set("Authorization", strings.Replace(r.Header.Get("Authorization"), "SignedHeaders=content-length;content-type;host;", "SignedHeaders=content-length;content-type;", 1))
		}, "IncompleteSignatureException"},
		{"date unsigned", func(r *http.Request) {
			r.Header.Set("Authorization", strings.Replace(r.Header.Get("Authorization"), ";x-amz-date", "", 1))
		}, "IncompleteSignatureException"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r, ok := signedWith(t, bedrockModel, "a=1", "value", goodBody, now)
			if !ok {
				t.Fatal("cannot build the request")
			}
			tt.change(r)
			_, sig, ref := v.verify(r, []byte(goodBody), now)
			if len(sig) != 64 {
				t.Errorf("signature %q", sig)
			}
			switch {
			case tt.kind == "" && ref != nil:
				t.Errorf("refused: %s %s", ref.kind, ref.message)
			case tt.kind != "" && (ref == nil || ref.kind != tt.kind):
				t.Errorf("refusal %+v, want %s", ref, tt.kind)
			}
		})
	}
}

// A good Authorization header parses into its parts, and each malformed
// one names what is wrong.
func TestParseSigV4(t *testing.T) {
	a, err := parseSigV4("AWS4-HMAC-SHA256 Credential=AKID/20261101/us-east-1/bedrock/aws4_request, SignedHeaders=host;x-amz-date, Signature=abc")
	want := sigV4Header{"AKID", "20261101", "us-east-1", "bedrock", "aws4_request", []string{"host", "x-amz-date"}, "abc"}
	if err != nil || a.accessKey != want.accessKey || a.date != want.date || a.region != want.region || a.service != want.service ||
		a.terminator != want.terminator || !slices.Equal(a.signedHeaders, want.signedHeaders) || a.signature != want.signature {
		t.Fatalf("parse = %+v, %v; want %+v", a, err, want)
	}
	for h, wantErr := range map[string]string{
		"":                                      `Unsupported AWS 'algorithm': ""`,
		"AWS4-HMAC-SHA256":                      `Unsupported AWS 'algorithm': "AWS4-HMAC-SHA256"`,
		"AWS4-HMAC-SHA256 Credential=a/b/c/d/e": "Authorization header requires 'SignedHeaders' parameter",
		"AWS4-HMAC-SHA256 Credential=a/b/c/d/e, SignedHeaders=host, Signature=x, Signature=y": `parameter "Signature" appears twice`,
		"AWS4-HMAC-SHA256 Credential=a/b/c/d/e, SignedHeaders=host, junk":                     `parameter "junk" is not of the form key=value`,
		"AWS4-HMAC-SHA256 Credential=a/b/c, SignedHeaders=host, Signature=x":                  `Credential "a/b/c" has 3 parts`,
		"AWS4-HMAC-SHA256 Credential=a/b/c/d/e, SignedHeaders=host;;x, Signature=x":           `header name "" is not lowercase`,
		"AWS4-HMAC-SHA256 Credential=a/b/c/d/e, SignedHeaders=Host, Signature=x":              `header name "Host" is not lowercase`,
	} {
		if _, err := parseSigV4(h); err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("parse(%q) = %v, want %q", h, err, wantErr)
		}
	}
}

// FuzzParseSigV4: no header makes the parser panic, and what it accepts
// it reads back the same once written out again.
func FuzzParseSigV4(f *testing.F) {
	f.Add("AWS4-HMAC-SHA256 Credential=AKID/20261101/us-east-1/bedrock/aws4_request, SignedHeaders=host;x-amz-date, Signature=abc")
	f.Add("AWS4-HMAC-SHA256 Credential=,,, SignedHeaders==, Signature=")
	f.Add("Bearer token")
	f.Fuzz(func(t *testing.T, h string) {
		a, err := parseSigV4(h)
		if err != nil {
			return
		}
		again := sigV4Algorithm + " Credential=" + strings.Join([]string{a.accessKey, a.date, a.region, a.service, a.terminator}, "/") +
			", SignedHeaders=" + strings.Join(a.signedHeaders, ";") + ", Signature=" + a.signature
		b, err := parseSigV4(again)
		if err != nil || b.accessKey != a.accessKey || b.region != a.region || b.signature != a.signature || !slices.Equal(b.signedHeaders, a.signedHeaders) {
			t.Fatalf("%q parsed to %+v; written out as %q it parses to %+v, %v", h, a, again, b, err)
		}
	})
}

// FuzzBedrockPath: no path makes the parser panic, and a model it reads
// from a path is read back from the path the SDK would build for it.
func FuzzBedrockPath(f *testing.F) {
	f.Add("/model/anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke")
	f.Add("/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A1%3Ainference-profile%2Fus.x/invoke-with-response-stream")
	f.Add("/model//invoke")
	f.Add("/model/%zz/invoke")
	f.Fuzz(func(t *testing.T, escaped string) {
		model, op, ok := bedrockPath(escaped)
		if !ok {
			return
		}
		again, op2, ok := bedrockPath("/model/" + url.PathEscape(model) + "/" + op)
		if !ok || again != model || op2 != op {
			t.Fatalf("%q read as %q %q; rebuilt, as %q %q %v", escaped, model, op, again, op2, ok)
		}
	})
}

// FuzzVertexPath: likewise for Vertex's paths.
func FuzzVertexPath(f *testing.F) {
	f.Add("/v1/projects/p/locations/us-east5/publishers/anthropic/models/claude-sonnet-4-5@20250929:rawPredict")
	f.Add("/v1/projects/p/locations/global/publishers/anthropic/models/a:b:streamRawPredict")
	f.Add("/v1/projects/p/locations/r/publishers/anthropic/models/:rawPredict")
	f.Fuzz(func(t *testing.T, escaped string) {
		project, region, model, method, ok := vertexPath(escaped)
		if !ok {
			return
		}
		rebuilt := "/v1/projects/" + url.PathEscape(project) + "/locations/" + url.PathEscape(region) +
			"/publishers/anthropic/models/" + url.PathEscape(model+":"+method)
		p2, r2, m2, me2, ok := vertexPath(rebuilt)
		if !ok || p2 != project || r2 != region || m2 != model || me2 != method {
			t.Fatalf("%q read as %q %q %q %q; rebuilt, as %q %q %q %q %v", escaped, project, region, model, method, p2, r2, m2, me2, ok)
		}
	})
}
