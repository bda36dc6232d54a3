package damper

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"runtime"
	"slices"
	"strings"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/damper-ai/damper-go/dampertest"
)

const costAnswer = `{"id":"msg_cost","type":"message","role":"assistant","model":"claude-sonnet-4-6","content":[{"type":"text","text":"ok"}],` +
	`"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":12,"cache_read_input_tokens":3,"cache_creation_input_tokens":0,"output_tokens":5}}`

// costStream is a short answer's whole stream, as the API sends it.
var costStream = func() string {
	var b strings.Builder
	for _, e := range (dampertest.Stream{Text: "a short streamed answer"}).Events() {
		b.WriteString(e.String())
	}
	return b.String()
}()

// answerTransport answers every call at once: with costAnswer, or with
// costStream for a call that asks for a stream.
type answerTransport struct{}

func (answerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	body, _ := io.ReadAll(req.Body)
	_ = req.Body.Close()
	answer, typ := costAnswer, "application/json"
	if strings.Contains(string(body), `"stream":true`) {
		answer, typ = costStream, "text/event-stream; charset=utf-8"
	}
	return &http.Response{
		StatusCode:    http.StatusOK,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        http.Header{"Content-Type": {typ}, "Request-Id": {"req_cost"}},
		Body:          io.NopCloser(strings.NewReader(answer)),
		ContentLength: int64(len(answer)),
		Request:       req,
	}, nil
}

// costProxy is a Proxy as `damper proxy` runs one, in memory: the metrics
// recorded (a reader collects them), one JSON log line per request, and an
// upstream that answers every call at once with a short message.
func costProxy(t testing.TB) *Proxy {
	t.Helper()
	log := slog.New(slog.NewJSONHandler(io.Discard, nil))
	d, err := New(Policy{}, WithLogger(log),
		WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))))
	if err != nil {
		t.Fatal(err)
	}
	px, err := NewProxy(d, ProxyConfig{Upstream: "http://api.test", Transport: answerTransport{}, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	return px
}

const (
	costRequest       = `{"model":"claude-sonnet-4-6","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`
	costStreamRequest = `{"model":"claude-sonnet-4-6","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}`
)

// costCall makes one plain call through px, as a client of the proxy.
func costCall(t testing.TB, px *Proxy) {
	costCallOf(t, px, costRequest, costAnswer)
}

// costCallOf makes one call with body through px, and checks its answer.
func costCallOf(t testing.TB, px *Proxy, body, want string) { costCallThrough(t, px, body, want) }

// costCallThrough makes one call with body through h, and checks its
// answer.
func costCallThrough(t testing.TB, h http.Handler, body, want string) {
	req := httptest.NewRequest(http.MethodPost, "/v1/messages", strings.NewReader(body))
	req.Header.Set("X-Api-Key", "sk-ant-api03-cost")
	req.Header.Set("Anthropic-Version", "2023-06-01")
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK || rec.Body.String() != want {
		t.Fatalf("status %d, body %q", rec.Code, rec.Body)
	}
}

// The allocations of one call through the Proxy, the client's request and
// recorder included, as measured with Go 1.26 (plain: 77 allocations,
// 13.7 KB; stream: 86, 20.1 KB), with some room: a plain answer is handed
// on in one write, with no copy buffer (32 KiB a call), and the metrics
// record with attribute sets built once per combination (optionCache),
// not some 25 allocations a call.
const (
	maxPlainCallAllocs  = 80
	maxPlainCallBytes   = 16 << 10
	maxStreamCallAllocs = 90
	maxStreamCallBytes  = 24 << 10
)

// TestProxyCallAllocations pins the allocations of a plain call and of a
// stream through the Proxy on their successful path.
func TestProxyCallAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	for _, tc := range []struct {
		name           string
		body, answer   string
		allocs, nbytes uint64
	}{
		{"plain", costRequest, costAnswer, maxPlainCallAllocs, maxPlainCallBytes},
		{"stream", costStreamRequest, costStream, maxStreamCallAllocs, maxStreamCallBytes},
	} {
		px := costProxy(t)
		call := func() { costCallOf(t, px, tc.body, tc.answer) }
		call()
		allocs := testing.AllocsPerRun(200, call)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		const n = 200
		for range n {
			call()
		}
		runtime.ReadMemStats(&after)
		perCall := (after.TotalAlloc - before.TotalAlloc) / n
		t.Logf("%s: %v allocations, %d bytes a call", tc.name, allocs, perCall)
		if allocs > float64(tc.allocs) || perCall > tc.nbytes {
			t.Errorf("%s: %v allocations, %d bytes a call; want at most %d and %d", tc.name, allocs, perCall, tc.allocs, tc.nbytes)
		}
	}
}

