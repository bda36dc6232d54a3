package damper

import (
	"context"
	"errors"
	"fmt"
	"github.com/damper-ai/damper-go/internal/engine"
	"net/http"
	"reflect"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"weak"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
)

// The SDK adapter: what is specific to the official Go SDK sits here, and
// the engine works on *http.Request and *http.Response alone, so that
// another front (a proxy serving the Messages API) can drive it. The
// adapter decides what is the SDK's (the errors its callers get, whether
// a middleware follows Damper's) and hands it to the call as it starts
// (front): the engine never calls back into it.

// Option returns the SDK option that puts Damper in charge of a client's
// Messages calls. Give it to anthropic.NewClient (or to one call).
//
// Damper works as SDK middleware, so its place among other middleware
// matters: middleware given before it sees each logical request once,
// middleware given after it sees every attempt. With Bedrock or Vertex,
// give Damper's option before bedrock.WithConfig / vertex.WithGoogleAuth so
// that each attempt is signed afresh; the other order is refused with an
// error on the first call.
//
// The SDK's own retry loop never runs for a Messages call through Damper:
// every failure Damper returns comes with x-should-retry: false. The SDK's
// request timeout (option.WithRequestTimeout, 10 minutes by default for
// Messages.New) wraps Damper's whole loop, so it becomes the deadline of
// the logical request, retries and waits included; PerAttemptTimeout bounds
// each attempt. When that timeout cuts Damper's loop short, the SDK tries
// the call again after its own backoff; Damper refuses that run at once,
// with an error that matches context.DeadlineExceeded, so that no provider
// attempt is made outside Damper's count. Damper knows the SDK's run again
// by the request it belongs to, not by any header, so headers a caller sets
// change nothing.
func (d *Damper) Option() option.RequestOption {
	return everyRequest(func() option.RequestOption {
		r := &sdkRequest{d: d}
		r.mw[0] = r.middleware
		return option.WithMiddleware(r.mw[:]...)
	})
}

// sdkRequest is one logical request of the SDK's, as Damper's middleware
// sees it: ran is set by its first run, so that any later one is the SDK's
// own retry. mw holds the middleware for WithMiddleware, which then needs
// no slice of its own.
type sdkRequest struct {
	d   *Damper
	ran atomic.Bool
	mw  [1]option.Middleware
}

func (r *sdkRequest) middleware(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
	return r.d.middleware(req, next, &r.ran)
}

// everyRequest is an SDK option that builds a fresh option for each request
// the SDK makes: the SDK applies a client's options once per logical
// request (once per method call), however many times it then sends it.
// O and C are the SDK's option type and the request configuration it
// applies to, inferred from f.
func everyRequest[O interface{ Apply(C) error }, C any](f func() O) requestOption[O, C] {
	return f
}

type requestOption[O interface{ Apply(C) error }, C any] func() O

func (f requestOption[O, C]) Apply(c C) error { return f().Apply(c) }

// middleware is the SDK middleware: it runs Damper's retry loop for
// Messages calls and passes everything else through. Every error it
// returns comes with x-should-retry: false, so that the SDK returns it at
// once. ran is the logical
// request's own: set by its first run, it marks any later one as the SDK's.
func (d *Damper) middleware(req *http.Request, next option.MiddlewareNext, ran *atomic.Bool) (*http.Response, error) {
	if fix := engine.SignedBy(req); fix != "" {
		return noRetry(req), fmt.Errorf("%w; give damper's Option() %s (an Option() given to one call runs after all of them)", ErrOptionOrder, fix)
	}
	if !engine.IsMessagesPath(req) {
		return next(req)
	}
	if ran.Swap(true) {
		return noRetry(req), errSDKRequestTimeout
	}
	if req.Context().Value(engine.HandedOverKey{}) != nil {
		return noRetry(req), engine.ErrBackendInBackend
	}
	c, err := d.e.NewCall(req, engine.Front{
		Client: &sdkClient, Next: next, ChangesRequest: changesRequest(next),
		Sink: reports.take(req),
	})
	if err != nil {
		return noRetry(req), err
	}
	res, err := c.Run()
	if err != nil {
		return noRetry(req), err
	}
	if res.StatusCode >= 400 {
		// The SDK turns it into its own *anthropic.Error, and retries it
		// not.
		res.Header.Set("X-Should-Retry", "false")
	}
	return res, nil
}

// changesRequest reports whether next, what sends Damper's attempts, may
// change a request in place: when it runs another middleware (a
// platform's, which rewrites and signs the request it is given). The
// client's HTTP client or doer sends a request as it is, as a
// RoundTripper must; so does the proxy's transport.
func changesRequest(next engine.SendFunc) bool {
	return reflect.ValueOf(next).Pointer() == middlewareLink()
}

