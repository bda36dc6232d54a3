package damper_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// hopRig is a Proxy on loopback in front of an upstream on loopback that
// answers with answer and notes the headers of every request it gets.
type hopRig struct {
	proxy *httptest.Server

	mu   sync.Mutex
	got  []http.Header
	path []string
}

func newHopRig(t *testing.T, answer http.HandlerFunc) *hopRig {
	t.Helper()
	r := &hopRig{}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.got = append(r.got, req.Header.Clone())
		r.path = append(r.path, req.URL.Path)
		r.mu.Unlock()
		answer(w, req)
	}))
	t.Cleanup(up.Close)
	clock := dampertest.NewClock(time.Now().Truncate(time.Minute).Add(time.Minute))
	d, err := damper.New(damper.Policy{}, damper.WithClock(clock), damper.WithRand(half))
	if err != nil {
		t.Fatal(err)
	}
	px, err := damper.NewProxy(d, damper.ProxyConfig{Upstream: up.URL})
	if err != nil {
		t.Fatal(err)
	}
	r.proxy = httptest.NewServer(px)
	t.Cleanup(r.proxy.Close)
	return r
}

// okAnswer answers a Messages call with a message, and any other request
// with an empty list.
func okAnswer(w http.ResponseWriter, req *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	if req.URL.Path == "/v1/messages" {
		_, _ = io.WriteString(w, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-6","content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","usage":{"input_tokens":1,"output_tokens":1}}`)
		return
	}
	_, _ = io.WriteString(w, `{"data":[]}`)
}

func (r *hopRig) received() ([]http.Header, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]http.Header(nil), r.got...), append([]string(nil), r.path...)
}

// exchange sends request as it is to the proxy at base and returns the
// first response on the connection and its body. A proxy that does not
// answer within 20 s fails the test, rather than hang it.
func exchange(t *testing.T, base, request string) (*http.Response, string) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(conn, request); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body) // a tunnel's bytes too, were one opened
	return res, string(b)
}

// errorMessage is the message of an error body of the API's shape.
func errorMessage(t *testing.T, body string) string {
	t.Helper()
	var e struct {
		Error struct{ Message string } `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatalf("not an API error body (%v): %s", err, body)
	}
	return e.Error.Message
}

// rawMessages is a raw Messages request with the extra header lines.
func rawMessages(extra string) string {
	return "POST /v1/messages HTTP/1.1\r\nHost: x\r\nX-Api-Key: " + testKey +
		"\r\nContent-Type: application/json\r\n" + extra +
		"Content-Length: " + strconv.Itoa(len(plainBody)) + "\r\n\r\n" + plainBody
}

// TestProxyRefusesUpgrades: a request that asks to switch protocols is
// refused at the door on every path, Messages included, and nothing
// reaches the upstream: a 101 through httputil.ReverseProxy would be a
// tunnel to the upstream that no check of the proxy's sees.
func TestProxyRefusesUpgrades(t *testing.T) {
	r := newHopRig(t, okAnswer)
	const ws = "Upgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
	for _, tc := range []struct{ name, request, shown string }{
		{"websocket, pass-through", "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n" + ws + "\r\n", `Upgrade is "websocket"`},
		{"websocket, Messages", rawMessages("Connection: Upgrade\r\n" + ws), `Upgrade is "websocket"`},
		{"upgrade among other names", "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, UPGRADE\r\n" + ws + "\r\n", `Upgrade is "websocket"`},
		{"h2c", "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n", `Upgrade is "h2c"`},
		{"Upgrade alone", "GET /v1/files HTTP/1.1\r\nHost: x\r\n" + ws + "\r\n", `Upgrade is "websocket"`},
		{"Connection: upgrade alone, Messages", rawMessages("Connection: upgrade\r\n"), `Connection is "upgrade"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, body := exchange(t, r.proxy.URL, tc.request)
			if res.StatusCode != http.StatusBadRequest {
				t.Fatalf("%d %q, want 400", res.StatusCode, body)
			}
			if typ, _ := apiError(t, []byte(body)); typ != "invalid_request_error" {
				t.Fatalf("%d %s, want 400 invalid_request_error", res.StatusCode, body)
			}
			if msg := errorMessage(t, body); !strings.Contains(msg, tc.shown) || !strings.Contains(msg, "switches no protocol") {
				t.Errorf("message %q: want it to name the header (%s) and say why", msg, tc.shown)
			}
			wantHeader(t, res, "X-Should-Retry", "false")
			wantHeader(t, res, "Damper-Backend", "") // refused before any backend
		})
	}
	if got, _ := r.received(); len(got) != 0 {
		t.Errorf("the upstream got %d requests, want 0", len(got))
	}
}

