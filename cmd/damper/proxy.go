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
	"reflect"
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
// Each setting is declared once, by its field's tags, as a Policy's are:
// its key, default and bounds, its doc for the usage text, and its flag
// when it has one; the keys of damper.ProxyConfig are its own, their docs
// and flags in proxyConfigKeys.
type proxyFile struct {
	Listen      string `key:"listen" default:"127.0.0.1:8787" flag:"listen" doc:"address to listen on; a non-loopback address serves other hosts"`
	AdminListen string `key:"admin_listen" doc:"host:port that serves /healthz, /readyz and /metrics in place of listen, which then answers them 404"`
	// Upstream's default is the command's: the library's has none.
	damper.ProxyConfig `key:",inline"`
	DrainTimeout       time.Duration  `key:"drain_timeout" default:"30s" min:">0" max:"24h" flag:"drain-timeout" doc:"on SIGINT or SIGTERM, how long requests in flight (streams included) may take to finish before they are cut"`
	ShutdownDelay      time.Duration  `key:"shutdown_delay" min:"0" max:"24h" zero:"no delay" flag:"shutdown-delay" doc:"on SIGINT or SIGTERM, how long to go on serving with /readyz answering 503, so that load balancers stop sending here, before the drain"`
	ReadHeaderTimeout  time.Duration  `key:"read_header_timeout" default:"10s" min:">0" max:"24h" doc:"how long a client may take to send a request's line and headers"`
	ReadTimeout        time.Duration  `key:"read_timeout" default:"1m" min:">0" max:"24h" doc:"how long a client may take to send a whole request, its body included"`
	IdleTimeout        time.Duration  `key:"idle_timeout" default:"2m" min:">0" max:"24h" doc:"how long a kept-alive connection may wait for its next request"`
	LogLevel           string         `key:"log_level" default:"info" flag:"log-level" doc:"least level logged: debug, info, warn or error"`
	Name               string         `key:"name" doc:"the proxy's name: its metrics and log lines carry it (damper.name), and its store's name is it unless the store names one"`
	Policy             *damper.Policy `key:"policy" doc:"the Damper policy, as damper.ParsePolicyYAML reads it; without one, Damper's defaults"`
	// Backends are the fallback backends, tried in order after the
	// upstream (proxy_backends.go).
	Backends []backendFile `key:"backends" max:"8" unit:"backends" doc:"the fallback backends, tried in order after the upstream: each a name, a provider of anthropic, bedrock or vertex, and its base_url, api_key_env, region, project, models and weight (under spread routing, policy.fallback.routing); their credentials and reachability are checked at start"`
	// Store keeps the Damper's state in Redis (proxy_store.go).
	Store *proxyStoreFile `key:"store" doc:"keeps the Damper's state (retry budget, throttle, breaker, rate limits) in Redis, shared by every proxy given the same store, with the keys address or url, username_env and password_env (the names of the variables that hold the credentials), tls, ca_file, name, timeout, fail_closed, lease and lease_for. The proxy does not start when a PING finds Redis refusing its credentials, TLS or user, nor, with fail_closed, unreachable; without fail_closed it starts on state in memory and joins Redis when it answers"`

	// MaxHeaderBytes bounds a request's line and headers, on both
	// listeners: net/http reads 4 KiB beyond it, then answers 431.
	MaxHeaderBytes int `key:"max_header_bytes" default:"65536" min:"1024" max:"1048576" unit:"bytes" doc:"largest request line and headers, on both listeners; a request past it is answered 431"`
	// MaxConnections caps the API listener's open connections; beyond it
	// a connection is answered 503 and closed (proxy_conns.go).
	MaxConnections int `key:"max_connections" default:"1024" min:"1" max:"65536" unit:"connections" doc:"the API listener's connections open at once; one beyond is answered 503 overloaded_error, with x-should-retry: true and retry-after: 1, and closed"`
	// Tenants are the clients that may call, by their keys; with any,
	// the proxy is in key mode (proxy_tenants.go).
	Tenants []tenantFile `key:"tenants" max:"1000" unit:"tenants" doc:"the clients: each a name and its keys' hashes under key_sha256 (damper key makes a key and its hash), or environment variables holding keys under key_env; with any, every request must present a tenant's key"`
	// UpstreamAPIKeyEnv names the environment variable holding the
	// operator's key for the upstream, required with tenants.
	UpstreamAPIKeyEnv string `key:"upstream_api_key_env" doc:"the environment variable that holds the operator's API key for the upstream; required with tenants, refused without"`
}

// proxySettings is what the proxy runs with: the file's values, then the
// flags', over the defaults, and what the proxy makes of them.
type proxySettings struct {
	// proxyFile is the settings filled in, upstream's default included;
	// its Policy is nil: policy has it.
	proxyFile
	level             slog.Level
	policy            damper.Policy
	built             []fallbackBackend // backends built and checked at start; nil: serveProxy builds them
	configFile        string            // for messages only
	listenIsNonLocal  bool
	policyFromDefault bool

	adminLn net.Listener // admin_listen's, opened by runProxy
	store   *storeConfig // nil: the state in memory
	fleet   *proxyStore  // store's, opened by runProxy

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
	f.Upstream = cmp.Or(f.Upstream, defaultProxyUpstream)
	*s = proxySettings{proxyFile: f, level: level, configFile: s.configFile, policyFromDefault: policy == nil,
		store: store, tenants: tenants, upstreamKey: upstreamKey}
	if policy != nil {
		s.policy = *policy
	}
	return nil
}

