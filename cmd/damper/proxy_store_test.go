package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/redistest"
	"github.com/damper-ai/damper-go/redisstore"
)

// redisSecret is a Redis password: nothing the proxy says may hold it.
const redisSecret = "hunter2-redis-secret"

func writeFile(t *testing.T, name, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// testCA is a certificate authority of the test's own, and a server
// certificate for 127.0.0.1 it signed.
type testCA struct {
	pem    string // the CA's certificate
	server tls.Certificate
}

func newTestCA(t *testing.T) testCA {
	t.Helper()
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	caKey, srvKey := key(), key()
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "damper test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	srv := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature,
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srv, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return testCA{
		pem:    string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})),
		server: tls.Certificate{Certificate: [][]byte{srvDER}, PrivateKey: srvKey},
	}
}

// parseProxyFile reads a configuration file of body, as the proxy does.
func parseProxyFile(t *testing.T, body string) (proxySettings, error) {
	t.Helper()
	return parseProxy([]string{"-config", writeFile(t, "proxy.yaml", body)}, io.Discard, io.Discard)
}

// TestProxyStoreSettings: every wrong store key is an error naming its
// path and its value, and none shows a secret; good ones are read as
// written, with the store's name defaulting to the proxy's.
func TestProxyStoreSettings(t *testing.T) {
	t.Setenv("DAMPER_TEST_REDIS_PASSWORD", redisSecret)
	t.Setenv("DAMPER_TEST_REDIS_USERNAME", "proxy")
	t.Setenv("DAMPER_TEST_EMPTY", "")
	os.Unsetenv("DAMPER_TEST_UNSET")
	ca := newTestCA(t)
	caFile := writeFile(t, "ca.pem", ca.pem)
	notPEM := writeFile(t, "not.pem", "hello\n")
	missing := filepath.Join(t.TempDir(), "missing.pem")
	long := strings.Repeat("a", 300)

	for _, tc := range []struct{ file, want string }{
		{"store: {}\n", "store: give address (host:port) or url"},
		{"store: {address: 'h:1', url: 'redis://h:1'}\n", "store: address and url are both given"},
		{"store: {address: nowhere}\n", `store.address: "nowhere": want host:port`},
		{"store: {address: ':6379'}\n", `store.address: ":6379": want host:port`},
		{"store: {address: 'h:0'}\n", `store.address: "h:0": port "0": want 1 to 65535`},
		{"store: {address: 'h:99999'}\n", `port "99999"`},
		{"store: {address: '" + long + ":1'}\n", "store.address: \"" + long[:64] + "\"...: 302 bytes: must be at most 261"},
		{"store: {url: 'redis://:" + redisSecret + "@h:6379'}\n", `store.url: "redis://xxxxx@h:6379": holds a password: give it in an environment variable named by password_env`},
		{"store: {url: 'rediss://u:" + redisSecret + "@h:6379/0'}\n", `store.url: "rediss://xxxxx@h:6379/0": holds a password`},
		{"store: {url: 'redis://u:" + redisSecret + "@h:6379/%zz'}\n", `store.url: "redis://xxxxx@h:6379/%zz": not a URL`},
		{"store: {url: 'http://h:6379'}\n", `store.url: "http://h:6379": want a redis:// or rediss:// URL`},
		{"store: {url: 'unix:///tmp/redis.sock'}\n", `want a redis:// or rediss:// URL`},
		{"store: {url: 'redis://h:6379/x'}\n", `store.url: "redis://h:6379/x": redis: invalid database number: "x"`},
		{"store: {url: 'redis://h:6379?frob=1'}\n", `store.url: "redis://h:6379?frob=xxxxx": redis: unexpected option: frob`},
		{"store: {url: 'rediss://h:6379?skip_verify=true'}\n", `store.url: "rediss://h:6379?skip_verify=xxxxx": skip_verify is not taken`},
		{"store: {url: 'redis://" + strings.Repeat("h", 3000) + "'}\n", "store.url: 3008 bytes: must be at most 2048"},
		{"store: {address: 'h:1', username_env: 'not a name'}\n", `store.username_env: want the name of an environment variable (letters, digits and _, not starting with a digit), not its value (the value, 10 characters, is not shown: it may be a secret)`},
		{"store: {address: 'h:1', password_env: '1PASSWORD'}\n", `store.password_env: want the name`},
		{"store: {address: 'h:1', password_env: '" + redisSecret + "'}\n", `store.password_env: want the name of an environment variable`},
		{"store: {address: 'h:1', password_env: " + strings.Repeat("P", 129) + "}\n", "store.password_env: want the name of an environment variable, at most 128 characters (the value, 129 characters"},
		{"store: {address: 'h:1', password_env: DAMPER_TEST_UNSET}\n", `store.password_env: "DAMPER_TEST_UNSET": the environment variable is not set`},
		{"store: {address: 'h:1', username_env: DAMPER_TEST_EMPTY}\n", `store.username_env: "DAMPER_TEST_EMPTY": the environment variable is empty`},
		{"store: {url: 'redis://alice@h:1', username_env: DAMPER_TEST_REDIS_USERNAME}\n", `store.username_env: "DAMPER_TEST_REDIS_USERNAME": the url names a username already`},
		{"store: {address: 'h:1', ca_file: '" + missing + "'}\n", `store.ca_file: "` + missing + `": no such file or directory`},
		{"store: {address: 'h:1', ca_file: '" + notPEM + "'}\n", `store.ca_file: "` + notPEM + `": holds no PEM certificate`},
		{"store: {address: 'h:1', ca_file: '/" + strings.Repeat("d", 5000) + "'}\n", "store.ca_file: \"/" + strings.Repeat("d", 63) + "\"...: a path of 5001 bytes: must be at most 4096"},
		{"store: {address: 'h:1', name: 'has space'}\n", `store.name: "has space": must be printable ASCII without spaces or braces`},
		{"store: {address: 'h:1', name: 'a{b}'}\n", `store.name: "a{b}": must be printable`},
		{"store: {address: 'h:1', name: " + strings.Repeat("n", 32) + "}\n", `store.name: "` + strings.Repeat("n", 32) + `": must be 1 to 31 characters`},
		{"name: " + strings.Repeat("n", 32) + "\nstore: {address: 'h:1'}\n", `name: "` + strings.Repeat("n", 32) + `": must be 1 to 31 characters (a fallback backend's state is kept under the name, a dot and the backend's name) (the store takes the proxy's name when store.name is not given)`},
		{"store: {address: 'h:1', timeout: 0s}\n", `store.timeout: "0s": must be positive`},
		{"store: {address: 'h:1', timeout: 11s}\n", `store.timeout: "11s": must be at most 10s`},
		{"store: {address: 'h:1', frob: 1}\n", `store.frob: unknown key`},
		{"store: {address: 'h:1', lease: 1001}\n", `store.lease: 1001: must be at most 1000`},
		{"store: {address: 'h:1', lease: -1}\n", `store.lease: -1: must be at least 0`},
		{"store: {address: 'h:1', lease_for: 2m}\n", `store.lease_for: "2m0s": must be at most 1m0s`},
		{"store: {address: 'h:1', tls: maybe}\n", `store.tls`},
		{"admin_listen: nowhere\n", `admin_listen: "nowhere": want host:port`},
		{"admin_listen: '" + long + "'\n", "admin_listen: 300 bytes: must be at most 261"},
	} {
		_, err := parseProxyFile(t, tc.file)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%.120s: error %v, want %s", tc.file, err, tc.want)
			continue
		}
		if strings.Contains(err.Error(), redisSecret) || strings.Contains(err.Error(), "DAMPER_TEST_REDIS_PASSWORD") {
			t.Errorf("the error shows the password, or a variable nobody asked about: %v", err)
		}
	}

	s, err := parseProxyFile(t, `
name: edge
admin_listen: 127.0.0.1:9464
store:
  address: redis.internal:6380
  username_env: DAMPER_TEST_REDIS_USERNAME
  password_env: DAMPER_TEST_REDIS_PASSWORD
  ca_file: `+caFile+`
  timeout: 20ms
  fail_closed: true
  lease: 5
  lease_for: 2s
`)
	if err != nil {
		t.Fatal(err)
	}
	c := s.store
	if s.AdminListen != "127.0.0.1:9464" || c == nil || c.base.Addr != "redis.internal:6380" || c.name != "edge" || c.timeout != 20*time.Millisecond ||
		!c.failClosed || c.lease != 5 || c.leaseFor != 2*time.Second || !c.tls || c.roots == nil || c.pingTimeout != 5*time.Second {
		t.Errorf("store %+v, admin_listen %q", c, s.AdminListen)
	}
	if strings.Contains(fmt.Sprintf("%+v %+v", s, *c), redisSecret) {
		t.Error("the settings hold the password: they are read at start only")
	}
	if user, password, err := c.credentials(); err != nil || user != "proxy" || password != redisSecret {
		t.Errorf("credentials: %q, %v", user, err)
	}
	tc := c.tlsConfig()
	if tc == nil || tc.MinVersion != tls.VersionTLS12 || tc.ServerName != "redis.internal" || tc.RootCAs != c.roots {
		t.Errorf("TLS config %+v", tc)
	}

	for _, tt := range []struct {
		file      string
		addr      string
		name      string
		tls       bool
		db        int
		username  string
		timeout   time.Duration
		transport bool // the url's own option came through
	}{
		{"store: {url: 'rediss://cache:6390/2'}\n", "cache:6390", "damper", true, 2, "", redisstore.DefaultTimeout, false},
		{"store: {url: 'redis://alice@cache?dial_timeout=2s', name: fleet-a}\n", "cache:6379", "fleet-a", false, 0, "alice", redisstore.DefaultTimeout, true},
		{"name: edge\nstore: {address: '[::1]:6379', tls: true}\n", "[::1]:6379", "edge", true, 0, "", redisstore.DefaultTimeout, false},
	} {
		s, err := parseProxyFile(t, tt.file)
		if err != nil {
			t.Errorf("%s: %v", tt.file, err)
			continue
		}
		c := s.store
		if c.base.Addr != tt.addr || c.name != tt.name || c.tls != tt.tls || c.base.DB != tt.db || c.base.Username != tt.username ||
			c.timeout != tt.timeout || c.base.TLSConfig != nil || (c.base.DialTimeout == 2*time.Second) != tt.transport {
			t.Errorf("%s: %+v", tt.file, c)
		}
		if (c.tlsConfig() != nil) != tt.tls {
			t.Errorf("%s: TLS config %v", tt.file, c.tlsConfig())
		}
	}
	if tc := (&storeConfig{base: redis.Options{Addr: "[::1]:6379"}, tls: true}).tlsConfig(); tc.ServerName != "::1" || tc.RootCAs != nil {
		t.Errorf("TLS config for [::1]: %+v", tc)
	}
	if s, err := parseProxyFile(t, "listen: 127.0.0.1:0\n"); err != nil || s.store != nil || s.AdminListen != "" {
		t.Errorf("no store: %+v, %v", s.store, err)
	}
}

