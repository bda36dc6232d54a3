package damper_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// floodPolicy has every part that records a metric: the breaker, the
// throttle, the rate limiter, the concurrency limit and the hedger.
func floodPolicy() damper.Policy {
	p := damper.RecommendedPolicy()
	p.RateLimit = &damper.RateLimitPolicy{}
	p.Concurrency = &damper.ConcurrencyPolicy{Adaptive: true}
	p.Hedge = &damper.HedgePolicy{}
	return p
}

// floodModel is the i-th of many distinct valid model names, each a name
// the proxy's door lets through: in turn one it does not know, one its
// price table prices by family (a dated ID), and one of the table's own.
func floodModel(i int, known []string) string {
	switch i % 3 {
	case 0:
		return fmt.Sprintf("claude-flood-%d", i)
	case 1:
		return fmt.Sprintf("claude-sonnet-4-5-%08d", 20250000+i)
	}
	return known[i%len(known)]
}

// floodUpstream answers the i-th call: a plain message or a stream whose
// model is the request's, or, hostile, a model of its own for each call,
// with the rate limit's headers; every fifth call an error not retried,
// of a status the API uses or, from every tenth, of any other.
func floodUpstream(hostile bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		model := string(body)
		if i := strings.Index(model, `"model":"`); i >= 0 {
			model = model[i+len(`"model":"`):]
			model = model[:strings.IndexByte(model, '"')]
		}
		var n int
		fmt.Sscanf(r.Header.Get("X-Flood"), "%d", &n)
		if hostile {
			model = fmt.Sprintf("claude-answer-%d", n)
		}
		w.Header().Set("request-id", "req_flood")
		if code := floodStatus(n); code != 200 {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Should-Retry", "false")
			w.WriteHeader(code)
			_, _ = io.WriteString(w, `{"type":"error","error":{"type":"invalid_request_error","message":"no"}}`)
			return
		}
		for _, b := range []string{"requests", "input-tokens", "output-tokens"} {
			w.Header().Set("anthropic-ratelimit-"+b+"-limit", "1000000")
			w.Header().Set("anthropic-ratelimit-"+b+"-remaining", "999000")
			w.Header().Set("anthropic-ratelimit-"+b+"-reset", "2026-01-01T00:01:00Z")
		}
		if bytes.Contains(body, []byte(`"stream":true`)) {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":%q,\"content\":[],\"stop_reason\":null,\"usage\":{\"input_tokens\":3,\"output_tokens\":1,\"cache_read_input_tokens\":2}}}\n\n", model)
			io.WriteString(w, "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n")
			io.WriteString(w, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n")
			io.WriteString(w, "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n")
			io.WriteString(w, "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":5}}\n\n")
			io.WriteString(w, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"msg_1","type":"message","role":"assistant","model":%q,"content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","usage":{"input_tokens":3,"output_tokens":1,"cache_creation_input_tokens":4}}`, model)
	}
}

// floodBody is the i-th call's body: every other one a stream.
func floodBody(i int, model string) string {
	return fmt.Sprintf(`{"model":%q,"max_tokens":16,"stream":%t,"messages":[{"role":"user","content":"hi"}]}`, model, i%2 == 1)
}

// floodProxy sends n calls, each naming a distinct valid model, through a
// Proxy whose Damper's metrics a Prometheus registry serves, and returns
// the scrape.
func floodProxy(t *testing.T, n int, hostile bool) []byte {
	t.Helper()
	clock := dampertest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	d, reg := promDamper(t, clock, floodPolicy(), slog.New(slog.DiscardHandler))
	px, err := damper.NewProxy(d, damper.ProxyConfig{Upstream: dampertest.MemoryURL, Transport: dampertest.Transport(floodUpstream(hostile))})
	if err != nil {
		t.Fatal(err)
	}
	known := damper.DefaultPriceTable().Models()
	slices.Sort(known)
	for i := range n {
		req := httptest.NewRequest(http.MethodPost, "/v1/messages", strings.NewReader(floodBody(i, floodModel(i, known))))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Flood", fmt.Sprint(i))
		rec := httptest.NewRecorder()
		px.ServeHTTP(rec, req)
		if want := floodStatus(i); rec.Code != want {
			t.Fatalf("call %d: %d, want %d: %.300s", i, rec.Code, want, rec.Body)
		}
	}
	return scrapeOK(t, reg)
}

// floodStatuses are the failures of a flood: every status the API and
// its platforms answer with, and a few no API sends.
var floodStatuses = []int{400, 401, 402, 403, 404, 408, 409, 413, 424, 429, 500, 502, 503, 504, 529, 418, 451, 499, 520, 599}

// floodStatus is the status the i-th call of a flood ends with: every
// fifth a failure that the upstream says not to retry, each of
// floodStatuses in turn, so that the first 100 calls have them all.
func floodStatus(i int) int {
	if i%5 != 0 {
		return 200
	}
	return floodStatuses[i/5%len(floodStatuses)]
}

// floodLibrary sends the same calls as floodProxy through the SDK and a
// Damper, as raw bodies, and returns the scrape.
func floodLibrary(t *testing.T, n int, hostile bool) []byte {
	t.Helper()
	clock := dampertest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	d, reg := promDamper(t, clock, floodPolicy(), slog.New(slog.DiscardHandler))
	client := anthropic.NewClient(d.Option(), option.WithBaseURL("http://api.invalid"), option.WithAPIKey("test-key"),
		option.WithHTTPClient(&http.Client{Transport: dampertest.Transport(floodUpstream(hostile))}))
	known := damper.DefaultPriceTable().Models()
	slices.Sort(known)
	for i := range n {
		opts := []option.RequestOption{option.WithRequestBody("application/json", []byte(floodBody(i, floodModel(i, known)))),
			option.WithHeader("X-Flood", fmt.Sprint(i))}
		var err error
		if i%2 == 1 {
			s := client.Messages.NewStreaming(context.Background(), anthropic.MessageNewParams{}, opts...)
			for s.Next() {
			}
			err = s.Err()
			s.Close()
		} else {
			_, err = client.Messages.New(context.Background(), anthropic.MessageNewParams{}, opts...)
		}
		if (err == nil) != (floodStatus(i) == 200) {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	return scrapeOK(t, reg)
}

func scrapeOK(t *testing.T, reg *prometheus.Registry) []byte {
	t.Helper()
	code, b := scrape(t, reg)
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d: %.300s", code, b)
	}
	return b
}

// families returns the bytes of a scrape by metric family, its HELP and
// TYPE lines included, largest first, as "name bytes series" lines.
func families(scrape []byte) string {
	size := map[string]int{}
	series := map[string]int{}
	for line := range strings.Lines(string(scrape)) {
		name := line
		if rest, ok := strings.CutPrefix(line, "# "); ok {
			f := strings.Fields(rest)
			if len(f) > 1 {
				name = f[1]
			}
		} else {
			name = name[:strings.IndexAny(name, "{ ")]
			series[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")]++
		}
		for _, s := range []string{"_bucket", "_sum", "_count"} {
			name = strings.TrimSuffix(name, s)
		}
		size[name] += len(line)
	}
	names := make([]string, 0, len(size))
	for n := range size {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b string) int { return size[b] - size[a] })
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, "%8d %6d %s\n", size[n], series[n], n)
	}
	return b.String()
}

// TestMetricsFloodMeasured logs the size of /metrics after 5,000 and
// 50,000 distinct models, through the proxy and through the SDK, with an
// upstream that answers with the request's model and with one that names
// a model of its own each time, and the bytes of each metric family: the
// numbers of docs/RELIABILITY.md. It takes some 20 s, so it runs only
// when asked:
//
//	DAMPER_MEASURE=1 go test -run TestMetricsFloodMeasured -v .
func TestMetricsFloodMeasured(t *testing.T) {
	if os.Getenv("DAMPER_MEASURE") == "" {
		t.Skip("set DAMPER_MEASURE=1 to run: it sends 220,000 calls")
	}
	for _, n := range []int{5000, 50000} {
		for _, hostile := range []bool{false, true} {
			p := floodProxy(t, n, hostile)
			l := floodLibrary(t, n, hostile)
			t.Logf("| %d models, hostile upstream %v | proxy %d bytes | library %d bytes |", n, hostile, len(p), len(l))
			if n == 50000 && hostile {
				t.Logf("proxy, by family (bytes, lines, name):\n%s", families(p))
			}
		}
	}
}

// seriesOf returns the series of a scrape, each line without its value.
func seriesOf(scrape []byte) map[string]bool {
	out := map[string]bool{}
	for line := range strings.Lines(string(scrape)) {
		if strings.HasPrefix(line, "#") {
			continue
		}
		out[line[:strings.LastIndexByte(line, ' ')]] = true
	}
	return out
}

// diffSeries lists the series of b that a lacks.
func diffSeries(a, b map[string]bool) []string {
	var out []string
	for s := range b {
		if !a[s] {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return out
}

// TestMetricsBoundedUnderFlood: 5,000 calls, each naming a distinct
// valid model, answered with every status and, by a hostile upstream,
// each with a model of its own, leave /metrics the series that 1,000 such
// calls leave, within a fixed size, through the proxy and through the SDK.
func TestMetricsBoundedUnderFlood(t *testing.T) {
	const bound = 512 << 10
	for _, path := range []struct {
		name  string
		flood func(*testing.T, int, bool) []byte
	}{{"proxy", floodProxy}, {"library", floodLibrary}} {
		t.Run(path.name, func(t *testing.T) {
			few, many := path.flood(t, 1000, true), path.flood(t, 5000, true)
			if len(many) > bound {
				t.Errorf("/metrics after 5,000 models: %d bytes, want at most %d:\n%s", len(many), bound, families(many))
			}
			// A hedge's result is one of a fixed few, and whether a race
			// ends with one canceled depends on the goroutines' order, not
			// on the callers' input: those series may differ by run.
			extra := slices.DeleteFunc(diffSeries(seriesOf(few), seriesOf(many)), func(s string) bool {
				return strings.HasPrefix(s, "damper_hedges_total{")
			})
			if len(extra) > 0 {
				t.Errorf("%d series after 5,000 models that 1,000 did not make:\n%s", len(extra), strings.Join(extra, "\n"))
			}
			// The same series: only the values' digits differ.
			if d := len(many) - len(few); d < 0 || d > len(few)/50 {
				t.Errorf("/metrics: %d bytes after 1,000 models, %d after 5,000", len(few), len(many))
			}
		})
	}
}
