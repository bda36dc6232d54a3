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
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/damper-ai/damper-go/internal/conf"
)

// The proxy adapter: the engine driven by HTTP requests from clients in any
// language, in place of the Go SDK's middleware (sdk.go).

// What the proxy accepts of a Messages request before anything is sent.
const (
	// maxMaxTokens bounds max_tokens, far above any model's output limit.
	maxMaxTokens = 1_000_000
	// maxHeaderTimeout bounds Damper-Timeout and X-Stainless-Timeout.
	maxHeaderTimeout = 24 * time.Hour
	// minTimeout is the shortest Damper-Timeout: a shorter one would round
	// to no deadline at all.
	minTimeout = time.Millisecond
	// initialBodyBuf is the most a request's declared Content-Length sizes
	// its buffer before its bytes arrive; past it, the buffer grows as
	// they do.
	initialBodyBuf = 64 << 10
)

// Headers the proxy reads and writes (see [Proxy]).
const (
	headerTimeout          = "Damper-Timeout"
	headerStainlessTimeout = "X-Stainless-Timeout"
	headerAttempts         = "Damper-Attempts"
	headerOutcome          = "Damper-Outcome"
	headerRetryCost        = "Damper-Retry-Cost-Usd"
	headerBackend          = "Damper-Backend"
)

