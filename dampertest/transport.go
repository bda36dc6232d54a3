package dampertest

import (
	"bytes"
	"cmp"
	"context"
	"io"
	"log"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"runtime/debug"
	"strconv"
)

// Transport returns an http.RoundTripper that serves every request with h in
// memory, with no network and no connection pool, for simulations that run
// thousands of calls. Give it to the SDK with
// option.WithHTTPClient(&http.Client{Transport: dampertest.Transport(h)})
// and any base URL.
//
// It behaves like a connection to a real server: the response is returned
// once the handler writes or flushes, and its body streams what the handler
// writes, so SSE events, stalls and drops arrive as they happen. A handler
// that panics with http.ErrAbortHandler cuts the connection: RoundTrip
// returns io.EOF if no header was sent, else the body's Read returns
// io.ErrUnexpectedEOF. When the request's context ends, RoundTrip or the
// body's Read returns its error and the handler's context ends; closing the
// body ends the handler's context too. The handler runs on its own goroutine,
// which is gone once the handler returns after either. An
// [httptrace.ClientTrace] in the request's context hears, as from net/http's
// transport, WroteRequest once the request's body is read and
// GotFirstResponseByte when the response's headers come.
//
// The handler sees a server-side request: RequestURI set, URL holding only
// the path and query, the body already read from the client. The
// RoundTripper is safe for concurrent use; each request gets its own
// handler goroutine.
func Transport(h http.Handler) http.RoundTripper {
	return &memTransport{h: h}
}

type memTransport struct{ h http.Handler }

// inMemoryKey marks the context of a request served by Transport, whose
// cancellation the handler sees at once, with no connection to notice it.
type inMemoryKey struct{}

func (t *memTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	trace := httptrace.ContextClientTrace(req.Context())
	body, err := readAll(req.Body)
	if trace != nil && trace.WroteRequest != nil {
		trace.WroteRequest(httptrace.WroteRequestInfo{Err: err})
	}
	if err != nil {
		return nil, err
	}
	if err := req.Context().Err(); err != nil {
		return nil, err
	}

	// ctx is the handler's: it ends with the client's context, or when the
	// client closes the body, as a real server's does when its connection goes.
	ctx, cancel := context.WithCancel(context.WithValue(req.Context(), inMemoryKey{}, true))
	pr, pw := io.Pipe()
	heads := make(chan *http.Response, 1) // one send: the response, or nil if cut before it
	w := &pipeWriter{req: req, header: http.Header{}, pw: pw, heads: heads}
	stop := context.AfterFunc(ctx, func() { pw.CloseWithError(ctx.Err()) })

	go func() {
		defer cancel()
		defer stop()
		aborted := runHandler(t.h, w, serverRequest(ctx, req, body))
		switch {
		case aborted && !w.sent:
			heads <- nil
		case aborted:
			pw.CloseWithError(io.ErrUnexpectedEOF)
		case ctx.Err() != nil:
			w.commit()
			pw.CloseWithError(ctx.Err())
		default:
			w.commit() // a handler that wrote nothing still answers 200
			pw.Close()
		}
	}()

	// Wait on the client's context, not ctx: the goroutine ends ctx itself as
	// soon as the handler returns, which must not read as a cancellation.
	select {
	case resp := <-heads:
		if resp == nil {
			return nil, io.EOF
		}
		if trace != nil && trace.GotFirstResponseByte != nil {
			trace.GotFirstResponseByte()
		}
		resp.Body = &pipeBody{pr: pr, cancel: cancel}
		return resp, nil
	case <-req.Context().Done():
		cancel()
		return nil, req.Context().Err()
	}
}

// runHandler runs h and reports whether it cut the connection. Other panics
// are logged, as net/http does, and also cut it.
func runHandler(h http.Handler, w http.ResponseWriter, r *http.Request) (aborted bool) {
	defer func() {
		if p := recover(); p != nil {
			aborted = true
			if p != http.ErrAbortHandler {
				log.Printf("dampertest: panic serving %s %s: %v\n%s", r.Method, r.URL, p, debug.Stack())
			}
		}
	}()
	h.ServeHTTP(w, r)
	return false
}

// serverRequest builds what a server would see of req, without changing req.
func serverRequest(ctx context.Context, req *http.Request, body []byte) *http.Request {
	r := req.Clone(ctx)
	r.URL = &url.URL{Path: req.URL.Path, RawPath: req.URL.RawPath, RawQuery: req.URL.RawQuery}
	r.RequestURI = r.URL.RequestURI()
	r.Host = cmp.Or(req.Host, req.URL.Host)
	r.RemoteAddr = "192.0.2.1:1234" // TEST-NET-1, as httptest.NewRequest uses
	r.Proto, r.ProtoMajor, r.ProtoMinor = "HTTP/1.1", 1, 1
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.GetBody = nil
	return r
}

// readAll reads and closes a request body, as a RoundTripper must close it.
func readAll(rc io.ReadCloser) ([]byte, error) {
	if rc == nil {
		return nil, nil
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

// pipeWriter is the handler's http.ResponseWriter. Like any ResponseWriter
// it is used by the handler's goroutine only.
type pipeWriter struct {
	req    *http.Request
	header http.Header
	pw     *io.PipeWriter
	heads  chan<- *http.Response
	status int  // set by WriteHeader; 0 means 200
	sent   bool // the response has gone to RoundTrip
}

func (w *pipeWriter) Header() http.Header { return w.header }

func (w *pipeWriter) WriteHeader(code int) {
	if w.sent || w.status != 0 || code < 200 {
		return // informational and repeated headers are dropped
	}
	w.status = code
}

// Write sends p to the client, blocking until it is read, as a connection
// with no buffer would.
func (w *pipeWriter) Write(p []byte) (int, error) {
	w.commit()
	return w.pw.Write(p)
}

// Flush sends the headers; written bytes are never buffered.
func (w *pipeWriter) Flush() { w.commit() }

// commit hands the response head to RoundTrip, once; like net/http, headers
// leave on the first write or flush, not on WriteHeader.
func (w *pipeWriter) commit() {
	if w.sent {
		return
	}
	w.sent = true
	status := cmp.Or(w.status, http.StatusOK)
	resp := &http.Response{
		Status:        strconv.Itoa(status) + " " + http.StatusText(status),
		StatusCode:    status,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        w.header.Clone(),
		ContentLength: -1,
		Request:       w.req,
	}
	if n, err := strconv.ParseInt(w.header.Get("Content-Length"), 10, 64); err == nil {
		resp.ContentLength = n
	}
	w.heads <- resp
}

// pipeBody is the client's response body.
type pipeBody struct {
	pr     *io.PipeReader
	cancel context.CancelFunc
}

func (b *pipeBody) Read(p []byte) (int, error) { return b.pr.Read(p) }

// Close stops the handler: its writes fail and its context ends.
func (b *pipeBody) Close() error {
	b.pr.Close()
	b.cancel()
	return nil
}
