package engine

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/tidwall/gjson"
)

// A plain answer: read whole within its attempt, and handed to the caller.

const (
	// MaxErrorBody bounds what Damper reads of an error response.
	MaxErrorBody = 1 << 20
	// maxResponseBody bounds what Damper buffers of a successful plain
	// response, far above any Messages answer (128k output tokens are a
	// few MiB), so that a body without end fails instead of filling memory.
	maxResponseBody = 64 << 20
)

// errResponseTooLarge is a plain response longer than maxResponseBody.
var errResponseTooLarge = fmt.Errorf("damper: response body exceeds %d MiB", maxResponseBody>>20)

// readWhole reads the whole body of res, a plain answer or an error
// status, inside the attempt's timeout, so that a connection that drops
// part-way through the body is a retryable failure rather than the
// caller's problem. An answer ends the attempt (or claims its race) and
// becomes the call's plainBody.
func (a *attempt) readWhole(res *http.Response) attemptResult {
	c := a.c
	var firstAt time.Time
	if res.StatusCode < 400 && c.d.hedge != nil {
		firstAt = c.d.clock.Now()
	}

	limit := int64(maxResponseBody + 1)
	if res.StatusCode >= 400 {
		limit = MaxErrorBody
	}
	body, readErr := readAll(res.Body, limit, res.ContentLength)
	if readErr != nil {
		readErr = a.cause(bodyError{readErr})
	}
	a.over()
	cut := false
	switch {
	case readErr != nil:
	case res.StatusCode >= 400 && len(body) == MaxErrorBody:
		cut = true // the body may go on: not all of it is read
	case len(body) > maxResponseBody:
		readErr = errResponseTooLarge
	}
	if readErr != nil {
		return attemptResult{err: readErr, failure: &Failure{Header: res.Header, Err: readErr}}
	}
	if res.StatusCode >= 400 {
		if cut {
			body = cutErrorBody(body)
		}
		res.Body = io.NopCloser(bytes.NewReader(body))
		return attemptResult{res: res, failure: &Failure{StatusCode: res.StatusCode, Header: res.Header, Body: body}}
	}
	if !gjson.ValidBytes(body) {
		// The SDK cannot decode it: an answer the caller cannot use.
		res.Body = io.NopCloser(bytes.NewReader(body))
		return attemptResult{res: res, failure: &Failure{StatusCode: res.StatusCode, Header: res.Header, Body: body, Err: errInvalidJSON}}
	}
	if a.race != nil {
		if !a.race.claim() {
			return attemptResult{err: errHedgeLost, failure: &Failure{Err: errHedgeLost}, firstAt: firstAt}
		}
	} else {
		a.end(succeeded(res))
	}
	answer := &c.plain // a call has one answer
	answer.c = c
	answer.r.Reset(body)
	res.Body = answer
	r := attemptResult{res: res, firstAt: firstAt}
	if c.wantsUsage() {
		r.usage = answerUsage(body)
	}
	c.trace.plainAnswer(body, r.usage)
	return r
}

// plainBody is the answer of a plain call, read whole within its attempt,
// and handed to the SDK. The SDK reads it and closes it before it looks at
// the caller's context again, so the call ends at Close with the outcome
// the caller gets: a success, or canceled when the context ended first.
// From the context's end, Read returns the context's error, as the SDK
// would, and ends the call.
type plainBody struct {
	r bytes.Reader
	c *call
}

func (b *plainBody) Read(p []byte) (int, error) {
	if err := b.c.ctx.Err(); err != nil {
		b.c.end(OutcomeCanceled)
		return 0, err
	}
	return b.r.Read(p)
}

// WriteTo hands the rest of the answer to w in one write, so that io.Copy
// (the proxy's, handing the answer on) needs no buffer of its own. As Read,
// once the call's context has ended it ends the call canceled.
func (b *plainBody) WriteTo(w io.Writer) (int64, error) {
	if err := b.c.ctx.Err(); err != nil {
		b.c.end(OutcomeCanceled)
		return 0, err
	}
	return b.r.WriteTo(w)
}

func (b *plainBody) Close() error {
	if b.c.ctx.Err() != nil {
		b.c.end(OutcomeCanceled)
	} else {
		b.c.end(OutcomeSuccess)
	}
	b.c.report.publish()
	return nil
}

// errInvalidJSON is a plain call's 2xx whose body is not JSON.
var errInvalidJSON = errors.New("damper: the response body is not valid JSON")

// bodyError is a failure to read a response body once its headers had come:
// the connection dropped, or the body's framing or encoding was corrupt
// (chunked encoding, a gzip checksum). Before content it is a transport
// failure, whatever its cause.
type bodyError struct{ err error }

func (e bodyError) Error() string { return e.err.Error() }
func (e bodyError) Unwrap() error { return e.err }

// cutErrorBody turns the first MaxErrorBody bytes of a longer error body
// into a whole JSON error with what they hold of the error's type, message
// (cut where the body was), details and request ID, so that the SDK still
// builds an *anthropic.Error that says what went wrong.
func cutErrorBody(prefix []byte) []byte {
	r := gjson.ParseBytes(prefix)
	msg := r.Get("error.message").String()
	if msg == "" {
		msg = cutString(prefix, `"message"`)
	}
	e := map[string]any{
		"type":    cmp.Or(r.Get("error.type").String(), "api_error"),
		"message": msg + " [error body cut at 1 MiB by damper]",
	}
	if d := r.Get("error.details"); d.IsObject() && json.Valid([]byte(d.Raw)) {
		e["details"] = json.RawMessage(d.Raw)
	}
	out := map[string]any{"type": "error", "error": e}
	if id := r.Get("request_id").String(); id != "" {
		out["request_id"] = id
	}
	b, err := json.Marshal(out)
	if err != nil {
		return prefix
	}
	return b
}

// cutString returns the value of the JSON string that follows key in b
// and runs past its end, unescaped as far as it goes.
func cutString(b []byte, key string) string {
	i := bytes.Index(b, []byte(key))
	if i < 0 {
		return ""
	}
	rest := bytes.TrimLeft(b[i+len(key):], " \t\r\n:")
	if len(rest) == 0 || rest[0] != '"' {
		return ""
	}
	rest = rest[1:]
	end := 0 // the end of the last whole character or escape
	for k := 0; k < len(rest) && rest[k] != '"'; {
		step := 1
		if rest[k] == '\\' {
			step = 2
			if k+1 < len(rest) && rest[k+1] == 'u' {
				step = 6
			}
		}
		if k+step > len(rest) {
			break
		}
		k += step
		end = k
	}
	var out string
	if json.Unmarshal(append(append([]byte{'"'}, rest[:end]...), '"'), &out) != nil {
		return ""
	}
	return strings.TrimRight(out, "\uFFFD") // a character cut in two
}

// readAll reads body to its end, or to limit bytes, and closes it. A
// length the response declared sizes the buffer at once, up to 1 MiB: a
// larger one is believed only as the bytes arrive.
func readAll(body io.ReadCloser, limit, length int64) ([]byte, error) {
	defer body.Close()
	return ReadUpTo(nil, body, min(length, limit, 1<<20), limit)
}

func CloseBody(res *http.Response) {
	if res != nil && res.Body != nil {
		_ = res.Body.Close()
	}
}