// middlewareLink is the code of the SDK's link from one middleware to the
// next: every next that leads to a middleware runs it. It is learned once,
// from a chain of two middlewares, the first of which sends nothing.
var middlewareLink = sync.OnceValue(func() uintptr {
	var link uintptr
	errStop := errors.New("damper: learning the SDK's middleware link")
	client := anthropic.NewClient(
		option.WithAPIKey("none"), option.WithBaseURL("http://localhost/"), option.WithMaxRetries(0),
		option.WithMiddleware(func(_ *http.Request, next option.MiddlewareNext) (*http.Response, error) {
			link = reflect.ValueOf(next).Pointer()
			return nil, errStop
		}),
		option.WithMiddleware(func(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
			return next(req)
		}),
	)
	_ = client.Get(context.Background(), "v1/models", nil, nil)
	return link
})

// ErrOptionOrder is the error of a Messages call that reached Damper
// already signed or rewritten for a cloud platform: Damper's option was
// given after the platform's (bedrock.WithConfig, vertex.WithGoogleAuth),
// so the call's retries could not be signed afresh. Nothing was sent; the
// error's text names the option to move.
var ErrOptionOrder = errors.New("damper: the Messages request reached Damper already signed or rewritten for a cloud platform, so its retries could not be signed afresh")

// errSDKRequestTimeout is the answer to the SDK's retry of a Messages call.
// The SDK retries a call through Damper only when its request timeout
// expired around Damper's loop: every failure Damper returns says
// x-should-retry: false.
var errSDKRequestTimeout = fmt.Errorf("damper: the SDK's request timeout ended this Messages call, which Damper does not run again: %w", context.DeadlineExceeded)

// sdkClient reports errors as the SDK does: *anthropic.Error.
var sdkClient = engine.ClientAdapter{StatusError: sdkStatusError, EventError: sdkEventError}

func sdkStatusError(req *http.Request, res *http.Response, body []byte) error {
	apiErr := &anthropic.Error{
		Request:     req,
		Response:    res,
		StatusCode:  res.StatusCode,
		RequestID:   res.Header.Get("request-id"),
		WorkspaceID: res.Header.Get("anthropic-workspace-id"),
	}
	_ = apiErr.UnmarshalJSON(body)
	return apiErr
}

func sdkEventError(res *http.Response, data []byte) error {
	apiErr := &anthropic.Error{
		Request:     res.Request,
		Response:    res,
		StatusCode:  res.StatusCode,
		RequestID:   res.Header.Get("request-id"),
		WorkspaceID: res.Header.Get("anthropic-workspace-id"),
	}
	if apiErr.UnmarshalJSON(data) != nil {
		return fmt.Errorf("received error while streaming: %s", data)
	}
	return apiErr
}

// noRetry is the response that goes with an error Damper returns: the SDK
// does not retry an attempt whose response says x-should-retry: false, and
// returns the error as it is.
func noRetry(req *http.Request) *http.Response {
	return &http.Response{
		Status:  "damper: no response",
		Header:  http.Header{"X-Should-Retry": {"false"}},
		Request: req,
	}
}

// ReportInto is a per-call option that makes Damper write the call's
// [Report] into dst once the call returns (and again when a stream ends).
// It works whichever order it is given in with the Damper option, for
// every call, including one refused or moved to another backend before
// any attempt; without a Damper on the client it leaves dst untouched.
func ReportInto(dst *Report) option.RequestOption {
	token := reports.add(dst)
	return option.Join(
		// Headers are set before any middleware runs, so Damper's finds
		// the destination before its first attempt.
		option.WithHeader(headerReportToken, token),
		// Still on the request, the token has not reached Damper's
		// middleware: it comes after this one, or there is none. It goes
		// to Damper in the context, and never on the wire.
		option.WithMiddleware(func(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
			if req.Header.Get(headerReportToken) == "" {
				return next(req)
			}
			req.Header.Del(headerReportToken)
			return next(req.WithContext(ContextWithReport(req.Context(), dst)))
		}),
	)
}

// headerReportToken carries a ReportInto destination's token from the option to
// Damper's middleware, which takes it off the request.
const headerReportToken = "X-Damper-Report"

// reports are the destinations of ReportInto options, by token. An entry
// holds its destination weakly and goes with it, so that an option whose
// call never reached Damper leaves nothing behind.
var reports reportTable

type reportTable struct {
	next    atomic.Uint64
	entries sync.Map // token (string) → weak.Pointer[Report]
}

func (t *reportTable) add(dst *Report) string {
	if dst == nil {
		return ""
	}
	token := strconv.FormatUint(t.next.Add(1), 36)
	t.entries.Store(token, weak.Make(dst))
	runtime.AddCleanup(dst, func(token string) { t.entries.Delete(token) }, token)
	return token
}

// take returns the destination of req's ReportInto option, if any, and
// takes its header off the request.
func (t *reportTable) take(req *http.Request) *Report {
	token := req.Header.Get(headerReportToken)
	if token == "" {
		return nil
	}
	req.Header.Del(headerReportToken)
	if p, ok := t.entries.Load(token); ok {
		return p.(weak.Pointer[Report]).Value()
	}
	return nil
}
