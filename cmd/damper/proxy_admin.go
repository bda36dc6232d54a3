package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/damper-ai/damper-go/conf"
)

// maxAdminListen bounds admin_listen: a 255-byte host name and a port.
const maxAdminListen = 261

// checkAdminListen checks the file's admin_listen: empty, or host:port.
func checkAdminListen(addr string) error {
	if addr == "" {
		return nil
	}
	if len(addr) > maxAdminListen {
		return &conf.Error{Path: "admin_listen", Err: fmt.Errorf("%d bytes: must be at most %d", len(addr), maxAdminListen)}
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return &conf.Error{Path: "admin_listen", Err: fmt.Errorf("%q: want host:port", addr)}
	}
	return nil
}

// listenAdmin opens the admin listener; nil when addr is empty.
func listenAdmin(addr string) (net.Listener, error) {
	if addr == "" {
		return nil, nil
	}
	return net.Listen("tcp", addr)
}

// isAdminPath reports whether path is one the process serves itself.
func isAdminPath(path string) bool {
	return path == "/healthz" || path == "/readyz" || path == "/metrics"
}

// adminEndpoints serves /healthz, /readyz (503 once draining is set) and
// /metrics to GET and HEAD, and reports whether it answered.
//
// While store's state is decided in memory (Redis not reached since the
// start, or failing since) /readyz is still 200, and says so: the proxy
// serves every call, on each part's state in memory, and a fleet whose
// sidecars all went unready with Redis would stop serving for want of a
// store it does without.
func adminEndpoints(metrics http.Handler, draining *atomic.Bool, store *proxyStore) func(http.ResponseWriter, *http.Request) bool {
	return func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			return false
		}
		switch r.URL.Path {
		case "/healthz":
			fmt.Fprintln(w, "ok")
		case "/readyz":
			if draining.Load() {
				http.Error(w, "draining", http.StatusServiceUnavailable)
				return true
			}
			if store.inMemory() {
				fmt.Fprintln(w, readyInMemory)
				return true
			}
			fmt.Fprintln(w, "ready")
		case "/metrics":
			metrics.ServeHTTP(w, r)
		default:
			return false
		}
		return true
	}
}

// readyInMemory is /readyz's answer while the store is in its fallback.
const readyInMemory = "ready (store: state in memory until Redis answers)"

// notOnAPI answers an admin path on the API's listener, when the admin
// listener serves it: a 404 of the API's shape, never sent upstream, so
// that the paths mean one thing only.
func notOnAPI(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Should-Retry", "false")
	w.WriteHeader(http.StatusNotFound)
	fmt.Fprintf(w, `{"type":"error","error":{"type":"not_found_error","message":"damper proxy: %s is served on admin_listen only"}}`, r.URL.Path)
}

// adminServer is the admin listener's server, or nothing without one.
type adminServer struct {
	srv    *http.Server
	failed chan error // the server's failure; nil without a server
	done   chan struct{}
	once   sync.Once
}

// serveAdmin serves admin on s.adminLn, with api's timeouts, until close.
func serveAdmin(s proxySettings, api *http.Server, admin func(http.ResponseWriter, *http.Request) bool, logger *slog.Logger) *adminServer {
	a := &adminServer{}
	if s.adminLn == nil {
		return a
	}
	a.srv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Host != "" || !admin(w, r) {
				http.NotFound(w, r)
			}
		}),
		ReadHeaderTimeout: api.ReadHeaderTimeout,
		ReadTimeout:       api.ReadTimeout,
		IdleTimeout:       api.IdleTimeout,
		MaxHeaderBytes:    api.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	a.failed, a.done = make(chan error, 1), make(chan struct{})
	go func() {
		defer close(a.done)
		if err := a.srv.Serve(s.adminLn); !errors.Is(err, http.ErrServerClosed) {
			a.failed <- fmt.Errorf("admin_listen %s: %w", s.adminLn.Addr(), err)
		}
	}()
	return a
}

// close stops the admin server and waits for it; it may be called again.
func (a *adminServer) close() {
	if a.srv == nil {
		return
	}
	a.once.Do(func() {
		_ = a.srv.Close()
		<-a.done
	})
}
