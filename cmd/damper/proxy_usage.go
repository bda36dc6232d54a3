package main

import (
	"cmp"
	"fmt"
	"io"
	"reflect"
	"strings"

	"github.com/damper-ai/damper-go/conf"
)

// proxyConfigKeys completes the settings of damper.ProxyConfig's keys,
// which the proxy's file inlines: the library declares their keys,
// defaults and bounds, the command their docs and flags, and upstream's
// default, the command's own.
var proxyConfigKeys = map[string]conf.Setting{
	"upstream":          {Flag: "upstream", Default: defaultProxyUpstream, Doc: "the API every request goes to, and nowhere else: an http or https URL with at most a path"},
	"max_request_bytes": {Flag: "max-request-bytes", Doc: "largest request body accepted; a larger one is answered with 413"},
	"write_timeout":     {Doc: "how long one write of an answer to a client may block: a client that stops reading its answer for this long has its call ended"},
}

// proxyKeys are the keys of the proxy's file, in the file's order, as the
// usage text lists them and the flags set them.
func proxyKeys() []conf.Setting {
	keys, err := conf.Settings(reflect.TypeFor[proxyFile]())
	if err != nil {
		panic(err) // tags that do not parse: TestProxyFileTags fails
	}
	for i, k := range keys {
		if more, ok := proxyConfigKeys[k.Key]; ok {
			keys[i].Flag, keys[i].Doc = more.Flag, more.Doc
			keys[i].Default = cmp.Or(more.Default, k.Default)
		}
	}
	return keys
}

// writeProxyUsage writes damper proxy's usage text but its flags: what it
// does, then every key of its file, each with its flag, default, bounds
// and doc.
func writeProxyUsage(w io.Writer, keys []conf.Setting) {
	fmt.Fprint(w, `Usage: damper proxy [flags]

Serves the Messages API through Damper, for services not written in Go:
point their SDK's base URL at the proxy (ANTHROPIC_BASE_URL). POST
/v1/messages, plain and streaming, gets Damper's retries, budget, breaker and
rate limiter; every other path passes through to the upstream unchanged.
Without tenants, clients send their own API key, which is forwarded and
never stored or logged, and the file may name no backend. With tenants,
every request must present a tenant's key as x-api-key or a bearer token
(else 401, and nothing is sent), and goes out with the operator's
credentials: upstream_api_key_env's key for the upstream, the backends'
own for them.

Also served: /healthz (the process is up), /readyz (it takes requests; 503
from SIGINT or SIGTERM on, through --shutdown-delay) and /metrics (Damper's
metrics, Prometheus text format; with tenants, for a tenant's key alone,
unless admin_listen serves it).

Every error response of a call says x-should-retry: false, so that the
client's SDK leaves retries to Damper, and carries Damper-Attempts,
Damper-Outcome and Damper-Retry-Cost-Usd. A client states the deadline of
its whole call with Damper-Timeout (seconds, such as 30 or 2.5). The
X-Stainless-Timeout the official SDKs send (their request timeout, 600 s
by default) bounds, as it does in the SDKs, only the time until the
answer's headers: for a stream, until its first content, never how long
it then runs.

What Damper decides on is checked before anything is sent: model (at most
256 characters of ASCII letters, digits and -._:@/), max_tokens (1 to
1,000,000), stream (true or false), none of them repeated, and the two
timeout headers; a bad value gets 400 invalid_request_error naming it. A
path with a . or .. segment is refused.

On SIGHUP the proxy reads its file again, the flags still over it, and
serves new requests with its policy, backends, tenants, upstream and
upstream key, and the other settings but listen, admin_listen, store,
name, max_connections, max_header_bytes and the read and idle timeouts,
which keep their values until a restart (a warning names them). Calls in
flight finish as they began; the retry budgets, throttle, breakers and
rate limits learned are kept. A file that does not parse or check, or
whose backends fail the checks made at start, is refused whole, and the
configuration in use goes on serving.

The configuration file, JSON or YAML, holds these keys; durations are
strings such as "30s", and so are the durations in the log lines. A flag
given overrides its key.

`)
	writeKeys(w, keys)
	fmt.Fprint(w, "\nFlags:\n")
}

// writeKeys lists keys: each on a line with its flag, default and bounds,
// its doc below.
func writeKeys(w io.Writer, keys []conf.Setting) {
	for _, k := range keys {
		line := "  " + k.Key
		if k.Flag != "" {
			line += " (-" + k.Flag + ")"
		}
		var about []string
		if k.Default != "" {
			about = append(about, "default "+k.Default)
		}
		if k.Range != "" {
			about = append(about, k.Range)
		}
		if k.Zero != "" {
			about = append(about, "0: "+k.Zero)
		}
		if len(about) > 0 {
			line += ": " + strings.Join(about, "; ")
		}
		fmt.Fprintln(w, line)
		for _, l := range wrap(k.Doc, 70) {
			fmt.Fprintln(w, "      "+l)
		}
	}
}

// wrap cuts text into lines of at most width bytes, at spaces.
func wrap(text string, width int) []string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(text) {
		if line != "" && len(line)+1+len(word) > width {
			lines = append(lines, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += word
	}
	if line != "" {
		lines = append(lines, line)
	}
	return lines
}
