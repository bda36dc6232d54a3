package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/conf"
)

// proxyFile is the proxy's configuration file, JSON or YAML:
//
//	listen: 127.0.0.1:8787
//	upstream: https://api.anthropic.com
//	drain_timeout: 30s
//	policy:                 # a Damper policy, as damper.ParsePolicyYAML reads it
//	  max_attempts: 3
//	  breaker: {}
//
// Each key is declared once, by its field's tags, as a Policy's are: its
// name, default and bounds; the keys of damper.ProxyConfig are its own.
type proxyFile struct {
	Listen string `key:"listen" default:"127.0.0.1:8787"`
	// AdminListen, when set, serves /healthz, /readyz and /metrics, which
	// the API's listener then no longer answers.
	AdminListen string `key:"admin_listen"`
	// Upstream's default is the command's: the library's has none.
	damper.ProxyConfig `key:",inline"`
	DrainTimeout       time.Duration `key:"drain_timeout" default:"30s" min:">0" max:"24h"`
	// ShutdownDelay is how long /readyz says 503 before the drain.
	ShutdownDelay     time.Duration  `key:"shutdown_delay" min:"0" max:"24h" zero:"no delay"`
	ReadHeaderTimeout time.Duration  `key:"read_header_timeout" default:"10s" min:">0" max:"24h"`
	ReadTimeout       time.Duration  `key:"read_timeout" default:"1m" min:">0" max:"24h"`
	IdleTimeout       time.Duration  `key:"idle_timeout" default:"2m" min:">0" max:"24h"`
	LogLevel          string         `key:"log_level" default:"info"`
	Name              string         `key:"name"`
	Policy            *damper.Policy `key:"policy"`
	// Backends are the fallback backends, tried in order after the
	// upstream (proxy_backends.go).
	Backends []backendFile `key:"backends" max:"8" unit:"backends"`
	// Store keeps the Damper's state in Redis (proxy_store.go).
	Store *proxyStoreFile `key:"store"`

	// MaxHeaderBytes bounds a request's line and headers, on both
	// listeners: net/http reads 4 KiB beyond it, then answers 431.
	MaxHeaderBytes int `key:"max_header_bytes" default:"65536" min:"1024" max:"1048576" unit:"bytes"`
	// MaxConnections caps the API listener's open connections; beyond it
	// a connection is answered 503 and closed (proxy_conns.go).
	MaxConnections int `key:"max_connections" default:"1024" min:"1" max:"65536" unit:"connections"`
	// Tenants are the clients that may call, by their keys; with any,
	// the proxy is in key mode (proxy_tenants.go).
	Tenants []tenantFile `key:"tenants" max:"1000" unit:"tenants"`
	// UpstreamAPIKeyEnv names the environment variable holding the
	// operator's key for the upstream, required with tenants.
	UpstreamAPIKeyEnv string `key:"upstream_api_key_env"`
}

// proxySettings is what the proxy runs with: the file's values, then the
// flags', over the defaults.
type proxySettings struct {
	listen, upstream  string
	maxRequestBytes   int64
	drain             time.Duration
	shutdownDelay     time.Duration // /readyz says 503 this long before the drain
	readHeader, read  time.Duration
	idle              time.Duration
	maxHeaderBytes    int           // a request's line and headers, on both listeners
	maxConns          int           // the API listener's open connections
	write             time.Duration // one write to a client, a stream's included
	level             slog.Level
	name              string
	policy            damper.Policy
	backends          []backendFile     // the fallback backends, as the file has them
	built             []fallbackBackend // backends built and checked at start; nil: serveProxy builds them
	configFile        string            // for messages only
	listenIsNonLocal  bool
	policyFromDefault bool

	adminListen string       // "": /healthz, /readyz and /metrics on listen
	adminLn     net.Listener // admin_listen's, opened by runProxy
	store       *storeConfig // nil: the state in memory
	fleet       *proxyStore  // store's, opened by runProxy

	tenants     []damper.Tenant // with key_env's keys hashed; none: pass-through mode
	upstreamKey string          // the operator's key for the upstream, in key mode

	// What runProxy gives a reload (proxy_reload.go): each signal on
	// reloads has reread read the settings again, as at start; checks, when
	// set, are made on the backends and the upstream the reload would use;
	// logLevel, when set, is the logger's, which a reload sets. stores are
	// the backends' stores, kept across reloads (proxy_keep.go).
	reloads  <-chan os.Signal
	reread   func() (proxySettings, error)
	checks   *startChecks
	logLevel *slog.LevelVar
	stores   *proxyKeepers
}