// ProxyConfig is what a [Proxy] needs besides its Damper. Its fields are
// declared as a [Policy]'s are, each with its key in a configuration file
// (the damper command's proxy reads upstream, max_request_bytes and
// write_timeout from its file), its default and its bounds.
type ProxyConfig struct {
	// Upstream is the one API every request goes to, as an http or https
	// URL with at most a path: "https://api.anthropic.com". A request's
	// path is appended to Upstream's.
	Upstream string `key:"upstream"`
	// Transport sends every request upstream; nil means a clone of
	// http.DefaultTransport that keeps up to 256 idle connections. It must not follow redirects to other hosts
	// (an http.RoundTripper never does).
	Transport http.RoundTripper `key:"-"` // code
	// MaxRequestBytes bounds a request's body, on every path. Default 32
	// MiB, the Messages API's own limit. A longer body is answered with
	// 413. At most 512 MiB, above the API's largest upload (a 500 MB
	// file): a Messages body is held whole.
	MaxRequestBytes int64 `key:"max_request_bytes" default:"33554432" min:">0" max:"536870912" unit:"bytes"`
	// WriteTimeout bounds how long one write of an answer to the client
	// may block, a stream's included: a client that stops reading has
	// its call ended after it, and the upstream connection freed. Default
	// 1 minute. The proxy sets the connection's write deadline itself, so
	// an http.Server's WriteTimeout, a bound on the whole answer that
	// would cut long streams, does not apply to it. At most 24 h.
	WriteTimeout time.Duration `key:"write_timeout" default:"1m" min:">0" max:"24h"`
	// Logger gets one line per request: its method and path (each cut at
	// 256 bytes), status and duration (a slog duration) and, for a
	// Messages call that passed the checks at the door, its report's
	// model, outcome and attempts, and the backend whose answer the
	// client got (the Damper-Backend header). No header, body or
	// credential is logged. nil means no lines.
	Logger *slog.Logger `key:"-"` // code
	// Tenants, when any are given, put the proxy in key mode: every
	// request must present a key of one of them (see [Proxy]), and is
	// sent with the operator's credentials, never the client's. None
	// means pass-through mode: the client's own credentials go to the
	// upstream, and the Damper may have no fallback backends. At most
	// 1000. The damper command's proxy reads them from its file's
	// tenants.
	Tenants []Tenant `key:"-"` // the command's file declares its own list
	// UpstreamAPIKey is the operator's API key for the upstream in key
	// mode, sent as x-api-key in place of the client's; required there,
	// refused in pass-through mode. The damper command's proxy reads it
	// from the environment variable its upstream_api_key_env names.
	UpstreamAPIKey string `key:"-"` // a secret: never in a file
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
// as they would a provider's. Each gate declares its answer; for example:
//
//   - the breaker open (circuit_open): 529 overloaded_error, with
//     retry-after (and retry-after-ms) until its next probe, or until the
//     probe in flight is due to answer, never longer than the open
//     period. The breaker opens on the provider's failures of health,
//     which the API reports as overload.
//   - the rate limiter's wait too long (rate_limited): 429
//     rate_limit_error, with retry-after (and retry-after-ms) until it
//     could admit the call.
//   - the call's deadline passed: 504 timeout_error.
//
// docs/guide/proxy.md lists them all.
//   - the provider unreachable, or its answer cut short, with no status:
//     502 api_error (504 timeout_error for an attempt's timeout).
//
// A stream is answered with its status and headers once its first content
// comes (before it, Damper may retry). A failure after that is sent as an
// SSE error event, the provider's own when it sent one, so that the
// client's SDK raises an error rather than take a cut stream for a whole
// one. The proxy passes events on whole: a failure never leaves half an
// event before the error.
//
// What Damper decides on is checked before anything is sent, and a bad
// value is answered with 400 invalid_request_error naming the field: the
// body must be a JSON object whose model is a string of 1 to 256
// characters that model IDs use (ASCII letters, digits and "-._:@/", which
// covers first-party, Bedrock and Vertex IDs and Bedrock ARNs), whose
// max_tokens is an integer from 1 to 1,000,000, whose stream, if present,
// is true or false, and in which none of these three keys is repeated (the
// API might act on a different one than Damper judged). Damper-Timeout and
// X-Stainless-Timeout must be plain decimal numbers of seconds, at most
// 86400. A path with a dot segment ("..", ".", percent-encoded or not) is
// refused on every route; a path that differs from /v1/messages only by
// repeated or trailing slashes is a Messages call, sent as /v1/messages.
//
// A client may state its call's deadline in the request header
// Damper-Timeout, in seconds from the request's arrival ("30", "2.5"; from
// 0.001 to 86400): the deadline of the whole call, a stream's last event
// included, and not forwarded. Without it the call has none but the
// client's connection. The official SDKs send their own request timeout
// in X-Stainless-Timeout, in whole seconds (600 by default); as an SDK
// does, the proxy applies it until the response's headers: it bounds the
// time until the proxy answers (for a stream, until its first content),
// never how long a stream then runs, and 0, a timeout under a second
// truncated, sets no bound. Every answer to a Messages call carries the
// call's report in three headers: Damper-Attempts, the number of attempts
// the call made (for a stream, until its first content); Damper-Outcome,
// the call's [Outcome] (a stream sends it as a trailer, at its end); and
// Damper-Retry-Cost-Usd, the estimated cost of its retries in US dollars
// ([Report.RetryCostUSD]). Damper-Backend names the backend whose answer
// the client got: "primary" for the upstream, else a fallback's
// [Backend.Name]; for a refusal, the backend whose gate refused; absent
// when the request was refused at the door, before any backend.
//
// The proxy switches no protocol: a request that asks for an upgrade (an
// Upgrade header, or "upgrade" in Connection: WebSocket, h2c) is refused
// with 400 invalid_request_error on every path, and nothing is sent, and
// an upstream that answers 101 Switching Protocols is answered with 502
// api_error, never relayed: either would open a tunnel to the upstream
// through the proxy. The headers of one connection, those that
// Connection names among them, are not forwarded.
//
// Memory per request grows with the bytes that have arrived, never with a
// declared Content-Length, up to MaxRequestBytes.
//
// A Proxy is safe for concurrent use.
type Proxy struct {
	d        *Damper
	upstream *url.URL
	rt       http.RoundTripper
	maxBody  int64
	write    time.Duration
	log      *slog.Logger
	pass     *httputil.ReverseProxy
	keys     *clientKeys // nil in pass-through mode
	tenants  []*tenant   // in key mode, in keys' order
	upKey    string      // the operator's key for the upstream, in key mode
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
	if err := conf.Fill(&cfg); err != nil {
		return nil, fmt.Errorf("damper: ProxyConfig.%w", err)
	}
	p := &Proxy{d: d, upstream: up, rt: cfg.Transport, maxBody: cfg.MaxRequestBytes, write: cfg.WriteTimeout, log: cfg.Logger}
	if err := p.authConfig(cfg); err != nil {
		return nil, err
	}
	if p.rt == nil {
		p.rt = newProxyTransport()
	}
	p.rt = noSwitch{p.rt}
	p.pass = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL = p.target(pr.In.URL)
			pr.Out.Host = ""
			if p.keys != nil {
				pr.Out.Header = operatorHeader(pr.Out.Header, p.upKey)
			}
		},
		ModifyResponse: func(res *http.Response) error {
			switch {
			case p.keys != nil && res.StatusCode >= 400:
				p.shapePassedError(res)
			case p.keys != nil:
				operatorAnswerHeader(res.Header)
			}
			return nil
		},
		Transport:     p.rt,
		FlushInterval: -1, // pass other streams on as they come
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			switch mb := (*http.MaxBytesError)(nil); {
			case errors.As(err, &mb):
				p.tooLarge(w)
			case errors.Is(err, errSwitched):
				writeAPIError(w, http.StatusBadGateway, "api_error", "damper proxy: "+err.Error(), nil)
			case r.Context().Err() == nil:
				writeAPIError(w, http.StatusBadGateway, "api_error", "damper proxy: the upstream did not answer: "+err.Error(), nil)
			}
		},
	}
	return p, nil
}

