package damper

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// A Messages call's deadlines at the proxy: Damper-Timeout and
// X-Stainless-Timeout read from the request (requestTimeouts), and kept in
// a deadlineContext on the Damper's clock.

// The bounds of a call's deadline as a client states it.
const (
	// maxHeaderTimeout bounds Damper-Timeout and X-Stainless-Timeout.
	maxHeaderTimeout = 24 * time.Hour
	// minTimeout is the shortest Damper-Timeout: a shorter one would round
	// to no deadline at all.
	minTimeout = time.Millisecond
)

// deadlineContext is a call's context with a deadline on the Damper's
// clock, by which it weighs every wait. The deadline of the time to the
// answer's headers is lifted once they are sent, as an SDK stops its own
// timer when they come: the context then ends only with its parent.
type deadlineContext struct {
	context.Context // a cancelable context under the request's
	at              time.Time
	stop            func() bool
	cancelCause     context.CancelCauseFunc
	lifted          atomic.Bool
}

// withDeadline returns ctx with a deadline d from now on the Damper's clock.
func (p *Proxy) withDeadline(ctx context.Context, d time.Duration) *deadlineContext {
	inner, cancel := context.WithCancelCause(ctx)
	dc := &deadlineContext{Context: inner, at: p.d.e.Clock().Now().Add(d), cancelCause: cancel}
	dc.stop = p.d.e.Clock().AfterFunc(d, func() { cancel(context.DeadlineExceeded) })
	return dc
}

func (c *deadlineContext) Deadline() (time.Time, bool) {
	if c.lifted.Load() {
		return c.Context.Deadline()
	}
	return c.at, true
}

// Err is context.DeadlineExceeded once the deadline has passed, as for a
// context of the standard library's.
func (c *deadlineContext) Err() error {
	err := c.Context.Err()
	if err != nil && context.Cause(c.Context) == context.DeadlineExceeded {
		return context.DeadlineExceeded
	}
	return err
}

// lift removes the deadline, unless it has passed already.
func (c *deadlineContext) lift() {
	if c.stop() {
		c.lifted.Store(true)
	}
}

// cancel releases the context's timer and resources.
func (c *deadlineContext) cancel() {
	c.stop()
	c.cancelCause(context.Canceled)
}

// requestTimeouts reads the call's deadlines from the request's headers:
// Damper-Timeout's, of the whole call, and X-Stainless-Timeout's, of the
// time to the answer's headers; 0 means none.
func requestTimeouts(h http.Header) (whole, toHeaders time.Duration, err error) {
	whole, err = headerSeconds(h, headerTimeout, false)
	if err != nil {
		return 0, 0, err
	}
	toHeaders, err = headerSeconds(h, headerStainlessTimeout, true)
	return whole, toHeaders, err
}

// headerSeconds reads header name as a plain decimal number of seconds,
// from minTimeout to maxHeaderTimeout, or 0 when zero is allowed; 0 when
// the header is absent.
func headerSeconds(h http.Header, name string, zero bool) (time.Duration, error) {
	vs := h.Values(name)
	if len(vs) == 0 {
		return 0, nil
	}
	bad := func(why string) error {
		return fmt.Errorf("damper proxy: header %s is %s: %s", name, excerpt([]byte(vs[0])), why)
	}
	if len(vs) > 1 {
		return 0, bad("repeated: send it once")
	}
	v := strings.TrimSpace(vs[0])
	want := fmt.Sprintf("want a number of seconds from %g to %g, such as 30 or 2.5", minTimeout.Seconds(), maxHeaderTimeout.Seconds())
	if zero {
		want = fmt.Sprintf("want 0 or a number of seconds from %g to %g, such as 600", minTimeout.Seconds(), maxHeaderTimeout.Seconds())
	}
	if !isDecimal(v) {
		return 0, bad(want)
	}
	s, err := strconv.ParseFloat(v, 64)
	d := time.Duration(s * float64(time.Second))
	if err != nil || s > maxHeaderTimeout.Seconds() || d < minTimeout && !(zero && s == 0) {
		return 0, bad(want)
	}
	return d, nil
}

// isDecimal reports whether s is digits, with at most one "." between
// digits: no sign, exponent, NaN or Inf.
func isDecimal(s string) bool {
	digits, dot := 0, -1
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9':
			digits++
		case c == '.' && dot < 0 && digits > 0:
			dot = i
		default:
			return false
		}
	}
	return digits > 0 && dot != len(s)-1 && len(s) <= 32
}
