package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// adminMaxConnections caps the admin listener's open connections: probes
// and scrapes need few, and a flood there must not cost what the API's
// cap allows.
const adminMaxConnections = 64

// Refusing a connection over the cap: at most refuseAtOnce refusals in
// progress, each given refuseFor to be written and to see the client hang
// up; beyond refuseAtOnce, a connection is closed at once. A flood costs
// a bounded amount.
const (
	refuseAtOnce = 64
	refuseFor    = time.Second
)

// refusalLogEvery is the least time between two log lines about refused
// connections on one listener: a flood writes one line per period, which
// counts the refusals since the previous one.
const refusalLogEvery = 10 * time.Second

// goTooLarge is what net/http writes, in one Write to the connection, when
// a request's headers exceed the server's MaxHeaderBytes; connLimit
// writes its own 431, of the API's shape, in its place.
const goTooLarge = "HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n431 Request Header Fields Too Large"

// connLimit is a listener that holds at most max connections open at
// once. Beyond them, it accepts a connection, answers it with a 503 of the
// API's shape that names the setting, and closes it, so that a client
// gets a clear answer rather than a wait in the backlog, and a flood of
// connections takes no more than the cap's memory. A connection counts
// until it is closed, a hijacked one included.
type connLimit struct {
	net.Listener
	name     string // the listener: "api" or "admin", in metrics and logs
	max      int64
	refusal  []byte // the whole 503 answer
	tooLarge []byte // the whole 431 answer, in place of net/http's
	logger   *slog.Logger
	refusals metric.Int64Counter // nil: not counted in metrics
	attrs    metric.MeasurementOption

	open     atomic.Int64
	refused  atomic.Int64 // since the start
	refusers chan struct{}
	wg       sync.WaitGroup // the refusals in progress

	mu      sync.Mutex
	closed  bool // no refusal starts once set
	lastLog time.Time
	unlog   int64 // refusals since the last log line
}

// newConnLimit caps ln at max open connections. full is the refusal's
// message; maxHeaderBytes is the server's, named in the answer to headers
// over it.
func newConnLimit(ln net.Listener, name string, max, maxHeaderBytes int, full string, logger *slog.Logger) *connLimit {
	return &connLimit{
		Listener: ln, name: name, max: int64(max), logger: logger,
		refusal: apiAnswer("503 Service Unavailable", "Retry-After: 1\r\nX-Should-Retry: true\r\n", "overloaded_error", full),
		tooLarge: apiAnswer("431 Request Header Fields Too Large", "X-Should-Retry: false\r\n",
			"invalid_request_error", fmt.Sprintf("damper proxy: the request's headers are over max_header_bytes (%d bytes)", maxHeaderBytes)),
		refusers: make(chan struct{}, refuseAtOnce),
	}
}

// apiAnswer is a whole HTTP/1.1 answer that closes its connection, with a
// body of the API's error shape.
func apiAnswer(status, headers, kind, message string) []byte {
	body := fmt.Sprintf(`{"type":"error","error":{"type":%q,"message":%q}}`, kind, message)
	return fmt.Appendf(nil, "HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n%s\r\n%s", status, len(body), headers, body)
}

// Accept returns the next connection under the cap, refusing those over it.
func (l *connLimit) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		for n := l.open.Load(); n < l.max; n = l.open.Load() {
			if l.open.CompareAndSwap(n, n+1) {
				return &limitedConn{Conn: c, l: l}, nil
			}
		}
		l.refuse(c)
	}
}

// Close closes the listener and waits for the refusals in progress.
func (l *connLimit) Close() error {
	err := l.Listener.Close()
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.wg.Wait()
	return err
}

// Open is the number of connections open.
func (l *connLimit) Open() int64 { return l.open.Load() }

// Refused is the number of connections refused since the start.
func (l *connLimit) Refused() int64 { return l.refused.Load() }

