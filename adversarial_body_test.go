package damper_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// Adversarial bodies, served in memory in a synctest bubble: the pipe of
// dampertest.Transport has no buffer, so what a handler has written is
// exactly what the client has read, and timeouts cost no real time.

// rawServer answers the n-th request with handlers[n-1] (the last one
// repeating) and counts the body bytes the client took.
type rawServer struct {
	handlers []http.HandlerFunc
	requests atomic.Int32
	written  atomic.Int64
}

func (s *rawServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	n := int(s.requests.Add(1))
	s.handlers[min(n, len(s.handlers))-1](countingWriter{w, &s.written}, r)
}

type countingWriter struct {
	http.ResponseWriter
	n *atomic.Int64
}

func (w countingWriter) Write(p []byte) (int, error) {
	n, err := w.ResponseWriter.Write(p)
	w.n.Add(int64(n))
	return n, err
}

func (w countingWriter) Flush() { _ = http.NewResponseController(w.ResponseWriter).Flush() }

// okHandler answers with a complete message.
func okHandler(w http.ResponseWriter, r *http.Request) {
	body := `{"id":"msg_ok","type":"message","role":"assistant","model":"claude-dampertest","content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","usage":{"input_tokens":1,"output_tokens":1}}`
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	_, _ = io.WriteString(w, body)
}

// streamOKHandler answers with a clean dampertest stream.
func streamOKHandler(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/event-stream")
	for _, e := range (dampertest.Stream{Text: "fine"}).Events() {
		_, _ = io.WriteString(w, e.String())
	}
}

// errorStatus answers status with body, written in chunks so that an
// endless or huge body costs the server nothing up front.
func errorStatus(status int, body io.Reader) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.CopyBuffer(w, body, make([]byte, 32<<10))
	}
}

// repeatReader yields s n times without holding n copies.
func repeatReader(s string, n int) io.Reader {
	return io.LimitReader(&cycle{s: s}, int64(len(s)*n))
}

type cycle struct {
	s   string
	off int
}

func (c *cycle) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		k := copy(p[n:], c.s[c.off:])
		n += k
		c.off = (c.off + k) % len(c.s)
	}
	return n, nil
}

// callIn runs one Messages.New call through Damper p to srv in a bubble.
func callIn(t *testing.T, p damper.Policy, srv *rawServer, model string) (*anthropic.Message, damper.Report, error) {
	t.Helper()
	var (
		msg *anthropic.Message
		err error
		rep damper.Report
	)
	synctest.Test(t, func(t *testing.T) {
		client := memClient(newDamper(t, p), srv)
		pr := params(model)
		pr.MaxTokens = 256
		msg, err = client.Messages.New(context.Background(), pr, damper.ReportInto(&rep))
	})
	return msg, rep, err
}

// streamIn drains one stream through Damper p to srv in a bubble.
func streamIn(t *testing.T, p damper.Policy, srv *rawServer) ([]anthropic.MessageStreamEventUnion, damper.Report, time.Duration, error) {
	t.Helper()
	var (
		evs     []anthropic.MessageStreamEventUnion
		err     error
		rep     damper.Report
		elapsed time.Duration
	)
	synctest.Test(t, func(t *testing.T) {
		client := memClient(newDamper(t, p), srv)
		start := time.Now()
		evs, err = drain(client.Messages.NewStreaming(context.Background(), streamParams(), damper.ReportInto(&rep)))
		elapsed = time.Since(start)
	})
	return evs, rep, elapsed, err
}

func TestAdversarialErrorBodyNotJSON(t *testing.T) {
	html := "<html><body><h1>502 Bad Gateway</h1></body></html>"
	t.Run("retryable status", func(t *testing.T) {
		srv := &rawServer{handlers: []http.HandlerFunc{errorStatus(502, strings.NewReader(html)), okHandler}}
		_, rep, err := callIn(t, damper.Policy{}, srv, "claude-sonnet-4-5")
		if err != nil || rep.Attempts != 2 || rep.AttemptLog[0].Kind != "server_error" {
			t.Fatalf("err %v, report %+v; want a retried 502", err, rep)
		}
	})
	t.Run("final status", func(t *testing.T) {
		srv := &rawServer{handlers: []http.HandlerFunc{errorStatus(400, strings.NewReader(html))}}
		_, rep, err := callIn(t, damper.Policy{}, srv, "claude-sonnet-4-5")
		if apiStatus(err) != 400 || !strings.Contains(err.Error(), "502 Bad Gateway") || rep.Attempts != 1 {
			t.Fatalf("err %v, report %+v; want the SDK's 400 quoting the body, one attempt", err, rep)
		}
	})
}

