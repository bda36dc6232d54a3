package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/damper-ai/damper-go/conf"
	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/redisstore"
)

// proxyStoreFile is the file's store: the Damper's state in Redis,
// shared by every proxy given the same store.
//
//	store:
//	  address: redis:6379          # or url: redis://host:6379/0, rediss://...
//	  username_env: REDIS_USERNAME # names of environment variables, never the secrets
//	  password_env: REDIS_PASSWORD
//	  tls: true                    # implied by rediss:// and ca_file
//	  ca_file: /etc/redis/ca.pem
//	  name: checkout               # default: the proxy's name, else "damper"
//	  timeout: 50ms
//	  fail_closed: false
type proxyStoreFile struct {
	Address     string        `key:"address"`
	URL         string        `key:"url"`
	UsernameEnv string        `key:"username_env"`
	PasswordEnv string        `key:"password_env"`
	TLS         bool          `key:"tls"`
	CAFile      string        `key:"ca_file"`
	Name        string        `key:"name"`
	Timeout     time.Duration `key:"timeout" default:"50ms" min:">0" max:"10s"`
	FailClosed  bool          `key:"fail_closed"`
	// Lease and LeaseFor are redisstore.Options': each process takes up
	// to Lease budget units, or calls' worth of rate-limit tokens, in one
	// decision.
	Lease    int           `key:"lease" min:"0" max:"1000" zero:"no lease"`
	LeaseFor time.Duration `key:"lease_for" min:"0" max:"1m" zero:"1s"`
}

// Bounds on what the store's keys hold.
const (
	maxStoreAddress = 261 // a 255-byte host name, ':', a port
	maxStoreURL     = 2048
	maxCAFilePath   = 4096
	maxCAFileBytes  = 1 << 20
	// maxStoreName leaves room for ".<backend>", a backend's name being at
	// most 32 bytes, within redisstore's 64.
	maxStoreName     = 31
	defaultStoreName = "damper"
	storePingTimeout = 5 * time.Second
	// storeJoinEvery is how often a proxy that started without Redis asks
	// it again, until it answers.
	storeJoinEvery    = time.Second
	storeBackendJoint = "."
)

// storeKeepEvery is how often a proxy that has heard Redis probes it,
// whatever its traffic: well within redisstore.MemberFor, so that an idle
// proxy stays counted among the members that share the limits in a
// fault, and comes back from a fallback without a call.
var storeKeepEvery = redisstore.MemberFor / 4

// storeConfig is the file's store, checked. It holds the names of the
// environment variables with the credentials, never their values, which
// openProxyStore reads.
type storeConfig struct {
	base        redis.Options // Addr, DB and the url's options; no credentials
	urlUsername bool          // the url named the username
	usernameEnv string
	passwordEnv string
	tls         bool
	roots       *x509.CertPool // nil: the system's
	name        string
	timeout     time.Duration
	failClosed  bool
	lease       int
	leaseFor    time.Duration
	// pingTimeout bounds the PING at start; tests shorten it.
	pingTimeout time.Duration
}

// describe names the store in messages: where it is, never a credential.
func (c *storeConfig) describe() string { return "store (redis at " + c.base.Addr + ")" }