// errSwitched is the failure of an upstream that answered 101 Switching
// Protocols: the proxy asks for no switch, and relaying one would open a
// tunnel through it.
var errSwitched = errors.New("the upstream answered 101 Switching Protocols, which the proxy never relays")

// noSwitch is the transport of a Proxy: its own, that fails a 101 answer
// (errSwitched) and closes its connection, on every path.
type noSwitch struct{ rt http.RoundTripper }

func (t noSwitch) RoundTrip(r *http.Request) (*http.Response, error) {
	res, err := t.rt.RoundTrip(r)
	if err == nil && res.StatusCode == http.StatusSwitchingProtocols {
		closeBody(res)
		return nil, errSwitched
	}
	return res, err
}

// newProxyTransport returns the transport a Proxy uses by default:
// http.DefaultTransport's settings, but for idle connections to the
// upstream: 256 kept rather than 2, so that a proxy serving many calls at
// once reuses its connections (and their TLS sessions) instead of opening
// one per call.
func newProxyTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = 256
	t.MaxIdleConnsPerHost = 256
	return t
}

// parseUpstream reads ProxyConfig.Upstream. Its errors never show a
// password the URL holds.
func parseUpstream(s string) (*url.URL, error) {
	bad := func(why string) error {
		// What may be a secret is masked: the user information, and
		// whatever follows a '?' or a '#'.
		shown := s
		if i := strings.IndexAny(shown, "?#"); i >= 0 {
			shown = shown[:i+1] + "xxxxx"
		}
		if at := strings.LastIndex(shown, "@"); at >= 0 {
			if scheme, _, ok := strings.Cut(shown, "://"); ok && len(scheme) < at {
				shown = scheme + "://xxxxx" + shown[at:]
			} else {
				shown = "xxxxx" + shown[at:]
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
	// The connection's write deadline is the proxy's: none while it waits
	// for the upstream (whatever an earlier request on the connection
	// left), WriteTimeout from each write, and from the handler's end for
	// the server's last flush.
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Time{}) // not every writer has one
	defer func() { _ = rc.SetWriteDeadline(time.Now().Add(p.write)) }()
	tenant, ok := p.authenticate(w, r) // before anything is read or sent
	if !ok {
		p.logRequest(r, http.StatusUnauthorized, start, nil, "", nil)
		return
	}
	if r.Method == http.MethodConnect || r.URL.Host != "" || r.URL.Scheme != "" {
		writeAPIError(w, http.StatusBadRequest, "invalid_request_error", "damper proxy: not a forward proxy: a request's target must be a path, such as /v1/messages", nil)
		p.logRequest(r, http.StatusBadRequest, start, nil, "", tenant)
		return
	}
	if asked := upgradeAsked(r.Header); asked != "" {
		// httputil.ReverseProxy would forward it, and tunnel a 101.
		writeAPIError(w, http.StatusBadRequest, "invalid_request_error",
			"damper proxy: "+asked+": the proxy switches no protocol (WebSocket, h2c); send plain HTTP requests", nil)
		p.logRequest(r, http.StatusBadRequest, start, nil, "", tenant)
		return
	}
	if hasDotSegment(r.URL.Path) {
		writeAPIError(w, http.StatusBadRequest, "invalid_request_error",
			"damper proxy: path "+excerpt([]byte(r.URL.EscapedPath()))+": a path with a dot segment (. or ..) is not forwarded", nil)
		p.logRequest(r, http.StatusBadRequest, start, nil, "", tenant)
		return
	}
	if r.ContentLength > p.maxBody {
		p.logRequest(r, p.tooLarge(w), start, nil, "", tenant) // before a byte of it is read or sent
		return
	}
	if tenant.hasCeiling() && p.ceilingReached(w, r, tenant) {
		p.logRequest(r, http.StatusTooManyRequests, start, nil, "", tenant)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, p.maxBody)
	if r.Method != http.MethodPost || !isMessagesRoute(r.URL.Path) {
		sw := &statusWriter{ResponseWriter: w, rc: rc, d: p.write}
		p.pass.ServeHTTP(sw, r)
		p.logRequest(r, sw.status, start, nil, "", tenant)
		return
	}
	var rep Report
	status, backend := p.messages(w, rc, r, &rep, tenant)
	p.logRequest(r, status, start, &rep, backend, tenant)
}

// upgradeAsked describes the header by which h asks to switch protocols
// (an Upgrade header, or "upgrade" among Connection's names), or is ""
// when it asks for none.
func upgradeAsked(h http.Header) string {
	if v, ok := h["Upgrade"]; ok && len(v) > 0 {
		return "header Upgrade is " + excerpt([]byte(v[0]))
	}
	for _, f := range h["Connection"] {
		for name := range strings.SplitSeq(f, ",") {
			if strings.EqualFold(strings.TrimSpace(name), "upgrade") {
				return "header Connection is " + excerpt([]byte(f))
			}
		}
	}
	return ""
}

// isMessagesRoute reports whether path names the Messages endpoint, with
// any repeated or trailing slashes, which an upstream may take for it.
func isMessagesRoute(path string) bool {
	const want = "/v1/messages"
	if path == want {
		return true
	}
	if !strings.HasPrefix(path, "/") {
		return false
	}
	i := 0
	for _, seg := range strings.Split(path, "/") {
		if seg == "" {
			continue
		}
		switch {
		case i == 0 && seg == "v1", i == 1 && seg == "messages":
			i++
		default:
			return false
		}
	}
	return i == 2
}

// hasDotSegment reports whether path, decoded, has a "." or ".." segment,
// which the upstream may resolve to another path than the one judged.
func hasDotSegment(path string) bool {
	if !strings.Contains(path, ".") {
		return false
	}
	for _, seg := range strings.FieldsFunc(path, func(r rune) bool { return r == '/' || r == '\\' }) {
		if seg == "." || seg == ".." {
			return true
		}
	}
	return false
}

func (p *Proxy) tooLarge(w http.ResponseWriter) int {
	return writeAPIError(w, http.StatusRequestEntityTooLarge, "request_too_large",
		fmt.Sprintf("damper proxy: the request body is larger than %d bytes", p.maxBody), nil)
}

// messages serves a Messages call for tenant (nil in pass-through mode) and
// returns the status it answered with (0 when the client had gone) and
// the backend it named, if any.
func (p *Proxy) messages(w http.ResponseWriter, rc *http.ResponseController, r *http.Request, rep *Report, tenant *tenant) (status int, backend string) {
	whole, toHeaders, err := requestTimeouts(r.Header)
	if err != nil {
		return writeAPIError(w, http.StatusBadRequest, "invalid_request_error", err.Error(), nil), ""
	}
	// The buffer grows as the body arrives: a declared length is believed
	// only up to initialBodyBuf before its bytes come.
	body, err := readUpTo(nil, r.Body, min(r.ContentLength, initialBodyBuf), -1)
	if err != nil {
		if mb := (*http.MaxBytesError)(nil); errors.As(err, &mb) {
			return p.tooLarge(w), ""
		}
		return writeAPIError(w, http.StatusBadRequest, "invalid_request_error", "damper proxy: reading the request body: "+err.Error(), nil), ""
	}
	if err := checkMessagesBody(body); err != nil {
		return writeAPIError(w, http.StatusBadRequest, "invalid_request_error", err.Error(), nil), ""
	}
	ctx := tenant.callContext(r.Context())
	if whole > 0 {
		dc := p.withDeadline(ctx, whole)
		defer dc.cancel()
		ctx = dc
	}
	var headers *deadlineContext
	if toHeaders > 0 && (whole == 0 || toHeaders < whole) {
		headers = p.withDeadline(ctx, toHeaders)
		defer headers.cancel()
		ctx = headers
	}
	target := p.target(r.URL)
	target.Path, target.RawPath = strings.TrimSuffix(p.upstream.Path, "/")+"/v1/messages", ""
	out, err := http.NewRequestWithContext(ctx, http.MethodPost, target.String(), bytes.NewReader(body))
	if err != nil {
		return writeAPIError(w, http.StatusBadRequest, "invalid_request_error", "damper proxy: "+err.Error(), nil), ""
	}
	out.Header = upstreamHeader(r.Header)
	if p.keys != nil {
		out.Header = operatorHeader(out.Header, p.upKey)
	}
	c, err := p.d.newCall(out, front{client: &proxyClient, next: p.rt.RoundTrip, sink: rep, tenant: tenant})
	if err != nil {
		return writeAPIError(w, http.StatusBadRequest, "invalid_request_error", err.Error(), nil), ""
	}
	res, err := c.run()
	backend = boundedText(answeredBy(err, rep)) // a name from the Damper's settings
	if err != nil {
		if r.Context().Err() != nil {
			return 0, backend // the client has gone: no one to answer
		}
		return p.writeCallError(w, err, rep, backend), backend
	}
	defer closeBody(res)
	if res.StatusCode < 200 { // an informational status as the answer: a fallback's client let it through
		reportHeader(w.Header(), rep, backend)
		return writeAPIError(w, http.StatusBadGateway, "api_error", fmt.Sprintf("damper proxy: the upstream answered %d, which the proxy never relays", res.StatusCode), nil), backend
	}
	if headers != nil {
		headers.lift() // the answer's headers go out now: the SDK's timeout ends here
	}
	if res.StatusCode >= 400 && p.keys != nil {
		// An error status handed on as it came: the operator's backend's
		// error, in the proxy's words.
		body, _ := io.ReadAll(io.LimitReader(res.Body, maxErrorBody))
		return p.writeCallError(w, &upstreamStatus{status: res.StatusCode, header: res.Header, body: body}, rep, backend), backend
	}
	h := w.Header()
	copyHeader(h, res.Header)
	if p.keys != nil {
		operatorAnswerHeader(h)
	}
	h.Del("Content-Length") // the transport may have decoded the body
	reportHeader(h, rep, backend)
	_, stream := res.Body.(*streamBody)
	dw := &deadlineWriter{w: w, rc: rc, d: p.write}
	switch {
	case res.StatusCode >= 400:
		h.Set("X-Should-Retry", "false")
	case stream:
		h.Set("Trailer", headerOutcome)
		w.WriteHeader(res.StatusCode)
		sb := res.Body.(*streamBody)
		passStream(dw, sb, p.d.policy.MaxEventBytes, p.eventShaper(backend), sb.delivered.Load)
		h.Set(headerOutcome, string(rep.Outcome))
		return res.StatusCode, backend
	case rep.Outcome == "":
		// A plain answer is read whole before it is handed on: it is the
		// call's success. A call that ended already (an answer that is
		// not JSON) keeps the outcome it ended with.
		h.Set(headerOutcome, string(OutcomeSuccess))
	}
	w.WriteHeader(res.StatusCode)
	_, _ = io.Copy(dw, res.Body)
	return res.StatusCode, backend
}

// deadlineWriter is a client's response writer whose every write must be
// taken within d: a client that stops reading fails the write after it,
// and the call ends.
type deadlineWriter struct {
	w  http.ResponseWriter
	rc *http.ResponseController
	d  time.Duration
}

func (w *deadlineWriter) Write(b []byte) (int, error) {
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.d)) // not every writer has one
	return w.w.Write(b)
}

