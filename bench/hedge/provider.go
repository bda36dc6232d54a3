package hedge

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/damper-ai/damper-go/dampertest"
)

// requestHeader carries the index of the logical request an attempt
// belongs to, which with the attempt's rank picks its latency.
const requestHeader = "X-Sim-Request"

// provider is the simulated Messages API: an in-memory http.RoundTripper
// that answers every request with the same SSE stream after the latency its
// Model draws for it. It must be used inside a synctest bubble, where its
// timers run on the bubble's virtual clock.
type provider struct {
	model Model
	// afterHeaders sends the headers and message_start after the model's
	// Headers time, and the first content after its Latency; otherwise
	// everything comes after its Latency.
	afterHeaders bool

	attempts []atomic.Int32 // per logical request, by index
	// servedBy is, per logical request, the rank of the attempt whose
	// stream was read whole.
	servedBy []atomic.Int32
	canceled atomic.Int64 // attempts whose context ended before their content
	open     atomic.Int64 // response bodies not yet closed
}

// newProvider returns a provider for requests logical requests.
func newProvider(m Model, requests int, afterHeaders bool) *provider {
	return &provider{model: m, afterHeaders: afterHeaders, attempts: make([]atomic.Int32, requests), servedBy: make([]atomic.Int32, requests)}
}

// sse is every answer: a short text in a few deltas; headSize is the
// size of its message_start, and deltas the number of its
// content_block_delta events.
var sse, headSize, deltas = func() ([]byte, int, int) {
	var b bytes.Buffer
	head, n := 0, 0
	for _, e := range (dampertest.Stream{Text: "a short answer in a few deltas", ChunkSize: 8}).Events() {
		b.WriteString(e.String())
		switch e.Name {
		case "message_start":
			head = b.Len()
		case "content_block_delta":
			n++
		}
	}
	return b.Bytes(), head, n
}()

// RoundTrip implements http.RoundTripper.
func (p *provider) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		_, _ = io.Copy(io.Discard, req.Body)
		_ = req.Body.Close()
	}
	ctx := req.Context()
	i, err := strconv.Atoi(req.Header.Get(requestHeader))
	if err != nil || i < 0 || i >= len(p.attempts) {
		return nil, fmt.Errorf("hedge: attempt without a valid %s header", requestHeader)
	}
	n := int(p.attempts[i].Add(1))
	wait := p.model.Latency(i, n)

	b := &body{p: p, req: i, rank: n, ctx: ctx, closed: make(chan struct{}), data: sse}
	if p.afterHeaders {
		headers := p.model.Headers(i, n)
		if err := sleep(ctx, headers); err != nil {
			p.canceled.Add(1)
			return nil, err
		}
		t := time.NewTimer(wait - headers)
		b.hold, b.due, b.stop = headSize, t.C, t.Stop
	} else if err := sleep(ctx, wait); err != nil {
		p.canceled.Add(1)
		return nil, err
	}
	p.open.Add(1)
	h := http.Header{}
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Request-Id", "req_sim_"+strconv.Itoa(i))
	return &http.Response{
		Status:        "200 OK",
		StatusCode:    http.StatusOK,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        h,
		Body:          b,
		ContentLength: -1,
		Request:       req,
	}, nil
}

// sleep waits for d or until ctx ends, and returns ctx's error in the
// second case.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// errBodyClosed is a read of a body after its Close.
var errBodyClosed = errors.New("hedge: read on closed response body")

// body is an answer's stream. Its first hold bytes are readable at once,
// the rest once due fires (nil: at once). As a network body does, it fails
// when the request's context ends, and a Close unblocks a Read.
type body struct {
	p         *provider
	req, rank int
	ctx       context.Context
	data      []byte
	hold      int
	due       <-chan time.Time // touched by Read alone
	stop      func() bool      // stops due's timer
	closed    chan struct{}
	once      sync.Once
}

func (b *body) Read(out []byte) (int, error) {
	select {
	case <-b.closed:
		return 0, errBodyClosed
	default:
	}
	if b.hold == 0 && b.due != nil {
		select {
		case <-b.due:
			b.due = nil
		case <-b.ctx.Done():
		case <-b.closed:
			return 0, errBodyClosed
		}
	}
	if err := b.ctx.Err(); err != nil {
		if b.due != nil {
			b.due = nil
			b.p.canceled.Add(1)
		}
		return 0, err
	}
	if len(b.data) == 0 {
		return 0, io.EOF
	}
	n := len(b.data)
	if b.due != nil {
		n = b.hold
	}
	n = copy(out, b.data[:n])
	b.data = b.data[n:]
	if len(b.data) == 0 {
		b.p.servedBy[b.req].Store(int32(b.rank))
	}
	if b.due != nil {
		b.hold -= n
	}
	return n, nil
}

func (b *body) Close() error {
	b.once.Do(func() {
		close(b.closed)
		if b.stop != nil {
			b.stop()
		}
		b.p.open.Add(-1)
	})
	return nil
}
