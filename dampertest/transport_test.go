package dampertest

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"go.uber.org/goleak"
)

// inMemoryClient returns an SDK client, retries off, that reaches h through
// Transport, with no network.
func inMemoryClient(h http.Handler) *anthropic.Client {
	c := anthropic.NewClient(
		option.WithBaseURL("http://dampertest.invalid"),
		option.WithAPIKey("test-key"),
		option.WithHTTPClient(&http.Client{Transport: Transport(h)}),
		option.WithMaxRetries(0),
	)
	return &c
}

func TestTransportPlainAndStreaming(t *testing.T) {
	defer goleak.VerifyNone(t)
	srv := NewServer()
	defer srv.Close()
	client := inMemoryClient(srv.Handler())

	srv.Script("plain", Status(529).RetryAfter("2"), OK().WithText("hello"))
	_, err := client.Messages.New(context.Background(), params(), Scenario("plain"))
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 529 || apiErr.Type() != "overloaded_error" ||
		apiErr.RequestID != "req_dampertest_plain_1" || apiErr.Response.Header.Get("retry-after") != "2" {
		t.Fatalf("err = %v", err)
	}
	msg, err := client.Messages.New(context.Background(), params(), Scenario("plain"))
	if err != nil || msg.Content[0].Text != "hello" {
		t.Fatalf("msg %v, err %v", msg, err)
	}

	st := Stream{Text: "streamed in memory", ChunkSize: 3, Pings: 1}
	srv.Script("stream", OK().WithStream(st))
	res := readStream(t, client, context.Background(), "stream", nil)
	if res.err != nil || res.msg.Content[0].Text != st.Text {
		t.Fatalf("text %q, err %v", res.msg.Content[0].Text, res.err)
	}
	if srv.Count("plain") != 2 || srv.Count("stream") != 1 {
		t.Errorf("counts %d %d", srv.Count("plain"), srv.Count("stream"))
	}
	if r := srv.Requests()[2]; r.Path != "/v1/messages" || !r.Stream || r.Header.Get("Authorization") != Redacted {
		t.Errorf("logged %+v", r)
	}
}

func TestTransportFaults(t *testing.T) {
	srv := NewServer()
	defer srv.Close()
	client := inMemoryClient(srv.Handler())
	ci := Stream{}.ContentIndex()

	tests := []struct {
		name string
		step Step
		want error
	}{
		{"drop before headers", OK().WithDrop(DropBeforeHeaders), io.EOF},
		{"drop mid body", OK().WithDrop(DropMidBody), io.ErrUnexpectedEOF},
		{"error drop mid body", Status(503).WithDrop(DropMidBody), io.ErrUnexpectedEOF},
		{"stream reset", OK().WithStream(Stream{Fault: FaultReset, At: ci + 1}), io.ErrUnexpectedEOF},
		{"stream drop mid body", OK().WithStream(Stream{Text: strings.Repeat("y", 64)}).WithDrop(DropMidBody), io.ErrUnexpectedEOF},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer goleak.VerifyNone(t, goleak.IgnoreCurrent()) // the parent's server stays up
			srv.Script(tt.name, tt.step)
			var err error
			if tt.step.Stream != nil {
				err = readStream(t, client, context.Background(), tt.name, nil).err
			} else {
				_, err = client.Messages.New(context.Background(), params(), Scenario(tt.name))
			}
			if !errors.Is(err, tt.want) {
				t.Errorf("err = %v, want %v", err, tt.want)
			}
		})
	}

	t.Run("stream error event", func(t *testing.T) {
		defer goleak.VerifyNone(t, goleak.IgnoreCurrent()) // the parent's server stays up
		srv.Script("ev", OK().WithStream(Stream{Fault: FaultErrorEvent, At: ci}))
		wantAPIError("overloaded_error", "req_dampertest_ev_1")(t, readStream(t, client, context.Background(), "ev", nil).err)
	})
	t.Run("stream truncated", func(t *testing.T) {
		defer goleak.VerifyNone(t, goleak.IgnoreCurrent()) // the parent's server stays up
		st := Stream{Fault: FaultTruncate}
		st.At = len(st.Events()) - 1
		srv.Script("tr", OK().WithStream(st))
		res := readStream(t, client, context.Background(), "tr", nil)
		if res.err != nil || res.types[len(res.types)-1] != "message_delta" {
			t.Errorf("events %v, err %v", res.types, res.err)
		}
	})
}