func (w *deadlineWriter) Flush() error { return w.rc.Flush() }

// deadlineContext is a call's context with a deadline on the Damper's
// clock, by which it weighs every wait. The deadline of the time to the
// answer's headers is lifted once they are sent, as an SDK stops its own
// timer when they come: the context then ends only with its parent.
type deadlineContext struct {
	context.Context // a cancelable context under the request's
	at              time.Time
	stop            func() bool
	cancelCause     context.CancelCauseFunc
	lifted          atomic.Bool
}

// withDeadline returns ctx with a deadline d from now on the Damper's clock.
func (p *Proxy) withDeadline(ctx context.Context, d time.Duration) *deadlineContext {
	inner, cancel := context.WithCancelCause(ctx)
	dc := &deadlineContext{Context: inner, at: p.d.clock.Now().Add(d), cancelCause: cancel}
	dc.stop = p.d.clock.AfterFunc(d, func() { cancel(context.DeadlineExceeded) })
	return dc
}

func (c *deadlineContext) Deadline() (time.Time, bool) {
	if c.lifted.Load() {
		return c.Context.Deadline()
	}
	return c.at, true
}

// Err is context.DeadlineExceeded once the deadline has passed, as for a
// context of the standard library's.
func (c *deadlineContext) Err() error {
	err := c.Context.Err()
	if err != nil && context.Cause(c.Context) == context.DeadlineExceeded {
		return context.DeadlineExceeded
	}
	return err
}

