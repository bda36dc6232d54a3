package damper_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

const okMessage = `{"id":"msg_ok","type":"message","role":"assistant","model":"claude-dampertest","content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","usage":{"input_tokens":1,"output_tokens":1}}`

// loopbackClient is a client through a Damper on a virtual clock (so no
// backoff waits) to base over real sockets.
func loopbackClient(t *testing.T, base string) (anthropic.Client, *damper.Damper) {
	t.Helper()
	clk := dampertest.NewClock(time.Now().Truncate(time.Minute).Add(time.Minute))
	d, err := damper.New(damper.Policy{}, damper.WithClock(clk), damper.WithRand(half))
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return anthropic.NewClient(d.Option(), option.WithBaseURL(base), option.WithAPIKey("test-key"),
		option.WithHTTPClient(&http.Client{Transport: tr})), d
}

// rawHTTP answers the first connection's request with raw bytes, closing
// the connection after them, and every later request with ok.
func rawHTTP(t *testing.T, raw string, ok func(w *bufio.Writer)) (string, *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var requests atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			r := bufio.NewReader(conn)
			for {
				req, err := http.ReadRequest(r)
				if err != nil {
					break
				}
				_, _ = io.Copy(io.Discard, req.Body)
				w := bufio.NewWriter(conn)
				if requests.Add(1) == 1 {
					_, _ = w.WriteString(raw)
					_ = w.Flush()
					break
				}
				ok(w)
				_ = w.Flush()
			}
			_ = conn.Close()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
	})
	return "http://" + ln.Addr().String(), &requests
}

func okPlain(w *bufio.Writer) {
	_, _ = w.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(okMessage)) + "\r\n\r\n" + okMessage)
}

func okStream(w *bufio.Writer) {
	var b strings.Builder
	for _, e := range (dampertest.Stream{Text: "fine"}).Events() {
		b.WriteString(e.String())
	}
	_, _ = w.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: " + strconv.Itoa(b.Len()) + "\r\n\r\n" + b.String())
}

// A body whose chunked framing is corrupt, before any content, is a
// transport failure and is retried, as the SDK alone would retry it.
func TestCorruptChunkedBodyIsRetried(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run("stream="+strconv.FormatBool(stream), func(t *testing.T) {
			ctype, ok := "application/json", okPlain
			if stream {
				ctype, ok = "text/event-stream", okStream
			}
			base, requests := rawHTTP(t, "HTTP/1.1 200 OK\r\nContent-Type: "+ctype+"\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", ok)
			client, _ := loopbackClient(t, base)
			var rep damper.Report
			var err error
			if stream {
				_, err = drain(client.Messages.NewStreaming(context.Background(), streamParams(), damper.ReportInto(&rep)))
			} else {
				_, err = client.Messages.New(context.Background(), params("claude-sonnet-4-5"), damper.ReportInto(&rep))
			}
			if err != nil || rep.Attempts != 2 || rep.AttemptLog[0].Kind != "transport" || rep.AttemptLog[0].Class != damper.Retryable {
				t.Fatalf("err %v, report %+v; want a transport failure retried once", err, rep)
			}
			if n := requests.Load(); n != 2 {
				t.Fatalf("the server got %d requests, want 2", n)
			}
		})
	}
}

// A gzip body whose checksum is wrong (the transport decompresses it, as it
// asked for gzip itself) is retried likewise.
func TestBadGzipChecksumIsRetried(t *testing.T) {
	var zipped bytes.Buffer
	zw := gzip.NewWriter(&zipped)
	_, _ = zw.Write([]byte(okMessage))
	_ = zw.Close()
	bad := zipped.Bytes()
	bad[len(bad)-8] ^= 0xff // the CRC-32 of the trailer
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if requests.Add(1) == 1 {
			w.Header().Set("Content-Encoding", "gzip")
			_, _ = w.Write(bad)
			return
		}
		_, _ = io.WriteString(w, okMessage)
	}))
	defer srv.Close()
	client, _ := loopbackClient(t, srv.URL)
	var rep damper.Report
	msg, err := client.Messages.New(context.Background(), params("claude-sonnet-4-5"), damper.ReportInto(&rep))
	if err != nil || msg.ID != "msg_ok" || rep.Attempts != 2 || rep.AttemptLog[0].Kind != "transport" ||
		!strings.Contains(rep.AttemptLog[0].Err, gzip.ErrChecksum.Error()) {
		t.Fatalf("err %v, report %+v; want a gzip checksum failure retried once", err, rep)
	}
}