// parseStore checks the file's store, filled in; proxyName is the proxy's
// name, the store name's default. It returns nil for no store.
func parseStore(f *proxyStoreFile, proxyName string) (*storeConfig, error) {
	if f == nil {
		return nil, nil
	}
	c := &storeConfig{timeout: f.Timeout, failClosed: f.FailClosed, lease: f.Lease, leaseFor: f.LeaseFor, tls: f.TLS, pingTimeout: storePingTimeout}
	switch {
	case f.Address != "" && f.URL != "":
		return nil, storeError("store", "address and url are both given: give one of them")
	case f.Address == "" && f.URL == "":
		return nil, storeError("store", "give address (host:port) or url (redis:// or rediss://)")
	case f.Address != "":
		if err := checkAddress(f.Address); err != nil {
			return nil, storeError("store.address", "%s: %v", shownURL(f.Address), err)
		}
		c.base.Addr = f.Address
	default:
		if err := c.parseURL(f.URL); err != nil {
			return nil, err
		}
	}
	for _, e := range []struct{ key, name string }{{"username_env", f.UsernameEnv}, {"password_env", f.PasswordEnv}} {
		if e.name == "" {
			continue
		}
		// A wrong name is not shown: it may be the secret itself.
		if err := checkEnvName(e.name); err != nil {
			return nil, storeError("store."+e.key, "%v (the value, %d characters, is not shown: it may be a secret)", err, len(e.name))
		}
	}
	if f.UsernameEnv != "" && c.urlUsername {
		return nil, storeError("store.username_env", "%q: the url names a username already: give it in one place", f.UsernameEnv)
	}
	c.usernameEnv, c.passwordEnv = f.UsernameEnv, f.PasswordEnv
	if f.CAFile != "" {
		roots, err := readCAFile(f.CAFile)
		if err != nil {
			return nil, storeError("store.ca_file", "%s: %v", shown(f.CAFile), err)
		}
		c.roots, c.tls = roots, true
	}
	c.name = f.Name
	namePath := "store.name"
	if c.name == "" {
		c.name = proxyName
		namePath = "name" // the store's name by default
	}
	if c.name == "" {
		c.name = defaultStoreName
	}
	if err := checkStoreName(c.name); err != nil {
		if namePath == "name" {
			err = fmt.Errorf("%w (the store takes the proxy's name when store.name is not given)", err)
		}
		return nil, storeError(namePath, "%s: %v", shown(c.name), err)
	}
	// The credentials are read at start, where their variables must be set
	// too: checked here so that a wrong file is found at once.
	if _, _, err := c.credentials(); err != nil {
		return nil, err
	}
	return c, nil
}

// parseURL reads the store's url into c.
func (c *storeConfig) parseURL(raw string) error {
	const path = "store.url"
	shownRaw := shownURL(raw)
	if len(raw) > maxStoreURL {
		return storeError(path, "%d bytes: must be at most %d", len(raw), maxStoreURL)
	}
	u, err := url.Parse(raw)
	if err != nil {
		// url's errors repeat the url, password and all.
		return storeError(path, "%s: not a URL", shownRaw)
	}
	if _, ok := u.User.Password(); ok {
		return storeError(path, "%s: holds a password: give it in an environment variable named by password_env", shownRaw)
	}
	if u.Scheme != "redis" && u.Scheme != "rediss" {
		return storeError(path, "%s: want a redis:// or rediss:// URL", shownRaw)
	}
	if u.Query().Has("skip_verify") {
		return storeError(path, "%s: skip_verify is not taken: give the server's CA in ca_file", shownRaw)
	}
	if u.Query().Has("max_retries") {
		return storeError(path, "%s: max_retries is not taken: the store's client never retries, the store's fallback and probes handle Redis's failures", shownRaw)
	}
	o, err := redis.ParseURL(raw)
	if err != nil {
		// The client's errors quote the value of a query option it cannot read.
		return storeError(path, "%s: %s", shownRaw, scrubQueryValues(err.Error(), raw))
	}
	if err := checkAddress(o.Addr); err != nil {
		return storeError(path, "%s: %v", shownRaw, err)
	}
	c.urlUsername = o.Username != ""
	if o.TLSConfig != nil {
		c.tls = true
		o.TLSConfig = nil // built again at start, with the CA file's roots
	}
	c.base = *o
	return nil
}

// credentials returns the client's username and password, read from the
// variables the file names. Its errors name the variable, never its value.
func (c *storeConfig) credentials() (user, password string, err error) {
	read := func(key, name string) (string, error) {
		if name == "" {
			return "", nil
		}
		v, ok := os.LookupEnv(name)
		switch {
		case !ok:
			return "", storeError("store."+key, "%q: the environment variable is not set", name)
		case v == "":
			return "", storeError("store."+key, "%q: the environment variable is empty", name)
		}
		return v, nil
	}
	if user, err = read("username_env", c.usernameEnv); err != nil {
		return "", "", err
	}
	if password, err = read("password_env", c.passwordEnv); err != nil {
		return "", "", err
	}
	return cmp.Or(user, c.base.Username), password, nil
}