const defaultProxyUpstream = "https://api.anthropic.com"

func defaultProxySettings() proxySettings {
	var s proxySettings
	if err := s.apply(proxyFile{}); err != nil {
		panic(err) // a default outside its bounds
	}
	return s
}

// apply sets s from f, its zero fields filled in with their defaults. The
// policy is kept as the file has it, for New to fill in.
func (s *proxySettings) apply(f proxyFile) error {
	policy := f.Policy
	f.Policy = nil
	if err := conf.Fill(&f); err != nil {
		return err
	}
	if err := checkBackendNames(f.Backends); err != nil {
		return err
	}
	level, err := parseLevel(f.LogLevel)
	if err != nil {
		return &conf.Error{Path: "log_level", Err: fmt.Errorf("%q: %w", f.LogLevel, err)}
	}
	if err := checkAdminListen(f.AdminListen); err != nil {
		return err
	}
	if f.Upstream != "" {
		if err := checkUpstream(f.Upstream); err != nil {
			return &conf.Error{Path: "upstream", Err: err}
		}
	}
	store, err := parseStore(f.Store, f.Name)
	if err != nil {
		return err
	}
	tenants, upstreamKey, err := proxyTenants(f.Tenants, f.Backends, f.UpstreamAPIKeyEnv)
	if err != nil {
		return err
	}
	*s = proxySettings{
		listen: f.Listen, upstream: cmp.Or(f.Upstream, defaultProxyUpstream),
		maxRequestBytes: f.MaxRequestBytes, drain: f.DrainTimeout, shutdownDelay: f.ShutdownDelay,
		readHeader: f.ReadHeaderTimeout, read: f.ReadTimeout, idle: f.IdleTimeout, write: f.WriteTimeout,
		maxHeaderBytes: f.MaxHeaderBytes, maxConns: f.MaxConnections,
		level: level, name: f.Name, configFile: s.configFile, policyFromDefault: policy == nil,
		backends: f.Backends, adminListen: f.AdminListen, store: store,
		tenants: tenants, upstreamKey: upstreamKey,
	}
	if policy != nil {
		s.policy = *policy
	}
	return nil
}

