package damper

import (
	"github.com/damper-ai/damper-go/internal/engine"
	"log/slog"
	"net/http"
	"time"
)

// The proxy's log: one line per request (logRequest), with the status a
// handler answered with (statusWriter).

// statusWriter notes the status a handler answered with, and gives each
// write WriteTimeout, as deadlineWriter does.
type statusWriter struct {
	http.ResponseWriter
	status int
	rc     *http.ResponseController
	d      time.Duration
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.d))
	return w.ResponseWriter.Write(p)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// logRequest logs one request: no header, body or credential, and what
// the client chose cut to a bound.
func (p *Proxy) logRequest(r *http.Request, status int, start time.Time, rep *Report, backend string, tenant *engine.ProxyTenant) {
	if p.log == nil {
		return
	}
	var buf [11]slog.Attr // every field below: one slice, not grown as they come
	attrs := append(buf[:0],
		slog.String("method", engine.BoundedText(r.Method)),
		slog.String("path", engine.BoundedText(r.URL.Path)),
		slog.Int("status", status),
		slog.Duration("duration", time.Since(start)))
	if tenant != nil { // a configured name, authenticated
		attrs = append(attrs, slog.String("tenant", tenant.Name))
	}
	if rep != nil && rep.Provider != "" { // a call was made
		attrs = append(attrs,
			slog.String("model", engine.BoundedText(rep.Model)),
			slog.String("backend", backend),
			slog.Bool("stream", rep.Stream),
			slog.Int("attempts", rep.Attempts),
			slog.String("outcome", string(rep.Outcome)),
			slog.Float64("retry_cost_usd", rep.RetryCostUSD))
	}
	level := slog.LevelInfo
	if status == 0 || status >= 500 {
		level = slog.LevelWarn
	}
	p.log.LogAttrs(r.Context(), level, "damper proxy: request", attrs...)
}
