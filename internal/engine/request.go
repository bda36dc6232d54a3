package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"slices"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/damper-ai/damper-go/internal/estimate"
)

// What a call reads of its request: the facts it needs from the body, and
// the request each attempt sends.

// request is the caller's request as the call's attempts send it. The
// first attempt sends req's URL and headers themselves. A middleware after
// Damper's (a platform's signer) may change them in place (changes, which
// also makes the first attempt send a copy), so a retry is then rebuilt
// from kept, taken before it.
type request struct {
	req     *http.Request
	changes bool
	kept    *keptRequest
	// bodyCopy is a body of the call's own, when GetBody's readers are
	// one and two attempts may be in flight at once (see own).
	bodyCopy []byte

	facts   bodyFacts
	factsIn factsWriter // reads facts in place, kept here: no allocation
	// parity: read the body's features too (bodyFacts.features), for a
	// Damper with backends to fall back to; affinity: the key of its
	// cached prefix (bodyFacts.prefix), for one with cache affinity.
	parity, affinity bool
}

// keptRequest is what a retry needs of a request that the attempts may
// change in place: a copy of its URL, and its headers' keys and value
// slices, which a change in place (Set, Del, Add) does not reach.
type keptRequest struct {
	url    *url.URL // nil when the request has none
	header []headerValues
}

// headerValues is one header of a request.
type headerValues struct {
	key    string
	values []string
}

// keep keeps, before the first attempt, what a retry needs of the
// request as it is now, when what sends the attempts may change it in
// place (changes). Else nothing changes it, and a retry copies it as the
// first attempt left it.
func (q *request) keep() {
	if !q.changes {
		return
	}
	k := &keptRequest{header: make([]headerValues, 0, len(q.req.Header))}
	if q.req.URL != nil {
		u := *q.req.URL
		k.url = &u
	}
	for key, v := range q.req.Header {
		k.header = append(k.header, headerValues{key, v})
	}
	q.kept = k
}

// forAttempt returns the request attempt n sends, with ctx: the first in
// the caller's own context (inCallCtx) sends the request itself, unless
// something after Damper's may change it in place (its body and GetBody as
// well as its headers: a retry needs it as it is) or the route sends a
// body of its own (routeBody); any other a copy. Its body is a fresh one
// from GetBody, unless the route sends its own.
func (q *request) forAttempt(ctx context.Context, n int, inCallCtx, routeBody bool) (*http.Request, error) {
	areq := q.req
	switch {
	case n > 1:
		areq = q.retry(ctx)
	case !inCallCtx || q.changes || routeBody:
		areq = q.req.WithContext(ctx)
	}
	if !routeBody && areq.GetBody != nil {
		body, err := q.body(areq)
		if err != nil {
			return nil, fmt.Errorf("damper: resending the request body: %w", err)
		}
		areq.Body = body
	}
	return areq, nil
}

// retry returns a copy of the request for a retry, with ctx, the URL and
// headers it had before the first attempt, and no body.
func (q *request) retry(ctx context.Context) *http.Request {
	r := q.req.WithContext(ctx)
	k := q.kept
	if k == nil {
		// Nothing changed it: it is as the first attempt sent it.
		r.Header = q.req.Header.Clone()
		return r
	}
	if k.url != nil {
		u := *k.url // a copy of its own: the attempt may change it too
		r.URL = &u
	}
	n := 0
	for _, h := range k.header {
		n += len(h.values)
	}
	values := make([]string, n) // one backing array, as http.Header.Clone does
	r.Header = make(http.Header, len(k.header))
	for _, h := range k.header {
		m := copy(values, h.values)
		r.Header[h.key] = values[:m:m]
		values = values[m:]
	}
	return r
}

