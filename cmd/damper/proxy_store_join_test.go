package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/damper-ai/damper-go/dampertest"
	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/redistest"
	"github.com/damper-ai/damper-go/redisstore"
)

// joinWait bounds the waits for a proxy to join a Redis that came up: it
// asks once a second.
const joinWait = 15 * time.Second

// TestProxyStartsWithoutRedis: a fail-open proxy whose Redis does not
// listen yet starts on state in memory, says so in its log and on /readyz
// (200: it serves), serves calls with its retries, and once a Redis
// answers on that address joins it, saying so once: its state then lands
// in Redis.
func TestProxyStartsWithoutRedis(t *testing.T) {
	needRedis(t)
	cloudEnv(t, false)
	srv := redistest.Start(t)
	srv.Kill() // its port is known, and nothing listens on it
	api := fakeAPI(t)
	p := startProxyProcess(t, "no-redis-yet", fmt.Sprintf(`
listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
upstream: %s
name: joins
store: {address: '%s', timeout: 200ms}
policy: {backoff_base: 0}
`, api.URL(), srv.Addr))
	store := `"store":"redis at ` + srv.Addr + `, name joins"`
	logs := p.logs.String()
	if !strings.Contains(logs, `"msg":"damper proxy: Redis cannot be reached: starting on state in memory; the store joins Redis when it answers",`+store+`,"error":"dial tcp `+srv.Addr+`: connect: connection refused"`) {
		t.Fatalf("no warning naming the store and the error:\n%s", logs)
	}
	firstWindow := time.Now().Unix() / 60 // the Policy's retry_budget_window, 60 s
	if res, _ := callThrough(t, p.url, "overloaded"); res.StatusCode != 200 || res.Header.Get("Damper-Attempts") != "2" {
		t.Errorf("a call before Redis: %d, %s attempts; want 200 after 2", res.StatusCode, res.Header.Get("Damper-Attempts"))
	}
	if code, body := get(t, "http://"+p.admin+"/readyz"); code != 200 || body != readyInMemory+"\n" {
		t.Errorf("/readyz before Redis: %d %q; want 200 %q", code, body, readyInMemory+"\n")
	}

	srv.Restart()
	joined := `"msg":"damper proxy: Redis answers: the store joined it, state is shared from now on",` + store
	deadline := time.Now().Add(joinWait)
	for !strings.Contains(p.logs.String(), joined) {
		if time.Now().After(deadline) {
			t.Fatalf("not joined within %v of Redis's start:\n%s", joinWait, p.logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code, body := get(t, "http://"+p.admin+"/readyz"); code != 200 || body != "ready\n" {
		t.Errorf("/readyz once joined: %d %q", code, body)
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()
	api.Script("overloaded", dampertest.Status(529), dampertest.OK())
	if res, _ := callThrough(t, p.url, "overloaded"); res.StatusCode != 200 || res.Header.Get("Damper-Attempts") != "2" {
		t.Errorf("a call once joined: %d, %s attempts", res.StatusCode, res.Header.Get("Damper-Attempts"))
	}
	// The retry took a unit of the budget in Redis, in its decision, after
	// the one granted in memory before the join was charged to its window.
	books, err := rdb.HGetAll(context.Background(), redisstore.Key("joins")).Result()
	want := "2"
	if books["w"] != fmt.Sprint(firstWindow) {
		want = "1" // a new window began between the two calls
	}
	if err != nil || books["u"] != want {
		t.Errorf("the budget in Redis after a retry: %v, %v; want u = %s", books, err, want)
	}
	if n := strings.Count(p.logs.String(), "the store joined it"); n != 1 {
		t.Errorf("%d lines say the store joined Redis, want 1", n)
	}
}

// TestProxyStoreUnreachable: a PING's failure that waiting may cure lets
// a fail-open proxy start; a refusal of the file's settings does not.
func TestProxyStoreUnreachable(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}, true},
		{&net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "redis", IsNotFound: true}}, true},
		{fmt.Errorf("ping: %w", context.DeadlineExceeded), true},
		{io.EOF, true},
		{&net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, true},
		{redisError("LOADING Redis is loading the dataset in memory"), true},
		{redisError("WRONGPASS invalid username-password pair or user is disabled."), false},
		{redisError("NOAUTH Authentication required."), false},
		{redisError("NOPERM User ops has no permissions to run the 'ping' command"), false},
		{&net.OpError{Op: "remote error", Net: "tcp", Err: errors.New("tls: bad certificate")}, false},
		{fmt.Errorf("tls: failed to verify certificate: %w", errors.New("x509: certificate signed by unknown authority")), false},
		{errors.New("ERR something else"), false},
	} {
		if got := unreachable(tc.err); got != tc.want {
			t.Errorf("unreachable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

type redisError string

func (e redisError) Error() string { return string(e) }

// TestProxyStoreMaxRetriesURL: a url that asks the client for retries is
// refused: the store's fallback is the one retry layer.
func TestProxyStoreMaxRetriesURL(t *testing.T) {
	_, err := parseStore(&proxyStoreFile{URL: "redis://redis:6379/0?max_retries=3", Timeout: time.Second}, "x")
	if err == nil || !strings.Contains(err.Error(), `store.url: "redis://redis:6379/0?max_retries=xxxxx": max_retries is not taken`) {
		t.Errorf("a url with max_retries: %v", err)
	}
}

// cutOnSecond holds the first pipeline of scripts until release is
// closed, and has the cutter cut the second's connection once Redis has
// answered its n commands, the client having read half of them.
type cutOnSecond struct {
	cut     *redistest.Cutter
	n       int
	pipes   int
	started chan struct{}
	release chan struct{}
}

func (h *cutOnSecond) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *cutOnSecond) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *cutOnSecond) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if n := cmds[0].Name(); n != "evalsha" && n != "eval" {
			return next(ctx, cmds)
		}
		h.pipes++ // the store sends one batch at a time
		switch h.pipes {
		case 1:
			h.started <- struct{}{}
			<-h.release
		case 2:
			h.cut.CutAfter(h.n)
		}
		return next(ctx, cmds)
	}
}

