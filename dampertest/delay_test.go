package dampertest

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestDelayAdvancesFakeClock(t *testing.T) {
	clock := NewClock(t0)
	srv := NewServer(WithClock(clock))
	defer srv.Close()
	srv.Script("slow", OK().WithDelay(90*time.Second))

	msg, err := newClientPtr(srv).Messages.New(context.Background(), params(), Scenario("slow"))
	if err != nil || msg.Content[0].Text != "ok" {
		t.Fatalf("msg %v, err %v", msg, err)
	}
	if got := clock.Now().Sub(t0); got != 90*time.Second {
		t.Errorf("clock moved %v, want 90s", got)
	}
	if len(clock.Sleeps()) != 0 {
		t.Errorf("the server's delay shows in Sleeps: %v", clock.Sleeps())
	}
}

// TestDelayFiresClientTimeout is the per-attempt timeout of a client on the
// same fake clock: the delay fires it, the client gives up, and the server,
// over a real connection, notices within the grace, stops the clock there
// and sends nothing.
func TestDelayFiresClientTimeout(t *testing.T) {
	clock := NewClock(t0)
	srv := NewServer(WithClock(clock))
	defer srv.Close()
	srv.Script("slow", OK().WithDelay(120*time.Second))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := clock.AfterFunc(60*time.Second, cancel)
	defer stop()

	_, err := newClientPtr(srv).Messages.New(ctx, params(), Scenario("slow"))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if got := clock.Now().Sub(t0); got != 60*time.Second {
		t.Errorf("clock moved %v, want 60s: the client gave up then", got)
	}
}

func TestHold(t *testing.T) {
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name  string
		setup func(s *Server, ctx context.Context) context.Context
		want  bool
		moved time.Duration // of the fake clock, if any
	}{
		{
			name:  "fake clock, no timer: answers at once",
			setup: func(s *Server, ctx context.Context) context.Context { return ctx },
			want:  true, moved: time.Minute,
		},
		{
			name: "fake clock, timer ends the request: no answer",
			setup: func(s *Server, ctx context.Context) context.Context {
				ctx, cancel := context.WithCancel(ctx)
				s.clock.AfterFunc(time.Second, cancel)
				return ctx
			},
			want: false, moved: time.Second,
		},
		{
			// The one case that waits out the grace, kept short here.
			name: "fake clock, unrelated timer: answers after the grace",
			setup: func(s *Server, ctx context.Context) context.Context {
				s.grace = time.Millisecond
				s.clock.AfterFunc(time.Second, func() {})
				return ctx
			},
			want: true, moved: time.Minute,
		},
		{
			name: "sleep func error: no answer",
			setup: func(s *Server, ctx context.Context) context.Context {
				s.sleep = func(context.Context, time.Duration) error { return errors.New("stop") }
				return ctx
			},
			want: false,
		},
		{
			name: "sleep func gets the delay",
			setup: func(s *Server, ctx context.Context) context.Context {
				s.sleep = s.clock.Sleep
				return ctx
			},
			want: true, moved: time.Minute,
		},
		{
			name: "real time, request already gone",
			setup: func(s *Server, ctx context.Context) context.Context {
				s.clock = nil
				return canceled
			},
			want: false,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &Server{clock: NewClock(t0), grace: time.Hour, closing: make(chan struct{})}
			ctx := tt.setup(s, context.Background())
			clock := s.clock
			if got := s.hold(ctx, time.Minute); got != tt.want {
				t.Errorf("hold = %v, want %v", got, tt.want)
			}
			if clock != nil && clock.Now().Sub(t0) != tt.moved {
				t.Errorf("clock moved %v, want %v", clock.Now().Sub(t0), tt.moved)
			}
		})
	}
}

func TestHoldCutByClose(t *testing.T) {
	s := &Server{grace: time.Hour, closing: make(chan struct{})}
	close(s.closing)
	defer func() {
		if p := recover(); p != http.ErrAbortHandler {
			t.Errorf("recovered %v, want http.ErrAbortHandler", p)
		}
	}()
	s.hold(context.Background(), time.Hour) // real time, but the server is closing
	t.Error("hold returned")
}

func TestDelayRealTimeEndsWithRequest(t *testing.T) {
	defer goleak.VerifyNone(t)
	srv := NewServer()
	arrived := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		srv.Handler().ServeHTTP(w, r)
	})
	srv.Script("slow", OK().WithDelay(time.Hour))
	client := inMemoryClient(h)

	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-arrived
		cancel()
	}()
	_, err := client.Messages.New(ctx, params(), Scenario("slow"))
	if !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", err)
	}
	srv.Close()
}
