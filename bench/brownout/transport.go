package brownout

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// simTransport is the http.RoundTripper under every contender: it sends
// the attempt to the simulated provider and parks the calling process
// until the answer is due in virtual time, or its context ends first (the
// provider still does the work: an abandoned attempt is wasted capacity).
type simTransport struct {
	run     *runState
	replica int // the replica it belongs to, for the record of attempts
	// secondary sends to the run's secondary provider.
	secondary bool
}

// okBody is every successful answer's body but for its input tokens: 12,
// what countInputTokens counts of the prompt "hello". Without a rate limit
// the provider does not count them, and answers with okBody as it is.
const okBody = `{"id":"msg_sim","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":1}}`

// okBodyWith is okBody reporting inputTokens of input.
func okBodyWith(inputTokens int) string {
	return `{"id":"msg_sim","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":` +
		strconv.Itoa(inputTokens) + `,"output_tokens":1}}`
}

// Input tokens as the simulated provider counts them: one token per four
// bytes of each text block (rounded up), plus a fixed overhead per request
// (the role markers and framing the API adds).
const (
	bytesPerInputToken   = 4
	requestOverheadToken = 10
)

// countInputTokens counts the input tokens of a Messages request body as
// the simulated provider does, for its rate limit and the answer's usage:
// a deterministic stand-in for the API's tokenizer. It differs from
// Damper's estimate (estimate.InputTokens, a token per four bytes of
// the whole JSON body), as the real tokenizer does, if less.
func countInputTokens(body []byte) int {
	var req struct {
		System   json.RawMessage `json:"system"`
		Messages []struct {
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	if json.Unmarshal(body, &req) != nil {
		return len(body) / bytesPerInputToken
	}
	n := requestOverheadToken + textTokens(req.System)
	for _, m := range req.Messages {
		n += textTokens(m.Content)
	}
	return n
}

// cachePrefix returns the key of the prefix of a Messages request body up
// to its last cache breakpoint (a block with cache_control), in the
// order the API caches it: the system blocks, then the messages' blocks;
// "" when it has none. The key is the model and the prefix's text.
func cachePrefix(body []byte) string {
	type block struct {
		Text         string          `json:"text"`
		CacheControl json.RawMessage `json:"cache_control"`
	}
	var req struct {
		Model    string          `json:"model"`
		System   json.RawMessage `json:"system"`
		Messages []struct {
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	if json.Unmarshal(body, &req) != nil {
		return ""
	}
	var all []block
	add := func(content json.RawMessage) {
		var blocks []block
		if json.Unmarshal(content, &blocks) == nil {
			all = append(all, blocks...)
		}
	}
	add(req.System)
	for _, m := range req.Messages {
		add(m.Content)
	}
	end := -1
	for i, b := range all {
		if len(b.CacheControl) > 0 && string(b.CacheControl) != "null" {
			end = i
		}
	}
	if end < 0 {
		return ""
	}
	var key strings.Builder
	key.WriteString(req.Model)
	for _, b := range all[:end+1] {
		key.WriteString("\x00")
		key.WriteString(b.Text)
	}
	return key.String()
}

// textTokens counts the text of content: a string, or a list of blocks.
func textTokens(content json.RawMessage) int {
	var s string
	if json.Unmarshal(content, &s) == nil {
		return (len(s) + bytesPerInputToken - 1) / bytesPerInputToken
	}
	var blocks []struct {
		Text string `json:"text"`
	}
	_ = json.Unmarshal(content, &blocks)
	n := 0
	for _, b := range blocks {
		n += (len(b.Text) + bytesPerInputToken - 1) / bytesPerInputToken
	}
	return n
}

func (t simTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	provider := t.run.provider
	if t.secondary {
		provider = t.run.secondary
	}
	inputTokens, prefix := 0, ""
	if req.Body != nil {
		if provider.RateLimit != nil {
			body, _ := io.ReadAll(req.Body)
			inputTokens = provider.count(body)
			if provider.cache != nil {
				prefix = provider.prefixOf(body)
			}
		} else {
			_, _ = io.Copy(io.Discard, req.Body)
		}
		_ = req.Body.Close()
	}
	ctx := req.Context()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s := t.run.s
	p := s.cur
	if p == nil {
		return nil, fmt.Errorf("brownout: attempt sent outside a simulated request")
	}
	p.sent = s.now
	if ps := t.run.saturating; ps != nil && !t.secondary {
		return t.saturated(req, ps, p)
	}
	res := provider.attempt(s.now, inputTokens, prefix)
	p.attempt++
	if t.secondary {
		p.secondary++
	}
	if res.status == http.StatusOK {
		p.bySecondary, p.cache = t.secondary, res.cache
	}
	t.run.recordAttempt(s.now, t.replica, res.status, t.secondary)

	e := s.at(s.now.Add(res.latency), nil, nil)
	e.fn = func() { s.resume(p, wakeup{res: &res}) }
	w := s.park(ctx, e)
	if w.err != nil {
		return nil, w.err
	}
	return httpResponse(req, *w.res), nil
}

// saturated sends the attempt of process p to the saturating provider ps,
// and parks p until its answer, or until its context ends: the attempt
// then leaves the provider. An admitted attempt is recorded as a 200, the
// only answer the provider gives one.
func (t simTransport) saturated(req *http.Request, ps *psProvider, p *proc) (*http.Response, error) {
	s := t.run.s
	p.attempt++
	job := ps.admit(p, t.replica)
	if job == nil {
		t.run.recordAttempt(s.now, t.replica, 529, false)
		res := response{status: 529, errType: "overloaded_error", latency: ps.RejectLatency}
		e := s.at(s.now.Add(res.latency), nil, nil)
		e.fn = func() { s.resume(p, wakeup{res: &res}) }
		if w := s.park(req.Context(), e); w.err != nil {
			return nil, w.err
		}
		return httpResponse(req, res), nil
	}
	t.run.recordAttempt(s.now, t.replica, http.StatusOK, false)
	w := s.park(req.Context(), nil)
	if w.err != nil {
		ps.leave(job)
		return nil, w.err
	}
	return httpResponse(req, *w.res), nil
}

func httpResponse(req *http.Request, r response) *http.Response {
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set("request-id", "req_sim")
	body := okBody
	if r.status != http.StatusOK {
		body = `{"type":"error","error":{"type":"` + r.errType + `","message":"simulated"}}`
	} else if r.rate != nil {
		body = okBodyWith(r.inputTokens)
	}
	if v := r.rate; v != nil {
		setBucketHeaders(h, "requests", v.requests)
		setBucketHeaders(h, "input-tokens", v.inputTokens)
		if v.retryAfter > 0 {
			h.Set("retry-after", strconv.Itoa(int(v.retryAfter/time.Second)))
		}
	}
	h.Set("Content-Length", strconv.Itoa(len(body)))
	return &http.Response{
		Status:        strconv.Itoa(r.status) + " " + http.StatusText(r.status),
		StatusCode:    r.status,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        h,
		Body:          io.NopCloser(bytes.NewReader([]byte(body))),
		ContentLength: int64(len(body)),
		Request:       req,
	}
}

// setBucketHeaders sets the anthropic-ratelimit-<name>-* headers of a
// bucket, if the limit has it.
func setBucketHeaders(h http.Header, name string, b *bucketView) {
	if b == nil {
		return
	}
	prefix := "anthropic-ratelimit-" + name + "-"
	h.Set(prefix+"limit", strconv.FormatInt(b.limit, 10))
	h.Set(prefix+"remaining", strconv.FormatInt(b.remaining, 10))
	h.Set(prefix+"reset", b.reset.UTC().Format(time.RFC3339))
}
