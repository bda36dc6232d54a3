package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/damper-ai/damper-go/dampertest"
)

// The processes this command starts again in a role: the fake API and the
// bare proxy.

// message is the fake API's plain answer, about 230 bytes.
const message = `{"id":"msg_bench","type":"message","role":"assistant","model":"claude-sonnet-4-6","content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":1}}`

// stream is a short answer's whole stream, as the API sends it: 8 events,
// about 1.2 KB.
var stream = func() string {
	var b strings.Builder
	for _, e := range (dampertest.Stream{Text: "a short streamed answer"}).Events() {
		b.WriteString(e.String())
	}
	return b.String()
}()

// apiHandler answers every call at once: a message, or a stream when the
// body asks for one.
func apiHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		w.Header().Set("Request-Id", "req_bench")
		if strings.Contains(string(body), `"stream":true`) {
			w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
			_, _ = io.WriteString(w, stream)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, message)
	})
}

// bareProxy is the floor a Go proxy pays: an httputil.ReverseProxy to
// upstream, streams flushed as they come, with the pool of upstream
// connections damper proxy keeps (256 idle).
func bareProxy(upstream string) http.Handler {
	up, err := url.Parse(upstream)
	if err != nil {
		fmt.Fprintln(os.Stderr, "proxycost: -upstream:", err)
		os.Exit(2)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns, tr.MaxIdleConnsPerHost = 256, 256
	return &httputil.ReverseProxy{
		Rewrite:       func(pr *httputil.ProxyRequest) { pr.SetURL(up) },
		FlushInterval: -1,
		Transport:     tr,
	}
}

// serveRole serves h on addr until the process is killed.
func serveRole(addr string, h http.Handler) int {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "proxycost:", err)
		return 1
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintln(os.Stderr, "proxycost:", srv.Serve(ln))
	return 1
}