// lift removes the deadline, unless it has passed already.
func (c *deadlineContext) lift() {
	if c.stop() {
		c.lifted.Store(true)
	}
}

// cancel releases the context's timer and resources.
func (c *deadlineContext) cancel() {
	c.stop()
	c.cancelCause(context.Canceled)
}

// requestTimeouts reads the call's deadlines from the request's headers:
// Damper-Timeout's, of the whole call, and X-Stainless-Timeout's, of the
// time to the answer's headers; 0 means none.
func requestTimeouts(h http.Header) (whole, toHeaders time.Duration, err error) {
	whole, err = headerSeconds(h, headerTimeout, false)
	if err != nil {
		return 0, 0, err
	}
	toHeaders, err = headerSeconds(h, headerStainlessTimeout, true)
	return whole, toHeaders, err
}

// headerSeconds reads header name as a plain decimal number of seconds,
// from minTimeout to maxHeaderTimeout, or 0 when zero is allowed; 0 when
// the header is absent.
func headerSeconds(h http.Header, name string, zero bool) (time.Duration, error) {
	vs := h.Values(name)
	if len(vs) == 0 {
		return 0, nil
	}
	bad := func(why string) error {
		return fmt.Errorf("damper proxy: header %s is %s: %s", name, excerpt([]byte(vs[0])), why)
	}
	if len(vs) > 1 {
		return 0, bad("repeated: send it once")
	}
	v := strings.TrimSpace(vs[0])
	want := fmt.Sprintf("want a number of seconds from %g to %g, such as 30 or 2.5", minTimeout.Seconds(), maxHeaderTimeout.Seconds())
	if zero {
		want = fmt.Sprintf("want 0 or a number of seconds from %g to %g, such as 600", minTimeout.Seconds(), maxHeaderTimeout.Seconds())
	}
	if !isDecimal(v) {
		return 0, bad(want)
	}
	s, err := strconv.ParseFloat(v, 64)
	d := time.Duration(s * float64(time.Second))
	if err != nil || s > maxHeaderTimeout.Seconds() || d < minTimeout && !(zero && s == 0) {
		return 0, bad(want)
	}
	return d, nil
}

