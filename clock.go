package damper

import (
	"context"
	"time"
)

// Clock is the source of time for every wait and timeout Damper starts.
// The default is the real clock; a virtual one (such as the one in package
// dampertest) makes tests and simulations exact and keeps them from
// sleeping. Implementations must be safe for concurrent use.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// Sleep waits for d, or until ctx is done, and then returns ctx.Err().
	Sleep(ctx context.Context, d time.Duration) error
	// AfterFunc calls f once d has passed, unless stop is called first;
	// stop reports whether it prevented the call.
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

// realClock is the wall clock.
type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func (realClock) AfterFunc(d time.Duration, f func()) func() bool {
	return time.AfterFunc(d, f).Stop
}
