package damper

import (
	"errors"
	"io"
	"net/http"
	"sync"
	"time"
)

// What the proxy writes to its client as it comes: a stream handed on whole
// events at a time (passStream, eventEnds), and every write bounded by the
// write timeout (deadlineWriter).

// deadlineWriter is a client's response writer whose every write must be
// taken within d: a client that stops reading fails the write after it,
// and the call ends.
type deadlineWriter struct {
	w  http.ResponseWriter
	rc *http.ResponseController
	d  time.Duration
}

func (w *deadlineWriter) Write(b []byte) (int, error) {
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.d)) // not every writer has one
	return w.w.Write(b)
}

func (w *deadlineWriter) Flush() error { return w.rc.Flush() }

// streamBufs are the buffers streams are passed on with.
var streamBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// flushWriter is a client's response, flushed after each write of a
// stream.
type flushWriter interface {
	io.Writer
	Flush() error
}

// passStream copies a stream to the client as it comes, flushing each
// read, and passes on only whole events: when the stream fails, the part
// of an event read so far is dropped and an error event takes its place.
// The stream fails once an event passes maxEvent bytes, so the buffer
// never grows beyond that and one read. It returns when the stream ends or
// a write fails (the client has gone, or stopped reading). Once delivered
// reports that the stream's message_stop has been handed on, nothing but
// the stream's end follows at once: the last write is not flushed, so
// that the server sends it with the end and the trailer in one write, not
// two.
func passStream(w flushWriter, body io.Reader, maxEvent int, shape func([]byte) []byte, delivered func() bool) {
	flush := w.Flush
	pooled := streamBufs.Get().(*[]byte)
	defer streamBufs.Put(pooled)
	buf := *pooled
	var ends eventEnds
	held := 0 // buf[:held] is the start of an event
	for {
		if held == len(buf) { // an event longer than the buffer
			grow := max(min(held, maxEvent-held), len(*pooled))
			buf = append(buf[:held], make([]byte, grow)...)
		}
		n, err := body.Read(buf[held:])
		cut := ends.last(buf, held, held+n)
		if cut > 0 {
			if _, werr := w.Write(buf[:cut]); werr != nil {
				return // the client has gone; the call ends with its context
			}
			if !delivered() {
				_ = flush()
			}
		}
		held = copy(buf, buf[cut:held+n])
		switch {
		case err == io.EOF:
			if held > 0 { // what the stream ends with after its last event
				_, _ = w.Write(buf[:held])
				_ = flush()
			}
			return
		case err != nil:
			_, _ = w.Write(failureEvent(err, shape))
			_ = flush()
			return
		}
	}
}

// failureEvent is the error event for a stream that failed after its first
// content with err: the provider's own event when it sent one.
func failureEvent(err error, shape func([]byte) []byte) []byte {
	var ev *upstreamEvent
	if errors.As(err, &ev) {
		if shape != nil {
			return errorEvent(shape(ev.data))
		}
		return errorEvent(ev.data)
	}
	return errorEvent(errorBody("api_error", "damper proxy: "+err.Error()))
}

// eventEnds finds where a stream's events end: after an empty line, with
// "\n", "\r\n" or "\r" as line ends. It carries what it has seen from one
// read to the next.
type eventEnds struct {
	lineStart bool // the last byte seen ended a line
	cr        bool // the last byte seen was "\r"
}

// last scans b[from:to], which follows what it has seen, and returns the
// index in b just after the last event that ends in b[:to], or 0 if none
// ends in b[from:to].
func (e *eventEnds) last(b []byte, from, to int) int {
	cut := 0
	for i := from; i < to; i++ {
		switch b[i] {
		case '\n':
			if e.cr { // the "\n" of "\r\n": the line ended at "\r"
				e.cr = false
				if cut == i {
					cut = i + 1
				}
				continue
			}
			if e.lineStart {
				cut = i + 1
			}
			e.lineStart = true
		case '\r':
			if e.lineStart {
				cut = i + 1
			}
			e.lineStart, e.cr = true, true
		default:
			e.lineStart, e.cr = false, false
		}
	}
	return cut
}
