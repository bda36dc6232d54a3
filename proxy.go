package damper

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The proxy adapter: the engine driven by HTTP requests from clients in any
// language, in place of the Go SDK's middleware (sdk.go).

// DefaultMaxRequestBytes is the request size a [Proxy] accepts by default:
// the Messages API's own limit, 32 MB.
const DefaultMaxRequestBytes = 32 << 20

// Headers the proxy reads and writes.
const (
	// HeaderTimeout is the request header in which a client may state its
	// call's deadline, in seconds from the request's arrival ("30",
	// "2.5"). Without it, the X-Stainless-Timeout header that the
	// official SDKs send (whole seconds) gives the deadline, and without
	// either the call has none but the client's connection.
	HeaderTimeout = "Damper-Timeout"
	// HeaderAttempts is the response header with the number of attempts
	// the call made (for a stream, until its first content).
	HeaderAttempts = "Damper-Attempts"
	// HeaderOutcome is the response header with the call's [Outcome]; a
	// stream sends it as a trailer, at its end.
	HeaderOutcome = "Damper-Outcome"
	// HeaderRetryCost is the response header with the estimated cost of
	// the call's retries in US dollars ([Report.RetryCostUSD]).
	HeaderRetryCost = "Damper-Retry-Cost-Usd"
)

// ProxyConfig is what a [Proxy] needs besides its Damper.
type ProxyConfig struct {
	// Upstream is the one API every request goes to, as an http or https
	// URL with at most a path: "https://api.anthropic.com". A request's
	// path is appended to Upstream's.
	Upstream string
	// Transport sends every request upstream; nil means
	// [NewProxyTransport]'s. It must not follow redirects to other hosts
	// (an http.RoundTripper never does).
	Transport http.RoundTripper
	// MaxRequestBytes bounds a request's body; 0 means
	// [DefaultMaxRequestBytes]. A longer body is answered with 413.
	MaxRequestBytes int64
	// Logger gets one line per request: its method, path, status and, for
	// a Messages call, its report's outcome, attempts and duration. No
	// header, body or credential is logged. nil means no lines.
	Logger *slog.Logger
}

// Proxy serves the Messages API over HTTP through a Damper, so that a
// service written in any language gets Damper's retries, budget, breaker
// and rate limiter by pointing its SDK's base URL at the proxy.
//
// POST /v1/messages, plain and streaming, runs through the Damper as a
// call from the Go SDK would; every other request passes through to the
// upstream unchanged. Either way the request goes to the configured
// upstream and nowhere else: a request whose target names a host (a
// forward-proxy request) is refused. The client's own credentials
// (x-api-key, authorization) are forwarded as they came and kept nowhere.
//
// Every error response of a Messages call says x-should-retry: false, so
// that the client's SDK does not retry what Damper has decided, and
// carries the Damper-* headers of the call's report. When Damper refuses a
// call, the answer is the last provider error it had, as the provider sent
// it; a refusal before any answer is shaped as the API's own error, with
// the status the API uses for the same condition, so that SDKs handle it
// as they would a provider's:
//
//   - the breaker open (circuit_open): 529 overloaded_error, with
//     retry-after until its next probe. The breaker opens on the
//     provider's failures of health, which the API reports as overload.
//   - the rate limiter's wait too long (rate_limited): 429
//     rate_limit_error, with retry-after until it could admit the call.
//   - the call's deadline passed: 504 timeout_error.
//   - the provider unreachable, or its answer cut short, with no status:
//     502 api_error (504 timeout_error for an attempt's timeout).
//
// A stream is answered with its status and headers once its first content
// comes (before it, Damper may retry). A failure after that is sent as an
// SSE error event, the provider's own when it sent one, so that the
// client's SDK raises an error rather than take a cut stream for a whole
// one. The proxy passes events on whole: a failure never leaves half an
// event before the error.
type Proxy struct {
	d        *Damper
	upstream *url.URL
	rt       http.RoundTripper
	maxBody  int64
	log      *slog.Logger
	pass     *httputil.ReverseProxy
}