// A huge error body: Damper reads 1 MiB of it and no more, for a status it
// retries and for one it returns, and allocates accordingly.
func TestAdversarialErrorBodyHuge(t *testing.T) {
	const huge = 64 << 20
	chunk := `{"type":"error","error":{"type":"api_error","message":"` + strings.Repeat("x", 4000) + `"}}`
	for _, status := range []int{503, 400} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			srv := &rawServer{handlers: []http.HandlerFunc{errorStatus(status, repeatReader(chunk, huge/len(chunk))), okHandler}}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, rep, err := callIn(t, damper.Policy{}, srv, "claude-sonnet-4-5")
			runtime.ReadMemStats(&after)
			if status == 503 && (err != nil || rep.Attempts != 2) {
				t.Fatalf("err %v, %d attempts; want a retried 503", err, rep.Attempts)
			}
			if status == 400 && (apiStatus(err) != 400 || rep.Attempts != 1) {
				t.Fatalf("err %.200v, %d attempts; want the SDK's 400, one attempt", err, rep.Attempts)
			}
			okBytes := int64(0)
			if status == 503 {
				okBytes = srv.written.Load() - 1<<20
			}
			if got := srv.written.Load() - okBytes; got != 1<<20 || (status == 503 && okBytes > 1024) {
				t.Fatalf("the client read %d bytes of the %d MiB error body, want exactly 1 MiB", got, huge>>20)
			}
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 32<<20 {
				t.Errorf("allocated %d MiB for a %d MiB body read 1 MiB deep", alloc>>20, huge>>20)
			}
		})
	}
}

// Deeply nested JSON in an error body, read by Damper's classifier and by
// the error it builds when a gate refuses the retry.
func TestAdversarialErrorBodyDeeplyNested(t *testing.T) {
	const depth = 400_000 // about 1 MiB: all Damper reads
	nested := `{"type":"error","error":{"type":"rate_limit_error","details":` + strings.Repeat(`{"a":`, depth) + "1" + strings.Repeat("}", depth) + "}}"
	arrays := strings.Repeat("[", depth) + strings.Repeat("]", depth)
	for _, tt := range []struct {
		name   string
		body   string
		policy damper.Policy
		check  func(error, damper.Report) bool
	}{
		{"objects, retried", nested, damper.Policy{}, func(err error, rep damper.Report) bool {
			return err == nil && rep.Attempts == 2 && rep.AttemptLog[0].Kind == "rate_limited"
		}},
		{"arrays, retried", arrays, damper.Policy{}, func(err error, rep damper.Report) bool {
			return err == nil && rep.Attempts == 2
		}},
		{"objects, refused by the cost ceiling", nested, damper.Policy{MaxRetryCostUSD: 1e-9}, func(err error, rep damper.Report) bool {
			return errors.Is(err, damper.ErrRetryCostCeiling) && apiStatus(err) == 429 && rep.Attempts == 1
		}},
		{"arrays, attempts exhausted", arrays, damper.Policy{MaxAttempts: 1}, func(err error, rep damper.Report) bool {
			return apiStatus(err) == 429 && rep.Attempts == 1
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := &rawServer{handlers: []http.HandlerFunc{errorStatus(429, strings.NewReader(tt.body)), okHandler}}
			_, rep, err := callIn(t, tt.policy, srv, "claude-sonnet-4-5")
			if !tt.check(err, rep) {
				t.Fatalf("err %.300v, report %+v", err, rep)
			}
		})
	}
}

// sseHandler writes head, then a line of n bytes of fill framed as line
// says, then tail; with n < 0 it writes the fill forever.
func sseHandler(head, linePrefix string, fill string, n int, tail string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		if _, err := io.WriteString(w, head+linePrefix); err != nil {
			return
		}
		var body io.Reader = &cycle{s: fill}
		if n >= 0 {
			body = repeatReader(fill, n/len(fill))
		}
		if _, err := io.CopyBuffer(w, body, make([]byte, 32<<10)); err != nil {
			return
		}
		_, _ = io.WriteString(w, tail)
	}
}

// The first events of a clean stream, up to and excluding its first content.
func preContent() string {
	var b strings.Builder
	evs := (dampertest.Stream{Text: "fine"}).Events()
	for _, e := range evs[:2] {
		b.WriteString(e.String())
	}
	return b.String()
}