// isDecimal reports whether s is digits, with at most one "." between
// digits: no sign, exponent, NaN or Inf.
func isDecimal(s string) bool {
	digits, dot := 0, -1
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9':
			digits++
		case c == '.' && dot < 0 && digits > 0:
			dot = i
		default:
			return false
		}
	}
	return digits > 0 && dot != len(s)-1 && len(s) <= 32
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
	h.Del(headerTimeout)
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

// reportHeader sets the Damper-* headers of rep so far, and of the
// backend that answered, if any. It comes after the upstream's headers are
// copied: an upstream's own Damper-* headers (another proxy's) give way.
func reportHeader(h http.Header, rep *Report, backend string) {
	if backend != "" {
		h.Set(headerBackend, backend)
	}
	h.Set(headerAttempts, strconv.Itoa(rep.Attempts))
	h.Set(headerRetryCost, strconv.FormatFloat(rep.RetryCostUSD, 'f', -1, 64))
	if rep.Outcome != "" {
		h.Set(headerOutcome, string(rep.Outcome))
	}
}

// answeredBy is the backend whose answer a Messages call's client gets, as
// its report, rep, names it after err: the backend the call ended on, or,
// for a provider's error passed on after a refusal, the backend of the
// attempt that got it; "" when no call was made.
func answeredBy(err error, rep *Report) string {
	if rep.Provider == "" {
		return ""
	}
	if err == nil {
		return rep.Backend // before the targets of errors.As, which go to the heap
	}
	var up *upstreamStatus
	var ev *upstreamEvent
	if errors.As(err, &up) || errors.As(err, &ev) {
		for _, a := range slices.Backward(rep.AttemptLog) {
			if !a.Lost {
				return a.Backend
			}
		}
	}
	return rep.Backend
}

