package damper

import (
	"context"
	"io"
	"net/http"
)

// streamAttempt takes a stream's response once its headers have arrived.
func (c *call) streamAttempt(res *http.Response, stop func() bool, cancel context.CancelCauseFunc, cause func(error) error) attemptResult {
	stop()
	res.Body = &cancelOnClose{ReadCloser: res.Body, cancel: cancel}
	return attemptResult{res: res}
}

// cancelOnClose ends the attempt's context when the caller closes the body.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelCauseFunc
}

func (b *cancelOnClose) Close() error {
	err := b.ReadCloser.Close()
	b.cancel(nil)
	return err
}
