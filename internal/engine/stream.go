package engine

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/damper-ai/damper-go/internal/sse"
)

// The rules a stream follows are in the package documentation, under
// Streams (damper.go).

// initialHold is the first size of the hold-back buffer; it doubles, up to
// Policy.MaxHoldBack, while no content has come.
const initialHold = 4 << 10

// holdBack takes a stream's response once its headers have arrived and
// reads it until its first content, which it releases to the caller with
// every event held before it; or until the attempt fails, whose failure it
// returns, the response closed.
func (a *attempt) holdBack(res *http.Response) attemptResult {
	c := a.c
	p := &c.d.policy
	b := &StreamBody{c: c, att: a, res: res, rc: res.Body, idle: p.StreamIdleTimeout}
	b.sc.TrackUsage = c.wantsUsage()
	b.sc.MaxEvent = p.MaxEventBytes
	fail := func(err error, f Failure) attemptResult {
		a.over()
		_ = b.rc.Close()
		f.Header, f.Err = res.Header, err
		return attemptResult{err: err, failure: &f}
	}
	held := make([]byte, 0, min(initialHold, p.MaxHoldBack))
	for {
		if len(held) == cap(held) {
			if len(held) >= p.MaxHoldBack {
				return fail(&Error{Reason: ErrHoldBackExceeded}, Failure{})
			}
			grown := make([]byte, len(held), min(2*cap(held), p.MaxHoldBack))
			copy(grown, held)
			held = grown
		}
		n, err := b.rc.Read(held[len(held):cap(held)])
		from := len(held)
		held = held[:from+n]
		for from < len(held) {
			k, kind := b.sc.Scan(held[from:])
			from += k
			switch kind {
			case sse.Held:
				if c.trace.gen != nil {
					if m := c.trace.heldModel(b.sc.EventData()); m != "" {
						b.model = m // message_start names the model
					}
				}
			case sse.Content, sse.MessageStop:
				if kind == sse.MessageStop {
					held = held[:from] // nothing after message_stop is read
				}
				return a.release(b, held, from, kind == sse.MessageStop, fail)
			case sse.ErrorEvent:
				data, _ := b.sc.EventData()
				return fail(c.client.EventError(res, data), Failure{Body: append([]byte(nil), data...)})
			case sse.TooLarge:
				return fail(&Error{Reason: ErrEventTooLarge}, Failure{})
			}
		}
		if err == nil {
			continue
		}
		if err != io.EOF {
			return fail(a.cause(bodyError{err}), Failure{})
		}
		// A last line without "\n" may still dispatch an event, as it
		// does for the SDK's decoder.
		switch b.sc.EOF() {
		case sse.Content:
			b.srcDone = true
			return a.release(b, held, len(held), false, fail)
		case sse.MessageStop:
			return a.release(b, held, len(held), true, fail)
		case sse.ErrorEvent:
			data, _ := b.sc.EventData()
			return fail(c.client.EventError(res, data), Failure{Body: append([]byte(nil), data...)})
		}
		return fail(errTruncated, Failure{})
	}
}

// release hands the stream to the caller: the held bytes, of which the
// first scanned have been scanned already, then the rest of the body.
func (a *attempt) release(b *StreamBody, held []byte, scanned int, complete bool, fail func(error, Failure) attemptResult) attemptResult {
	c := a.c
	if !a.stopTimer() {
		// The attempt's timer fired as the content came: the attempt is
		// over, and nothing has reached the caller yet.
		var err error = attemptTimeoutError{d: c.d.policy.PerAttemptTimeout}
		if c.ctx.Err() != nil {
			err = c.ctx.Err()
		}
		return fail(err, Failure{})
	}
	now := c.d.clock.Now()
	if a.race != nil && !a.race.claim() {
		lost := fail(errHedgeLost, Failure{})
		lost.firstAt = now
		return lost
	}
	first := now.Sub(c.start)
	c.report.firstContent(first)
	c.trace.firstChunkAt(first, b.model)
	b.held, b.skip = held, scanned
	b.noteUsage()
	b.complete.Store(complete)
	b.res.Body = b
	return attemptResult{res: b.res, stream: b, firstAt: now}
}

// stallError is a stream that sent nothing for the idle limit.
type stallError struct{ d time.Duration }

func (e stallError) Error() string {
	return fmt.Sprintf("damper: stream stalled: no data for %v", e.d)
}

func (e stallError) Is(target error) bool { return target == errStalled }

// Timeout reports true, as net.Error timeouts do.
func (stallError) Timeout() bool { return true }

// eventTooLargeError is a stream that sent an event larger than limit
// after its first content.
type eventTooLargeError struct{ limit int }

func (e eventTooLargeError) Error() string {
	return fmt.Sprintf("damper: stream sent an SSE event larger than %d bytes (MaxEventBytes)", e.limit)
}

