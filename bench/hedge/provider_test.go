package hedge

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

func newRequest(t *testing.T, ctx context.Context, i int) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://provider.sim/v1/messages", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(requestHeader, strconv.Itoa(i))
	return req
}

func TestProviderAnswersAfterTheLatency(t *testing.T) {
	for _, after := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			p := newProvider(DefaultModel, 1, after)
			start := time.Now()
			res, err := p.RoundTrip(newRequest(t, context.Background(), 0))
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(res.Body)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := time.Since(start), DefaultModel.Latency(0, 1); got != want {
				t.Errorf("after headers %v: stream read in %v, want %v", after, got, want)
			}
			if !bytes.Equal(body, sse) {
				t.Errorf("after headers %v: body differs from the stream", after)
			}
			_ = res.Body.Close()
			if n := p.open.Load(); n != 0 {
				t.Errorf("after headers %v: %d bodies open after Close", after, n)
			}
		})
	}
}

func TestProviderHonoursCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newProvider(DefaultModel, 1, false)
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(100*time.Millisecond, cancel)
		start := time.Now()
		_, err := p.RoundTrip(newRequest(t, ctx, 0))
		if !errors.Is(err, context.Canceled) || time.Since(start) != 100*time.Millisecond {
			t.Errorf("cancelled before the headers: %v after %v, want context.Canceled after 100ms", err, time.Since(start))
		}
		if p.canceled.Load() != 1 {
			t.Errorf("canceled = %d, want 1", p.canceled.Load())
		}
	})
	synctest.Test(t, func(t *testing.T) {
		p := newProvider(DefaultModel, 1, true)
		ctx, cancel := context.WithCancel(context.Background())
		res, err := p.RoundTrip(newRequest(t, ctx, 0))
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, len(sse))
		n, err := res.Body.Read(buf)
		if err != nil || n != headSize {
			t.Fatalf("first read: %d bytes, %v; want message_start, %d bytes", n, err, headSize)
		}
		time.AfterFunc(100*time.Millisecond, cancel)
		start := time.Now()
		if _, err := res.Body.Read(buf); !errors.Is(err, context.Canceled) || time.Since(start) != 100*time.Millisecond {
			t.Errorf("cancelled after the headers: %v after %v, want context.Canceled after 100ms", err, time.Since(start))
		}
		_ = res.Body.Close()
		if p.open.Load() != 0 || p.canceled.Load() != 1 {
			t.Errorf("open %d, canceled %d; want 0 and 1", p.open.Load(), p.canceled.Load())
		}
	})
}

func TestModelQuantiles(t *testing.T) {
	m := DefaultModel
	if r := m.Quantile(0.99).Seconds() / m.Quantile(0.5).Seconds(); r < 9.5 || r > 10.5 {
		t.Errorf("p99/p50 = %.2f, want about 10", r)
	}
	if m.Quantile(0.95) > m.FastMax {
		t.Errorf("p95 %v beyond the fast range", m.Quantile(0.95))
	}
	slow := 0
	const n = 100000
	for i := range n {
		if m.Latency(i, 1) >= m.SlowMin {
			slow++
		}
	}
	if share := float64(slow) / n; share < 0.037 || share > 0.043 {
		t.Errorf("slow share %.4f, want about %.2f", share, 1-m.FastShare)
	}
}