// fakeTLSRedis is a server that speaks enough of Redis over TLS, with
// cert, for a client to connect and PING: it answers PING with PONG,
// HELLO with an error (the client then speaks RESP2), and the rest with
// OK.
func fakeTLSRedis(t *testing.T, cert tls.Certificate) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() { serveFakeRedis(c) })
		}
	})
	return ln.Addr().String()
}

func serveFakeRedis(c net.Conn) {
	defer c.Close()
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "*") {
			return
		}
		n, _ := strconv.Atoi(strings.TrimSpace(line[1:]))
		var args []string
		for range n {
			if _, err := r.ReadString('\n'); err != nil { // $len
				return
			}
			arg, err := r.ReadString('\n')
			if err != nil {
				return
			}
			args = append(args, strings.TrimSpace(arg))
		}
		reply := "+OK\r\n"
		switch strings.ToUpper(args[0]) {
		case "PING":
			reply = "+PONG\r\n"
		case "HELLO":
			reply = "-ERR unknown command 'HELLO'\r\n"
		}
		if _, err := io.WriteString(c, reply); err != nil {
			return
		}
	}
}

// TestProxyStoreTLS: a store with the CA's file reaches a server that
// speaks TLS with a certificate the CA signed; without the CA the start
// check fails, naming the store.
func TestProxyStoreTLS(t *testing.T) {
	ca := newTestCA(t)
	addr := fakeTLSRedis(t, ca.server)
	caFile := writeFile(t, "ca.pem", ca.pem)

	s, err := parseProxyFile(t, fmt.Sprintf("store: {address: '%s', ca_file: '%s'}\n", addr, caFile))
	if err != nil {
		t.Fatal(err)
	}
	st, err := openProxyStore(context.Background(), s.store, newLogger(io.Discard, 0))
	if err != nil {
		t.Fatalf("with the CA: %v", err)
	}
	if o := st.client.Options(); o.TLSConfig == nil || o.TLSConfig.MinVersion != tls.VersionTLS12 || !o.ContextTimeoutEnabled {
		t.Errorf("client options: TLS %+v, context timeouts %v", o.TLSConfig, o.ContextTimeoutEnabled)
	}
	st.Close()

	s, err = parseProxyFile(t, fmt.Sprintf("store: {url: 'rediss://%s'}\n", addr))
	if err != nil {
		t.Fatal(err)
	}
	s.store.pingTimeout = 2 * time.Second
	_, err = openProxyStore(context.Background(), s.store, newLogger(io.Discard, 0))
	want := "store (redis at " + addr + "): TLS failed: "
	if err == nil || !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), "x509") {
		t.Errorf("without the CA: %v, want %s...x509...", err, want)
	}
}