// BenchmarkProxyPlainCall times one plain call through the Proxy in
// memory: Damper's own work on the proxy's path, without the network.
func BenchmarkProxyPlainCall(b *testing.B) {
	px := costProxy(b)
	b.ReportAllocs()
	for b.Loop() {
		costCall(b, px)
	}
}

// BenchmarkBareProxyCall is BenchmarkProxyPlainCall and
// BenchmarkProxyStreamCall through a bare httputil.ReverseProxy to the same
// in-memory upstream: the floor Damper's proxy is set against.
func BenchmarkBareProxyCall(b *testing.B) {
	up, _ := url.Parse("http://api.test")
	bare := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(up) }, FlushInterval: -1, Transport: answerTransport{}}
	for _, c := range []struct{ name, body, answer string }{{"plain", costRequest, costAnswer}, {"stream", costStreamRequest, costStream}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				costCallThrough(b, bare, c.body, c.answer)
			}
		})
	}
}

// BenchmarkProxyStreamCall is BenchmarkProxyPlainCall for a short stream.
func BenchmarkProxyStreamCall(b *testing.B) {
	px := costProxy(b)
	b.ReportAllocs()
	for b.Loop() {
		costCallOf(b, px, costStreamRequest, costStream)
	}
}

// flushLog is a client's response that notes its writes and flushes.
type flushLog struct{ ops []string }

func (f *flushLog) Write(p []byte) (int, error) {
	f.ops = append(f.ops, "write "+string(p))
	return len(p), nil
}

func (f *flushLog) Flush() error {
	f.ops = append(f.ops, "flush")
	return nil
}

// chunks is a stream read in the parts it holds, delivered once the last
// has been read.
type chunks struct{ parts []string }

func (c *chunks) Read(p []byte) (int, error) {
	if len(c.parts) == 0 {
		return 0, io.EOF
	}
	n := copy(p, c.parts[0])
	c.parts = c.parts[1:]
	return n, nil
}

// TestStreamEndGoesOutWithItsLastEvents: every read of a stream is
// flushed as it comes but the one that hands on its message_stop, which
// the server sends with the stream's end and trailer, in one write.
func TestStreamEndGoesOutWithItsLastEvents(t *testing.T) {
	body := &chunks{parts: []string{"event: a\ndata: 1\n\n", "event: message_stop\ndata: {}\n\n"}}
	var w flushLog
	passStream(&w, body, 1<<20, nil, func() bool { return len(body.parts) == 0 })
	want := []string{"write event: a\ndata: 1\n\n", "flush", "write event: message_stop\ndata: {}\n\n"}
	if !slices.Equal(w.ops, want) {
		t.Errorf("passed on as %q, want %q", w.ops, want)
	}

	// Through the proxy: a stream that came whole is not flushed before
	// its end, and its outcome is still the trailer.
	px := costProxy(t)
	req := httptest.NewRequest(http.MethodPost, "/v1/messages", strings.NewReader(costStreamRequest))
	req.Header.Set("Anthropic-Version", "2023-06-01")
	rec := httptest.NewRecorder()
	px.ServeHTTP(rec, req)
	res := rec.Result()
	if rec.Body.String() != costStream || rec.Flushed || res.Trailer.Get(headerOutcome) != string(OutcomeSuccess) {
		t.Errorf("flushed %v, trailer %q, body %q", rec.Flushed, res.Trailer, rec.Body)
	}
}
