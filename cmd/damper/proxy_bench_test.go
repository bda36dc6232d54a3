package main

// The proxy's cost, recorded in docs/BENCHMARKS.md:
//
//	go test -run '^$' -bench ProxyPaired -benchtime 2000x -count 10 ./cmd/damper
//	go test -run '^$' -bench ProxyThroughput -benchtime 4x -count 5 ./cmd/damper

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
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
		Transport:     proxyTransport(), // the same pool of connections as Damper's
	})
	b.Cleanup(bare.Close)
	s := defaultProxySettings()
	s.Upstream = api.URL
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
func benchCall(client *http.Client, base, body string) error {
	req, err := http.NewRequest(http.MethodPost, base+"/v1/messages", strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("X-Api-Key", "bench-key")
	req.Header.Set("Anthropic-Version", "2023-06-01")
	req.Header.Set("Content-Type", "application/json")
	res, err := client.Do(req)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if err == nil && res.StatusCode != http.StatusOK {
		err = fmt.Errorf("status %d", res.StatusCode)
	}
	return err
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
				if err := benchCall(client, t, c.body); err != nil {
					b.Fatal(err)
				}
			}
			conns.Store(0)
			var took [3]time.Duration
			i := 0
			for b.Loop() {
				for k := range 3 {
					t := (i + k) % 3
					t0 := time.Now()
					if err := benchCall(client, targets[t], c.body); err != nil {
						b.Fatal(err)
					}
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
// calls one after another for a slice of time, straight to the fake API,
// through a bare httputil.ReverseProxy and through Damper's proxy, in an
// order that rotates each round (an iteration is one round, three slices
// of 500 ms), so that all three see the same machine load. It reports
// calls per second for each, and the fake API's new connections per call.
// The load, the proxies and the fake API share the machine's CPUs.
func BenchmarkProxyThroughput(b *testing.B) {
	const clients, slice = 64, 500 * time.Millisecond
	for _, c := range []struct{ name, body string }{{"plain", benchPlainBody}, {"stream", benchStreamBody}} {
		b.Run(c.name, func(b *testing.B) {
			targets, client, conns := benchTargets(b)
			conns.Store(0)
			var calls [3]atomic.Int64
			var took [3]time.Duration
			round := 0
			for b.Loop() {
				for k := range 3 {
					t := (round + k) % 3
					stop := time.Now().Add(slice)
					t0 := time.Now()
					var wg sync.WaitGroup
					for range clients {
						wg.Go(func() {
							for time.Now().Before(stop) {
								if err := benchCall(client, targets[t], c.body); err != nil {
									b.Error(err)
									return
								}
								calls[t].Add(1)
							}
						})
					}
					wg.Wait()
					took[t] += time.Since(t0)
				}
				round++
			}
			rate := func(t int) float64 { return float64(calls[t].Load()) / took[t].Seconds() }
			b.ReportMetric(rate(0), "direct-calls/s")
			b.ReportMetric(rate(1), "bare-proxy-calls/s")
			b.ReportMetric(rate(2), "damper-proxy-calls/s")
			b.ReportMetric(rate(2)/rate(1), "damper/bare")
			b.ReportMetric(float64(conns.Load())/float64(calls[0].Load()+calls[1].Load()+calls[2].Load()), "upstream-conns/call")
		})
	}
}

// proxyTransport is the transport a Proxy uses when its config gives none.
func proxyTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = 256
	t.MaxIdleConnsPerHost = 256
	return t
}
