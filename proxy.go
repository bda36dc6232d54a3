package damper

import (
	"bytes"
	"errors"
	"fmt"
	"github.com/damper-ai/damper-go/internal/engine"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"time"

	"github.com/damper-ai/damper-go/internal/conf"
)

// The proxy adapter: the engine driven by HTTP requests from clients in any
// language, in place of the Go SDK's middleware (sdk.go). This file holds
// the Proxy, its configuration and its routing: which requests run as a
// Messages call through the Damper, and the call itself; the concerns it
// draws on are in the other proxy_*.go files.

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
	keys     *clientKeys           // nil in pass-through mode
	tenants  []*engine.ProxyTenant // in key mode, in keys' order
	upKey    string                // the operator's key for the upstream, in key mode
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
	if tenant.HasCeiling() && p.ceilingReached(w, r, tenant) {
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

// messages serves a Messages call for tenant (nil in pass-through mode) and
// returns the status it answered with (0 when the client had gone) and
// the backend it named, if any.
func (p *Proxy) messages(w http.ResponseWriter, rc *http.ResponseController, r *http.Request, rep *Report, tenant *engine.ProxyTenant) (status int, backend string) {
	whole, toHeaders, err := requestTimeouts(r.Header)
	if err != nil {
		return writeAPIError(w, http.StatusBadRequest, "invalid_request_error", err.Error(), nil), ""
	}
	// The buffer grows as the body arrives: a declared length is believed
	// only up to initialBodyBuf before its bytes come.
	body, err := engine.ReadUpTo(nil, r.Body, min(r.ContentLength, initialBodyBuf), -1)
	if err != nil {
		if mb := (*http.MaxBytesError)(nil); errors.As(err, &mb) {
			return p.tooLarge(w), ""
		}
		return writeAPIError(w, http.StatusBadRequest, "invalid_request_error", "damper proxy: reading the request body: "+err.Error(), nil), ""
	}
	if err := checkMessagesBody(body); err != nil {
		return writeAPIError(w, http.StatusBadRequest, "invalid_request_error", err.Error(), nil), ""
	}
	ctx := tenant.CallContext(r.Context())
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
	c, err := p.d.e.NewCall(out, engine.Front{Client: &proxyClient, Next: p.rt.RoundTrip, Sink: rep, Tenant: tenant})
	if err != nil {
		return writeAPIError(w, http.StatusBadRequest, "invalid_request_error", err.Error(), nil), ""
	}
	res, err := c.Run()
	backend = engine.BoundedText(answeredBy(err, rep)) // a name from the Damper's settings
	if err != nil {
		if r.Context().Err() != nil {
			return 0, backend // the client has gone: no one to answer
		}
		return p.writeCallError(w, err, rep, backend), backend
	}
	defer engine.CloseBody(res)
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
		body, _ := io.ReadAll(io.LimitReader(res.Body, engine.MaxErrorBody))
		return p.writeCallError(w, &upstreamStatus{status: res.StatusCode, header: res.Header, body: body}, rep, backend), backend
	}
	h := w.Header()
	copyHeader(h, res.Header)
	if p.keys != nil {
		operatorAnswerHeader(h)
	}
	h.Del("Content-Length") // the transport may have decoded the body
	reportHeader(h, rep, backend)
	_, stream := res.Body.(*engine.StreamBody)
	dw := &deadlineWriter{w: w, rc: rc, d: p.write}
	switch {
	case res.StatusCode >= 400:
		h.Set("X-Should-Retry", "false")
	case stream:
		h.Set("Trailer", headerOutcome)
		w.WriteHeader(res.StatusCode)
		sb := res.Body.(*engine.StreamBody)
		passStream(dw, sb, p.d.e.MaxEventBytes(), p.eventShaper(backend), sb.Delivered.Load)
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
