package damper

import (
	"bytes"
	"errors"
	"fmt"
	"github.com/damper-ai/damper-go/internal/engine"
	"net/http"
)

// The proxy's side of the call: its ClientAdapter (proxyClient), whose
// errors keep the provider's answer to write back, and its transport to the
// upstream, which never relays a protocol switch (noSwitch).

// errSwitched is the failure of an upstream that answered 101 Switching
// Protocols: the proxy asks for no switch, and relaying one would open a
// tunnel through it.
var errSwitched = errors.New("the upstream answered 101 Switching Protocols, which the proxy never relays")

// noSwitch is the transport of a Proxy: its own, that fails a 101 answer
// (errSwitched) and closes its connection, on every path.
type noSwitch struct{ rt http.RoundTripper }

func (t noSwitch) RoundTrip(r *http.Request) (*http.Response, error) {
	res, err := t.rt.RoundTrip(r)
	if err == nil && res.StatusCode == http.StatusSwitchingProtocols {
		engine.CloseBody(res)
		return nil, errSwitched
	}
	return res, err
}

// newProxyTransport returns the transport a Proxy uses by default:
// http.DefaultTransport's settings, but for idle connections to the
// upstream: 256 kept rather than 2, so that a proxy serving many calls at
// once reuses its connections (and their TLS sessions) instead of opening
// one per call.
func newProxyTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = 256
	t.MaxIdleConnsPerHost = 256
	return t
}

// proxyClient reports the provider's errors as values the proxy writes
// back as they came.
var proxyClient = engine.ClientAdapter{
	StatusError: func(_ *http.Request, res *http.Response, body []byte) error {
		return &upstreamStatus{status: res.StatusCode, header: res.Header.Clone(), body: bytes.Clone(body)}
	},
	EventError: func(_ *http.Response, data []byte) error {
		return &upstreamEvent{data: bytes.Clone(data)}
	},
}

// upstreamStatus is a provider's answer with an error status.
type upstreamStatus struct {
	status int
	header http.Header
	body   []byte
}

func (e *upstreamStatus) Error() string {
	return fmt.Sprintf("the upstream answered %d: %s", e.status, bytes.TrimSpace(e.body))
}

// upstreamEvent is a provider's SSE error event.
type upstreamEvent struct{ data []byte }

func (e *upstreamEvent) Error() string {
	return "the upstream's stream sent an error event: " + string(e.data)
}