// NewProxy returns a Proxy that sends Messages calls through d, or an
// error that names the field of cfg that cannot be used.
func NewProxy(d *Damper, cfg ProxyConfig) (*Proxy, error) {
	if d == nil {
		return nil, errors.New("damper: NewProxy: the Damper is nil")
	}
	up, err := parseUpstream(cfg.Upstream)
	if err != nil {
		return nil, err
	}
	if cfg.MaxRequestBytes < 0 {
		return nil, fmt.Errorf("damper: ProxyConfig.MaxRequestBytes = %d: must be positive, or 0 for the default", cfg.MaxRequestBytes)
	}
	p := &Proxy{d: d, upstream: up, rt: cfg.Transport, maxBody: cfg.MaxRequestBytes, log: cfg.Logger}
	if p.rt == nil {
		p.rt = NewProxyTransport()
	}
	if p.maxBody == 0 {
		p.maxBody = DefaultMaxRequestBytes
	}
	p.pass = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL = p.target(pr.In.URL)
			pr.Out.Host = ""
		},
		Transport:     p.rt,
		FlushInterval: -1, // pass other streams on as they come
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() == nil {
				writeAPIError(w, http.StatusBadGateway, "api_error", "damper proxy: the upstream did not answer: "+err.Error(), nil)
			}
		},
	}
	return p, nil
}

// NewProxyTransport returns the transport a [Proxy] uses by default:
// http.DefaultTransport's settings, but for idle connections to the
// upstream: 256 kept rather than 2, so that a proxy serving many calls at
// once reuses its connections (and their TLS sessions) instead of opening
// one per call.
func NewProxyTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = 256
	t.MaxIdleConnsPerHost = 256
	return t
}

// parseUpstream reads ProxyConfig.Upstream. Its errors never show a
// password the URL holds.
func parseUpstream(s string) (*url.URL, error) {
	bad := func(why string) error {
		shown := s
		if at := strings.LastIndex(s, "@"); at >= 0 {
			shown = "xxxxx" + s[at:]
			if scheme, _, ok := strings.Cut(s, "://"); ok && len(scheme) < at {
				shown = scheme + "://xxxxx" + s[at:]
			}
		}
		return fmt.Errorf("damper: ProxyConfig.Upstream = %q: %s", shown, why)
	}
	u, err := url.Parse(s)
	switch {
	case s == "":
		return nil, bad("is required: the API's URL, such as https://api.anthropic.com")
	case err != nil:
		return nil, bad("is not a URL")
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, bad("must be an http or https URL")
	case u.Host == "":
		return nil, bad("has no host")
	case u.User != nil:
		return nil, bad("must not hold credentials: clients send their own")
	case u.RawQuery != "" || u.Fragment != "":
		return nil, bad("must not have a query or fragment")
	}
	return u, nil
}

// target is the upstream URL for a request to in: the upstream's scheme,
// host and path, then in's path and query.
func (p *Proxy) target(in *url.URL) *url.URL {
	u := *p.upstream
	base := strings.TrimSuffix(p.upstream.Path, "/")
	u.Path = base + in.Path
	u.RawPath = ""
	if in.RawPath != "" {
		u.RawPath = strings.TrimSuffix(p.upstream.EscapedPath(), "/") + in.EscapedPath()
	}
	u.RawQuery = in.RawQuery
	return &u
}

// ServeHTTP serves one request: a Messages call through the Damper, or
// any other request passed through.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	if r.Method == http.MethodConnect || r.URL.Host != "" || r.URL.Scheme != "" {
		writeAPIError(w, http.StatusBadRequest, "invalid_request_error", "damper proxy: not a forward proxy: a request's target must be a path, such as /v1/messages", nil)
		p.logRequest(r, http.StatusBadRequest, start, nil)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, p.maxBody)
	if r.Method != http.MethodPost || r.URL.Path != "/v1/messages" {
		sw := &statusWriter{ResponseWriter: w}
		p.pass.ServeHTTP(sw, r)
		p.logRequest(r, sw.status, start, nil)
		return
	}
	var rep Report
	status := p.messages(w, r, &rep)
	p.logRequest(r, status, start, &rep)
}