func storeError(path, format string, args ...any) error {
	return &conf.Error{Path: path, Err: fmt.Errorf(format, args...)}
}

// checkAddress checks a host:port.
func checkAddress(addr string) error {
	if len(addr) > maxStoreAddress {
		return fmt.Errorf("%d bytes: must be at most %d", len(addr), maxStoreAddress)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return errors.New("want host:port")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port %q: want 1 to 65535", port)
	}
	for _, r := range host {
		if r <= ' ' || r > '~' {
			return errors.New("the host holds a space or a character that is not printable ASCII")
		}
	}
	return nil
}

// checkStoreName checks a name as redisstore takes it, with room for a
// backend's suffix.
func checkStoreName(name string) error {
	if len(name) > maxStoreName {
		return fmt.Errorf("must be 1 to %d characters (a fallback backend's state is kept under the name, a dot and the backend's name)", maxStoreName)
	}
	for _, r := range name {
		if r < 0x21 || r > 0x7e || r == '{' || r == '}' {
			return errors.New("must be printable ASCII without spaces or braces")
		}
	}
	return nil
}

// readCAFile reads a PEM file of root certificates.
func readCAFile(path string) (*x509.CertPool, error) {
	if len(path) > maxCAFilePath {
		return nil, fmt.Errorf("a path of %d bytes: must be at most %d", len(path), maxCAFilePath)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, pathCause(err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxCAFileBytes+1))
	if err != nil {
		return nil, pathCause(err)
	}
	if len(data) > maxCAFileBytes {
		return nil, fmt.Errorf("larger than %d bytes", maxCAFileBytes)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, errors.New("holds no PEM certificate")
	}
	return pool, nil
}

