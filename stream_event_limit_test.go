package damper_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// allocated returns the bytes f allocated, over the whole process.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// hugeDeltaServer sends a stream's first content, then a text delta of
// size bytes in one event.
func hugeDeltaServer(size int) *rawServer {
	evs := (dampertest.Stream{Text: "fine"}).Events()
	delta := `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"`
	return &rawServer{handlers: []http.HandlerFunc{
		sseHandler(preContent()+evs[2].String(), "event: content_block_delta\ndata: "+delta, "x", size, "\"}}\n\n"),
	}}
}

// One event of 64 MiB after the first content, under a limit of 1 MiB: the
// SDK caller gets the events before it, then an ErrEventTooLarge that is
// ambiguous; Damper reads and allocates a bounded part of the event.
func TestStreamEventLimitAfterContent(t *testing.T) {
	const limit = 1 << 20
	srv := hugeDeltaServer(64 << 20)
	var (
		err  error
		n    int
		rep  damper.Report
		used = allocated(func() {
			evs, r, _, e := streamIn(t, damper.Policy{MaxEventBytes: limit}, srv)
			n, rep, err = len(evs), r, e
		})
	)
	if !errors.Is(err, damper.ErrEventTooLarge) || !errors.Is(err, damper.ErrAmbiguous) || n != 3 {
		t.Fatalf("%d events, err %.300v; want 3 events, then ErrEventTooLarge after content", n, err)
	}
	if rep.Outcome != damper.OutcomeAmbiguous || rep.Attempts != 1 || rep.AttemptLog[0].Kind != "event_too_large" {
		t.Errorf("report %+v; want one attempt, ambiguous, event_too_large", rep)
	}
	if got := srv.written.Load(); got > 4*limit {
		t.Errorf("the upstream wrote %d bytes of the stream, want at most %d", got, 4*limit)
	}
	t.Logf("allocated %d bytes, the upstream wrote %d", used, srv.written.Load())
	if used > 8*limit {
		t.Errorf("the call allocated %d bytes, want at most %d", used, 8*limit)
	}
}

// An event larger than the limit before the first content fails the
// attempt, and is not retried: it is the provider's answer.
func TestStreamEventLimitBeforeContent(t *testing.T) {
	const limit = 64 << 10
	srv := &rawServer{handlers: []http.HandlerFunc{
		sseHandler("", "event: message_start\ndata: ", "x", 4<<20, "\n\n"), streamOKHandler,
	}}
	evs, rep, _, err := streamIn(t, damper.Policy{MaxHoldBack: 8 << 20, MaxEventBytes: limit}, srv)
	if !errors.Is(err, damper.ErrEventTooLarge) || errors.Is(err, damper.ErrAmbiguous) || len(evs) != 0 || rep.Attempts != 1 {
		t.Fatalf("%d events, err %v, report %+v; want ErrEventTooLarge after one attempt, nothing shown", len(evs), err, rep)
	}
	if k := rep.AttemptLog[0].Kind; k != "event_too_large" {
		t.Errorf("the attempt's kind is %q, want event_too_large", k)
	}
	if got := srv.written.Load(); got > 4*limit {
		t.Errorf("the upstream wrote %d bytes, want at most %d", got, 4*limit)
	}
}

// Through the proxy, the same event ends the stream with an SSE error
// event of the API's shape, after the whole events before it and with no
// part of the large one; the proxy holds a bounded part of it.
func TestProxyEventLimit(t *testing.T) {
	const limit = 1 << 20
	srv := hugeDeltaServer(64 << 20)
	d := newDamper(t, damper.Policy{MaxEventBytes: limit})
	px, err := damper.NewProxy(d, damper.ProxyConfig{Upstream: "http://api.invalid", Transport: dampertest.Transport(srv)})
	if err != nil {
		t.Fatal(err)
	}
	body := `{"model":"claude-sonnet-4-5","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"hi"}]}`
	w := httptest.NewRecorder()
	used := allocated(func() {
		px.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/messages", strings.NewReader(body)))
	})
	got := w.Body.String()
	events := strings.Split(strings.TrimSuffix(got, "\n\n"), "\n\n")
	last := events[len(events)-1]
	if w.Code != http.StatusOK || len(events) != 4 || !strings.HasPrefix(last, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\"") ||
		!strings.Contains(last, "larger than 1048576 bytes") {
		t.Fatalf("status %d, %d events, the last %.300q; want 3 events and an api_error event naming the limit", w.Code, len(events), last)
	}
	if strings.Contains(got, "xxxx") {
		t.Error("part of the event over the limit reached the client")
	}
	if got := srv.written.Load(); got > 4*limit {
		t.Errorf("the upstream wrote %d bytes of the stream, want at most %d", got, 4*limit)
	}
	t.Logf("allocated %d bytes, the upstream wrote %d", used, srv.written.Load())
	if used > 8*limit {
		t.Errorf("the call allocated %d bytes, want at most %d", used, 8*limit)
	}
}

// Before the first content, the proxy answers an event over the limit as a
// failure of the upstream's answer: 502 api_error, after one attempt.
func TestProxyEventLimitBeforeContent(t *testing.T) {
	srv := &rawServer{handlers: []http.HandlerFunc{
		sseHandler("", "event: message_start\ndata: ", "x", 4<<20, "\n\n"), streamOKHandler,
	}}
	d := newDamper(t, damper.Policy{MaxHoldBack: 8 << 20, MaxEventBytes: 64 << 10})
	px, err := damper.NewProxy(d, damper.ProxyConfig{Upstream: "http://api.invalid", Transport: dampertest.Transport(srv)})
	if err != nil {
		t.Fatal(err)
	}
	body := `{"model":"claude-sonnet-4-5","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"hi"}]}`
	w := httptest.NewRecorder()
	px.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/messages", strings.NewReader(body)))
	if w.Code != http.StatusBadGateway || !strings.Contains(w.Body.String(), `"type":"api_error"`) ||
		!strings.Contains(w.Body.String(), "MaxEventBytes") || w.Header().Get(damper.HeaderAttempts) != "1" {
		t.Fatalf("status %d, attempts %s, body %.300s; want 502 api_error naming MaxEventBytes after one attempt",
			w.Code, w.Header().Get(damper.HeaderAttempts), w.Body)
	}
}