// messages serves a Messages call and returns the status it answered with
// (0 when the client had gone).
func (p *Proxy) messages(w http.ResponseWriter, r *http.Request, rep *Report) int {
	timeout, err := requestTimeout(r.Header)
	if err != nil {
		return writeAPIError(w, http.StatusBadRequest, "invalid_request_error", err.Error(), nil)
	}
	tooLarge := func() int {
		return writeAPIError(w, http.StatusRequestEntityTooLarge, "request_too_large",
			fmt.Sprintf("damper proxy: the request body is larger than %d bytes", p.maxBody), nil)
	}
	if r.ContentLength > p.maxBody {
		return tooLarge() // before a buffer of that size is made
	}
	body, err := readInto(nil, r.Body, r.ContentLength)
	if err != nil {
		if mb := (*http.MaxBytesError)(nil); errors.As(err, &mb) {
			return tooLarge()
		}
		return writeAPIError(w, http.StatusBadRequest, "invalid_request_error", "damper proxy: reading the request body: "+err.Error(), nil)
	}
	ctx := ContextWithReport(r.Context(), rep)
	if timeout > 0 {
		// On the Damper's clock, by which it weighs every wait against
		// the deadline.
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, p.d.clock.Now().Add(timeout))
		defer cancel()
	}
	out, err := http.NewRequestWithContext(ctx, http.MethodPost, p.target(r.URL).String(), bytes.NewReader(body))
	if err != nil {
		return writeAPIError(w, http.StatusBadRequest, "invalid_request_error", "damper proxy: "+err.Error(), nil)
	}
	out.Header = upstreamHeader(r.Header)
	c, err := p.d.newCall(out, &proxyClient)
	if err != nil {
		return writeAPIError(w, http.StatusBadRequest, "invalid_request_error", err.Error(), nil)
	}
	res, err := c.run(p.rt.RoundTrip)
	if err != nil {
		if r.Context().Err() != nil {
			return 0 // the client has gone: no one to answer
		}
		return writeCallError(w, err, rep)
	}
	defer closeBody(res)
	h := w.Header()
	copyHeader(h, res.Header)
	h.Del("Content-Length") // the transport may have decoded the body
	reportHeader(h, rep)
	_, stream := res.Body.(*streamBody)
	switch {
	case res.StatusCode >= 400:
		h.Set("X-Should-Retry", "false")
	case stream:
		h.Set("Trailer", HeaderOutcome)
		w.WriteHeader(res.StatusCode)
		passStream(w, res.Body, p.d.policy.MaxEventBytes)
		h.Set(HeaderOutcome, string(rep.Outcome))
		return res.StatusCode
	default:
		h.Set(HeaderOutcome, string(OutcomeSuccess)) // a plain answer is read whole before it is handed on
	}
	w.WriteHeader(res.StatusCode)
	_, _ = io.Copy(w, res.Body)
	return res.StatusCode
}

// requestTimeout reads the call's deadline from the request's headers:
// Damper-Timeout if set, else X-Stainless-Timeout; 0 means none.
func requestTimeout(h http.Header) (time.Duration, error) {
	if v := h.Get(HeaderTimeout); v != "" {
		s, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || !(s > 0) || s > math.MaxInt64/float64(time.Second) {
			return 0, fmt.Errorf("damper proxy: header %s is %q: want a number of seconds above 0, such as 30 or 2.5", HeaderTimeout, v)
		}
		return time.Duration(s * float64(time.Second)), nil
	}
	if v := h.Get("X-Stainless-Timeout"); v != "" {
		s, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil || s < 0 || s > math.MaxInt64/int64(time.Second) {
			return 0, fmt.Errorf("damper proxy: header X-Stainless-Timeout is %q: want whole seconds", v)
		}
		// 0 is a timeout under a second, which the SDK sends truncated: the
		// client's own connection is the deadline then.
		return time.Duration(s) * time.Second, nil
	}
	return 0, nil
}