func (l *connLimit) refuse(c net.Conn) {
	l.refused.Add(1)
	if l.refusals != nil {
		l.refusals.Add(context.Background(), 1, l.attrs)
	}
	l.mu.Lock()
	l.logRefusal()
	start := !l.closed
	if start {
		select {
		case l.refusers <- struct{}{}:
			l.wg.Add(1)
		default:
			start = false // too many refusals at once: no answer
		}
	}
	l.mu.Unlock()
	if !start {
		c.Close()
		return
	}
	go func() {
		defer l.wg.Done()
		defer func() { <-l.refusers }()
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(refuseFor))
		if _, err := c.Write(l.refusal); err != nil {
			return
		}
		// Half-close and read until the client hangs up: closing with its
		// request unread would send a reset, which may destroy the answer
		// before the client reads it.
		if cw, ok := c.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		var buf [512]byte
		for {
			if _, err := c.Read(buf[:]); err != nil {
				return
			}
		}
	}()
}

// logRefusal logs at most one line per refusalLogEvery, counting the
// refusals since the previous line. l.mu is held.
func (l *connLimit) logRefusal() {
	l.unlog++
	if now := time.Now(); now.Sub(l.lastLog) >= refusalLogEvery {
		l.logger.Warn("damper proxy: connections refused: the listener holds its maximum", "listener", l.name,
			"max_connections", l.max, "refused", l.unlog, "refused_total", l.refused.Load())
		l.lastLog, l.unlog = now, 0
	}
}

// limitedConn is a connection under a connLimit's cap.
type limitedConn struct {
	net.Conn
	l      *connLimit
	closed atomic.Bool
}

// Close releases the connection's place under the cap, once, before it
// closes: a client that sees its connection closed finds the place free.
func (c *limitedConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.l.open.Add(-1)
	}
	return c.Conn.Close()
}

// Write writes p, but the API's 431 in place of net/http's plain-text one:
// net/http writes it alone, in one Write, and then closes the connection.
func (c *limitedConn) Write(p []byte) (int, error) {
	if len(p) == len(goTooLarge) && string(p) == goTooLarge {
		if _, err := c.Conn.Write(c.l.tooLarge); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	return c.Conn.Write(p)
}

// CloseWrite half-closes the connection, as net/http does before it
// closes one it answered with an error.
func (c *limitedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// Metric names and attribute of the connection caps.
const (
	metricConnsOpen    = "damper.proxy.connections.open"
	metricConnsRefused = "damper.proxy.connections.refused"
	keyListener        = attribute.Key("damper.proxy.listener")
)

// limitConns caps ln at s.MaxConnections connections, and s.adminLn, when
// there is one, at adminMaxConnections, and counts both in mp: a gauge of
// the open connections and a counter of those refused, by listener
// ("api" or "admin"), with damper.name when the proxy has a name.
func limitConns(mp metric.MeterProvider, s *proxySettings, ln net.Listener, logger *slog.Logger) (net.Listener, error) {
	meter := mp.Meter("github.com/damper-ai/damper-go/cmd/damper")
	refused, err := meter.Int64Counter(metricConnsRefused, metric.WithUnit("{connection}"),
		metric.WithDescription("Connections refused because their listener held its maximum open (max_connections on the API's)."))
	if err != nil {
		return nil, err
	}
	attrs := func(listener string) metric.MeasurementOption {
		set := []attribute.KeyValue{keyListener.String(listener)}
		if s.Name != "" {
			set = append(set, attribute.String("damper.name", s.Name))
		}
		return metric.WithAttributeSet(attribute.NewSet(set...))
	}
	api := newConnLimit(ln, "api", s.MaxConnections, s.MaxHeaderBytes,
		fmt.Sprintf("damper proxy: the proxy holds max_connections (%d) connections open: try again later", s.MaxConnections), logger)
	api.refusals, api.attrs = refused, attrs("api")
	limits := []*connLimit{api}
	if s.adminLn != nil {
		admin := newConnLimit(s.adminLn, "admin", adminMaxConnections, s.MaxHeaderBytes,
			fmt.Sprintf("damper proxy: the admin listener holds its %d connections open: try again later", adminMaxConnections), logger)
		admin.refusals, admin.attrs = refused, attrs("admin")
		s.adminLn = admin
		limits = append(limits, admin)
	}
	_, err = meter.Int64ObservableGauge(metricConnsOpen, metric.WithUnit("{connection}"),
		metric.WithDescription("The connections open on each listener of the proxy."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			for _, l := range limits {
				o.Observe(l.Open(), l.attrs)
			}
			return nil
		}))
	if err != nil {
		return nil, err
	}
	return api, nil
}
