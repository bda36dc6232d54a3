package dampertest

import (
	"cmp"
	"context"
	"net/http"
	"strconv"
	"time"
)

// call is what the server knows about one request when it answers it.
type call struct {
	model       string
	stream      bool
	requestID   string
	messageID   string      // of the message sent
	inputTokens int         // reported in usage
	header      http.Header // rate-limit headers; a step's Header wins
	ticket      *ticket     // output reservation to settle; nil without limits
}

// respond answers r with step.
func (s *Server) respond(w http.ResponseWriter, r *http.Request, step Step, c call) {
	ctx := r.Context()
	if step.Delay > 0 && !s.hold(ctx, step.Delay) {
		return // the client gave up: like the API, send nothing more
	}
	if step.Drop == DropBeforeHeaders {
		abort()
	}

	h := w.Header()
	for k, vs := range c.header {
		h[k] = vs
	}
	h.Set("Request-Id", c.requestID)
	for k, vs := range step.Header {
		h.Del(k) // canonicalizes k, so a step's request-id replaces ours
		for _, v := range vs {
			h.Add(k, v)
		}
	}
	requestID := h.Get("Request-Id")
	status := cmp.Or(step.Status, http.StatusOK)
	c.messageID = cmp.Or(step.MessageID, messageID)

	// The output reservation is settled before the answer goes out, so a
	// client that has the answer sees it settled: by the answer's usage, or
	// given back whole for an error or a drop. A stream settles at its
	// message_delta (see writeStream).
	if status >= 400 || step.Drop != DropNone {
		c.ticket.settle(0)
	}
	switch {
	case step.Body != nil:
		c.ticket.settle(bodyOutputTokens(step.Body))
		s.writeBody(ctx, w, status, step.Body, step.Drop)
	case status >= 400 && s.platform.name == platformBedrock:
		status, kind := bedrockError(status, step.ErrorType)
		s.writeBedrockError(ctx, w, status, kind, step.Message, step.Drop)
	case status >= 400:
		errorType := cmp.Or(step.ErrorType, DefaultErrorType(status))
		s.writeBody(ctx, w, status, errorJSON(errorType, step.ErrorCode, step.Message, requestID), step.Drop)
	case step.Stream != nil || c.stream:
		st := Stream{Text: step.Text}
		if step.Stream != nil {
			st = *step.Stream
		}
		s.writeStream(ctx, w, status, st, c, requestID, step.Drop)
	default:
		text := cmp.Or(step.Text, "ok")
		c.ticket.settle(int64(outputTokens(text)))
		if s.platform.name == platformBedrock {
			setBedrockUsage(h, c.inputTokens, outputTokens(text))
		}
		s.writeBody(ctx, w, status, messageJSON(c.messageID, c.model, text, c.inputTokens), step.Drop)
	}
}

// writeBody sends a whole JSON (or raw) body, or half of it when drop is
// DropMidBody or StallMidBody. The full Content-Length is declared either
// way, so that the client can tell a cut body from a short one.
func (s *Server) writeBody(ctx context.Context, w http.ResponseWriter, status int, body []byte, drop Drop) {
	h := w.Header()
	setDefault(h, "Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	if drop == DropMidBody || drop == StallMidBody {
		w.Write(body[:len(body)/2])
		flush(w)
		s.stopMidBody(ctx, drop)
		return
	}
	w.Write(body)
}

// stopMidBody ends a response sent in part: DropMidBody cuts the
// connection, StallMidBody holds it.
func (s *Server) stopMidBody(ctx context.Context, drop Drop) {
	if drop == StallMidBody {
		s.stall(ctx)
		return
	}
	abort()
}

// stall sends nothing until the request's context ends; Close cuts the
// connection instead, so that it never waits on a stalled handler.
func (s *Server) stall(ctx context.Context) {
	select {
	case <-ctx.Done():
	case <-s.closing:
		abort()
	}
}

// hold waits d before a response, on the server's clock, and reports whether
// the client is still there to answer.
//
// With a fake Clock the wait is an advance of the clock, which may fire the
// client's own per-attempt timeout registered on the same clock. The client
// gives up at that instant, so the advance stops there: the clock then reads
// what it would for the client, deterministically, however the goroutines
// are scheduled. Over Transport the timeout ends the request's context
// within the callback. Over a real connection the server learns of it only
// once the closed connection is noticed, a moment later, so after each
// timer the advance fires, hold waits up to s.grace of real time for the
// context to end; a timer that was not the client's costs that wait.
func (s *Server) hold(ctx context.Context, d time.Duration) bool {
	switch {
	case s.sleep != nil:
		if s.sleep(ctx, d) != nil {
			return false
		}
	case s.clock != nil:
		inMemory := ctx.Value(inMemoryKey{}) != nil
		s.clock.advance(d, func() bool {
			if !inMemory {
				s.wait(ctx, s.grace)
			}
			return ctx.Err() != nil
		})
	default:
		s.wait(ctx, d)
	}
	select {
	case <-s.closing:
		abort()
	default:
	}
	return ctx.Err() == nil
}

// wait blocks for d of real time, or until ctx ends or the server closes.
func (s *Server) wait(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	case <-s.closing:
	}
}

// abort cuts the connection: net/http and [Transport] both close it without
// finishing the response when a handler panics with http.ErrAbortHandler,
// and net/http logs nothing for it.
func abort() {
	panic(http.ErrAbortHandler)
}

// flush pushes what has been written to the client. Writers that cannot
// flush are left as they are: the response still arrives, only later.
func flush(w http.ResponseWriter) {
	_ = http.NewResponseController(w).Flush()
}

func setDefault(h http.Header, k, v string) {
	if h.Get(k) == "" {
		h.Set(k, v)
	}
}
