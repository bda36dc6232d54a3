package damper

import (
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// The headers of the proxy: those it reads and writes (Damper-*), those of
// one connection that it never passes on (hop-by-hop), and the report's
// headers on every answer to a Messages call.

// Headers the proxy reads and writes (see [Proxy]).
const (
	headerTimeout          = "Damper-Timeout"
	headerStainlessTimeout = "X-Stainless-Timeout"
	headerAttempts         = "Damper-Attempts"
	headerOutcome          = "Damper-Outcome"
	headerRetryCost        = "Damper-Retry-Cost-Usd"
	headerBackend          = "Damper-Backend"
)

// hopHeaders are the headers of one connection, which a proxy does not pass
// on (RFC 9110, section 7.6.1).
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// upstreamHeader is the header of a Messages call's attempts: the client's,
// less what belongs to its connection and to the proxy. Accept-Encoding
// is left to the transport, which then decodes the answer Damper reads.
func upstreamHeader(in http.Header) http.Header {
	h := in.Clone()
	removeHopHeaders(h)
	h.Del("Accept-Encoding")
	h.Del(headerTimeout)
	return h
}

func removeHopHeaders(h http.Header) {
	for _, f := range h["Connection"] {
		for name := range strings.SplitSeq(f, ",") {
			if name = strings.TrimSpace(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, k := range hopHeaders {
		h.Del(k)
	}
}

// copyHeader adds the end-to-end headers of src to dst, with the upstream's
// x-should-retry dropped: the proxy decides what the client retries.
func copyHeader(dst, src http.Header) {
	for k, v := range src {
		dst[k] = append(dst[k], v...)
	}
	removeHopHeaders(dst)
	dst.Del("X-Should-Retry")
}

// reportHeader sets the Damper-* headers of rep so far, and of the
// backend that answered, if any. It comes after the upstream's headers are
// copied: an upstream's own Damper-* headers (another proxy's) give way.
func reportHeader(h http.Header, rep *Report, backend string) {
	if backend != "" {
		h.Set(headerBackend, backend)
	}
	h.Set(headerAttempts, strconv.Itoa(rep.Attempts))
	h.Set(headerRetryCost, strconv.FormatFloat(rep.RetryCostUSD, 'f', -1, 64))
	if rep.Outcome != "" {
		h.Set(headerOutcome, string(rep.Outcome))
	}
}

// answeredBy is the backend whose answer a Messages call's client gets, as
// its report, rep, names it after err: the backend the call ended on, or,
// for a provider's error passed on after a refusal, the backend of the
// attempt that got it; "" when no call was made.
func answeredBy(err error, rep *Report) string {
	if rep.Provider == "" {
		return ""
	}
	if err == nil {
		return rep.Backend // before the targets of errors.As, which go to the heap
	}
	var up *upstreamStatus
	var ev *upstreamEvent
	if errors.As(err, &up) || errors.As(err, &ev) {
		for _, a := range slices.Backward(rep.AttemptLog) {
			if !a.Lost {
				return a.Backend
			}
		}
	}
	return rep.Backend
}