// TestProxyStoreOneRetryLayer: the proxy's Redis client does not retry.
// A connection cut in the middle of the replies to a batch of the
// budget's records, after Redis ran them, as a failover's reset does, is
// one failure for the store, and Redis's books hold each record once
// (go-redis's default retries would send the batch again, and count its
// records twice).
func TestProxyStoreOneRetryLayer(t *testing.T) {
	needRedis(t)
	srv := redistest.Start(t)
	cut := redistest.NewCutter(t, srv.Addr)
	c, err := parseStore(&proxyStoreFile{Address: cut.Addr, Timeout: 10 * time.Second}, "cut")
	if err != nil {
		t.Fatal(err)
	}
	p, err := openProxyStore(context.Background(), c, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if n := p.client.Options().MaxRetries; n != 0 {
		t.Errorf("the client's MaxRetries: %d, want 0 (none)", n)
	}
	const k = 20
	hook := &cutOnSecond{cut: cut, n: k, started: make(chan struct{}, 1), release: make(chan struct{})}
	p.client.AddHook(hook)
	b, err := p.primary.Budget(fleet.BudgetSettings{Ratio: 0.1, Window: time.Minute, MinTokens: 10})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	success := fleet.AttemptOutcome{First: true, Success: true}
	if _, err := b.Available(ctx, now); err != nil { // the window's books
		t.Fatal(err)
	}
	if err := b.Observe(ctx, now, success); err != nil {
		t.Fatal(err)
	}
	select {
	case <-hook.started: // the first batch, of one record, held
	case <-time.After(10 * time.Second):
		t.Fatal("no batch started")
	}
	for range k {
		if err := b.Observe(ctx, now, success); err != nil {
			t.Fatal(err)
		}
	}
	close(hook.release)
	if err := p.primary.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if cut.Cuts() != 1 || hook.pipes != 2 {
		t.Fatalf("%d connections cut, %d pipelines; want 1 cut, in the second of 2", cut.Cuts(), hook.pipes)
	}
	direct := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer direct.Close()
	got, err := direct.HGetAll(ctx, redisstore.Key("cut")).Result()
	want := map[string]string{"w": fmt.Sprint(now.UnixNano() / int64(time.Minute)), "s": fmt.Sprint(1 + k), "u": "0"}
	if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("the books in Redis: %v, %v; want %v (each record once)", got, err, want)
	}
	if st := p.primary.State(); st != redisstore.StateFallback {
		t.Errorf("the store after the cut: %v, want the fallback", st)
	}
}

// TestProxyStoreOpensWithoutRedis: a fail-open store whose Redis does not
// listen opens, its state in memory at once, and Close ends its wait for
// Redis; a fail-closed one does not open.
func TestProxyStoreOpensWithoutRedis(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	c, err := parseStore(&proxyStoreFile{Address: closed, Timeout: time.Second}, "later")
	if err != nil {
		t.Fatal(err)
	}
	p, err := openProxyStore(context.Background(), c, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("fail-open, Redis down: %v", err)
	}
	if !p.inMemory() {
		t.Error("the store is not in its fallback at start")
	}
	if err := p.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	select {
	case <-p.joined:
	default:
		t.Error("the wait for Redis goes on after Close")
	}
	c.failClosed = true
	if _, err := openProxyStore(context.Background(), c, slog.New(slog.DiscardHandler)); err == nil ||
		!strings.HasPrefix(err.Error(), "store (redis at "+closed+"): cannot reach it (fail_closed: the proxy starts only once Redis answers): ") {
		t.Errorf("fail-closed, Redis down: %v", err)
	}
}

// TestProxyStoreKeepsMembership: a proxy with no traffic probes Redis on
// a timer, and each probe refreshes its membership, so that the other
// proxies keep counting it; Close ends the timer.
func TestProxyStoreKeepsMembership(t *testing.T) {
	needRedis(t)
	srv := redistest.Start(t)
	defer func(d time.Duration) { storeKeepEvery = d }(storeKeepEvery)
	storeKeepEvery = 30 * time.Millisecond
	c, err := parseStore(&proxyStoreFile{Address: srv.Addr, Timeout: time.Second}, "idle")
	if err != nil {
		t.Fatal(err)
	}
	p, err := openProxyStore(context.Background(), c, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer admin.Close()
	ctx := context.Background()
	key := redisstore.MembersKey("idle")
	var scores []float64
	deadline := time.Now().Add(5 * time.Second)
	for len(scores) < 2 && time.Now().Before(deadline) {
		zs, err := admin.ZRangeWithScores(ctx, key, 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(zs) == 1 && (len(scores) == 0 || zs[0].Score > scores[len(scores)-1]) {
			scores = append(scores, zs[0].Score)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(scores) < 2 {
		t.Fatalf("the idle proxy's membership refreshed %d times in 5 s, want 2 (%v)", len(scores), scores)
	}
	if err := p.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	select {
	case <-p.joined:
	default:
		t.Error("the probes go on after Close")
	}
}