// writeCallError answers a Messages call that ended with err, before any
// of its answer was sent; backend is the backend that answered, if any.
func (p *Proxy) writeCallError(w http.ResponseWriter, err error, rep *Report, backend string) int {
	h := w.Header()
	reportHeader(h, rep, backend)
	var up *upstreamStatus
	var ev *upstreamEvent
	var de *Error
	var refused *gate // the gate whose refusal err is, if any
	if errors.As(err, &de) {
		refused = refusedBy(de.Reason)
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
	case refused != nil && refused.status != 0:
		// A gate's refusal, shaped as the API's own error for it.
		return writeAPIError(w, refused.status, refused.apiType, err.Error(), retryAfter(de.RetryAfter))
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

// streamBufs are the buffers streams are passed on with.
var streamBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// flushWriter is a client's response, flushed after each write of a
// stream.
type flushWriter interface {
	io.Writer
	Flush() error
}

// passStream copies a stream to the client as it comes, flushing each
// read, and passes on only whole events: when the stream fails, the part
// of an event read so far is dropped and an error event takes its place.
// The stream fails once an event passes maxEvent bytes, so the buffer
// never grows beyond that and one read. It returns when the stream ends or
// a write fails (the client has gone, or stopped reading). Once delivered
// reports that the stream's message_stop has been handed on, nothing but
// the stream's end follows at once: the last write is not flushed, so
// that the server sends it with the end and the trailer in one write, not
// two.
func passStream(w flushWriter, body io.Reader, maxEvent int, shape func([]byte) []byte, delivered func() bool) {
	flush := w.Flush
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
			if !delivered() {
				_ = flush()
			}
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
			_, _ = w.Write(failureEvent(err, shape))
			_ = flush()
			return
		}
	}
}