func (eventTooLargeError) Is(target error) bool { return target == ErrEventTooLarge }

// maxErrorEvent bounds what Damper reads of an SSE error event after content
// before it gives up on the rest of it.
const maxErrorEvent = sse.MaxEventData + 64<<10

// StreamBody is the body of a stream whose first content has come. Read is
// called by one goroutine at a time (the SDK's decoder); Close may be called
// from any, the idle timer runs on the clock's, and contextDone on one of
// its own. The stream ends its attempt, then the call (finish).
type StreamBody struct {
	c   *call
	att *attempt // the attempt the stream is: it ends with the stream
	res *http.Response
	rc  io.ReadCloser
	sc  sse.Scanner

	model string // what message_start named, for the GenAI metrics

	// Used by Read only.
	held     []byte // bytes read before content, still to be returned
	skip     int    // bytes at the start of held scanned already
	errEvent bool   // an event named error is being read: it is withheld
	errRead  int    // bytes of it read so far
	withheld []byte // those bytes, for the caller if a later line renames the event
	scratch  []byte // buffer for the withheld error event
	srcDone  bool   // the source has returned io.EOF
	err      error  // the end of the stream, returned by every later Read

	complete  atomic.Bool // message_stop has been read from the source
	Delivered atomic.Bool // message_stop has been returned to the caller
	closed    atomic.Bool
	reading   atomic.Bool // a Read is under way
	ctxDone   atomic.Bool // the call's context has ended

	// The idle limit: a Read that waits on the source longer than idle
	// fails the stream.
	idle      time.Duration
	readSince atomic.Int64 // when the current Read began to wait (UnixNano); 0 when none waits
	stalled   atomic.Bool
	idleMu    sync.Mutex // guards the timers: the idle timer's state and stopWatch
	idleArmed bool       // requires idleMu
	idleOff   bool       // requires idleMu
	idleStop  func() bool
	stopWatch func() bool // stops the watch on the call's context (watch); requires idleMu

	// The answer's usage so far, for the rate limiter and the token
	// metrics: Read writes it, and the stream's end, on any goroutine,
	// reads it.
	usageMu     sync.Mutex
	usage       usage
	usageEvents int // the scanner's Usage().Events when usage was last kept; Read's only
}

// noteUsage keeps the usage the scanner has read so far, if it has read
// more since it was last kept: a lock only per usage event, not per event.
func (b *StreamBody) noteUsage() {
	if !b.sc.TrackUsage {
		return
	}
	u := b.sc.Usage()
	if u.Events == b.usageEvents {
		return
	}
	b.usageEvents = u.Events
	b.usageMu.Lock()
	b.usage = usage{input: u.Input, cacheCreation: u.CacheCreation, cacheRead: u.CacheRead, output: u.Output, known: u.Known}
	b.usageMu.Unlock()
}

// Read returns the held bytes, then the body's, scanning them for the end
// of the message and for error events. Once the call's context has ended,
// a stream whose message_stop the caller does not have yet ends with the
// context's error.
func (b *StreamBody) Read(p []byte) (int, error) {
	b.reading.Store(true)
	n, err := b.read(p)
	b.reading.Store(false)
	// contextDone leaves the end to a Read under way: this one.
	if b.ctxDone.Load() {
		b.endOnContext()
		b.c.report.publish()
	}
	return n, err
}

func (b *StreamBody) read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, b.err
	}
	if b.err == nil && b.ctxDone.Load() && !b.Delivered.Load() {
		b.err = b.c.ctx.Err()
	}
	for b.err == nil {
		switch {
		case b.errEvent:
			b.readErrorEvent()
		case len(b.held) > 0:
			n := copy(p, b.held)
			skip := min(b.skip, n)
			b.skip -= skip
			b.held = b.held[n:]
			if len(b.held) == 0 {
				b.held = nil // let the hold-back buffer go for the stream's life
			}
			wasComplete := b.complete.Load()
			m := b.pass(p[:n], skip)
			if !wasComplete && b.complete.Load() {
				b.held = nil // what follows message_stop is not read
			}
			if m > 0 {
				return b.handed(m), nil
			}
		case b.complete.Load() || b.srcDone:
			b.sourceEnd(io.EOF)
		default:
			n, err := b.readSource(p)
			m := b.pass(p[:n], 0)
			switch {
			case err == nil || b.complete.Load() || b.err != nil:
			case err == io.EOF:
				b.srcDone = true
			case b.errEvent:
				b.failErrorEvent()
			default:
				b.sourceEnd(err)
			}
			if m > 0 {
				return b.handed(m), nil
			}
		}
	}
	return 0, b.err
}