// A 200 whose body is not JSON is no success: the caller gets the SDK's
// own decoding error, the report says error, and the budget earns nothing.
func TestInvalidJSONIsNotASuccess(t *testing.T) {
	base, requests := rawHTTP(t, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 9\r\n\r\nnot json!", okPlain)
	client, d := loopbackClient(t, base)
	before, _ := d.Budget().Available(context.Background(), time.Now())
	var rep damper.Report
	_, err := client.Messages.New(context.Background(), params("claude-sonnet-4-5"), damper.ReportInto(&rep))
	if err == nil || !strings.Contains(err.Error(), "error parsing response json") {
		t.Fatalf("err = %v, want the SDK's JSON error", err)
	}
	if rep.Outcome != damper.OutcomeError || rep.Attempts != 1 || rep.AttemptLog[0].Kind != "invalid_response" || rep.AttemptLog[0].StatusCode != 200 {
		t.Fatalf("report %+v, want one attempt ending in error, kind invalid_response", rep)
	}
	if got, _ := d.Budget().Available(context.Background(), time.Now()); got != before {
		t.Errorf("budget balance %v after the call, want %v: an unusable answer earned a unit share", got, before)
	}
	if n := requests.Load(); n != 1 {
		t.Errorf("the server got %d requests, want 1", n)
	}
}

// An error body longer than Damper reads still reaches the caller as an
// *anthropic.Error with its type and message, the message cut where the
// body was when it is the message that is long.
func TestLongErrorBodyKeepsItsError(t *testing.T) {
	longMsg := `{"type":"error","error":{"type":"rate_limit_error","message":"` + strings.Repeat(`x\"é`, 700_000) + `"},"request_id":"req_long"}`
	longPad := `{"type":"error","error":{"type":"rate_limit_error","message":"slow down","details":{"error_code":"rate_limited"}},"request_id":"req_pad","pad":"` + strings.Repeat("p", 2<<20) + `"}`
	for _, tt := range []struct {
		name, body, prefix string
	}{
		{"long message", longMsg, `x"éx"é`},
		{"long padding", longPad, "slow down"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := &rawServer{handlers: []http.HandlerFunc{errorStatus(429, strings.NewReader(tt.body))}}
			_, rep, err := callIn(t, damper.Policy{MaxAttempts: 1}, srv, "claude-sonnet-4-5")
			var apiErr *anthropic.Error
			if !errors.As(err, &apiErr) || apiErr.StatusCode != 429 {
				t.Fatalf("err = %.300v, want the 429 as an *anthropic.Error", err)
			}
			if !strings.HasPrefix(apiErr.Message, tt.prefix) || string(apiErr.Type()) != "rate_limit_error" {
				t.Fatalf("message %.80q, type %q; want a message starting %q, type rate_limit_error", apiErr.Message, apiErr.Type(), tt.prefix)
			}
			if rep.AttemptLog[0].Kind != "rate_limited" {
				t.Errorf("kind %q, want rate_limited", rep.AttemptLog[0].Kind)
			}
		})
	}
}

// A middleware after Damper (a platform's signer, say) may change the
// first attempt's URL and headers in place: a retry is sent as the SDK
// built the request, with its whole body, not with those changes.
func TestRetryIsSentAsTheSDKBuiltIt(t *testing.T) {
	srv := dampertest.NewServer(dampertest.InMemory())
	defer srv.Close()
	srv.Script("", dampertest.Status(529), dampertest.Status(500), dampertest.OK())
	type seen struct {
		path, apiKey, added, auth string
		body                      int
	}
	var got []seen
	signer := option.WithMiddleware(func(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		body, _ := io.ReadAll(req.Body)
		req.Body = io.NopCloser(bytes.NewReader(body))
		got = append(got, seen{req.URL.Path, req.Header.Get("X-Api-Key"), req.Header.Get("X-Added"), req.Header.Get("Authorization"), len(body)})
		// Changes in place, as a signer or a rewriting middleware makes.
		req.URL.Path = "/rewritten" + req.URL.Path
		req.Header.Add("X-Added", "once")
		req.Header.Set("Authorization", "signature "+strconv.Itoa(len(got)))
		req.Header.Del("X-Api-Key")
		req.Header.Del("Authorization")
		req.Header.Set("Authorization", "signature "+strconv.Itoa(len(got)))
		req.URL.Path = strings.TrimPrefix(req.URL.Path, "/rewritten")
		return next(req)
	})
	clk := dampertest.NewClock(time.Now().Truncate(time.Minute).Add(time.Minute))
	d, err := damper.New(damper.Policy{}, damper.WithClock(clk), damper.WithRand(half))
	if err != nil {
		t.Fatal(err)
	}
	client := anthropic.NewClient(append([]option.RequestOption{d.Option(), signer}, srv.Options()...)...)
	params := anthropic.MessageNewParams{Model: "claude-sonnet-4-5", MaxTokens: 8,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(strings.Repeat("x", 5000)))}}
	if _, err := client.Messages.New(context.Background(), params); err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("the middleware saw %d attempts, want 3", len(got))
	}
	for i, s := range got {
		if s != got[0] || s.path != "/v1/messages" || s.added != "" || strings.HasPrefix(s.auth, "signature") || s.body < 5000 {
			t.Errorf("attempt %d reached the middleware as %+v, want what the SDK built, as attempt 1 did: %+v", i+1, s, got[0])
		}
	}
}

// With no middleware after Damper's, nothing changes the first attempt's
// request: a retry is sent with the same URL, headers and body.
func TestRetryWithNothingAfterDamperIsTheSame(t *testing.T) {
	srv := dampertest.NewServer(dampertest.InMemory())
	defer srv.Close()
	srv.Script("", dampertest.Status(529), dampertest.OK())
	clk := dampertest.NewClock(time.Now().Truncate(time.Minute).Add(time.Minute))
	d, err := damper.New(damper.Policy{}, damper.WithClock(clk), damper.WithRand(half))
	if err != nil {
		t.Fatal(err)
	}
	client := anthropic.NewClient(append([]option.RequestOption{d.Option(), option.WithHeader("X-Caller", "one")}, srv.Options()...)...)
	if _, err := client.Messages.New(context.Background(), params("claude-sonnet-4-5")); err != nil {
		t.Fatal(err)
	}
	reqs := srv.Requests()
	if len(reqs) != 2 {
		t.Fatalf("%d requests, want 2", len(reqs))
	}
	first, retry := reqs[0], reqs[1]
	if first.Path != retry.Path || !bytes.Equal(first.Body, retry.Body) || !reflect.DeepEqual(first.Header, retry.Header) {
		t.Errorf("the retry was sent as\n%s %v %s\nwant the first attempt's\n%s %v %s", retry.Path, retry.Header, retry.Body, first.Path, first.Header, first.Body)
	}
	if first.Header.Get("X-Caller") != "one" {
		t.Errorf("X-Caller = %q, want one", first.Header.Get("X-Caller"))
	}
}
