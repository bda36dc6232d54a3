package dampertest

import (
	"cmp"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// sigV4Algorithm opens the Authorization header of a SigV4-signed request.
const sigV4Algorithm = "AWS4-HMAC-SHA256"

// amzDateFormat is the layout of X-Amz-Date; the credential scope holds its
// first 8 characters.
const amzDateFormat = "20060102T150405Z"

// maxClockSkew is how far a signature's time may be from the server's: a
// request signed longer ago, or later, is refused, so a replayed request
// goes stale.
const maxClockSkew = 5 * time.Minute

// sigV4Header is the Authorization header of a SigV4-signed request.
type sigV4Header struct {
	accessKey, date, region, service, terminator string // the Credential's parts
	signedHeaders                                []string
	signature                                    string
}

// parseSigV4 reads an Authorization header of the form
//
//	AWS4-HMAC-SHA256 Credential=KEY/DATE/REGION/SERVICE/aws4_request, SignedHeaders=a;b;c, Signature=HEX
//
// The error names the part that is missing or malformed.
func parseSigV4(h string) (sigV4Header, error) {
	var a sigV4Header
	rest, ok := strings.CutPrefix(h, sigV4Algorithm+" ")
	if !ok {
		alg, _, _ := strings.Cut(h, " ")
		return a, fmt.Errorf("Unsupported AWS 'algorithm': %q; want %q", alg, sigV4Algorithm)
	}
	params := map[string]string{}
	for part := range strings.SplitSeq(rest, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return a, fmt.Errorf("Authorization header parameter %q is not of the form key=value", strings.TrimSpace(part))
		}
		if _, dup := params[k]; dup {
			return a, fmt.Errorf("Authorization header parameter %q appears twice", k)
		}
		params[k] = v
	}
	for _, k := range []string{"Credential", "SignedHeaders", "Signature"} {
		if params[k] == "" {
			return a, fmt.Errorf("Authorization header requires '%s' parameter", k)
		}
	}
	cred := strings.Split(params["Credential"], "/")
	if len(cred) != 5 {
		return a, fmt.Errorf("Credential %q has %d parts; want KEY/DATE/REGION/SERVICE/aws4_request", params["Credential"], len(cred))
	}
	a.accessKey, a.date, a.region, a.service, a.terminator = cred[0], cred[1], cred[2], cred[3], cred[4]
	a.signedHeaders = strings.Split(params["SignedHeaders"], ";")
	for _, name := range a.signedHeaders {
		if name == "" || name != strings.ToLower(name) {
			return a, fmt.Errorf("SignedHeaders %q: header name %q is not lowercase and non-empty", params["SignedHeaders"], name)
		}
	}
	a.signature = params["Signature"]
	return a, nil
}

// sigV4 verifies requests signed for one service and region, with one key.
type sigV4 struct {
	service, region, accessKey, secretKey string
}

// verify checks the SigV4 signature of r, whose body is body, as AWS would
// at now. It returns the signing time and the signature as far as it read
// them, and why it refuses r, or nil.
func (v sigV4) verify(r *http.Request, body []byte, now time.Time) (signedAt time.Time, signature string, ref *refusal) {
	refuse := func(kind, format string, args ...any) *refusal {
		return &refusal{http.StatusForbidden, kind, fmt.Sprintf(format, args...)}
	}
	auth := r.Header.Get("Authorization")
	switch {
	case auth == "":
		return signedAt, "", refuse("MissingAuthenticationTokenException", "Missing Authentication Token")
	case len(auth) > 7 && strings.EqualFold(auth[:7], "bearer "):
		return signedAt, "", refuse("UnrecognizedClientException",
			"dampertest: the fake Bedrock accepts SigV4 signatures only, and the request carries a bearer token. "+
				"The SDK's bedrock package sends one instead of signing when AWS_BEARER_TOKEN_BEDROCK is set (unset it in the test) "+
				"or when aws.Config prefers httpBearerAuth.")
	}
	a, err := parseSigV4(auth)
	if err != nil {
		return signedAt, "", refuse("IncompleteSignatureException", "%s", err)
	}
	signature = a.signature

	date := r.Header.Get("X-Amz-Date")
	if date == "" {
		return signedAt, signature, refuse("IncompleteSignatureException", "Authorization header requires existence of either a 'X-Amz-Date' or a 'Date' header.")
	}
	signedAt, err = time.Parse(amzDateFormat, date)
	if err != nil {
		return signedAt, signature, refuse("IncompleteSignatureException", "X-Amz-Date is %q; want the form %s", date, amzDateFormat)
	}
	switch {
	case a.accessKey != v.accessKey:
		return signedAt, signature, refuse("UnrecognizedClientException",
			"The security token included in the request is invalid. (dampertest: the access key ID is %q; want BedrockAccessKeyID, %q)", a.accessKey, v.accessKey)
	case a.date != date[:8]:
		return signedAt, signature, refuse("InvalidSignatureException",
			"Date in Credential scope does not match YYYYMMDD from ISO-8601 version of date from HTTP: '%s' != '%s', from '%s'.", a.date, date[:8], date)
	case a.region != v.region:
		return signedAt, signature, refuse("InvalidSignatureException",
			"Credential should be scoped to a valid region, not '%s'. (dampertest: this Bedrock is in '%s')", a.region, v.region)
	case a.service != v.service:
		return signedAt, signature, refuse("InvalidSignatureException", "Credential should be scoped to correct service: '%s', not '%s'.", v.service, a.service)
	case a.terminator != "aws4_request":
		return signedAt, signature, refuse("InvalidSignatureException", "Credential should be scoped with a valid terminator: 'aws4_request', not '%s'.", a.terminator)
	case !slices.Contains(a.signedHeaders, "host"):
		return signedAt, signature, refuse("IncompleteSignatureException", "'Host' or ':authority' must be a 'SignedHeader' in the AWS Authorization.")
	case !slices.Contains(a.signedHeaders, "x-amz-date"):
		// Else a replay could carry a fresh date under an old signature.
		return signedAt, signature, refuse("IncompleteSignatureException", "'X-Amz-Date' must be a 'SignedHeader' in the AWS Authorization.")
	}
	if now.Sub(signedAt) > maxClockSkew {
		return signedAt, signature, refuse("InvalidSignatureException", "Signature expired: %s is now earlier than %s (%s - 5 min.)",
			date, now.Add(-maxClockSkew).UTC().Format(amzDateFormat), now.UTC().Format(amzDateFormat))
	}
	if signedAt.Sub(now) > maxClockSkew {
		return signedAt, signature, refuse("InvalidSignatureException", "Signature not yet current: %s is still later than %s (%s + 5 min.)",
			date, now.Add(maxClockSkew).UTC().Format(amzDateFormat), now.UTC().Format(amzDateFormat))
	}

	canonical := canonicalRequest(r, body, a.signedHeaders)
	scope := a.date + "/" + a.region + "/" + a.service + "/aws4_request"
	toSign := sigV4Algorithm + "\n" + date + "\n" + scope + "\n" + hexSHA256([]byte(canonical))
	want := hex.EncodeToString(hmacSHA256(signingKey(v.secretKey, a.date, a.region, a.service), toSign))
	if !hmac.Equal([]byte(want), []byte(a.signature)) {
		return signedAt, signature, refuse("InvalidSignatureException",
			"The request signature we calculated does not match the signature you provided. "+
				"Check your AWS Secret Access Key and signing method. Consult the service documentation for details.\n\n"+
				"The Canonical String for this request should have been\n'%s'\n\nThe String-to-Sign should have been\n'%s'\n", canonical, toSign)
	}
	return signedAt, signature, nil
}

