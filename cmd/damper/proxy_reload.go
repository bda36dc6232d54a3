package main

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"reflect"
	"slices"
	"sync/atomic"

	"go.opentelemetry.io/otel/metric"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/fleet"
)

// A reload (SIGHUP) reads the configuration again, as at start, and
// serves new requests with a Damper and a Proxy built from it; calls in
// flight finish on those they started on. The state of the Damper's parts
// is kept (proxy_keep.go). What a running server cannot change keeps its
// value, with a warning naming it; a configuration that cannot be read,
// checked or built is refused whole, and the one in use goes on.

// proxyRun is what one configuration serves with: built at start, and
// again at each reload applied.
type proxyRun struct {
	s        proxySettings
	d        *damper.Damper
	px       *damper.Proxy
	apiAdmin func(http.ResponseWriter, *http.Request) bool // the admin paths on the API's listener
	backends []fallbackBackend
}

// serve serves one request on the API's listener.
func (run *proxyRun) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Host == "" && isAdminPath(r.URL.Path) {
		if run.s.adminLn != nil {
			notOnAPI(w, r)
			return
		}
		if run.apiAdmin(w, r) {
			return
		}
	}
	run.px.ServeHTTP(w, r)
}

// runShared is what every run of one server shares: the meter provider,
// the metrics handler, the readiness flag, the transport to the upstream
// (and its idle connections), the stores kept across reloads.
type runShared struct {
	mp        metric.MeterProvider
	metrics   http.Handler
	draining  *atomic.Bool
	transport http.RoundTripper
	stores    *proxyKeepers
	logger    *slog.Logger
}

// newRun builds the Damper and the Proxy of s, with backends built.
func newRun(s proxySettings, backends []fallbackBackend, sh *runShared) (*proxyRun, error) {
	settings := []damper.Setting{damper.WithMeterProvider(sh.mp), damper.WithLogger(sh.logger),
		damper.WithStore(sh.stores.primary())}
	if s.Name != "" {
		settings = append(settings, damper.WithName(s.Name))
	}
	if len(backends) > 0 {
		settings = append(settings, damper.WithBackends(damperBackends(backends)...))
	}
	d, err := damper.New(s.policy, settings...)
	if err != nil {
		return nil, err
	}
	px, err := damper.NewProxy(d, damper.ProxyConfig{Upstream: s.Upstream, Transport: sh.transport, MaxRequestBytes: s.MaxRequestBytes,
		WriteTimeout: s.WriteTimeout, Logger: sh.logger, Tenants: s.tenants, UpstreamAPIKey: s.upstreamKey})
	if err != nil {
		_ = d.Close()
		return nil, err
	}
	// In key mode, /metrics on the API's listener is for the tenants'
	// keys alone; admin_listen serves it to whoever reaches that.
	return &proxyRun{s: s, d: d, px: px, backends: backends, apiAdmin: adminEndpoints(px.Authenticated(sh.metrics), sh.draining, sh.stores.fleet)}, nil
}

// proxyKeepers are the stores of the proxy's backends, the primary's
// included, by backend name: each a partKeeper, over Redis's store when
// the proxy has one, kept across reloads while its backend is configured.
type proxyKeepers struct {
	fleet  *proxyStore // nil: the state in memory
	byName map[string]*partKeeper
	gen    uint64
}

func newProxyKeepers(fleet *proxyStore) *proxyKeepers {
	return &proxyKeepers{fleet: fleet, byName: map[string]*partKeeper{}, gen: 1}
}

// storeFor returns the store of backend name, for buildBackends.
func (k *proxyKeepers) storeFor(name string) (fleet.Store, error) {
	pk, ok := k.byName[name]
	if !ok {
		var inner fleet.Store
		switch {
		case k.fleet != nil && name == damper.PrimaryBackend:
			inner = k.fleet.primary
		case k.fleet != nil:
			var err error
			if inner, err = k.fleet.backendStore(name); err != nil {
				return nil, err
			}
		}
		pk = newPartKeeper(inner)
		k.byName[name] = pk
	}
	pk.begin(k.gen)
	return pk.store(), nil
}

// primary returns the primary backend's store.
func (k *proxyKeepers) primary() fleet.Store {
	s, _ := k.storeFor(damper.PrimaryBackend) // only a fallback's can fail
	return s
}

// next starts the generation of the next Damper.
func (k *proxyKeepers) next() { k.gen++ }

// retain keeps, once the Damper of the current generation serves, the
// stores of its backends and the parts it took, and drops the others.
func (k *proxyKeepers) retain(backends []fallbackBackend) {
	for name, pk := range k.byName {
		if name != damper.PrimaryBackend && !slices.ContainsFunc(backends, func(b fallbackBackend) bool { return b.name == name }) {
			delete(k.byName, name)
			continue
		}
		pk.retain(k.gen)
	}
}