// An SSE line of many megabytes before the first content: the hold-back
// stops at MaxHoldBack, and the call fails without a retry.
func TestAdversarialSSEHugeLineBeforeContent(t *testing.T) {
	srv := &rawServer{handlers: []http.HandlerFunc{
		sseHandler("", "event: message_start\ndata: ", "x", 16<<20, "\n\n"), streamOKHandler,
	}}
	evs, rep, _, err := streamIn(t, damper.Policy{}, srv)
	if !errors.Is(err, damper.ErrHoldBackExceeded) || len(evs) != 0 || rep.Attempts != 1 {
		t.Fatalf("%d events, err %v, report %+v; want ErrHoldBackExceeded, nothing shown", len(evs), err, rep)
	}
	if got := srv.written.Load(); got > 1<<20 {
		t.Fatalf("the client read %d bytes, more than MaxHoldBack", got)
	}
}

// An 8 MiB content line after the first content passes through to the
// caller whole: Damper keeps none of it.
func TestAdversarialSSEHugeLineAfterContent(t *testing.T) {
	const size = 8 << 20
	delta := `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"`
	evs := (dampertest.Stream{Text: "fine"}).Events()
	var tail strings.Builder
	tail.WriteString("\"}}\n\n")
	for _, e := range evs[len(evs)-3:] {
		tail.WriteString(e.String())
	}
	srv := &rawServer{handlers: []http.HandlerFunc{
		sseHandler(preContent()+evs[2].String(), "event: content_block_delta\ndata: "+delta, "y", size, tail.String()),
	}}
	got, rep, _, err := streamIn(t, damper.Policy{}, srv)
	if err != nil || rep.Outcome != damper.OutcomeSuccess || len(got) != 7 {
		t.Fatalf("%d events, err %v, report %+v; want the whole stream", len(got), err, rep)
	}
	if n := len(got[3].Delta.Text); n != size {
		t.Fatalf("the large delta reached the caller with %d bytes of text, want %d", n, size)
	}
}

// An error event of many megabytes after content: Damper reads a bounded
// part of it, then ends the stream as ambiguous.
func TestAdversarialSSEHugeErrorEventAfterContent(t *testing.T) {
	evs := (dampertest.Stream{Text: "fine"}).Events()
	srv := &rawServer{handlers: []http.HandlerFunc{
		sseHandler(preContent()+evs[2].String(), `event: error`+"\n"+`data: {"type":"error","error":{"type":"overloaded_error","message":"`, "z", -1, ""),
	}}
	got, rep, _, err := streamIn(t, damper.Policy{}, srv)
	if !errors.Is(err, damper.ErrAmbiguous) || rep.Outcome != damper.OutcomeAmbiguous || len(got) != 3 {
		t.Fatalf("%d events, err %.300v, report %+v; want 3 events, then ErrAmbiguous", len(got), err, rep)
	}
	if n := srv.written.Load(); n > 1<<20+256<<10 {
		t.Fatalf("the client read %d bytes of an endless error event", n)
	}
}

// A response that never sends its headers is one attempt's timeout, every
// time: in memory, and over a real socket.
func TestAdversarialNoHeaders(t *testing.T) {
	t.Run("in memory", func(t *testing.T) {
		srv := &rawServer{handlers: []http.HandlerFunc{func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }}}
		var rep damper.Report
		var err error
		synctest.Test(t, func(t *testing.T) {
			client := memClient(newDamper(t, damper.Policy{PerAttemptTimeout: 5 * time.Second, MaxAttempts: 2}), srv)
			start := time.Now()
			_, err = client.Messages.New(context.Background(), params("claude-sonnet-4-5"), damper.ReportInto(&rep))
			// Two timeouts and half of the 1 s backoff between them.
			if elapsed := time.Since(start); elapsed != 10500*time.Millisecond {
				t.Errorf("returned after %v, want 10.5s", elapsed)
			}
		})
		if !errors.Is(err, damper.ErrAttemptTimeout) || rep.Attempts != 2 || rep.Outcome != damper.OutcomeAttemptsExhausted {
			t.Fatalf("err %v, report %+v; want two timed-out attempts", err, rep)
		}
	})
	t.Run("raw TCP", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var conns []net.Conn
		var mu sync.Mutex
		wg.Go(func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				conns = append(conns, c) // read nothing, answer nothing
				mu.Unlock()
			}
		})
		defer func() {
			ln.Close()
			wg.Wait()
			for _, c := range conns {
				c.Close()
			}
		}()
		d := newDamper(t, damper.Policy{PerAttemptTimeout: 100 * time.Millisecond, MaxAttempts: 2, BackoffBase: time.Millisecond})
		tr := &http.Transport{}
		defer tr.CloseIdleConnections()
		client := anthropic.NewClient(d.Option(), option.WithBaseURL("http://"+ln.Addr().String()),
			option.WithAPIKey("test-key"), option.WithHTTPClient(&http.Client{Transport: tr}))
		var rep damper.Report
		_, err = client.Messages.New(context.Background(), params("claude-sonnet-4-5"), damper.ReportInto(&rep))
		if !errors.Is(err, damper.ErrAttemptTimeout) || rep.Attempts != 2 || rep.AttemptLog[1].Kind != "timeout" {
			t.Fatalf("err %v, report %+v; want two timed-out attempts", err, rep)
		}
	})
}