// handed notes that m bytes go to the caller, and returns m: with them the
// caller has the whole message once message_stop is among them.
func (b *StreamBody) handed(m int) int {
	if b.complete.Load() && len(b.held) == 0 && !b.errEvent {
		b.Delivered.Store(true)
	}
	return m
}

// readSource reads the body, under the idle limit when one is set.
func (b *StreamBody) readSource(p []byte) (int, error) {
	if b.idle <= 0 {
		return b.rc.Read(p)
	}
	b.readSince.Store(b.c.d.clock.Now().UnixNano())
	b.armIdle()
	n, err := b.rc.Read(p)
	b.readSince.Store(0)
	return n, err
}

// pass scans p[from:], which is about to reach the caller, and returns how
// much of p may: all of it, unless the message ends or an error event
// starts within it.
func (b *StreamBody) pass(p []byte, from int) int {
	for off := from; off < len(p); {
		k, kind := b.sc.Scan(p[off:])
		off += k
		switch kind {
		case sse.Held:
			b.noteUsage() // a message_delta's usage
		case sse.MessageStop:
			b.complete.Store(true)
			return off
		case sse.ErrorStarted:
			// The SDK has the line naming the event, but never gets the
			// empty line that would dispatch it.
			b.errEvent = true
			b.scanErrorEvent(p[off:])
			return off
		case sse.ErrorEvent:
			// A dispatch with no name line before it cannot happen;
			// withhold the event all the same.
			b.errEvent = true
			b.failErrorEvent()
			return from
		case sse.TooLarge:
			// The caller gets the event up to the limit, then the error.
			b.fail(eventTooLargeError{b.sc.MaxEvent}, Failure{})
			return off
		}
	}
	return len(p)
}

// scanErrorEvent reads q as part of a withheld error event. It fails the
// stream once the event is dispatched under that name; when a later line
// renames the event (the last name is the one the SDK acts on), it gives
// the withheld bytes back, with the rest of q, to be read on. It reports
// whether the event was settled either way.
func (b *StreamBody) scanErrorEvent(q []byte) bool {
	for off := 0; off < len(q); {
		k, kind := b.sc.Scan(q[off:])
		b.withheld = append(b.withheld, q[off:off+k]...)
		b.errRead += k
		off += k
		switch kind {
		case sse.None, sse.ErrorStarted:
		case sse.TooLarge:
			b.fail(eventTooLargeError{b.sc.MaxEvent}, Failure{})
			return true
		case sse.ErrorRenamed:
			back := append(append(b.withheld, q[off:]...), b.held...)
			b.held, b.skip = back, len(b.withheld)
			b.errEvent, b.errRead, b.withheld = false, 0, nil
			return true
		default:
			b.failErrorEvent()
			return true
		}
	}
	return false
}

// failErrorEvent fails the stream with the withheld error event, as far as
// it came.
func (b *StreamBody) failErrorEvent() {
	data, _ := b.sc.EventData()
	data = append([]byte(nil), data...)
	b.fail(b.c.client.EventError(b.res, data), Failure{Body: data})
}

// readErrorEvent reads the rest of a withheld error event, from held and
// then from the source, until it is settled.
func (b *StreamBody) readErrorEvent() {
	if len(b.held) > 0 {
		held := b.held
		b.held = nil
		if b.scanErrorEvent(held) {
			return
		}
	}
	if b.scratch == nil {
		b.scratch = make([]byte, 4<<10)
	}
	for b.err == nil && b.errEvent {
		if b.srcDone || b.errRead > maxErrorEvent {
			b.sc.EOF()
			if data, _ := b.sc.EventData(); len(data) == 0 || !b.sc.ErrorNamed() {
				b.fail(errTruncated, Failure{})
				return
			}
			b.failErrorEvent()
			return
		}
		n, err := b.readSource(b.scratch)
		if err == io.EOF {
			b.srcDone = true
		}
		if b.scanErrorEvent(b.scratch[:n]) {
			return
		}
		switch {
		case err == nil || err == io.EOF:
		case b.closed.Load() || b.c.ctx.Err() != nil || b.stalled.Load():
			b.sourceEnd(err)
		default:
			b.failErrorEvent()
		}
	}
}

// sourceEnd ends the stream when the source has ended or failed.
func (b *StreamBody) sourceEnd(err error) {
	switch {
	case b.complete.Load():
		b.err = io.EOF
		b.end(OutcomeSuccess, nil, nil)
	case err == io.EOF:
		switch b.sc.EOF() {
		case sse.MessageStop:
			b.complete.Store(true)
			b.Delivered.Store(true)
			b.err = io.EOF
			b.end(OutcomeSuccess, nil, nil)
			return
		}
		b.fail(errTruncated, Failure{})
	case b.closed.Load():
		b.err = err
	case b.c.ctx.Err() != nil:
		b.err = err
		b.end(OutcomeCanceled, err, nil)
	case b.stalled.Load():
		b.fail(stallError{d: b.idle}, Failure{})
	default:
		b.fail(err, Failure{})
	}
}

