package damper_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// FuzzPolicyFile: any policy file that ParsePolicyYAML or ParsePolicyJSON
// accepts makes a Damper, and that Damper's first call, plain or
// streamed, ends: no panic, no hang, and no more attempts than the policy
// allows. The fake API answers the first attempt 529 and the next ones
// 200, so that the call retries through every gate the file sets up. The
// seeds are in testdata/fuzz/FuzzPolicyFile.
func FuzzPolicyFile(f *testing.F) {
	f.Fuzz(func(t *testing.T, doc []byte, stream bool) {
		for _, parse := range []struct {
			name string
			fn   func([]byte) (damper.Policy, error)
		}{{"yaml", damper.ParsePolicyYAML}, {"json", damper.ParsePolicyJSON}} {
			p, err := parse.fn(doc)
			if err != nil {
				if ce := (*damper.ConfigError)(nil); !errors.As(err, &ce) {
					t.Fatalf("%s: error %v is not a *ConfigError", parse.name, err)
				}
				continue
			}
			callOnce(t, parse.name, p, stream)
		}
	})
}

// callOnce makes one call through a Damper of policy p, on a virtual
// clock, and fails the test if it hangs or sends a wrong number of
// attempts.
func callOnce(t *testing.T, name string, p damper.Policy, stream bool) {
	t.Helper()
	// In the future, so that the call's deadline, taken from this clock,
	// does not pass in real time while the call runs.
	clk := dampertest.NewClock(time.Now().Truncate(time.Minute).Add(time.Minute))
	srv := dampertest.NewServer(dampertest.InMemory(), dampertest.WithClock(clk))
	defer srv.Close()
	srv.Script("", dampertest.Status(529), dampertest.OK())
	d, err := damper.New(p, damper.WithClock(clk), damper.WithRand(half))
	if err != nil {
		t.Fatalf("%s: parsed %+v, which New rejects: %v", name, p, err)
	}
	client := anthropic.NewClient(append([]option.RequestOption{d.Option(), option.WithMaxRetries(0)}, srv.Options()...)...)

	// The deadline bounds the call on the virtual clock: every wait the
	// policy makes (backoff, provider delay, rate limiter) moves that clock.
	ctx, cancel := context.WithDeadline(context.Background(), clk.Now().Add(time.Hour))
	defer cancel()
	done := make(chan error, 1)
	go func() {
		if !stream {
			_, err := client.Messages.New(ctx, params("claude-sonnet-4-5"))
			done <- err
			return
		}
		s := client.Messages.NewStreaming(ctx, params("claude-sonnet-4-5"))
		for s.Next() {
		}
		err := s.Err()
		s.Close()
		done <- err
	}()
	var callErr error
	select {
	case callErr = <-done:
	case <-time.After(30 * time.Second): // real time: the call should take none
		t.Fatalf("%s: the call of policy %+v (stream %v) did not end", name, p, stream)
	}
	n, most := srv.Count(""), d.Policy().MaxAttempts
	switch {
	case n < 1 || n > most:
		t.Fatalf("%s: %d attempts for a policy of at most %d", name, n, most)
	case callErr == nil && n < 2:
		t.Fatalf("%s: success after %d attempts; the first one failed", name, n)
	}
}