// A body that never ends is bounded: by PerAttemptTimeout when it trickles
// (a plain call, or a stream before its content), by MaxHoldBack when a
// stream floods before its content.
func TestAdversarialEndlessBody(t *testing.T) {
	trickle := func(head string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "1000000")
			if _, err := io.WriteString(w, head); err != nil {
				return
			}
			_ = http.NewResponseController(w).Flush()
			for {
				select {
				case <-r.Context().Done():
					return
				case <-time.After(time.Second):
				}
				if _, err := io.WriteString(w, " "); err != nil {
					return
				}
				_ = http.NewResponseController(w).Flush()
			}
		}
	}
	p := damper.Policy{PerAttemptTimeout: 5 * time.Second, MaxAttempts: 2}
	t.Run("plain call, trickling", func(t *testing.T) {
		srv := &rawServer{handlers: []http.HandlerFunc{trickle(`{"id":"msg_1",`)}}
		var err error
		var rep damper.Report
		synctest.Test(t, func(t *testing.T) {
			client := memClient(newDamper(t, p), srv)
			start := time.Now()
			_, err = client.Messages.New(context.Background(), params("claude-sonnet-4-5"), damper.ReportInto(&rep))
			if elapsed := time.Since(start); elapsed != 10500*time.Millisecond {
				t.Errorf("returned after %v, want 10.5s", elapsed)
			}
		})
		if !errors.Is(err, damper.ErrAttemptTimeout) || rep.Attempts != 2 {
			t.Fatalf("err %v, report %+v; want two timed-out attempts", err, rep)
		}
	})
	t.Run("stream before content, pinging", func(t *testing.T) {
		srv := &rawServer{handlers: []http.HandlerFunc{func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, preContent())
			for {
				select {
				case <-r.Context().Done():
					return
				case <-time.After(time.Second):
				}
				if _, err := io.WriteString(w, "event: ping\ndata: {\"type\": \"ping\"}\n\n"); err != nil {
					return
				}
			}
		}}}
		evs, rep, elapsed, err := streamIn(t, p, srv)
		if !errors.Is(err, damper.ErrAttemptTimeout) || len(evs) != 0 || rep.Attempts != 2 || elapsed != 10500*time.Millisecond {
			t.Fatalf("%d events, err %v, report %+v after %v; want two timed-out attempts in 10.5s", len(evs), err, rep, elapsed)
		}
	})
	t.Run("stream before content, flooding", func(t *testing.T) {
		srv := &rawServer{handlers: []http.HandlerFunc{sseHandler(preContent(), "", ": flood\n", -1, "")}}
		evs, rep, _, err := streamIn(t, damper.Policy{MaxHoldBack: 64 << 10}, srv)
		if !errors.Is(err, damper.ErrHoldBackExceeded) || len(evs) != 0 || rep.Attempts != 1 {
			t.Fatalf("%d events, err %v, report %+v; want ErrHoldBackExceeded", len(evs), err, rep)
		}
		if n := srv.written.Load(); n > 64<<10 {
			t.Fatalf("the client read %d bytes, more than MaxHoldBack", n)
		}
	})
}