// hopHeaders are the headers of one connection, which a proxy does not pass
// on (RFC 9110, section 7.6.1).
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// upstreamHeader is the header of a Messages call's attempts: the client's,
// less what belongs to its connection and to the proxy. Accept-Encoding
// is left to the transport, which then decodes the answer Damper reads.
func upstreamHeader(in http.Header) http.Header {
	h := in.Clone()
	removeHopHeaders(h)
	h.Del("Accept-Encoding")
	h.Del(HeaderTimeout)
	return h
}

func removeHopHeaders(h http.Header) {
	for _, f := range h["Connection"] {
		for name := range strings.SplitSeq(f, ",") {
			if name = strings.TrimSpace(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, k := range hopHeaders {
		h.Del(k)
	}
}

// copyHeader adds the end-to-end headers of src to dst, with the upstream's
// x-should-retry dropped: the proxy decides what the client retries.
func copyHeader(dst, src http.Header) {
	for k, v := range src {
		dst[k] = append(dst[k], v...)
	}
	removeHopHeaders(dst)
	dst.Del("X-Should-Retry")
}

// reportHeader sets the Damper-* headers of rep so far.
func reportHeader(h http.Header, rep *Report) {
	h.Set(HeaderAttempts, strconv.Itoa(rep.Attempts))
	h.Set(HeaderRetryCost, strconv.FormatFloat(rep.RetryCostUSD, 'f', -1, 64))
	if rep.Outcome != "" {
		h.Set(HeaderOutcome, string(rep.Outcome))
	}
}

// writeCallError answers a Messages call that ended with err, before any
// of its answer was sent.
func writeCallError(w http.ResponseWriter, err error, rep *Report) int {
	h := w.Header()
	reportHeader(h, rep)
	var up *upstreamStatus
	var ev *upstreamEvent
	var de *Error
	isDamper := errors.As(err, &de)
	switch {
	case errors.As(err, &up):
		// The provider's own answer, as it came.
		copyHeader(h, up.header)
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
	case isDamper && de.Reason == ErrCircuitOpen:
		return writeAPIError(w, 529, "overloaded_error", err.Error(), retryAfter(de.RetryAfter))
	case isDamper && de.Reason == ErrRateLimited:
		return writeAPIError(w, http.StatusTooManyRequests, "rate_limit_error", err.Error(), retryAfter(de.RetryAfter))
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrAttemptTimeout):
		return writeAPIError(w, http.StatusGatewayTimeout, "timeout_error", "damper proxy: "+err.Error(), nil)
	}
	return writeAPIError(w, http.StatusBadGateway, "api_error", "damper proxy: "+err.Error(), nil)
}

// retryAfter is the retry-after header for a wait of d, in whole seconds
// rounded up.
func retryAfter(d time.Duration) http.Header {
	if d <= 0 {
		return nil
	}
	return http.Header{"Retry-After": {strconv.FormatInt(int64(math.Ceil(d.Seconds())), 10)}}
}

// writeAPIError answers with an error of the API's shape, and returns the
// status.
func writeAPIError(w http.ResponseWriter, status int, typ, msg string, extra http.Header) int {
	h := w.Header()
	for k, v := range extra {
		h[k] = v
	}
	h.Set("Content-Type", "application/json")
	h.Set("X-Should-Retry", "false")
	w.WriteHeader(status)
	_, _ = w.Write(errorBody(typ, msg))
	return status
}

// errorBody is an error body of the API's shape.
func errorBody(typ, msg string) []byte {
	type apiError struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	}
	b, _ := json.Marshal(struct {
		Type  string   `json:"type"`
		Error apiError `json:"error"`
	}{"error", apiError{typ, msg}}) // strings only: it cannot fail
	return b
}

// errorEvent is an SSE error event whose data is data.
func errorEvent(data []byte) []byte {
	b := append([]byte("event: error\ndata: "), data...)
	return append(b, "\n\n"...)
}

// streamBufs are the buffers streams are passed on with.
var streamBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// passStream copies a stream to the client as it comes, flushing each
// read, and passes on only whole events: when the stream fails, the part
// of an event read so far is dropped and an error event takes its place.
// The stream fails once an event passes maxEvent bytes, so the buffer
// never grows beyond that and one read.
func passStream(w http.ResponseWriter, body io.Reader, maxEvent int) {
	flush := http.NewResponseController(w).Flush
	pooled := streamBufs.Get().(*[]byte)
	defer streamBufs.Put(pooled)
	buf := *pooled
	var ends eventEnds
	held := 0 // buf[:held] is the start of an event
	for {
		if held == len(buf) { // an event longer than the buffer
			grow := max(min(held, maxEvent-held), len(*pooled))
			buf = append(buf[:held], make([]byte, grow)...)
		}
		n, err := body.Read(buf[held:])
		cut := ends.last(buf, held, held+n)
		if cut > 0 {
			if _, werr := w.Write(buf[:cut]); werr != nil {
				return // the client has gone; the call ends with its context
			}
			_ = flush()
		}
		held = copy(buf, buf[cut:held+n])
		switch {
		case err == io.EOF:
			if held > 0 { // what the stream ends with after its last event
				_, _ = w.Write(buf[:held])
				_ = flush()
			}
			return
		case err != nil:
			_, _ = w.Write(failureEvent(err))
			_ = flush()
			return
		}
	}
}

// failureEvent is the error event for a stream that failed after its first
// content with err: the provider's own event when it sent one.
func failureEvent(err error) []byte {
	var ev *upstreamEvent
	if errors.As(err, &ev) {
		return errorEvent(ev.data)
	}
	return errorEvent(errorBody("api_error", "damper proxy: "+err.Error()))
}

// eventEnds finds where a stream's events end: after an empty line, with
// "\n", "\r\n" or "\r" as line ends. It carries what it has seen from one
// read to the next.
type eventEnds struct {
	lineStart bool // the last byte seen ended a line
	cr        bool // the last byte seen was "\r"
}

// last scans b[from:to], which follows what it has seen, and returns the
// index in b just after the last event that ends in b[:to], or 0 if none
// ends in b[from:to].
func (e *eventEnds) last(b []byte, from, to int) int {
	cut := 0
	for i := from; i < to; i++ {
		switch b[i] {
		case '\n':
			if e.cr { // the "\n" of "\r\n": the line ended at "\r"
				e.cr = false
				if cut == i {
					cut = i + 1
				}
				continue
			}
			if e.lineStart {
				cut = i + 1
			}
			e.lineStart = true
		case '\r':
			if e.lineStart {
				cut = i + 1
			}
			e.lineStart, e.cr = true, true
		default:
			e.lineStart, e.cr = false, false
		}
	}
	return cut
}

// proxyClient reports the provider's errors as values the proxy writes
// back as they came.
var proxyClient = clientAdapter{
	statusError: func(_ *http.Request, res *http.Response, body []byte) error {
		return &upstreamStatus{status: res.StatusCode, header: res.Header.Clone(), body: bytes.Clone(body)}
	},
	eventError: func(_ *http.Response, data []byte) error {
		return &upstreamEvent{data: bytes.Clone(data)}
	},
}

// upstreamStatus is a provider's answer with an error status.
type upstreamStatus struct {
	status int
	header http.Header
	body   []byte
}

func (e *upstreamStatus) Error() string {
	return fmt.Sprintf("the upstream answered %d: %s", e.status, bytes.TrimSpace(e.body))
}

// upstreamEvent is a provider's SSE error event.
type upstreamEvent struct{ data []byte }

func (e *upstreamEvent) Error() string {
	return "the upstream's stream sent an error event: " + string(e.data)
}

// statusWriter notes the status a handler answered with.
type statusWriter struct {
	http.ResponseWriter
	status int
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
	return w.ResponseWriter.Write(p)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// logRequest logs one request: no header, body or credential.
func (p *Proxy) logRequest(r *http.Request, status int, start time.Time, rep *Report) {
	if p.log == nil {
		return
	}
	attrs := []slog.Attr{
		slog.String("method", r.Method),
		slog.String("path", boundedText(r.URL.Path)),
		slog.Int("status", status),
		slog.Duration("duration", time.Since(start)),
	}
	if rep != nil {
		attrs = append(attrs,
			slog.String("model", boundedText(rep.Model)),
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
