package engine

import (
	"context"
	"io"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go/dampertest"
)

// What the adaptive limit times: the provider's part of an attempt, from
// the request written to the answer's first byte (a stream's first
// content), not the process's own delays around it. The calls run in a
// synctest bubble, so every time is exact.

// latencyRound is one round of concurrent calls: the provider holds each
// answer for provider before its headers; the process waits before before
// the request is written (for a connection, for a busy CPU) and reading
// while it reads the body.
type latencyRound struct {
	provider, before, reading time.Duration
}

// slowProcess is the process's side of the exchange: a transport that
// waits before it hands the request on, and a body whose first read waits.
type slowProcess struct {
	rt    http.RoundTripper
	round *latencyRound // set between rounds
}

func (s *slowProcess) RoundTrip(req *http.Request) (*http.Response, error) {
	time.Sleep(s.round.before) // the bubble's clock
	res, err := s.rt.RoundTrip(req)
	if err == nil && s.round.reading > 0 {
		res.Body = &slowBody{ReadCloser: res.Body, wait: s.round.reading}
	}
	return res, err
}

type slowBody struct {
	io.ReadCloser
	wait time.Duration
}

func (b *slowBody) Read(p []byte) (int, error) {
	time.Sleep(b.wait)
	b.wait = 0
	return b.ReadCloser.Read(p)
}

// latencyLimit runs rounds of 10 calls at once (two rounds make a cohort
// of 20) under an adaptive limit of 10 that cannot grow, and returns the
// limit after them.
func latencyLimit(t *testing.T, p ConcurrencyPolicy, stream bool, rounds ...latencyRound) int {
	t.Helper()
	var got int
	synctest.Test(t, func(t *testing.T) {
		p.Adaptive, p.Initial, p.Max = true, 10, 10
		d, err := New(Policy{Concurrency: &p})
		if err != nil {
			t.Fatal(err)
		}
		proc := &slowProcess{round: new(latencyRound)}
		srv := dampertest.NewServer(dampertest.InMemory(), dampertest.WithStepFunc(func(dampertest.Request) dampertest.Step {
			step := dampertest.OK().WithDelay(proc.round.provider)
			if stream {
				step = step.WithStream(dampertest.Stream{Text: "a streamed answer"})
			}
			return step
		}))
		defer srv.Close()
		proc.rt = dampertest.Transport(srv.Handler())
		client := anthropic.NewClient(d.Option(), option.WithBaseURL(srv.URL()), option.WithAPIKey("test-key"),
			option.WithHTTPClient(&http.Client{Transport: proc}))
		r := &concRig{d: d}
		for i, round := range rounds {
			*proc.round = round
			var wg sync.WaitGroup
			for range 10 {
				wg.Go(func() {
					var err error
					if stream {
						s := client.Messages.NewStreaming(context.Background(), concParams())
						for s.Next() {
						}
						err = s.Err()
						s.Close()
					} else {
						_, err = client.Messages.New(context.Background(), concParams())
					}
					if err != nil {
						t.Errorf("round %d: %v", i+1, err)
					}
				})
			}
			wg.Wait()
		}
		r.assertNoneHeld(t)
		got = r.d.primary.conc.Slots()
	})
	return got
}

// The provider's time to the first byte stays 1 s while the process's own
// delays grow to 2 s before the request is written and 2 s while the body
// is read: the limit holds. Timed from the slot to the body's end, the
// attempts took 5 s, five times their best, and the limit was halved.
func TestConcurrencyLimitIgnoresTheProcesssDelays(t *testing.T) {
	quiet := latencyRound{provider: time.Second}
	busy := latencyRound{provider: time.Second, before: 2 * time.Second, reading: 2 * time.Second}
	if got := latencyLimit(t, ConcurrencyPolicy{}, false, quiet, quiet, busy, busy); got != 10 {
		t.Errorf("plain calls: limit %d after the process slowed, want 10", got)
	}
	// A stream is timed to its first content: the wait before the request
	// is written is left out.
	busy.reading = 0
	if got := latencyLimit(t, ConcurrencyPolicy{}, true, quiet, quiet, busy, busy); got != 10 {
		t.Errorf("streams: limit %d after the process slowed, want 10", got)
	}
}

// The provider's own time to the first byte grows from 1 s to 5 s: the
// limit shrinks as before, to 1.5 / 5 of itself, at most halved: 5. A
// stream's time to its first content does the same.
func TestConcurrencyLimitFollowsTheProvidersSlowdown(t *testing.T) {
	quiet := latencyRound{provider: time.Second}
	slow := latencyRound{provider: 5 * time.Second}
	for _, stream := range []bool{false, true} {
		if got := latencyLimit(t, ConcurrencyPolicy{}, stream, quiet, quiet, slow, slow); got != 5 {
			t.Errorf("stream %v: limit %d after the provider slowed 5 times, want 5", stream, got)
		}
	}
}

// Against a provider whose best is 1 ms, Slack (50 ms by default) lets
// attempts take up to 51 ms before the limit shrinks: jitter to 5 ms,
// five times the best, moves nothing, where Tolerance alone halved the
// limit. Beyond it, the limit shrinks to where the latency would be
// within it: 10 × 51 / 80 = 6.375.
func TestConcurrencyLimitSlack(t *testing.T) {
	quiet := latencyRound{provider: time.Millisecond}
	for _, tt := range []struct {
		name  string
		slack time.Duration
		then  time.Duration
		want  int
	}{
		{"jitter within the slack", 0, 5 * time.Millisecond, 10},
		{"beyond the slack", 0, 80 * time.Millisecond, 6},
		{"no slack", None, 5 * time.Millisecond, 5},
		{"a slack of 100 ms", 100 * time.Millisecond, 80 * time.Millisecond, 10},
	} {
		then := latencyRound{provider: tt.then}
		if got := latencyLimit(t, ConcurrencyPolicy{Slack: tt.slack}, false, quiet, quiet, then, then); got != tt.want {
			t.Errorf("%s: limit %d after the provider went from 1 ms to %v, want %d", tt.name, got, tt.then, tt.want)
		}
	}
}