// pathCause is err without the path a message shows already.
func pathCause(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// proxyStore is the proxy's way to Redis: one client, the primary's
// store on it, and the fallback backends' stores on the same client.
type proxyStore struct {
	client  *redis.Client
	primary *redisstore.Store
	name    string
	addr    string
	options redisstore.Options // the primary's; a backend's differs by Name

	mu       sync.Mutex
	backends []*redisstore.Store // made by backendStore, flushed at Close
	byName   map[string]*redisstore.Store

	// The probes (join): stopJoin ends them, joined is closed when they
	// have ended.
	stopJoin  context.CancelFunc
	joined    chan struct{}
	joinEvery time.Duration
	keepEvery time.Duration
}

// openProxyStore builds the client and the primary's store, and checks
// with a PING, bounded by c.pingTimeout, that Redis answers and takes the
// credentials; nil without a store. A Redis that cannot be reached stops
// the start only with fail_closed: otherwise the proxy starts on state in
// memory and joins Redis when it answers (join). A Redis that refuses the
// file's credentials, TLS or user always stops it: that proxy could never
// share its state. Once running, a Redis that fails is the store's
// fallback, not an exit.
func openProxyStore(ctx context.Context, c *storeConfig, logger *slog.Logger) (*proxyStore, error) {
	if c == nil {
		return nil, nil
	}
	user, password, err := c.credentials()
	if err != nil {
		return nil, err
	}
	redisLog.once.Do(func() { redis.SetLogger(redisLogger{}) })
	redisLog.to.Store(logger)
	o := c.base
	o.Username, o.Password = user, password
	o.ContextTimeoutEnabled = true
	// One retry layer, redisstore's: go-redis sends a pipeline whose
	// replies a reset cut again, though Redis ran it.
	o.MaxRetries = -1
	o.TLSConfig = c.tlsConfig()
	client := redis.NewClient(&o)
	pctx, cancel := context.WithTimeout(ctx, c.pingTimeout)
	defer cancel()
	p := &proxyStore{client: client, name: c.name, addr: c.base.Addr, joinEvery: storeJoinEvery, keepEvery: storeKeepEvery,
		options: redisstore.Options{Name: c.name, Timeout: c.timeout, FailClosed: c.failClosed, Lease: c.lease, LeaseFor: c.leaseFor, Logger: logger}}
	pingErr := client.Ping(pctx).Err()
	if pingErr != nil && (c.failClosed || !unreachable(pingErr)) {
		_ = p.Close()
		hint := ""
		if c.failClosed && unreachable(pingErr) {
			hint = " (fail_closed: the proxy starts only once Redis answers)"
		}
		return nil, fmt.Errorf("%s: %s%s: %w", c.describe(), pingFailure(pingErr), hint, pingErr)
	}
	if p.primary, err = redisstore.New(client, p.options); err != nil {
		_ = p.Close()
		return nil, fmt.Errorf("%s: %w", c.describe(), err)
	}
	if pingErr != nil {
		logger.Warn("damper proxy: Redis cannot be reached: starting on state in memory; the store joins Redis when it answers",
			"store", p.String(), "error", pingErr.Error())
	}
	p.join(logger, pingErr != nil)
	return p, nil
}

// join probes the stores on a timer until Close: while waiting (a proxy
// started without Redis), at once and then every joinEvery until Redis
// answers all of them, saying so in one line; from then on every
// keepEvery, which keeps an idle proxy's membership fresh (see
// redisstore.Store.Probe). The first probe, before join returns, puts the
// stores in their fallback, so that no call waits on a Redis that is not
// there.
func (p *proxyStore) join(logger *slog.Logger, waiting bool) {
	ctx, stop := context.WithCancel(context.Background())
	p.stopJoin, p.joined = stop, make(chan struct{})
	began := time.Now()
	joined := func() {
		logger.Info("damper proxy: Redis answers: the store joined it, state is shared from now on",
			"store", p.String(), "after", time.Since(began))
	}
	if waiting && p.probe(ctx) {
		joined()
		waiting = false
	}
	go func() {
		defer close(p.joined)
		every := func() time.Duration {
			if waiting {
				return p.joinEvery
			}
			return p.keepEvery
		}
		timer := time.NewTimer(every())
		defer timer.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			}
			if p.probe(ctx) && waiting {
				joined()
				waiting = false
			}
			timer.Reset(every())
		}
	}()
}

// probe probes every store, and reports whether Redis answered each.
func (p *proxyStore) probe(ctx context.Context) bool {
	p.mu.Lock()
	stores := append([]*redisstore.Store{p.primary}, p.backends...)
	p.mu.Unlock()
	ok := true
	for _, s := range stores {
		if s.Probe(ctx) != nil {
			ok = false
		}
	}
	return ok
}

// inMemory reports whether the primary's state is decided in memory now:
// Redis has not answered since the start, or failed since; nil-safe.
func (p *proxyStore) inMemory() bool {
	return p != nil && p.primary != nil && p.primary.State() == redisstore.StateFallback
}

// unreachable reports whether err, a failed PING, says that Redis could
// not be reached (nothing listens, no route, a name not found, no answer
// in time, a connection cut, a server loading its data) rather than that
// it refused the file's credentials, TLS or user: those never change by
// waiting.
func unreachable(err error) bool {
	if pingFailure(err) != cannotReach {
		return false
	}
	var dns *net.DNSError
	var op *net.OpError
	var ne net.Error
	switch {
	case errors.As(err, &dns), errors.As(err, &op),
		errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return true
	case errors.As(err, &ne) && ne.Timeout():
		return true
	}
	return strings.HasPrefix(err.Error(), "LOADING")
}

// redisLog is where the Redis client's own messages go: the proxy's
// logger, as JSON lines, rather than the client's default, plain lines on
// stderr. The client's logger is global: set once, it writes to the
// logger of the last store opened.
var redisLog struct {
	once sync.Once
	to   atomic.Pointer[slog.Logger]
}

