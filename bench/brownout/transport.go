package brownout

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strconv"
)

// simTransport is the http.RoundTripper under every contender: it sends
// the attempt to the simulated provider and parks the calling process
// until the answer is due in virtual time, or its context ends first (the
// provider still does the work: an abandoned attempt is wasted capacity).
type simTransport struct {
	run     *runState
	replica int // the replica it belongs to, for the record of attempts
}

const okBody = `{"id":"msg_sim","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":1}}`

func (t simTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		_, _ = io.Copy(io.Discard, req.Body)
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
	res := t.run.provider.attempt(s.now)
	p.attempt++
	t.run.recordAttempt(s.now, t.replica)

	e := s.at(s.now.Add(res.latency), nil, nil)
	e.fn = func() { s.resume(p, wakeup{res: &res}) }
	w := s.park(ctx, e)
	if w.err != nil {
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
