package damper_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// streamContenders are the bare SDK and the SDK through Damper, against
// the same loopback server and HTTP transport.
func streamContenders(b *testing.B, srv *dampertest.Server) map[string]anthropic.Client {
	tr := &http.Transport{MaxIdleConnsPerHost: 4}
	b.Cleanup(tr.CloseIdleConnections)
	base := append(srv.Options(), option.WithHTTPClient(&http.Client{Transport: tr}), option.WithMaxRetries(0))
	d, err := damper.New(damper.Policy{})
	if err != nil {
		b.Fatal(err)
	}
	return map[string]anthropic.Client{
		"bare":   anthropic.NewClient(base...),
		"damper": anthropic.NewClient(append([]option.RequestOption{d.Option()}, base...)...),
	}
}

// The benchmarks below run the bare SDK and Damper within each iteration,
// alternating which goes first, so that both see the same machine load,
// and report each one's figure and the ratio: on a shared machine, runs of
// one after the other drift more than the difference measured.

// BenchmarkStreamThroughput streams a long answer (256 KiB of text in
// 4,096 deltas) to its end, once bare and once through Damper per
// iteration; damper/bare is Damper's throughput as a share of the bare
// SDK's.
func BenchmarkStreamThroughput(b *testing.B) {
	srv := dampertest.NewServer()
	defer srv.Close()
	st := dampertest.Stream{Text: strings.Repeat("streaming throughput, sixty-four bytes of text per delta here.\n", 4096), ChunkSize: 64}
	srv.Script("long", dampertest.OK().WithStream(st))
	size := 0
	for _, e := range st.Events() {
		size += len(e.String())
	}
	clients := streamContenders(b, srv)
	var spent [2]time.Duration
	b.SetBytes(int64(2 * size))
	names := [2]string{"bare", "damper"}
	for k := 0; b.Loop(); k++ {
		for j := range 2 {
			i := (k + j) % 2 // alternate which goes first
			name := names[i]
			client := clients[name]
			start := time.Now()
			evs, err := drainCount(client.Messages.NewStreaming(context.Background(), streamParams(), dampertest.Scenario("long")))
			spent[i] += time.Since(start)
			if err != nil || evs != len(st.Events()) {
				b.Fatalf("%s: %d events, error %v", name, evs, err)
			}
		}
	}
	mbps := func(d time.Duration) float64 { return float64(size) * float64(b.N) / d.Seconds() / 1e6 }
	b.ReportMetric(mbps(spent[0]), "bare-MB/s")
	b.ReportMetric(mbps(spent[1]), "damper-MB/s")
	b.ReportMetric(100*mbps(spent[1])/mbps(spent[0]), "damper/bare-%")
}

// BenchmarkStreamFirstContent measures the time from the call to the first
// content_block_delta in the caller's hands, for a short answer after a
// ping, bare and through Damper in each iteration; added-ns is Damper's
// extra time to first content.
func BenchmarkStreamFirstContent(b *testing.B) {
	srv := dampertest.NewServer()
	defer srv.Close()
	srv.Script("short", dampertest.OK().WithStream(dampertest.Stream{Text: "Hello there, a short answer.", Pings: 1}))
	clients := streamContenders(b, srv)
	var spent [2]time.Duration
	names := [2]string{"bare", "damper"}
	for k := 0; b.Loop(); k++ {
		for j := range 2 {
			i := (k + j) % 2 // alternate which goes first
			client := clients[names[i]]
			start := time.Now()
			s := client.Messages.NewStreaming(context.Background(), streamParams(), dampertest.Scenario("short"))
			for s.Next() && s.Current().Type != "content_block_delta" {
			}
			spent[i] += time.Since(start)
			if s.Err() != nil {
				b.Fatal(s.Err())
			}
			for s.Next() {
			}
			s.Close()
		}
	}
	n := float64(b.N)
	b.ReportMetric(float64(spent[0].Nanoseconds())/n, "bare-ns/first-content")
	b.ReportMetric(float64(spent[1].Nanoseconds())/n, "damper-ns/first-content")
	b.ReportMetric(float64((spent[1]-spent[0]).Nanoseconds())/n, "added-ns")
}
func drainCount(s interface {
	Next() bool
	Err() error
	Close() error
}) (int, error) {
	defer s.Close()
	n := 0
	for s.Next() {
		n++
	}
	return n, s.Err()
}

// BenchmarkStreamHeldMemory opens 256 streams with a 100 KB prompt and
// holds them open after their first content, bare and then through Damper
// (alternating which goes first), and reports the heap each contender holds
// per open stream once the garbage is collected: added-B/stream is what
// Damper keeps for a stream's life.
func BenchmarkStreamHeldMemory(b *testing.B) {
	const open = 256
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for _, e := range (dampertest.Stream{Text: "held open"}).Events()[:3] { // up to the first delta
			_, _ = io.WriteString(w, e.String())
		}
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	tr := &http.Transport{MaxIdleConnsPerHost: open, MaxConnsPerHost: 0}
	defer tr.CloseIdleConnections()
	base := []option.RequestOption{option.WithBaseURL(srv.URL), option.WithAPIKey("bench-key"),
		option.WithHTTPClient(&http.Client{Transport: tr}), option.WithMaxRetries(0)}
	d, err := damper.New(damper.Policy{})
	if err != nil {
		b.Fatal(err)
	}
	clients := [2]anthropic.Client{anthropic.NewClient(base...), anthropic.NewClient(append(base, d.Option())...)}
	params := benchParams("claude-sonnet-4-5", 100_000)
	held := func(client anthropic.Client) float64 {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		streams := make([]interface{ Close() error }, 0, open)
		for range open {
			s := client.Messages.NewStreaming(ctx, params)
			for s.Next() && s.Current().Type != "content_block_delta" {
			}
			if s.Err() != nil {
				b.Fatal(s.Err())
			}
			streams = append(streams, s)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		for _, s := range streams {
			_ = s.Close()
		}
		return float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / open
	}
	var sum [2]float64
	for k := 0; b.Loop(); k++ {
		for j := range 2 {
			i := (k + j) % 2
			sum[i] += held(clients[i])
		}
	}
	n := float64(b.N)
	b.ReportMetric(sum[0]/n, "bare-B/stream")
	b.ReportMetric(sum[1]/n, "damper-B/stream")
	b.ReportMetric((sum[1]-sum[0])/n, "added-B/stream")
}
