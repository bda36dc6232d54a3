package damper_test

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"go.uber.org/goleak"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// A call over a real socket may return past its limit by the time the
// runtime takes to deliver the context's end to the goroutines that wait on
// it and to run them: loopbackSlack on a quiet machine under -race, plus
// loopbackLagFactor times the longest lag the process showed while the call
// was over its limit (lagMeter), since every step of that way waits for a
// core as the meter's wake-ups do. A call held past its limit by Damper
// overruns on a quiet machine too, where the lag is near zero. Calls on the
// bubble's clock return at the limit's very instant.
const (
	loopbackSlack     = time.Second
	loopbackLagFactor = 4
)

// loopbackProfiles are the Dampers of the loopback soak, on real time, so
// every wait is short: stalls end at a per-attempt or idle limit of a few
// hundred milliseconds, backoffs and honoured hints at tens. The budget's
// window is a day, so that the whole run is one window.
func loopbackProfiles() []soakProfile {
	deadlines := []time.Duration{400 * time.Millisecond, time.Second, 2 * time.Second, 3 * time.Second}
	return []soakProfile{
		{"loopback", damper.Policy{
			PerAttemptTimeout: 300 * time.Millisecond, StreamIdleTimeout: 300 * time.Millisecond,
			BackoffBase: 2 * time.Millisecond, BackoffMax: 20 * time.Millisecond, MaxRetryAfter: 50 * time.Millisecond,
			RetryBudgetWindow: 24 * time.Hour,
		}, dampertest.DefaultModel, deadlines, 2 * time.Second},
		{"loopback-4", damper.Policy{
			MaxAttempts: 4, PerAttemptTimeout: 500 * time.Millisecond, MaxHoldBack: 4 << 10,
			BackoffBase: time.Millisecond, BackoffMax: 10 * time.Millisecond, MaxRetryAfter: 30 * time.Millisecond,
			RetryBudgetWindow: 24 * time.Hour, RetryBudgetMinTokens: 20,
		}, dampertest.DefaultModel, deadlines, 2 * time.Second},
	}
}

// connCounter follows the server's connections through ConnState.
type connCounter struct {
	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every change
	state   map[net.Conn]http.ConnState
	total   int
}

func newConnCounter() *connCounter {
	return &connCounter{changed: make(chan struct{}), state: map[net.Conn]http.ConnState{}}
}

func (c *connCounter) track(conn net.Conn, s http.ConnState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch s {
	case http.StateNew:
		c.total++
		c.state[conn] = s
	case http.StateClosed, http.StateHijacked:
		delete(c.state, conn)
	default:
		c.state[conn] = s
	}
	close(c.changed)
	c.changed = make(chan struct{})
}

// waitUntil waits for ok to hold of the open connections' states, and
// reports whether it did within limit. It waits on the server's news of
// its connections, not on a timer: limit only bounds a failing test.
func (c *connCounter) waitUntil(limit time.Duration, ok func(map[net.Conn]http.ConnState) bool) (bool, string) {
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	for {
		c.mu.Lock()
		done, changed, desc := ok(c.state), c.changed, fmt.Sprint(c.state)
		c.mu.Unlock()
		if done {
			return true, ""
		}
		select {
		case <-changed:
		case <-deadline.C:
			return false, desc
		}
	}
}

// loopbackAllowance is how far past its limit each call of a loopback run
// may return, by the lag the process showed while it was over.
func loopbackAllowance(plans []reqPlan, results []soakResult, lag *lagMeter) func(int) time.Duration {
	return func(i int) time.Duration {
		r := results[i]
		return loopbackSlack + loopbackLagFactor*lag.Max(r.start.Add(plans[i].limit()), r.start.Add(r.elapsed))
	}
}

// attemptHeader carries an attempt's number within its call, from the
// client's transport to the soak's server.
const attemptHeader = "X-Soak-Attempt"

// attemptNumbers numbers each call's attempts as they leave, and answers
// each with its own attempt's step. Over a socket an attempt given up on a
// busy machine can reach the server after the one that replaced it, so the
// order of arrival does not say which attempt a request is.
type attemptNumbers struct {
	next http.RoundTripper

	mu       sync.Mutex
	sent     map[string]int // attempts sent, by scenario
	latestOf map[int]int    // the latest attempt received, by request
}

// RoundTrip sends a copy of req that carries its attempt's number. The
// attempts of one call leave one after another (the soak does not hedge),
// so the order they reach the transport in is theirs.
func (a *attemptNumbers) RoundTrip(req *http.Request) (*http.Response, error) {
	scenario := req.Header.Get(dampertest.ScenarioHeader)
	a.mu.Lock()
	if a.sent == nil {
		a.sent = map[string]int{}
	}
	a.sent[scenario]++
	n := a.sent[scenario]
	a.mu.Unlock()
	out := req.Clone(req.Context())
	out.Header.Set(attemptHeader, strconv.Itoa(n))
	return a.next.RoundTrip(out)
}

// stepFor answers each attempt of a plan's request with its own step, the
// last one again beyond the plan.
func (a *attemptNumbers) stepFor(plans []reqPlan) func(dampertest.Request) dampertest.Step {
	return func(r dampertest.Request) dampertest.Step {
		id, err := strconv.Atoi(r.Scenario)
		n, nerr := strconv.Atoi(r.Header.Get(attemptHeader))
		if err != nil || id < 0 || id >= len(plans) || nerr != nil || n < 1 {
			return dampertest.Status(http.StatusTeapot) // not a plan's request
		}
		a.mu.Lock()
		if a.latestOf == nil {
			a.latestOf = map[int]int{}
		}
		a.latestOf[id] = max(a.latestOf[id], n)
		a.mu.Unlock()
		p := plans[id]
		return p.attempts[min(n, len(p.attempts))-1].step(p.stream, true)
	}
}