// A server that closes in the middle of a UTF-8 sequence.
func TestAdversarialPartialUTF8(t *testing.T) {
	text := "café crème brûlée"
	cut := strings.Index(text, "é") + 1 // the first byte of é only
	msg := `{"id":"msg_1","type":"message","role":"assistant","model":"claude-dampertest","content":[{"type":"text","text":"` + text[:cut]
	t.Run("plain call, cut short of its Content-Length", func(t *testing.T) {
		srv := &rawServer{handlers: []http.HandlerFunc{func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "4096")
			_, _ = io.WriteString(w, msg)
			_ = http.NewResponseController(w).Flush()
			panic(http.ErrAbortHandler)
		}, okHandler}}
		got, rep, err := callIn(t, damper.Policy{}, srv, "claude-sonnet-4-5")
		if err != nil || rep.Attempts != 2 || rep.AttemptLog[0].Kind != "transport" || got.Content[0].Text != "ok" {
			t.Fatalf("err %v, report %+v; want the cut body retried", err, rep)
		}
	})
	t.Run("plain call, ended cleanly", func(t *testing.T) {
		srv := &rawServer{handlers: []http.HandlerFunc{func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, msg) // no Content-Length: the end of the body is the end
		}}}
		_, rep, err := callIn(t, damper.Policy{}, srv, "claude-sonnet-4-5")
		if err == nil || rep.Attempts != 1 {
			t.Fatalf("err %v, report %+v; want the SDK's decoding error, one attempt", err, rep)
		}
	})
	evs := (dampertest.Stream{Text: "fine"}).Events()
	delta := "event: content_block_delta\ndata: " + `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"` + text[:cut]
	t.Run("stream before content", func(t *testing.T) {
		srv := &rawServer{handlers: []http.HandlerFunc{func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, preContent()+delta)
		}, streamOKHandler}}
		got, rep, _, err := streamIn(t, damper.Policy{}, srv)
		if err != nil || rep.Attempts != 2 || rep.AttemptLog[0].Kind != "truncated" || len(got) != 6 {
			t.Fatalf("%d events, err %v, report %+v; want the truncated attempt retried", len(got), err, rep)
		}
	})
	t.Run("stream after content", func(t *testing.T) {
		srv := &rawServer{handlers: []http.HandlerFunc{func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			first := "event: content_block_delta\ndata: " + `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"caf"}}` + "\n\n"
			_, _ = io.WriteString(w, preContent()+evs[2].String()+first+delta)
			_ = http.NewResponseController(w).Flush()
			panic(http.ErrAbortHandler)
		}}}
		got, rep, _, err := streamIn(t, damper.Policy{}, srv)
		if !errors.Is(err, damper.ErrAmbiguous) || rep.Attempts != 1 || len(got) != 4 || got[3].Delta.Text != "caf" {
			t.Fatalf("%d events, err %v, report %+v; want the whole first delta, then ErrAmbiguous", len(got), err, rep)
		}
	})
}

// A 200 whose body never ends, sent as fast as it is read: Damper buffers a
// plain call's body to retry a cut one, and stops at 64 MiB with an error
// instead of buffering without end until the attempt's timeout.
func TestAdversarialEndlessSuccessBody(t *testing.T) {
	srv := &rawServer{handlers: []http.HandlerFunc{func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"msg_1","type":"message","content":[{"type":"text","text":"`)
		_, _ = io.CopyBuffer(w, &cycle{s: "la"}, make([]byte, 256<<10))
	}}}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, rep, err := callIn(t, damper.Policy{}, srv, "claude-sonnet-4-5")
	runtime.ReadMemStats(&after)
	if err == nil || !strings.Contains(err.Error(), "exceeds 64 MiB") || rep.Attempts != 1 || rep.Outcome != damper.OutcomeError {
		t.Fatalf("err %v, report %+v; want a body-too-large error, not retried", err, rep)
	}
	if n := srv.written.Load(); n > 64<<20+256<<10 {
		t.Fatalf("the client read %d MiB of the endless body", n>>20)
	}
	// io.ReadAll grows its buffer by a quarter at a time for large bodies,
	// so reading 64 MiB allocates about five times that: bounded, not zero.
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 512<<20 {
		t.Errorf("allocated %d MiB reading at most 64 MiB", alloc>>20)
	}
}

// On the real clock, a plain attempt's timeout is its context's deadline:
// a provider that never answers is cut at PerAttemptTimeout and retried,
// and a caller's deadline that comes first ends the call instead.
func TestAttemptTimeoutOnTheRealClock(t *testing.T) {
	hang := func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }
	p := damper.Policy{PerAttemptTimeout: 5 * time.Second}
	t.Run("cut and retried", func(t *testing.T) {
		srv := &rawServer{handlers: []http.HandlerFunc{hang, okHandler}}
		_, rep, err := callIn(t, p, srv, "claude-sonnet-4-5")
		if err != nil || rep.Attempts != 2 {
			t.Fatalf("err %v, %d attempts; want an answer on the second", err, rep.Attempts)
		}
		if a := rep.AttemptLog[0]; a.Kind != "timeout" || a.Duration != 5*time.Second {
			t.Errorf("first attempt %+v, want a timeout after exactly 5s", a)
		}
	})
	t.Run("the caller's deadline first", func(t *testing.T) {
		srv := &rawServer{handlers: []http.HandlerFunc{hang, okHandler}}
		synctest.Test(t, func(t *testing.T) {
			client := memClient(newDamper(t, p), srv)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			var rep damper.Report
			start := time.Now()
			_, err := client.Messages.New(ctx, params("claude-sonnet-4-5"), damper.ReportInto(&rep))
			if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, damper.ErrAttemptTimeout) || rep.Attempts != 1 || time.Since(start) != 3*time.Second {
				t.Errorf("err %v after %v, report %+v; want the caller's deadline after 3s, one attempt", err, time.Since(start), rep)
			}
		})
	})
}