// fail ends the stream with a failure after content: ambiguous.
func (b *StreamBody) fail(last error, f Failure) {
	e := &Error{Reason: ErrAmbiguous, Last: last}
	b.err = e
	f.Header, f.Err, f.AfterContent = b.res.Header, last, true
	if f.Body != nil {
		f.Err = nil
	}
	b.end(OutcomeAmbiguous, e, &f)
}

// end ends the call with the stream, on the caller's goroutine (a Read or
// Close), and writes the report to the caller's sink.
func (b *StreamBody) end(outcome Outcome, err error, f *Failure) {
	b.finish(outcome, err, f)
	b.c.report.publish()
	if e, ok := err.(*Error); ok {
		e.Report = b.c.report.snapshot()
	}
}

// finish ends the stream, and with it the call, once (see call.end): the
// first of the stream's end, Close and the end of the call's context stops
// the stream's timers, closes its body, ends its attempt, whose record is
// the answer's or, after a failure f, the failure's as classified, and
// then the call.
func (b *StreamBody) finish(outcome Outcome, err error, f *Failure) {
	c := b.c
	if !c.ending.begin() {
		return
	}
	defer c.ending.done()
	b.idleMu.Lock()
	b.idleOff = true
	if b.idleStop != nil {
		b.idleStop()
	}
	if b.stopWatch != nil {
		b.stopWatch()
	}
	b.idleMu.Unlock()
	_ = b.rc.Close()
	b.usageMu.Lock()
	u := b.usage
	b.usageMu.Unlock()
	b.att.settleEnd(u)
	c.trace.streamUsage(u, b.complete.Load())
	c.report.usage(u)
	if f == nil {
		b.att.end(succeeded(b.res))
	} else {
		ar := failed(f, c.d.classify(*f))
		ar.StatusCode = b.res.StatusCode
		if f.Err == nil {
			ar.Err = err.Error() // an SSE error event: the error built from it
		}
		b.att.end(ar)
	}
	c.close(outcome)
}

// watch ends the stream when the call's context ends, between its caller's
// reads (contextDone), from now until the stream's end.
func (b *StreamBody) watch() {
	stop := context.AfterFunc(b.c.ctx, b.contextDone)
	b.idleMu.Lock()
	if b.idleOff {
		stop() // the stream has ended already
	} else {
		b.stopWatch = stop
	}
	b.idleMu.Unlock()
}

// Close closes the body. Closed before the caller has the whole message,
// the stream's call ends as canceled.
func (b *StreamBody) Close() error {
	b.closed.Store(true)
	err := b.rc.Close()
	if b.Delivered.Load() {
		b.end(OutcomeSuccess, nil, nil)
	} else {
		b.end(OutcomeCanceled, nil, nil)
	}
	return err
}

// contextDone runs when the call's context ends. It ends the call unless a
// Read is under way, which then ends it itself: the outcome depends on
// whether that Read hands the caller message_stop. It leaves the report to
// the caller's next Read or Close.
func (b *StreamBody) contextDone() {
	b.ctxDone.Store(true)
	if !b.reading.Load() {
		b.endOnContext()
	}
}

// endOnContext ends the call of a stream whose context has ended: a success
// if the caller has the whole message, else canceled.
func (b *StreamBody) endOnContext() {
	if b.Delivered.Load() {
		b.finish(OutcomeSuccess, nil, nil)
	} else {
		b.finish(OutcomeCanceled, b.c.ctx.Err(), nil)
	}
}

// armIdle starts the idle timer unless it runs.
func (b *StreamBody) armIdle() {
	b.idleMu.Lock()
	defer b.idleMu.Unlock()
	if !b.idleArmed && !b.idleOff {
		b.idleArmed = true
		b.idleStop = b.c.d.clock.AfterFunc(b.idle, b.checkIdle)
	}
}

// checkIdle runs when the idle timer fires: it fails a Read that has waited
// the whole limit, and otherwise waits for what is left of it. A timer that
// finds no Read waiting stops; the next Read starts it again.
func (b *StreamBody) checkIdle() {
	now := b.c.d.clock.Now()
	b.idleMu.Lock()
	defer b.idleMu.Unlock()
	b.idleArmed = false
	since := b.readSince.Load()
	if b.idleOff || since == 0 {
		return
	}
	waited := now.Sub(time.Unix(0, since))
	if waited >= b.idle {
		b.stalled.Store(true)
		b.att.cancel(stallError{d: b.idle})
		return
	}
	b.idleArmed = true
	b.idleStop = b.c.d.clock.AfterFunc(b.idle-waited, b.checkIdle)
}