// readFacts reads what the call needs to know of its request body: the
// model, max_tokens, whether it streams, and an estimate of its input
// tokens. The SDK's body is read in place, any other body into a buffer
// of its own; no copy is kept: each attempt sends the body GetBody gives
// it.
func (q *request) readFacts() error {
	req := q.req
	if req.Body == nil || req.Body == http.NoBody {
		return nil
	}
	if req.GetBody == nil {
		return errors.New("damper: the Messages request body cannot be resent (no GetBody)")
	}
	defer func() { _ = req.Body.Close() }()
	if wt, ok := req.Body.(io.WriterTo); ok && req.ContentLength > 0 {
		// The SDK's body is a bytes.Reader: it hands its bytes to Write
		// in one call, and they are read there, with no copy.
		w := &q.factsIn
		*w = factsWriter{facts: &q.facts, length: req.ContentLength, parity: q.parity, affinity: q.affinity}
		_, err := wt.WriteTo(w)
		switch {
		case err == nil && w.read:
			return nil
		case err != nil && !errors.Is(err, errPartialWrite):
			return fmt.Errorf("damper: reading the request body: %w", err)
		}
		// Written in parts, or not as long as declared: read it again.
		body, err := req.GetBody()
		if err != nil {
			return fmt.Errorf("damper: reading the request body: %w", err)
		}
		_ = req.Body.Close()
		req.Body = body
	}
	body, err := readInto(nil, req.Body, req.ContentLength)
	if err != nil {
		return fmt.Errorf("damper: reading the request body: %w", err)
	}
	q.facts = readFacts(body, q.parity, q.affinity)
	return nil
}

// own gives the call a copy of its body of its own when GetBody hands out
// one reader again and again (a caller's *bytes.Reader, which the SDK
// seeks back for each attempt): two attempts in flight at once, a raced
// call's, cannot share it. The SDK's own bodies are independent readers
// of one buffer, and need no copy.
func (q *request) own() {
	if q.bodyCopy != nil || q.req.GetBody == nil {
		return
	}
	first, err := q.req.GetBody()
	if err != nil {
		return // the attempt that asks again fails with it
	}
	second, err := q.req.GetBody()
	if err != nil {
		return
	}
	if v, w := reflect.ValueOf(first), reflect.ValueOf(second); v.Type() != w.Type() || !v.Comparable() || !v.Equal(w) {
		_, _ = first.Close(), second.Close()
		return
	}
	defer func() { _ = first.Close() }()
	if body, err := readInto(nil, first, q.req.ContentLength); err == nil {
		q.bodyCopy = body
	}
}

// body returns the body of an attempt's request, areq: the call's own copy,
// if it has one, else a fresh one from GetBody.
func (q *request) body(areq *http.Request) (io.ReadCloser, error) {
	if q.bodyCopy != nil {
		return io.NopCloser(bytes.NewReader(q.bodyCopy)), nil
	}
	return areq.GetBody()
}

// withModel returns the request body with its model set to model ("" for
// the body as it is).
func (q *request) withModel(model string) ([]byte, error) {
	if q.req.GetBody == nil {
		return nil, errors.New("damper: the Messages request body cannot be resent (no GetBody)")
	}
	rc, err := q.body(q.req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = rc.Close() }()
	body, err := readInto(nil, rc, q.req.ContentLength)
	if err != nil || model == "" {
		return body, err
	}
	return sjson.SetBytes(body, "model", model)
}

// factsWriter reads the facts of a body written to it whole, in one Write
// of length bytes; a body written in parts is refused, to be read again.
type factsWriter struct {
	facts    *bodyFacts
	length   int64
	read     bool
	parity   bool // read the body's features too
	affinity bool // and the key of its cached prefix
}

// errPartialWrite stops a WriteTo that writes a body in parts.
var errPartialWrite = errors.New("damper: request body written in parts")

func (w *factsWriter) Write(p []byte) (int, error) {
	if w.read || int64(len(p)) != w.length {
		w.read = false
		return 0, errPartialWrite
	}
	*w.facts = readFacts(p, w.parity, w.affinity) // p is not kept
	w.read = true
	return len(p), nil
}

// readInto reads r to its end, appending to buf, which is sized at once
// when the length is known (> 0).
func readInto(buf []byte, r io.Reader, length int64) ([]byte, error) {
	return ReadUpTo(buf, r, length, -1)
}