type redisLogger struct{}

func (redisLogger) Printf(_ context.Context, format string, v ...any) {
	if l := redisLog.to.Load(); l != nil {
		l.Warn("damper proxy: redis client", "message", libraryMessage(format, v...))
	}
}

// tlsConfig is the client's TLS configuration: nil without TLS.
func (c *storeConfig) tlsConfig() *tls.Config {
	if !c.tls {
		return nil
	}
	host, _, _ := net.SplitHostPort(c.base.Addr)
	return &tls.Config{MinVersion: tls.VersionTLS12, ServerName: host, RootCAs: c.roots}
}

// cannotReach is pingFailure's word for every failure that is not a
// refusal of the file's settings.
const cannotReach = "cannot reach it"

// pingFailure says what a failed PING at start means.
func pingFailure(err error) string {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "tls: "), strings.Contains(msg, "x509: "):
		return "TLS failed"
	case strings.HasPrefix(msg, "NOAUTH"):
		return "it asks for credentials: name the variables that hold them in username_env and password_env"
	case strings.HasPrefix(msg, "WRONGPASS"), strings.Contains(msg, "invalid password"), strings.Contains(msg, "invalid username-password"):
		return "it refused the credentials"
	case strings.HasPrefix(msg, "NOPERM"):
		return "it refused the user a command the store needs"
	}
	return cannotReach
}

// maxBackendStores bounds the fallback backends' stores one process
// makes: a backend's is made once, and kept through reloads.
const maxBackendStores = 64

// backendStore returns the store of a fallback backend: on the same
// client as the primary's, under the store's name, a dot and backend;
// the same one each time it is asked for the same backend.
func (p *proxyStore) backendStore(backend string) (fleet.Store, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s, ok := p.byName[backend]; ok {
		return s, nil
	}
	if len(p.backends) >= maxBackendStores {
		return nil, fmt.Errorf("the store of backend %q: the proxy has made the stores of %d backends, the most it keeps: restart it to use another", backend, maxBackendStores)
	}
	o := p.options
	o.Name = p.name + storeBackendJoint + backend
	s, err := redisstore.New(p.client, o)
	if err != nil {
		return nil, fmt.Errorf("the store of backend %q: %w", backend, err)
	}
	p.backends = append(p.backends, s)
	if p.byName == nil {
		p.byName = map[string]*redisstore.Store{}
	}
	p.byName[backend] = s
	return s, nil
}

// storeFor returns what gives each fallback backend its store, or nil
// (each keeps its state in memory) when the proxy has no store; nil-safe.
func (p *proxyStore) storeFor() func(backend string) (fleet.Store, error) {
	if p == nil {
		return nil
	}
	return p.backendStore
}

// flush sends the records every store holds and waits for Redis's
// answers, or for ctx's end.
func (p *proxyStore) flush(ctx context.Context) error {
	var err error
	p.mu.Lock()
	stores := append([]*redisstore.Store{p.primary}, p.backends...)
	p.mu.Unlock()
	for _, s := range stores {
		if s != nil { // nil: closing after a failed start
			err = errors.Join(err, s.Flush(ctx))
		}
	}
	return err
}

// Close sends the records the stores still hold (an attempt's end, heard
// after the drain's last answer), within a store timeout each, and closes
// the client, after which the client's messages go nowhere; nil-safe.
func (p *proxyStore) Close() error {
	if p == nil {
		return nil
	}
	if p.stopJoin != nil {
		p.stopJoin()
		<-p.joined
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(2*p.options.Timeout, 100*time.Millisecond))
	err := p.flush(ctx)
	cancel()
	err = errors.Join(err, p.client.Close())
	redisLog.to.CompareAndSwap(p.options.Logger, nil)
	return err
}

// String names the store in log lines.
func (p *proxyStore) String() string { return "redis at " + p.addr + ", name " + p.name }
