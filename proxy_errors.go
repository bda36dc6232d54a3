package damper

import (
	"context"
	"errors"
	"github.com/damper-ai/damper-go/internal/core"
	"github.com/damper-ai/damper-go/internal/engine"
	"math"
	"net/http"
	"strconv"
	"time"
)

// The proxy's answers when a Messages call fails: the provider's error as
// it came, or a refusal in the API's error shape (writeCallError), with the
// wait in retry-after headers.

// writeCallError answers a Messages call that ended with err, before any
// of its answer was sent; backend is the backend that answered, if any.
func (p *Proxy) writeCallError(w http.ResponseWriter, err error, rep *Report, backend string) int {
	h := w.Header()
	reportHeader(h, rep, backend)
	var up *upstreamStatus
	var ev *upstreamEvent
	var de *Error
	var refused *core.Gate // the gate whose refusal err is, if any
	if errors.As(err, &de) {
		refused = engine.RefusedBy(de.Reason)
	}
	switch {
	case p.keys != nil && errors.As(err, &up):
		// The operator's backend's error, in the proxy's words.
		extra, body := operatorError(backend, up.status, up.header, up.body)
		return writeAPIBody(w, up.status, extra, body)
	case p.keys != nil && errors.As(err, &ev):
		h.Set("Content-Type", "text/event-stream; charset=utf-8")
		h.Set("X-Should-Retry", "false")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(errorEvent(operatorEvent(backend, ev.data)))
		return http.StatusOK
	case errors.As(err, &up):
		// The provider's own answer, as it came.
		copyHeader(h, up.header)
		reportHeader(h, rep, backend)
		h.Del("Content-Length")
		h.Set("X-Should-Retry", "false")
		w.WriteHeader(up.status)
		_, _ = w.Write(up.body)
		return up.status
	case errors.As(err, &ev):
		// A stream's error event before its first content, as it came.
		h.Set("Content-Type", "text/event-stream; charset=utf-8")
		h.Set("X-Should-Retry", "false")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(errorEvent(ev.data))
		return http.StatusOK
	case refused != nil && refused.Status != 0:
		// A gate's refusal, shaped as the API's own error for it.
		return writeAPIError(w, refused.Status, refused.APIType, err.Error(), retryAfter(de.RetryAfter))
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrAttemptTimeout):
		return writeAPIError(w, http.StatusGatewayTimeout, "timeout_error", "damper proxy: "+err.Error(), nil)
	}
	return writeAPIError(w, http.StatusBadGateway, "api_error", "damper proxy: "+err.Error(), nil)
}

// retryAfter is the headers of a wait of d: retry-after in whole seconds
// and retry-after-ms in whole milliseconds, each rounded up, so that a
// client reading either waits no less than d, and one reading
// retry-after-ms (as the API's SDKs do first) no more than a millisecond
// longer.
func retryAfter(d time.Duration) http.Header {
	if d <= 0 {
		return nil
	}
	return http.Header{
		"Retry-After":    {strconv.FormatInt(int64(math.Ceil(d.Seconds())), 10)},
		"Retry-After-Ms": {strconv.FormatInt(int64((d+time.Millisecond-1)/time.Millisecond), 10)},
	}
}

// writeAPIError answers with an error of the API's shape, and returns the
// status.
func writeAPIError(w http.ResponseWriter, status int, typ, msg string, extra http.Header) int {
	return writeAPIBody(w, status, extra, errorBody(typ, msg))
}

// writeAPIBody answers with body, an error of the API's shape, and
// returns the status.
func writeAPIBody(w http.ResponseWriter, status int, extra http.Header, body []byte) int {
	h := w.Header()
	for k, v := range extra {
		h[k] = v
	}
	h.Set("Content-Type", "application/json")
	h.Set("X-Should-Retry", "false")
	w.WriteHeader(status)
	_, _ = w.Write(body)
	return status
}

// errorBody is an error body of the API's shape.
func errorBody(typ, msg string) []byte { return errorBodyID(typ, msg, "") }

// errorEvent is an SSE error event whose data is data.
func errorEvent(data []byte) []byte {
	b := append([]byte("event: error\ndata: "), data...)
	return append(b, "\n\n"...)
}