// TestProxyStoreStartCheck: at start the proxy asks Redis, and stops with
// an error naming the store when Redis refuses the credentials, never
// showing the password, or, with fail_closed, cannot be reached; with the
// right password it serves, and a Redis that goes down afterwards is a
// fallback, not an exit.
func TestProxyStoreStartCheck(t *testing.T) {
	cloudEnv(t, false)
	// A closed port: nothing to reach.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	var errb bytes.Buffer
	file := writeFile(t, "closed.yaml", "listen: 127.0.0.1:0\nstore: {address: '"+closed+"', fail_closed: true}\n")
	if code := run([]string{"proxy", "-config", file}, io.Discard, &errb); code != exitFail ||
		!strings.Contains(errb.String(), "store (redis at "+closed+"): cannot reach it (fail_closed: the proxy starts only once Redis answers): dial tcp "+closed+": ") {
		t.Errorf("a closed port: exit %d, %s", code, errb.String())
	}
	if strings.Contains(errb.String(), "damper proxy: serving") {
		t.Error("the proxy served without its store")
	}

	needRedis(t)
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	if err := rdb.ConfigSet(context.Background(), "requirepass", redisSecret).Err(); err != nil {
		t.Fatal(err)
	}
	rdb.Close()

	for _, tc := range []struct {
		env, want string
	}{
		{"wrong-password-secret", "store (redis at " + srv.Addr + "): it refused the credentials: WRONGPASS"},
		{"", "store (redis at " + srv.Addr + "): it asks for credentials: name the variables that hold them in username_env and password_env: NOAUTH"},
	} {
		conf := "listen: 127.0.0.1:0\nstore: {address: '" + srv.Addr + "'}\n"
		if tc.env != "" {
			t.Setenv("DAMPER_TEST_REDIS_PASSWORD", tc.env)
			conf = "listen: 127.0.0.1:0\nstore: {address: '" + srv.Addr + "', password_env: DAMPER_TEST_REDIS_PASSWORD}\n"
		}
		errb.Reset()
		if code := run([]string{"proxy", "-config", writeFile(t, "auth.yaml", conf)}, io.Discard, &errb); code != exitFail ||
			!strings.Contains(errb.String(), tc.want) {
			t.Errorf("password %q: exit %d, %s; want %s", tc.env, code, errb.String(), tc.want)
		}
		if tc.env != "" && strings.Contains(errb.String(), tc.env) || strings.Contains(errb.String(), redisSecret) {
			t.Errorf("the error shows a password: %s", errb.String())
		}
	}

	api := fakeAPI(t)
	p := startProxyProcess(t, "with-password", fmt.Sprintf(`
listen: 127.0.0.1:0
upstream: %s
name: start-check
store: {address: '%s', password_env: DAMPER_TEST_REDIS_PASSWORD, timeout: 20ms}
policy: {backoff_base: 0}
`, api.URL(), srv.Addr), "DAMPER_TEST_REDIS_PASSWORD="+redisSecret)
	if !strings.Contains(p.logs.String(), `"store":"redis at `+srv.Addr+`, name start-check"`) {
		t.Errorf("the serving line does not name the store:\n%s", p.logs)
	}
	call := func() *http.Response {
		t.Helper()
		res, _ := callThrough(t, p.url, "overloaded")
		return res
	}
	if res := call(); res.StatusCode != 200 || res.Header.Get("Damper-Attempts") != "2" {
		t.Errorf("a call with Redis up: %d, %s attempts", res.StatusCode, res.Header.Get("Damper-Attempts"))
	}
	srv.Kill()
	api.Script("overloaded", dampertest.Status(529), dampertest.OK())
	if res := call(); res.StatusCode != 200 || res.Header.Get("Damper-Attempts") != "2" {
		t.Errorf("a call with Redis down: %d, %s attempts", res.StatusCode, res.Header.Get("Damper-Attempts"))
	}
	if strings.Contains(p.logs.String(), redisSecret) {
		t.Error("the password is in the proxy's logs")
	}
}