// When the caller's deadline comes before the attempt's timeout, an attempt
// runs in the caller's own context, with no context of its own: failures
// are retried as ever, and the answer comes whole.
func TestAttemptInTheCallersContext(t *testing.T) {
	overloaded := errorStatus(529, strings.NewReader(`{"type":"error","error":{"type":"overloaded_error","message":"busy"}}`))
	srv := &rawServer{handlers: []http.HandlerFunc{overloaded, errorStatus(500, strings.NewReader(`{}`)), okHandler}}
	synctest.Test(t, func(t *testing.T) {
		client := memClient(newDamper(t, damper.Policy{}), srv)
		var rep damper.Report
		msg, err := client.Messages.New(context.Background(), params("claude-sonnet-4-5"),
			option.WithRequestTimeout(defaults.PerAttemptTimeout/2), damper.ReportInto(&rep))
		if err != nil || msg.ID != "msg_ok" || rep.Attempts != 3 || rep.Outcome != damper.OutcomeSuccess {
			t.Fatalf("message %v, err %v, report %+v; want the answer on the third attempt", msg, err, rep)
		}
		if k0, k1 := rep.AttemptLog[0].Kind, rep.AttemptLog[1].Kind; k0 != "overloaded" || k1 != "server_error" {
			t.Errorf("attempts failed as %q and %q, want overloaded and server_error", k0, k1)
		}
	})
}

// An attempt in the caller's own context, with a middleware after Damper's
// that rewrites the request in place, body and GetBody too, as a
// platform's does: a retry still reaches it as the SDK built the request.
func TestAttemptInTheCallersContextWithAMiddlewareAfter(t *testing.T) {
	overloaded := errorStatus(529, strings.NewReader(`{"type":"error","error":{"type":"overloaded_error","message":"busy"}}`))
	srv := &rawServer{handlers: []http.HandlerFunc{overloaded, okHandler}}
	type seen struct{ path, rewritten, body string }
	var got []seen
	rewriter := option.WithMiddleware(func(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		body, _ := io.ReadAll(req.Body)
		got = append(got, seen{req.URL.Path, req.Header.Get("X-Rewritten"), string(body)})
		rewritten := []byte(`{"rewritten":true}`)
		req.Body = io.NopCloser(bytes.NewReader(rewritten))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(rewritten)), nil }
		req.ContentLength = int64(len(rewritten))
		req.URL.Path = "/rewritten"
		req.Header.Set("X-Rewritten", "yes")
		return next(req)
	})
	synctest.Test(t, func(t *testing.T) {
		client := anthropic.NewClient(newDamper(t, damper.Policy{}).Option(), rewriter,
			option.WithBaseURL("http://api.invalid"), option.WithAPIKey("test-key"),
			option.WithHTTPClient(&http.Client{Transport: dampertest.Transport(srv)}),
			option.WithRequestTimeout(defaults.PerAttemptTimeout/2))
		if _, err := client.Messages.New(context.Background(), params("claude-sonnet-4-5")); err != nil {
			t.Fatal(err)
		}
	})
	if len(got) != 2 {
		t.Fatalf("the middleware saw %d attempts, want 2", len(got))
	}
	for i, s := range got {
		if s != got[0] || s.path != "/v1/messages" || s.rewritten != "" || !strings.Contains(s.body, `"model":"claude-sonnet-4-5"`) {
			t.Errorf("attempt %d reached the middleware as %+v, want the SDK's request, as attempt 1 did", i+1, s)
		}
	}
}