func TestTransportStallEndsWithContext(t *testing.T) {
	defer goleak.VerifyNone(t)
	srv := NewServer()
	defer srv.Close()
	client := inMemoryClient(srv.Handler())
	srv.Script("stall", OK().WithStream(Stream{Fault: FaultStall, At: Stream{}.ContentIndex() + 1}))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res := readStream(t, client, ctx, "stall", func(ev anthropic.MessageStreamEventUnion) {
		if ev.Type == "content_block_delta" {
			cancel()
		}
	})
	if !errors.Is(res.err, context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", res.err)
	}
}

func TestTransportBodyCloseStopsHandler(t *testing.T) {
	defer goleak.VerifyNone(t)
	srv := NewServer()
	defer srv.Close()
	client := inMemoryClient(srv.Handler())
	srv.Script("long", OK().WithStream(Stream{Text: strings.Repeat("z", 10000), ChunkSize: 1}))

	stream := client.Messages.NewStreaming(context.Background(), params(), Scenario("long"))
	if !stream.Next() {
		t.Fatal(stream.Err())
	}
	stream.Close() // the handler, blocked writing, must stop
}

func TestTransportDelayTimeoutOnFakeClock(t *testing.T) {
	defer goleak.VerifyNone(t)
	clock := NewClock(t0)
	srv := NewServer(WithClock(clock))
	defer srv.Close()
	srv.grace = time.Hour // in memory the cancellation is seen at once: no wait
	client := inMemoryClient(srv.Handler())
	srv.Script("slow", OK().WithDelay(2*time.Minute))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	defer clock.AfterFunc(time.Minute, cancel)()
	fired := false
	clock.AfterFunc(30*time.Second, func() { fired = true }) // unrelated: costs no wait in memory
	_, err := client.Messages.New(ctx, params(), Scenario("slow"))
	if !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", err)
	}
	if got := clock.Now().Sub(t0); got != time.Minute || !fired {
		t.Errorf("clock moved %v, want 1m, the client's timeout; other timer fired: %v", got, fired)
	}
}

// A ClientTrace in the request's context hears the request written once
// its body is read, and the first byte when the headers come, after the
// step's Delay.
func TestTransportClientTrace(t *testing.T) {
	defer goleak.VerifyNone(t)
	clock := NewClock(t0)
	srv := NewServer(WithClock(clock))
	defer srv.Close()
	client := inMemoryClient(srv.Handler())
	srv.Script("slow", OK().WithDelay(3*time.Second))
	var wrote, first []time.Duration
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		WroteRequest:         func(httptrace.WroteRequestInfo) { wrote = append(wrote, clock.Now().Sub(t0)) },
		GotFirstResponseByte: func() { first = append(first, clock.Now().Sub(t0)) },
	})
	if _, err := client.Messages.New(ctx, params(), Scenario("slow")); err != nil {
		t.Fatal(err)
	}
	if len(wrote) != 1 || wrote[0] != 0 || len(first) != 1 || first[0] != 3*time.Second {
		t.Errorf("written at %v, first byte at %v; want [0s] and [3s]", wrote, first)
	}
}

func TestTransportServesAnyHandler(t *testing.T) {
	defer goleak.VerifyNone(t)
	var seen *http.Request
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = r
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Echo", string(body))
		w.WriteHeader(http.StatusTeapot)
	})
	rt := Transport(h)
	req, _ := http.NewRequest("POST", "http://example.test/a/b?c=d", strings.NewReader("payload"))
	req.Header.Set("X-In", "1")
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusTeapot || resp.Status != "418 I'm a teapot" || resp.Header.Get("X-Echo") != "payload" || resp.Request != req {
		t.Errorf("response %d %q %v", resp.StatusCode, resp.Status, resp.Header)
	}
	if seen.RequestURI != "/a/b?c=d" || seen.Host != "example.test" || seen.Header.Get("X-In") != "1" || seen.URL.Host != "" {
		t.Errorf("handler saw %s %q host %q", seen.Method, seen.RequestURI, seen.Host)
	}
	if req.URL.String() != "http://example.test/a/b?c=d" || req.RequestURI != "" {
		t.Error("RoundTrip changed the caller's request")
	}

	// A handler that writes nothing answers 200 with an empty body.
	resp2, err := Transport(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})).RoundTrip(req.Clone(context.Background()))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp2.Body)
	resp2.Body.Close()
	if resp2.StatusCode != 200 || len(b) != 0 {
		t.Errorf("empty handler: %d %q", resp2.StatusCode, b)
	}
}

func TestTransportContextDoneBeforeCall(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://x.test/v1/messages", strings.NewReader("{}"))
	if _, err := Transport(http.NotFoundHandler()).RoundTrip(req); !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v", err)
	}
}
