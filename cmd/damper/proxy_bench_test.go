package main

// The proxy's cost, recorded in docs/BENCHMARKS.md:
//
//	go test -run '^$' -bench ProxyPaired -benchtime 2000x -count 10 ./cmd/damper
//	go test -run '^$' -bench ProxyThroughput -benchtime 5s -count 3 ./cmd/damper

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/damper-ai/damper-go/dampertest"
)

const benchMessage = `{"id":"msg_bench","type":"message","role":"assistant","model":"claude-sonnet-4-6","content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":1}}`

// benchStream is a short answer's whole stream, as the API sends it.
var benchStream = func() string {
	var b strings.Builder
	for _, e := range (dampertest.Stream{Text: "a short streamed answer"}).Events() {
		b.WriteString(e.String())
	}
	return b.String()
}()

// benchAPI answers every call at once: a message, or a stream when the
// body asks for one.
var benchAPI = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Request-Id", "req_bench")
	if strings.Contains(string(body), `"stream":true`) {
		w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
		_, _ = io.WriteString(w, benchStream)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, benchMessage)
})

const (
	benchPlainBody  = `{"model":"claude-sonnet-4-6","max_tokens":64,"messages":[{"role":"user","content":"hello"}]}`
	benchStreamBody = `{"model":"claude-sonnet-4-6","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hello"}]}`
)

// benchTargets starts the fake API and, in front of it, the proxy as the
// command runs it (logging at info, to nowhere) and a bare
// httputil.ReverseProxy; it returns their base URLs, in that order, a
// client with room for many idle connections, and a count of the
// connections the fake API accepted.
func benchTargets(b *testing.B) (targets [3]string, client *http.Client, conns *atomic.Int64) {
	b.Helper()
	conns = new(atomic.Int64)
	api := httptest.NewUnstartedServer(benchAPI)
	api.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	api.Start()
	b.Cleanup(api.Close)
	up, _ := url.Parse(api.URL)
	bare := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite:       func(pr *httputil.ProxyRequest) { pr.SetURL(up) },
		FlushInterval: -1,
	})
	b.Cleanup(bare.Close)
	s := defaultProxySettings()
	s.upstream = api.URL
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serveProxy(ctx, s, ln, slog.New(slog.NewJSONHandler(io.Discard, nil))) }()
	b.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			b.Error(err)
		}
	})
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 256
	client = &http.Client{Transport: tr, Timeout: 30 * time.Second}
	b.Cleanup(tr.CloseIdleConnections)
	return [3]string{api.URL, bare.URL, "http://" + ln.Addr().String()}, client, conns
}

// benchCall makes one Messages call to base and reads its answer whole.
func benchCall(b *testing.B, client *http.Client, base, body string) {
	req, err := http.NewRequest(http.MethodPost, base+"/v1/messages", strings.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	req.Header.Set("X-Api-Key", "bench-key")
	req.Header.Set("Anthropic-Version", "2023-06-01")
	req.Header.Set("Content-Type", "application/json")
	res, err := client.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	_, err = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if err != nil || res.StatusCode != http.StatusOK {
		b.Fatalf("status %d, %v", res.StatusCode, err)
	}
}

// BenchmarkProxyPaired makes, in every iteration, one call straight to the
// fake API, one through a bare httputil.ReverseProxy and one through
// Damper's proxy, in an order that rotates, so that all three see the
// same machine load. It reports each one's time per call, the time
// Damper's proxy adds to a direct call and to a bare proxy's, and the
// fake API's new connections per call (0: every hop reuses its
// connections).
func BenchmarkProxyPaired(b *testing.B) {
	for _, c := range []struct{ name, body string }{{"plain", benchPlainBody}, {"stream", benchStreamBody}} {
		b.Run(c.name, func(b *testing.B) {
			targets, client, conns := benchTargets(b)
			for _, t := range targets { // connections open before the clock runs
				benchCall(b, client, t, c.body)
			}
			conns.Store(0)
			var took [3]time.Duration
			i := 0
			for b.Loop() {
				for k := range 3 {
					t := (i + k) % 3
					t0 := time.Now()
					benchCall(b, client, targets[t], c.body)
					took[t] += time.Since(t0)
				}
				i++
			}
			n := float64(b.N)
			us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / n }
			b.ReportMetric(us(took[0]), "direct-µs/call")
			b.ReportMetric(us(took[1]), "bare-proxy-µs/call")
			b.ReportMetric(us(took[2]), "damper-proxy-µs/call")
			b.ReportMetric(us(took[2]-took[0]), "added-to-direct-µs/call")
			b.ReportMetric(us(took[2]-took[1]), "added-to-bare-µs/call")
			b.ReportMetric(float64(conns.Load())/n, "upstream-conns/call")
		})
	}
}

// BenchmarkProxyThroughput is a load of 64 clients at once, each making
// calls one after another, straight to the fake API, through a bare
// httputil.ReverseProxy and through Damper's proxy; it reports calls per
// second. The load, the proxy and the fake API share the machine's CPUs.
func BenchmarkProxyThroughput(b *testing.B) {
	for _, c := range []struct{ name, body string }{{"plain", benchPlainBody}, {"stream", benchStreamBody}} {
		for k, target := range []string{"direct", "bare-proxy", "damper-proxy"} {
			b.Run(c.name+"/"+target, func(b *testing.B) {
				targets, client, _ := benchTargets(b)
				base := targets[k]
				b.SetParallelism(32) // 64 clients on 2 CPUs
				start := time.Now()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						benchCall(b, client, base, c.body)
					}
				})
				b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "calls/s")
			})
		}
	}
}