// reload reads the configuration again and, unless it is refused, builds
// the run that serves new requests from now on and hands it to apply. It
// logs one line, once applied: the keys that changed and those that need
// a restart; or refused, with the reason.
func reload(ctx context.Context, old *proxyRun, sh *runShared, apply func(*proxyRun)) {
	logger := sh.logger
	refuse := func(err error) {
		logger.Error("damper proxy: reload refused: the configuration in use goes on serving", "error", err.Error())
	}
	if old.s.reread == nil {
		refuse(errors.New("the proxy was started with no configuration to read again"))
		return
	}
	s, err := old.s.reread()
	if err != nil {
		refuse(err)
		return
	}
	fixed := keepFixed(old.s, &s)
	changed := changedKeys(old.s, s)
	sh.stores.next()
	built, err := buildBackends(ctx, s.Backends, sh.stores.storeFor, logger)
	if err != nil {
		refuse(err)
		return
	}
	if s.checks != nil {
		if err := s.checks.run(ctx, s.Upstream, built); err != nil {
			refuse(err)
			return
		}
	}
	run, err := newRun(s, built, sh)
	if err != nil {
		refuse(err)
		return
	}
	apply(run)
	if s.logLevel != nil {
		s.logLevel.Set(s.level)
	}
	attrs := []any{"changed", changed}
	if s.configFile != "" {
		attrs = append([]any{"config", s.configFile}, attrs...)
	}
	if len(fixed) > 0 {
		attrs = append(attrs, "restart_needed", fixed)
		logger.Warn("damper proxy: reloaded; settings that a running proxy cannot change keep their values until a restart", attrs...)
	} else {
		logger.Info("damper proxy: reloaded", attrs...)
	}
}

// keepFixed gives s the values of old that a running proxy cannot change
// (its listeners, its store, its name, the server's limits and timeouts,
// and the log level when the logger's is fixed), with what runs them, and
// returns the keys whose values s had changed.
func keepFixed(old proxySettings, s *proxySettings) []string {
	var fixed []string
	keep := func(key string, differs bool) {
		if differs {
			fixed = append(fixed, key)
		}
	}
	keep("listen", s.Listen != old.Listen)
	keep("admin_listen", s.AdminListen != old.AdminListen)
	keep("store", !sameStore(old.store, s.store))
	keep("name", s.Name != old.Name)
	keep("max_connections", s.MaxConnections != old.MaxConnections)
	keep("max_header_bytes", s.MaxHeaderBytes != old.MaxHeaderBytes)
	keep("read_header_timeout", s.ReadHeaderTimeout != old.ReadHeaderTimeout)
	keep("read_timeout", s.ReadTimeout != old.ReadTimeout)
	keep("idle_timeout", s.IdleTimeout != old.IdleTimeout)
	if old.logLevel == nil {
		keep("log_level", s.level != old.level)
		s.level = old.level
	}
	s.Listen, s.listenIsNonLocal, s.AdminListen, s.adminLn = old.Listen, old.listenIsNonLocal, old.AdminListen, old.adminLn
	s.store, s.fleet, s.Name = old.store, old.fleet, old.Name
	s.MaxConnections, s.MaxHeaderBytes = old.MaxConnections, old.MaxHeaderBytes
	s.ReadHeaderTimeout, s.ReadTimeout, s.IdleTimeout = old.ReadHeaderTimeout, old.ReadTimeout, old.IdleTimeout
	s.reloads, s.reread, s.checks, s.logLevel, s.stores = old.reloads, old.reread, old.checks, old.logLevel, old.stores
	return fixed
}

// sameStore reports whether two stores, as files give them, are the same.
func sameStore(a, b *storeConfig) bool {
	if a == nil || b == nil {
		return a == b
	}
	ac, bc := *a, *b
	if (ac.roots == nil) != (bc.roots == nil) || ac.roots != nil && !ac.roots.Equal(bc.roots) {
		return false
	}
	ac.roots, bc.roots = nil, nil
	return reflect.DeepEqual(ac, bc)
}

// changedKeys are the keys, of those a reload applies, whose values
// differ between old and s. A secret is compared, never shown.
func changedKeys(old, s proxySettings) []string {
	changed := []string{}
	add := func(key string, differs bool) {
		if differs {
			changed = append(changed, key)
		}
	}
	add("upstream", s.Upstream != old.Upstream)
	add("max_request_bytes", s.MaxRequestBytes != old.MaxRequestBytes)
	add("write_timeout", s.WriteTimeout != old.WriteTimeout)
	add("drain_timeout", s.DrainTimeout != old.DrainTimeout)
	add("shutdown_delay", s.ShutdownDelay != old.ShutdownDelay)
	add("log_level", s.level != old.level)
	add("policy", s.policyFromDefault != old.policyFromDefault || !reflect.DeepEqual(s.policy, old.policy))
	add("backends", !reflect.DeepEqual(s.Backends, old.Backends))
	add("tenants", !reflect.DeepEqual(s.tenants, old.tenants))
	add("upstream_api_key_env", s.upstreamKey != old.upstreamKey)
	return changed
}
