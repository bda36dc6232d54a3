// Command fakeapi is a fake Anthropic Messages API on loopback, for trying
// damper proxy offline, as the README's quick start does:
//
//	go run ./cmd/damper/internal/fakeapi -listen 127.0.0.1:8788 &
//	go run ./cmd/damper proxy -listen 127.0.0.1:8787 -upstream http://127.0.0.1:8788
//
// It answers POST /v1/messages, plain or streaming, alternately with 529
// overloaded_error and with a short message, so that each call made
// through the proxy, one at a time, succeeds on its second attempt; any
// other request gets 404. It takes any API key and stores nothing.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"
)

// maxBody bounds a request's body.
const maxBody = 1 << 20

func main() {
	listen := flag.String("listen", "127.0.0.1:8788", "address to listen on")
	flag.Parse()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fakeapi:", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "fakeapi: a fake Messages API on http://%s: every other attempt is 529 overloaded\n", ln.Addr())
	srv := &http.Server{Handler: handler(), ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintln(os.Stderr, "fakeapi:", srv.Serve(ln))
	os.Exit(1)
}

func handler() http.Handler {
	var attempts atomic.Int64
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Model  string `json:"model"`
			Stream bool   `json:"stream"`
		}
		if r.Method != http.MethodPost || r.URL.Path != "/v1/messages" {
			apiError(w, http.StatusNotFound, "not_found_error", "Not found: "+r.Method+" "+r.URL.Path)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
		if err != nil || json.Unmarshal(body, &req) != nil {
			apiError(w, http.StatusBadRequest, "invalid_request_error", "the body is not a JSON object")
			return
		}
		n := attempts.Add(1)
		w.Header().Set("Request-Id", fmt.Sprintf("req_fake_%d", n))
		switch {
		case n%2 == 1:
			apiError(w, 529, "overloaded_error", "Overloaded")
		case req.Stream:
			stream(w, jsonString(req.Model), n)
		default:
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"msg_fake_%d","type":"message","role":"assistant","model":%s,"content":[{"type":"text","text":"Hello from the fake API."}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":6}}`, n, jsonString(req.Model))
		}
	})
}

// jsonString is s as a JSON string.
func jsonString(s string) []byte {
	b, _ := json.Marshal(s)
	return b
}

func apiError(w http.ResponseWriter, status int, kind, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	b, _ := json.Marshal(map[string]any{"type": "error", "error": map[string]string{"type": kind, "message": msg}})
	w.Write(b)
}

// stream answers as the API streams a message: its events, as SSE.
func stream(w http.ResponseWriter, model []byte, n int64) {
	w.Header().Set("Content-Type", "text/event-stream")
	events := []string{
		fmt.Sprintf(`message_start {"type":"message_start","message":{"id":"msg_fake_%d","type":"message","role":"assistant","model":%s,"content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":1}}}`, n, model),
		`content_block_start {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
		`content_block_delta {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello from the fake API."}}`,
		`content_block_stop {"type":"content_block_stop","index":0}`,
		`message_delta {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":6}}`,
		`message_stop {"type":"message_stop"}`,
	}
	for _, e := range events {
		name, data, _ := strings.Cut(e, " ")
		if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, data); err != nil {
			return
		}
	}
}
