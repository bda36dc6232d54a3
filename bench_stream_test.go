package damper_test

import (
	"context"
	"net/http"
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

// The benchmarks below alternate the bare SDK and Damper within each
// iteration, so that both see the same machine load, and report each one's
// figure and the ratio: on a shared machine, runs of one after the other
// drift more than the difference measured.

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
	for b.Loop() {
		for i, name := range []string{"bare", "damper"} {
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
	for b.Loop() {
		for i, name := range []string{"bare", "damper"} {
			client := clients[name]
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