// ReadUpTo is readInto that stops once buf holds limit bytes, unless limit
// is negative.
func ReadUpTo(buf []byte, r io.Reader, length, limit int64) ([]byte, error) {
	switch {
	case length > 0 && int64(cap(buf)-len(buf)) < length+1:
		buf = slices.Grow(buf, int(length)+1) // +1: the read that finds the end
	case cap(buf) == 0:
		buf = make([]byte, 0, 512)
	}
	for {
		if limit >= 0 && int64(len(buf)) >= limit {
			return buf, nil
		}
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		end := cap(buf)
		if limit >= 0 && int64(end) > limit {
			end = int(limit)
		}
		n, err := r.Read(buf[len(buf):end])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// bodyFacts are what a call reads of its request body.
type bodyFacts struct {
	model       string
	maxTokens   int
	stream      bool
	inputTokens int // see estimate.InputTokens
	// features are the members a platform may lack (parity.go), read
	// when asked for: a top-level cache_control, inference_geo or
	// mcp_servers, and the server tools among the tools.
	features bodyFeature
	// prefix is the key of the prompt's cached prefix (affinity.go), read
	// when asked for; 0 when it has no cache breakpoint.
	prefix uint64
}

// readBodyFacts reads the model, max_tokens and stream members of a
// Messages request body (the first of duplicate members counting) and
// estimates its input tokens as estimate.InputTokens does, in one pass;
// with parity, its features too (the first tools member's server tools).
// The SDK writes the members after the messages, which it skips at the
// speed of a byte search: a long prompt is one long string. A body it does
// not follow (a key with an escape, a body that is not an object) is left
// to gjson and estimate.InputTokens.
func readBodyFacts(body []byte, parity bool) bodyFacts {
	return readFacts(body, parity, false)
}

// readFacts is readBodyFacts that, with affinity, also reads the key of
// the prompt's cached prefix (promptSections.key) from the places of the
// members the pass found. A body left to gjson gets no key: its call is
// spread as one without a breakpoint.
func readFacts(body []byte, parity, affinity bool) bodyFacts {
	var f bodyFacts
	var sections promptSections
	s := BodyScan{Body: body}
	var seen [4]bool
	var seenFeatures bodyFeature
	i := SkipSpace(body, 0)
	if i == len(body) || body[i] != '{' {
		return slowFacts(body, parity)
	}
	for i = SkipSpace(body, i+1); i < len(body) && body[i] != '}'; {
		if body[i] != '"' {
			return slowFacts(body, parity)
		}
		end := SkipString(body, i)
		if end < 0 || bytes.IndexByte(body[i:end-1], '\\') >= 0 {
			return slowFacts(body, parity)
		}
		key := body[i+1 : end-1]
		i = SkipSpace(body, end)
		if i == len(body) || body[i] != ':' {
			return slowFacts(body, parity)
		}
		start := SkipSpace(body, i+1)
		if i = s.Value(start); i < 0 {
			return slowFacts(body, parity)
		}
		if string(key) == "data" && end+1 < len(body) && body[end] == ':' && body[end+1] == '"' {
			s.count(start, i)
		}
		value := body[start:i]
		if affinity {
			sections.note(key, value, start, i)
		}
		switch k := string(key); {
		case k == "model" && !seen[0]:
			f.model, seen[0] = jsonString(value), true
		case k == "max_tokens" && !seen[1]:
			f.maxTokens, seen[1] = jsonInt(value), true
		case k == "stream" && !seen[2]:
			f.stream, seen[2] = string(value) == "true" || gjson.ParseBytes(value).Bool(), true
		case !parity:
		case k == "tools" && !seen[3]:
			f.features |= toolFeatures(gjson.GetBytes(value, "#.type"))
			seen[3] = true
		default:
			// The first of duplicate members counts, as gjson reads them.
			if bit := topLevelKey(key); bit != 0 && seenFeatures&bit == 0 {
				seenFeatures |= bit
				if string(value) != "null" {
					f.features |= bit
				}
			}
		}
		if i = SkipSpace(body, i); i < len(body) && body[i] == ',' {
			i = SkipSpace(body, i+1)
		}
	}
	f.inputTokens = estimate.FromCounts(len(body), s.dataBytes, s.blocks)
	if affinity {
		f.prefix = sections.key(body, f.model)
	}
	return f
}

// jsonString is the string value v, as gjson reads it; one without an
// escape is copied as it is, and the name of a model the default price
// table knows is not copied at all.
func jsonString(v []byte) string {
	if len(v) >= 2 && v[0] == '"' && bytes.IndexByte(v, '\\') < 0 {
		if m, ok := knownModels[string(v[1:len(v)-1])]; ok {
			return m
		}
		return string(v[1 : len(v)-1])
	}
	return gjson.ParseBytes(v).Str
}

// knownModels are the models of the default price table, by name.
var knownModels = func() map[string]string {
	m := make(map[string]string, len(defaultPrices.prices))
	for name := range defaultPrices.prices {
		m[name] = name
	}
	return m
}()

// jsonInt is the integer value v, as gjson reads it; a plain run of up to
// nine digits is read as it is.
func jsonInt(v []byte) int {
	if len(v) == 0 || len(v) > 9 {
		return int(gjson.ParseBytes(v).Int())
	}
	n := 0
	for _, b := range v {
		if b < '0' || b > '9' {
			return int(gjson.ParseBytes(v).Int())
		}
		n = n*10 + int(b-'0')
	}
	return n
}

// slowFacts is readBodyFacts by gjson's look-up of each path.
func slowFacts(body []byte, parity bool) bodyFacts {
	r := gjson.GetManyBytes(body, "model", "max_tokens", "stream")
	f := bodyFacts{model: r[0].Str, maxTokens: int(r[1].Int()), stream: r[2].Bool(), inputTokens: estimate.InputTokens(body)}
	if parity {
		r = gjson.GetManyBytes(body, "cache_control", "inference_geo", "mcp_servers", "tools.#.type")
		for i, bit := range []bodyFeature{featCacheControl, featInferenceGeo, featMCPServers} {
			if r[i].Exists() && r[i].Type != gjson.Null {
				f.features |= bit
			}
		}
		f.features |= toolFeatures(r[3])
	}
	return f
}

func SkipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// SkipString returns the index after the string that starts at b[i], a
// quote, or -1 when it does not end.
func SkipString(b []byte, i int) int {
	for i++; ; {
		j := bytes.IndexByte(b[i:], '"')
		if j < 0 {
			return -1
		}
		i += j
		backslashes := 0
		for k := i - 1; k >= 0 && b[k] == '\\'; k-- {
			backslashes++
		}
		i++
		if backslashes%2 == 0 {
			return i
		}
	}
}

// BodyScan skips JSON values, counting as it goes the base64 "data"
// strings that estimate.InputTokens leaves out.
type BodyScan struct {
	Body              []byte
	dataBytes, blocks int
}

// count counts the string b[start:end] as a "data" string.
func (s *BodyScan) count(start, end int) {
	s.dataBytes += end - start - 2
	s.blocks++
}

// Value returns the index after the JSON value that starts at b[i], or -1
// when it does not end. It checks nesting, not every rule of JSON.
func (s *BodyScan) Value(i int) int {
	b := s.Body
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return SkipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				end := SkipString(b, i)
				if end < 0 {
					return -1
				}
				if end-i == 6 && string(b[i:end]) == `"data"` && end+1 < len(b) && b[end] == ':' && b[end+1] == '"' {
					// "data":"...": the string that follows is one.
					i, end = end+1, SkipString(b, end+1)
					if end < 0 {
						return -1
					}
					s.count(i, end)
				}
				i = end
				continue
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return -1
	}
	// A number, true, false or null: up to the next delimiter.
	j := i
	for j < len(b) && b[j] != ',' && b[j] != '}' && b[j] != ']' && b[j] != ' ' && b[j] != '\t' && b[j] != '\n' && b[j] != '\r' {
		j++
	}
	if j == i {
		return -1
	}
	return j
}
