package brownout

import (
	"context"
	"time"
)

// deadlineCtx is a caller's context whose deadline is in virtual time. It
// embeds a standard cancelable context, so contexts derived from it are
// cancelled synchronously (no watcher goroutine) when the scheduler ends it.
type deadlineCtx struct {
	context.Context
	deadline time.Time
	expired  bool
}

func newDeadlineCtx(deadline time.Time) (*deadlineCtx, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	return &deadlineCtx{Context: ctx, deadline: deadline}, cancel
}

func (c *deadlineCtx) Deadline() (time.Time, bool) { return c.deadline, true }

// Err reports DeadlineExceeded, as a real deadline would, once expired.
func (c *deadlineCtx) Err() error {
	err := c.Context.Err()
	if err != nil && c.expired {
		return context.DeadlineExceeded
	}
	return err
}