func parseProxy(args []string, stdout, stderr io.Writer) (proxySettings, error) {
	s := defaultProxySettings()
	fs := flag.NewFlagSet("proxy", flag.ContinueOnError)
	config := fs.String("config", "", "read the settings and the Damper policy from this JSON or YAML `file`; flags given override it")
	listen := fs.String("listen", s.listen, "address to listen on; a non-loopback address serves other hosts")
	upstream := fs.String("upstream", s.upstream, "the API every request goes to, and nowhere else")
	maxBytes := fs.Int64("max-request-bytes", s.maxRequestBytes, "largest request body accepted; a larger one is answered with 413")
	drain := fs.Duration("drain-timeout", s.drain, "on SIGINT or SIGTERM, how long requests in flight (streams included) may take to finish before they are cut")
	delay := fs.Duration("shutdown-delay", 0, "on SIGINT or SIGTERM, how long to go on serving with /readyz answering 503, so that load balancers stop sending here, before the drain")
	level := fs.String("log-level", "info", "least level logged: debug, info, warn or error")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: damper proxy [flags]

Serves the Messages API through Damper, for services not written in Go:
point their SDK's base URL at the proxy (ANTHROPIC_BASE_URL). POST
/v1/messages, plain and streaming, gets Damper's retries, budget, breaker and
rate limiter; every other path passes through to the upstream unchanged.
Without tenants, clients send their own API key, which is forwarded and
never stored or logged, and the file may name no backend. With tenants
(each a name and its keys' hashes under key_sha256, or environment
variables holding keys under key_env; damper key makes a key and its hash),
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
Damper-Outcome and Damper-Retry-Cost-Usd. A connection beyond
max_connections open at once is answered 503 overloaded_error, with
x-should-retry: true and retry-after: 1, and closed; a request whose line
and headers pass max_header_bytes, 431. A client states the deadline of its whole call with
Damper-Timeout (seconds, such as 30 or 2.5). The X-Stainless-Timeout the
official SDKs send (their request timeout, 600 s by default) bounds, as it
does in the SDKs, only the time until the answer's headers: for a stream,
until its first content, never how long it then runs.

What Damper decides on is checked before anything is sent: model (at most
256 characters of ASCII letters, digits and -._:@/), max_tokens (1 to
1,000,000), stream (true or false), none of them repeated, and the two
timeout headers; a bad value gets 400 invalid_request_error naming it. A
path with a . or .. segment is refused. A client that stops reading its
answer for write_timeout has its call ended.

The configuration file holds every setting under its snake_case name
(listen, upstream, max_request_bytes, drain_timeout, read_header_timeout,
read_timeout, idle_timeout, write_timeout, shutdown_delay, log_level, name,
max_header_bytes, max_connections, upstream_api_key_env), the clients under "tenants",
the Damper policy under "policy", and under "backends" the fallback
backends tried in order after the upstream (each a name, a provider of
anthropic, bedrock or vertex, and its base_url, api_key_env, region,
project and models), whose credentials and reachability are checked at
start; durations are strings such as "30s", and so are the durations in
the log lines.

admin_listen (host:port), when set, serves /healthz, /readyz and /metrics
there instead, and the listen address answers them 404. store keeps the
Damper's state (retry budget, throttle, breaker, rate limits) in Redis,
shared by every proxy given the same store, with the keys address or url,
username_env and password_env (the names of the variables that hold the
credentials), tls, ca_file, name, timeout, fail_closed, lease and
lease_for; the proxy does not start when a PING finds Redis refusing its
credentials, TLS or user, nor, with fail_closed, unreachable; without
fail_closed it starts on state in memory and joins Redis when it answers.

On SIGHUP the proxy reads its file again, the flags still over it, and
serves new requests with its policy, backends, tenants, upstream and
upstream key, and the other settings but listen, admin_listen, store,
name, max_connections, max_header_bytes and the read and idle timeouts,
which keep their values until a restart (a warning names them). Calls in
flight finish as they began; the retry budgets, throttle, breakers and
rate limits learned are kept. A file that does not parse or check, or
whose backends fail the checks made at start, is refused whole, and the
configuration in use goes on serving.

Flags:
`)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, stdout, stderr); err != nil {
		return s, err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return s, fmt.Errorf("proxy takes no arguments, got %q", fs.Args())
	}
	if *config != "" {
		if err := s.loadFile(*config); err != nil {
			return s, err
		}
	}
	var err error
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "listen":
			s.listen = *listen
		case "upstream":
			s.upstream = *upstream
			if uerr := checkUpstream(*upstream); uerr != nil {
				err = errors.Join(err, fmt.Errorf("--upstream %w", uerr))
			}
		case "max-request-bytes":
			s.maxRequestBytes = *maxBytes
			if *maxBytes <= 0 {
				err = errors.Join(err, fmt.Errorf("--max-request-bytes %d: must be above 0", *maxBytes))
			} else {
				err = errors.Join(err, flagBound(f.Name, *maxBytes, proxyFile{ProxyConfig: damper.ProxyConfig{MaxRequestBytes: *maxBytes}}))
			}
		case "drain-timeout":
			s.drain = *drain
			if *drain <= 0 {
				err = errors.Join(err, fmt.Errorf("--drain-timeout %v: must be above 0", *drain))
			} else {
				err = errors.Join(err, flagBound(f.Name, *drain, proxyFile{DrainTimeout: *drain}))
			}
		case "shutdown-delay":
			s.shutdownDelay = *delay
			if *delay < 0 {
				err = errors.Join(err, fmt.Errorf("--shutdown-delay %v: must be 0 or more", *delay))
			} else {
				err = errors.Join(err, flagBound(f.Name, *delay, proxyFile{ShutdownDelay: *delay}))
			}
		case "log-level":
			var lerr error
			if s.level, lerr = parseLevel(*level); lerr != nil {
				err = errors.Join(err, fmt.Errorf("--log-level %q: %w", *level, lerr))
			}
		}
	})
	if err != nil {
		return s, err
	}
	if s.listenIsNonLocal, err = beyondLoopback(s.listen); err != nil {
		return s, fmt.Errorf("listen address %q: %w", s.listen, err)
	}
	return s, nil
}

// flagBound returns an error naming the flag when value, the one field
// set in f, is outside its key's bounds: a flag has the bounds of its key.
func flagBound(flag string, value any, f proxyFile) error {
	var fe *conf.FieldError
	if err := conf.Fill(&f); errors.As(err, &fe) {
		return fmt.Errorf("--%s %v: %s", flag, value, fe.Why)
	}
	return nil
}

// beyondLoopback reports whether a listener on addr (host:port) serves
// other hosts: any host but localhost and a loopback IP, the empty one
// (every interface) included.
func beyondLoopback(addr string) (bool, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false, err
	}
	ip := net.ParseIP(host)
	return host != "localhost" && (ip == nil || !ip.IsLoopback()), nil
}

// checkUpstream checks the upstream as the proxy takes it, before
// damper.NewProxy does: its errors show the URL masked (maskURL).
func checkUpstream(s string) error {
	if _, err := parseBaseURL(s); err != nil {
		return fmt.Errorf("%s: %v", shownURL(s), err)
	}
	return nil
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if s == "" || strings.ContainsAny(s, "+-") || l.UnmarshalText([]byte(s)) != nil {
		return 0, errors.New("want debug, info, warn or error")
	}
	return l, nil
}

// loadFile reads the configuration file name into s. Its errors name the
// file and the key.
func (s *proxySettings) loadFile(name string) error {
	data, err := os.ReadFile(name)
	if err != nil {
		return err
	}
	s.configFile = name
	var f proxyFile
	if strings.EqualFold(filepath.Ext(name), ".json") {
		err = conf.DecodeJSON(data, &f)
	} else {
		err = conf.DecodeYAML(data, &f)
	}
	if err == nil {
		err = s.apply(f)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// newLogger is the proxy's logger: JSON lines to w, from level on.
func newLogger(w io.Writer, level slog.Level) *slog.Logger { return leveledLogger(w, level) }

// leveledLogger is newLogger with a level that may change, such as a
// slog.LevelVar.
func leveledLogger(w io.Writer, level slog.Leveler) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level, ReplaceAttr: readableDurations}))
}

// readableDurations writes a duration in a log line as Go writes it
// ("1.5s", "250ms"), not as a bare number of nanoseconds.
func readableDurations(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}

func runProxy(args []string, stdout, stderr io.Writer) int {
	s, err := parseProxy(args, stdout, stderr)
	if code, stop := badFlags("proxy", err, stderr); stop {
		return code
	}
	// Asked for before anything else: SIGHUP's default would end the
	// process.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	s.reloads = hup
	s.reread = func() (proxySettings, error) { return parseProxy(args, io.Discard, io.Discard) }
	checks := defaultStartChecks()
	s.checks = &checks
	s.logLevel = new(slog.LevelVar)
	s.logLevel.Set(s.level)
	logger := leveledLogger(stderr, s.logLevel)
	defer routeLibraryLogs(logger)()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if s.fleet, err = openProxyStore(ctx, s.store, logger); err != nil {
		logger.Error("damper proxy: cannot start", "error", err.Error())
		return exitFail
	}
	defer func() {
		if err := s.fleet.Close(); err != nil {
			logger.Warn("damper proxy: the store's last records did not all reach Redis", "error", err.Error())
		}
	}()
	s.stores = newProxyKeepers(s.fleet)
	if s.built, err = startBackends(ctx, s, checks, logger); err != nil {
		logger.Error("damper proxy: cannot start", "error", err.Error())
		return exitFail
	}
	ln, err := net.Listen("tcp", s.listen)
	if err != nil {
		logger.Error("damper proxy: cannot listen", "listen", s.listen, "error", err.Error())
		return exitFail
	}
	if s.adminLn, err = listenAdmin(s.adminListen); err != nil {
		ln.Close()
		logger.Error("damper proxy: cannot listen", "admin_listen", s.adminListen, "error", err.Error())
		return exitFail
	}
	if err := serveProxy(ctx, s, ln, logger); err != nil {
		logger.Error("damper proxy: stopped", "error", err.Error())
		return exitFail
	}
	return exitOK
}

// serveProxy serves on ln until ctx ends, then, after s.shutdownDelay of
// serving with /readyz unready, drains: it stops accepting, lets the
// requests in flight finish within s.drain, cuts those left, and returns.
// Each signal on s.reloads reads the configuration again (s.reread) and
// serves new requests with it (reload).
func serveProxy(ctx context.Context, s proxySettings, ln net.Listener, logger *slog.Logger) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	if s.stores == nil {
		s.stores = newProxyKeepers(s.fleet)
	}
	// One transport for every run: a reload keeps the connections to the
	// upstream. Damper's default for a Proxy: 256 idle connections kept.
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConns, transport.MaxIdleConnsPerHost = 256, 256
	defer transport.CloseIdleConnections()
	var draining atomic.Bool
	sh := &runShared{mp: mp, metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), draining: &draining,
		transport: transport, stores: s.stores, logger: logger}
	backends := s.built
	if backends == nil {
		if backends, err = buildBackends(ctx, s.backends, s.stores.storeFor, logger); err != nil {
			return err
		}
	}
	s.built = nil
	if ln, err = limitConns(mp, &s, ln, logger); err != nil {
		return err
	}
	first, err := newRun(s, backends, sh)
	if err != nil {
		return err
	}
	var current atomic.Pointer[proxyRun]
	current.Store(first)
	defer func() { _ = current.Load().d.Close() }()
	admin := adminEndpoints(sh.metrics, &draining, s.fleet)
	srv := &http.Server{
		// Each request is served to its end by the run it started on.
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { current.Load().serve(w, r) }),
		ReadHeaderTimeout: s.readHeader,
		ReadTimeout:       s.read,
		IdleTimeout:       s.idle,
		MaxHeaderBytes:    s.maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	attrs := []any{"listen", ln.Addr().String(), "upstream", maskURL(s.upstream), "drain_timeout", s.drain.String()}
	if s.configFile != "" {
		attrs = append(attrs, "config", s.configFile)
	}
	if s.policyFromDefault {
		attrs = append(attrs, "policy", "default")
	}
	if len(backends) > 0 {
		names := make([]string, len(backends))
		for i, b := range backends {
			names[i] = b.name
		}
		attrs = append(attrs, "backends", names)
	}
	if s.adminLn != nil {
		attrs = append(attrs, "admin_listen", s.adminLn.Addr().String())
	}
	if s.fleet != nil {
		attrs = append(attrs, "store", s.fleet.String())
	}
	logger.Info("damper proxy: serving", attrs...)
	if len(s.tenants) > 0 {
		attrs := []any{"tenants", len(s.tenants)}
		logger.Info("damper proxy: key mode: clients present a tenant's key; the operator's credentials are sent", attrs...)
	}
	if s.listenIsNonLocal && len(s.tenants) == 0 {
		logger.Warn("damper proxy: listening beyond loopback: other hosts can send calls through this proxy with their own keys", "listen", s.listen)
	}
	if beyond, _ := beyondLoopback(s.adminListen); s.adminLn != nil && beyond {
		logger.Warn("damper proxy: admin listener beyond loopback: other hosts can read /metrics (the models, backends and outcomes of the calls) and /readyz", "admin_listen", s.adminListen)
	}

	adm := serveAdmin(s, srv, admin, logger)
	defer adm.close() // after the drain: it answers through it
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
serving:
	for {
		select {
		case err := <-served:
			return err
		case err := <-adm.failed:
			srv.Close()
			<-served
			return err
		case <-s.reloads:
			old := current.Load()
			reload(ctx, old, sh, func(run *proxyRun) {
				current.Store(run)
				s.stores.retain(run.backends)
				// Its calls in flight finish on it; its gauges are the
				// new run's now.
				_ = old.d.Close()
				s.drain, s.shutdownDelay = run.s.drain, run.s.shutdownDelay
			})
		case <-ctx.Done():
			break serving
		}
	}
	draining.Store(true)
	if s.shutdownDelay > 0 {
		logger.Info("damper proxy: unready, still serving", "shutdown_delay", s.shutdownDelay.String())
		select {
		case err := <-served:
			return err
		case err := <-adm.failed:
			srv.Close()
			<-served
			return err
		case <-time.After(s.shutdownDelay):
		}
	}
	logger.Info("damper proxy: draining", "drain_timeout", s.drain.String())
	dctx, cancel := context.WithTimeout(context.Background(), s.drain)
	defer cancel()
	err = srv.Shutdown(dctx)
	if errors.Is(err, context.DeadlineExceeded) {
		logger.Warn("damper proxy: requests still in flight at the drain timeout were cut", "drain_timeout", s.drain.String())
		err = srv.Close()
	}
	<-served // http.ErrServerClosed
	adm.close()
	logger.Info("damper proxy: stopped")
	return err
}