// parseProxy reads the command line, and the file it names: the flags,
// each one's key's (proxyKeys), over the file.
func parseProxy(args []string, stdout, stderr io.Writer) (proxySettings, error) {
	s := defaultProxySettings()
	keys := proxyKeys()
	fs := flag.NewFlagSet("proxy", flag.ContinueOnError)
	config := fs.String("config", "", "read the settings and the Damper policy from this JSON or YAML `file`; flags given override it")
	flags, err := conf.NewFlags(fs, reflect.TypeFor[proxyFile](), keys)
	if err != nil {
		return s, err
	}
	fs.Usage = func() {
		writeProxyUsage(fs.Output(), keys)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, stdout, stderr); err != nil {
		return s, err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return s, fmt.Errorf("proxy takes no arguments, got %q", fs.Args())
	}
	var f proxyFile // as the file has it, and then the flags
	if *config != "" {
		if err := s.loadFile(*config, &f); err != nil {
			return s, err
		}
	}
	byFlag := false
	fs.Visit(func(g *flag.Flag) { byFlag = byFlag || g.Name != "config" })
	if byFlag {
		if err := flags.Set(&f); err != nil {
			return s, err
		}
		if err := s.apply(f); err != nil {
			return s, flags.Name(err)
		}
	}
	if s.listenIsNonLocal, err = beyondLoopback(s.Listen); err != nil {
		return s, fmt.Errorf("listen address %q: %w", s.Listen, err)
	}
	return s, nil
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

// loadFile reads the configuration file name into s, and into f as the
// file has it. Its errors name the file and the key.
func (s *proxySettings) loadFile(name string, f *proxyFile) error {
	data, err := os.ReadFile(name)
	if err != nil {
		return err
	}
	s.configFile = name
	if strings.EqualFold(filepath.Ext(name), ".json") {
		err = conf.DecodeJSON(data, f)
	} else {
		err = conf.DecodeYAML(data, f)
	}
	if err == nil {
		err = s.apply(*f)
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
	ln, err := net.Listen("tcp", s.Listen)
	if err != nil {
		logger.Error("damper proxy: cannot listen", "listen", s.Listen, "error", err.Error())
		return exitFail
	}
	if s.adminLn, err = listenAdmin(s.AdminListen); err != nil {
		ln.Close()
		logger.Error("damper proxy: cannot listen", "admin_listen", s.AdminListen, "error", err.Error())
		return exitFail
	}
	if err := serveProxy(ctx, s, ln, logger); err != nil {
		logger.Error("damper proxy: stopped", "error", err.Error())
		return exitFail
	}
	return exitOK
}

// serveProxy serves on ln until ctx ends, then, after s.ShutdownDelay of
// serving with /readyz unready, drains: it stops accepting, lets the
// requests in flight finish within s.DrainTimeout, cuts those left, and returns.
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
		if backends, err = buildBackends(ctx, s.Backends, s.stores.storeFor, logger); err != nil {
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
		ReadHeaderTimeout: s.ReadHeaderTimeout,
		ReadTimeout:       s.ReadTimeout,
		IdleTimeout:       s.IdleTimeout,
		MaxHeaderBytes:    s.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	attrs := []any{"listen", ln.Addr().String(), "upstream", maskURL(s.Upstream), "drain_timeout", s.DrainTimeout.String()}
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
		logger.Warn("damper proxy: listening beyond loopback: other hosts can send calls through this proxy with their own keys", "listen", s.Listen)
	}
	if beyond, _ := beyondLoopback(s.AdminListen); s.adminLn != nil && beyond {
		logger.Warn("damper proxy: admin listener beyond loopback: other hosts can read /metrics (the models, backends and outcomes of the calls) and /readyz", "admin_listen", s.AdminListen)
	}

	adm := serveAdmin(s, srv, admin, logger)
	defer adm.close() // after the drain: it answers through it
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	// One wait, in two stages: serving, each reload applied, until ctx
	// ends; then unready for s.ShutdownDelay, still serving. The server
	// stopping or the admin listener failing ends either.
	done, reloads := ctx.Done(), s.reloads
	var unready <-chan time.Time
wait:
	for {
		select {
		case err := <-served:
			return err
		case err := <-adm.failed:
			srv.Close()
			<-served
			return err
		case <-reloads:
			old := current.Load()
			reload(ctx, old, sh, func(run *proxyRun) {
				current.Store(run)
				s.stores.retain(run.backends)
				// Its calls in flight finish on it; its gauges are the
				// new run's now.
				_ = old.d.Close()
				s.DrainTimeout, s.ShutdownDelay = run.s.DrainTimeout, run.s.ShutdownDelay
			})
		case <-done:
			done, reloads = nil, nil
			draining.Store(true)
			if s.ShutdownDelay <= 0 {
				break wait
			}
			logger.Info("damper proxy: unready, still serving", "shutdown_delay", s.ShutdownDelay.String())
			unready = time.After(s.ShutdownDelay)
		case <-unready:
			break wait
		}
	}
	logger.Info("damper proxy: draining", "drain_timeout", s.DrainTimeout.String())
	dctx, cancel := context.WithTimeout(context.Background(), s.DrainTimeout)
	defer cancel()
	err = srv.Shutdown(dctx)
	if errors.Is(err, context.DeadlineExceeded) {
		logger.Warn("damper proxy: requests still in flight at the drain timeout were cut", "drain_timeout", s.DrainTimeout.String())
		err = srv.Close()
	}
	<-served // http.ErrServerClosed
	adm.close()
	logger.Info("damper proxy: stopped")
	return err
}