// latest is the number of the latest attempt of request id the server
// received, 0 if none.
func (a *attemptNumbers) latest(id int) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.latestOf[id]
}

// TestSoakLoopback is the chaos soak over real loopback sockets, against
// dampertest.Server: fewer requests, on real time, to exercise what memory
// cannot (connection pools, the server noticing closed connections). It
// checks, besides the in-memory soak's invariants, that no connection is
// left open on the server once the calls are over.
func TestSoakLoopback(t *testing.T) {
	requests, workers := 600, 16
	if testing.Short() {
		requests = 200
	}
	if soakIsLong() {
		requests = 20_000
	}
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	seed := soakSeedFor(t)
	rng := rand.New(rand.NewPCG(seed, 0x100b))
	profiles := loopbackProfiles()
	plans := make([]reqPlan, requests)
	for i := range plans {
		plans[i] = drawPlan(rng, i, 100, profiles)
		for k := range plans[i].attempts {
			plans[i].attempts[k].msgID = "msg_dampertest" // the fake API's default, for every message
		}
	}
	numbered := &attemptNumbers{}
	fake := dampertest.NewServer(dampertest.WithStepFunc(numbered.stepFor(plans)))
	conns := newConnCounter()
	ts := httptest.NewUnstartedServer(fake.Handler())
	ts.Config.ConnState = conns.track
	ts.Start()
	// The fake API logs every request it gets; it is closed and dropped
	// before the heap is measured, so that its log is not counted as
	// Damper's.
	closeServers := sync.OnceFunc(func() {
		ts.Close()
		fake.Close()
	})
	defer closeServers()
	tr := &http.Transport{MaxIdleConnsPerHost: workers}
	defer tr.CloseIdleConnections()
	numbered.next = tr

	tel := newSoakTelemetry(t)
	before := heapAfterGC()
	clients := soakClients(t, profiles, tel, rand.NewPCG(seed, 0x7a12),
		option.WithBaseURL(ts.URL), option.WithHTTPClient(&http.Client{Transport: numbered}))

	ck := &checker{}
	received := func(i int) served { return served{fake.Count(strconv.Itoa(i)), numbered.latest(i)} }
	lag := newLagMeter(2 * time.Millisecond)
	results, ends := runSoak(ck, tel, workers, plans, profiles, clients, received, true)
	lag.Stop()
	checkDeadlines(ck, plans, results, loopbackAllowance(plans, results, lag))
	// A call its context ended as Damper answered ends on a goroutine of
	// its own: wait for every request span.
	tel.waitSpans(ck, len(plans), 10*time.Second)
	tel.flush(ck)
	tel.checkOutcomes(ck, results)

	// Every call is over: no connection may still carry a request, and
	// once the client lets its idle ones go, none may stay open.
	if ok, desc := conns.waitUntil(10*time.Second, func(m map[net.Conn]http.ConnState) bool {
		for _, s := range m {
			if s == http.StateActive {
				return false
			}
		}
		return true
	}); !ok {
		ck.failf("connections still active after every call returned: %s", desc)
	}
	tr.CloseIdleConnections()
	if ok, desc := conns.waitUntil(10*time.Second, func(m map[net.Conn]http.ConnState) bool { return len(m) == 0 }); !ok {
		ck.failf("connections still open after the client closed its idle ones: %s", desc)
	}

	st := soakStats{requests: len(plans), outcomes: map[damper.Outcome]int{}}
	var over time.Duration
	for i, r := range results {
		p := plans[i]
		st.count(p, r)
		st.ends[ends[i]]++
		over = max(over, r.elapsed-p.limit())
		n := fake.Count(strconv.Itoa(i))
		st.served += int64(n)
		st.lost += r.report.Attempts - n
		for k := range min(n, len(p.attempts)) {
			st.faults[p.attempts[k].kind]++
		}
		if n > len(p.attempts) {
			ck.failf("request %d: the server received %d attempts, more than MaxAttempts", i, n)
		}
	}
	for i, pr := range profiles {
		var mine []soakResult
		for k, r := range results {
			if plans[k].damper == i {
				mine = append(mine, r)
			}
		}
		checkBudget(ck, &st, pr.name, pr.policy, mine)
	}
	ck.report(t)
	results = nil // what the test kept is not what Damper kept
	closeServers()
	ts, fake = nil, nil
	after := heapAfterGC()
	runtime.KeepAlive(plans) // measured in both, so not part of the difference
	conns.mu.Lock()
	total := conns.total
	conns.mu.Unlock()
	t.Logf("seed %d: %s\n%d connections opened, none left; latest return %v past the caller's limit, longest lag %v; heap %d KiB before, %d KiB after",
		seed, &st, total, max(over, 0), lag.Max(time.Time{}, time.Now()), before>>10, after>>10)
	if grown := int64(after) - int64(before); grown > 64<<20 {
		t.Errorf("the heap grew by %d MiB over the soak, want at most 64", grown>>20)
	}
	if !testing.Short() && (st.outcomes[damper.OutcomeSuccess] == 0 || st.outcomes[damper.OutcomeAmbiguous] == 0 || st.outcomes[damper.OutcomeBudgetExhausted] == 0) {
		t.Errorf("the draw missed an outcome: %v", st.outcomes)
	}
}
