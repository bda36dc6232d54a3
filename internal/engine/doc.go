// Package engine is Damper's call engine: a logical Messages call and its
// loop (admit, send, judge, retry or move, end), the gates' list, the
// backends, hedging, the report and the telemetry. It works on
// *http.Request and *http.Response and hands back neutral results; the
// adapters in front of it (the root package's SDK option and proxy) give
// each call what is particular to their client in a [Front], and the root
// package is its public face. It imports neither.
package engine