// failureEvent is the error event for a stream that failed after its first
// content with err: the provider's own event when it sent one.
func failureEvent(err error, shape func([]byte) []byte) []byte {
	var ev *upstreamEvent
	if errors.As(err, &ev) {
		if shape != nil {
			return errorEvent(shape(ev.data))
		}
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
func (p *Proxy) logRequest(r *http.Request, status int, start time.Time, rep *Report, backend string, tenant *tenant) {
	if p.log == nil {
		return
	}
	var buf [11]slog.Attr // every field below: one slice, not grown as they come
	attrs := append(buf[:0],
		slog.String("method", boundedText(r.Method)),
		slog.String("path", boundedText(r.URL.Path)),
		slog.Int("status", status),
		slog.Duration("duration", time.Since(start)))
	if tenant != nil { // a configured name, authenticated
		attrs = append(attrs, slog.String("tenant", tenant.name))
	}
	if rep != nil && rep.Provider != "" { // a call was made
		attrs = append(attrs,
			slog.String("model", boundedText(rep.Model)),
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

// excerpt is b quoted for an error message: its first 64 bytes, escaped
// (invalid UTF-8 and control characters included), and its length when
// longer.
func excerpt(b []byte) string {
	const shown = 64
	if len(b) <= shown {
		return strconv.QuoteToASCII(string(b))
	}
	return fmt.Sprintf("%s… (%d bytes)", strconv.QuoteToASCII(string(b[:shown])), len(b))
}

// The top-level keys of a Messages request the proxy checks.
const (
	checkModelKey = iota
	checkMaxTokensKey
	checkStreamKey
)

var notObject = errors.New("damper proxy: the request body is not a JSON object")

var checkedKeys = [...]string{checkModelKey: "model", checkMaxTokensKey: "max_tokens", checkStreamKey: "stream"}

// checkMessagesBody checks what Damper decides on in a Messages request
// body, body, before anything is sent: see [Proxy]. It reads the body's
// top level once, skipping the values of other keys at the speed of a
// byte search.
func checkMessagesBody(body []byte) error {
	var raw [len(checkedKeys)][]byte
	s := bodyScan{b: body}
	i := skipSpace(body, 0)
	if i == len(body) || body[i] != '{' {
		return notObject
	}
	for i = skipSpace(body, i+1); i < len(body) && body[i] != '}'; {
		if body[i] != '"' {
			return notObject
		}
		end := skipString(body, i)
		if end < 0 {
			return notObject
		}
		key := body[i+1 : end-1]
		if bytes.IndexByte(key, '\\') >= 0 {
			// "mod\u0065l" is "model" to the API.
			k, ok := unquote(body[i:end])
			if !ok {
				return notObject
			}
			key = []byte(k)
		}
		i = skipSpace(body, end)
		if i == len(body) || body[i] != ':' {
			return notObject
		}
		start := skipSpace(body, i+1)
		if i = s.value(start); i < 0 {
			return notObject
		}
		for k, name := range checkedKeys {
			if string(key) != name {
				continue
			}
			if raw[k] != nil {
				return fmt.Errorf("damper proxy: %s: the key is repeated; send it once (the API might act on another than the one checked)", name)
			}
			raw[k] = body[start:i]
		}
		switch i = skipSpace(body, i); {
		case i < len(body) && body[i] == ',':
			i = skipSpace(body, i+1)
		case i < len(body) && body[i] != '}':
			return notObject
		}
	}
	if i == len(body) || skipSpace(body, i+1) != len(body) {
		return notObject
	}
	if err := checkModel(raw[checkModelKey]); err != nil {
		return err
	}
	if err := checkMaxTokens(raw[checkMaxTokensKey]); err != nil {
		return err
	}
	if v := raw[checkStreamKey]; v != nil && string(v) != "true" && string(v) != "false" {
		return fmt.Errorf("damper proxy: stream %s: want true or false", excerpt(v))
	}
	return nil
}

// checkModel checks a request's model, v as it is in the body.
func checkModel(v []byte) error {
	if v == nil {
		return errors.New("damper proxy: model: required")
	}
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return badModel(v, "want a string")
	}
	sent := v[1 : len(v)-1] // as it was sent, escapes and all
	if !utf8.Valid(sent) {
		return badModel(sent, "is not valid UTF-8")
	}
	model := sent
	if bytes.IndexByte(sent, '\\') >= 0 {
		s, ok := unquote(v)
		if !ok {
			return badModel(sent, "is not a valid JSON string")
		}
		model = []byte(s)
	}
	switch {
	case len(model) == 0:
		return badModel(sent, "is empty")
	case len(model) > maxModelID:
		return badModel(sent, fmt.Sprintf("is %d bytes long: a model ID has at most %d", len(model), maxModelID))
	}
	for i, b := range model {
		if !isModelByte(b) {
			r, _ := utf8.DecodeRune(model[i:])
			return badModel(sent, fmt.Sprintf("holds %q, which no model ID holds: want ASCII letters, digits and -._:@/", r))
		}
	}
	return nil
}

func badModel(shown []byte, why string) error {
	return fmt.Errorf("damper proxy: model %s: %s", excerpt(shown), why)
}

// unquote is the JSON string q, unescaped.
func unquote(q []byte) (string, bool) {
	var s string
	err := json.Unmarshal(q, &s)
	return s, err == nil
}

// checkMaxTokens checks a request's max_tokens, v as it is in the body.
func checkMaxTokens(v []byte) error {
	if v == nil {
		return errors.New("damper proxy: max_tokens: required")
	}
	n := 0
	for i, b := range v {
		if b < '0' || b > '9' || i == 7 || i == 1 && v[0] == '0' {
			n = -1
			break
		}
		n = n*10 + int(b-'0')
	}
	if n < 1 || n > maxMaxTokens {
		return fmt.Errorf("damper proxy: max_tokens %s: want an integer from 1 to %d", excerpt(v), maxMaxTokens)
	}
	return nil
}