// canonicalRequest is the SigV4 canonical request of r as it was received,
// over the headers the client says it signed, in its order.
func canonicalRequest(r *http.Request, body []byte, signed []string) string {
	var b strings.Builder
	b.WriteString(r.Method)
	b.WriteByte('\n')
	b.WriteString(sigV4Escape(cmp.Or(r.URL.EscapedPath(), "/")))
	b.WriteByte('\n')
	query := r.URL.Query()
	for _, vs := range query {
		slices.Sort(vs)
	}
	b.WriteString(strings.ReplaceAll(query.Encode(), "+", "%20"))
	b.WriteByte('\n')
	for _, name := range signed {
		b.WriteString(name)
		b.WriteByte(':')
		b.WriteString(canonicalValue(r, name))
		b.WriteByte('\n')
	}
	b.WriteByte('\n')
	b.WriteString(strings.Join(signed, ";"))
	b.WriteByte('\n')
	b.WriteString(hexSHA256(body))
	return b.String()
}

// canonicalValue is the value of a signed header as SigV4 canonicalizes it:
// each value with its spaces trimmed and runs of them collapsed, joined by
// commas. Host and Content-Length, which net/http takes out of the header
// map, come from the request itself.
func canonicalValue(r *http.Request, name string) string {
	switch name {
	case "host":
		return collapseSpaces(r.Host)
	case "content-length":
		if v := r.Header.Get("Content-Length"); v != "" || r.ContentLength <= 0 {
			return strings.TrimSpace(v)
		}
		return strconv.FormatInt(r.ContentLength, 10)
	}
	vs := r.Header.Values(name)
	clean := make([]string, len(vs))
	for i, v := range vs {
		clean[i] = strings.TrimSpace(collapseSpaces(v))
	}
	return strings.Join(clean, ",")
}

// collapseSpaces trims spaces off s and collapses each run of them inside
// to one; other white space is kept, as SigV4 keeps it.
func collapseSpaces(s string) string {
	s = strings.Trim(s, " ")
	for strings.Contains(s, "  ") {
		s = strings.ReplaceAll(s, "  ", " ")
	}
	return s
}

// sigV4Escape escapes every byte of an already escaped path but the
// unreserved ones and '/', as SigV4 does for every service but S3: an
// escape such as %3A becomes %253A.
func sigV4Escape(path string) string {
	const hexDigits = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(path); i++ {
		switch c := path[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '.', c == '_', c == '~', c == '/':
			b.WriteByte(c)
		default:
			b.WriteByte('%')
			b.WriteByte(hexDigits[c>>4])
			b.WriteByte(hexDigits[c&15])
		}
	}
	return b.String()
}

// signingKey derives the SigV4 key of secret for one day, region and
// service.
func signingKey(secret, date, region, service string) []byte {
	k := hmacSHA256([]byte("AWS4"+secret), date)
	k = hmacSHA256(k, region)
	k = hmacSHA256(k, service)
	return hmacSHA256(k, "aws4_request")
}

func hmacSHA256(key []byte, data string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(data))
	return m.Sum(nil)
}

func hexSHA256(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