// TestProxyRelaysNoSwitch: an upstream that answers 101 to a request that
// asked for no switch gets its connection closed, and the client a 502,
// never the 101 nor a byte of what follows it, on every path.
func TestProxyRelaysNoSwitch(t *testing.T) {
	const tunnelled = "TUNNELLED-BYTES"
	r := newHopRig(t, func(w http.ResponseWriter, _ *http.Request) {
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		_, _ = buf.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n" + tunnelled)
		_ = buf.Flush()
	})
	streamReq := strings.Replace(rawMessages(""), plainBody, streamBody, 1)
	streamReq = strings.Replace(streamReq, strconv.Itoa(len(plainBody)), strconv.Itoa(len(streamBody)), 1)
	for i, tc := range []struct{ name, request string }{
		{"pass-through", "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"},
		{"Messages", rawMessages("")},
		{"Messages, a stream", streamReq},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, body := exchange(t, r.proxy.URL, tc.request)
			if res.StatusCode != http.StatusBadGateway {
				t.Fatalf("%d %q, want 502", res.StatusCode, body)
			}
			if typ, _ := apiError(t, []byte(body)); typ != "api_error" {
				t.Fatalf("%d %s, want 502 api_error", res.StatusCode, body)
			}
			if !strings.Contains(errorMessage(t, body), "101 Switching Protocols") || strings.Contains(body, tunnelled) {
				t.Errorf("body %s: want it to name the 101, and nothing of what came after it", body)
			}
			if got, _ := r.received(); len(got) != i+1 {
				t.Errorf("the upstream got %d requests in all, want %d: one each, a 101 is not retried", len(got), i+1)
			}
		})
	}
}

// TestProxyDropsConnectionHeaders: the headers a request's Connection
// names, and the standard hop-by-hop ones, belong to the client's
// connection and reach no upstream, on either path; the rest do.
func TestProxyDropsConnectionHeaders(t *testing.T) {
	r := newHopRig(t, okAnswer)
	const hop = "Connection: X-Foo, Keep-Alive, close\r\nX-Foo: bar\r\nKeep-Alive: timeout=5\r\nProxy-Connection: keep-alive\r\nX-Kept: yes\r\n"
	for _, request := range []string{
		"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Api-Key: " + testKey + "\r\n" + hop + "\r\n",
		rawMessages(hop),
	} {
		if res, body := exchange(t, r.proxy.URL, request); res.StatusCode != http.StatusOK {
			t.Fatalf("%d %s", res.StatusCode, body)
		}
	}
	got, paths := r.received()
	if len(got) != 2 {
		t.Fatalf("the upstream got %d requests, want 2", len(got))
	}
	for i, h := range got {
		for _, k := range []string{"X-Foo", "Keep-Alive", "Proxy-Connection", "Upgrade"} {
			if v, ok := h[k]; ok {
				t.Errorf("%s: the upstream got %s: %q", paths[i], k, v)
			}
		}
		if c := strings.ToLower(strings.Join(h["Connection"], ",")); strings.Contains(c, "x-foo") || strings.Contains(c, "keep-alive") {
			t.Errorf("%s: the upstream got Connection %q", paths[i], c)
		}
		if h.Get("X-Kept") != "yes" || h.Get("X-Api-Key") != testKey {
			t.Errorf("%s: an end-to-end header was dropped: %v", paths[i], h)
		}
	}
}