// TestProxyBackendStore: a fallback backend's store is on the primary's
// client, under the store's name, a dot and the backend's name.
func TestProxyBackendStore(t *testing.T) {
	needRedis(t)
	srv := redistest.Start(t)
	s, err := parseProxyFile(t, "name: checkout\nstore: {address: '"+srv.Addr+"'}\n")
	if err != nil {
		t.Fatal(err)
	}
	p, err := openProxyStore(context.Background(), s.store, newLogger(io.Discard, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	bs, err := p.backendStore("bedrock")
	if err != nil {
		t.Fatal(err)
	}
	settings := fleet.BudgetSettings{Ratio: 0.1, Window: time.Minute, MinTokens: 10}
	for name, st := range map[string]fleet.Store{"checkout": p.primary, "checkout.bedrock": bs} {
		b, err := st.Budget(settings)
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := b.Acquire(context.Background(), time.Now()); !ok || err != nil {
			t.Fatalf("%s: Acquire %v, %v", name, ok, err)
		}
		if n, err := p.client.Exists(context.Background(), redisstore.Key(name)).Result(); n != 1 || err != nil {
			t.Errorf("key %s: %d, %v", redisstore.Key(name), n, err)
		}
	}
	if _, err := p.backendStore(strings.Repeat("b", 32)); err != nil {
		t.Errorf("a 32-character backend: %v", err)
	}
	if _, err := p.backendStore("has space"); err == nil || !strings.Contains(err.Error(), `the store of backend "has space"`) {
		t.Errorf("a bad backend name: %v", err)
	}
}

// openTestStore opens the proxy's store of name on the Redis at addr, as
// a file with the address alone (and a timeout a loaded machine keeps to)
// would.
func openTestStore(t *testing.T, addr, name string) *proxyStore {
	t.Helper()
	c, err := parseStore(&proxyStoreFile{Address: addr, Timeout: time.Second}, name)
	if err != nil {
		t.Fatal(err)
	}
	st, err := openProxyStore(context.Background(), c, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestProxyBackendStateInRedis: with a store and a fallback backend, the
// upstream's state and the backend's live in Redis apart, under the
// store's name and under the name, a dot and the backend's.
func TestProxyBackendStateInRedis(t *testing.T) {
	needRedis(t)
	cloudEnv(t, true)
	rds := redistest.Start(t)
	primary := newSwitchable(t, 529)
	bedrock := fakeBedrock(t)
	st := openTestStore(t, rds.Addr, "fleet")
	defer st.Close()
	withStore := func(s *proxySettings) {
		s.policy = damper.Policy{MaxAttempts: 1, Breaker: &damper.BreakerPolicy{MinAttempts: 2, OpenFor: time.Minute}}
		s.Backends = []backendFile{bedrockBackend(bedrock)}
		keyMode(s)
		s.fleet = st
	}
	p := startProxy(t, primary.URL(), withStore)
	for i := range 3 {
		resp, body := callThrough(t, p.url, "")
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "from bedrock") {
			t.Fatalf("call %d: %d %s, want Bedrock's answer", i+1, resp.StatusCode, body)
		}
	}
	if n, m := primary.Count(""), bedrock.Count(""); n != 2 || m != 3 {
		t.Errorf("the upstream got %d requests, Bedrock %d; want 2 and 3: the upstream's breaker opened at its second failure", n, m)
	}
	// The attempts' records go to Redis in batches after the answers.
	if err := st.flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: rds.Addr})
	defer rdb.Close()
	keys, err := rdb.Keys(context.Background(), "damper:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(keys)
	var upstream, backend bool
	for _, k := range keys {
		upstream = upstream || strings.HasPrefix(k, "damper:{fleet}:breaker")
		backend = backend || strings.HasPrefix(k, "damper:{fleet.bedrock}:budget")
	}
	if !upstream || !backend {
		t.Errorf("keys in Redis: %q; want the upstream's breaker under {fleet} and Bedrock's budget under {fleet.bedrock}", keys)
	}
	// The upstream's breaker is the one in Redis: open, so a proxy given
	// the same store sends nothing upstream.
	q := startProxy(t, primary.URL(), withStore)
	resp, _ := callThrough(t, q.url, "")
	if n, m := primary.Count(""), bedrock.Count(""); resp.StatusCode != http.StatusOK || n != 2 || m != 4 {
		t.Errorf("through a second proxy: %d, the upstream got %d requests, Bedrock %d; want 200, 2 and 4", resp.StatusCode, n, m)
	}
}

// TestProxyStoreCloseSendsTheRecords: what the stores still hold when the
// proxy stops (an attempt's end heard after the last answer) reaches
// Redis before the client closes.
func TestProxyStoreCloseSendsTheRecords(t *testing.T) {
	needRedis(t)
	rds := redistest.Start(t)
	st := openTestStore(t, rds.Addr, "closing")
	backend, err := st.backendStore("bedrock")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for _, s := range []fleet.Store{st.primary, backend} {
		b, err := s.Budget(fleet.BudgetSettings{Ratio: 0.1, Window: time.Hour, MinTokens: 10})
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Observe(context.Background(), now, fleet.AttemptOutcome{First: true, Success: true}); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: rds.Addr})
	defer rdb.Close()
	for _, name := range []string{"closing", "closing.bedrock"} {
		if got, err := rdb.HGet(context.Background(), redisstore.Key(name), "s").Result(); err != nil || got != "1" {
			t.Errorf("%s: the success heard before Close: %q, %v; want 1 in Redis", redisstore.Key(name), got, err)
		}
	}
}
