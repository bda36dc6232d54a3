package dampertest

import (
	"bytes"
	"cmp"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2/option"
)

// ScenarioHeader is the request header that picks the scenario a request
// belongs to; a request without it belongs to scenario "". Set it from the
// SDK with [Scenario].
const ScenarioHeader = "X-Dampertest-Scenario"

// Scenario returns the SDK request option that sends a request, or every
// request of a client, in the named scenario:
//
//	client.Messages.New(ctx, params, dampertest.Scenario("overloaded"))
//
// It is option.WithHeader(ScenarioHeader, name).
func Scenario(name string) option.RequestOption {
	return option.WithHeader(ScenarioHeader, name)
}

// defaultGrace bounds the real time a delayed response waits, after the
// fake clock fired a timer, for the client to hang up (see Server.hold).
const defaultGrace = 2 * time.Second

// Server is a fake Anthropic Messages API on a loopback
// [httptest.Server], or in memory only (see [InMemory]), for tests and
// simulations of code that calls the API through the official SDK.
//
// It answers POST /v1/messages (any query, such as ?beta=true, is
// accepted) from scripts of [Step] values, one script per scenario (see
// [ScenarioHeader] and [Server.Script]). A scenario without a script gets
// the step of [WithStepFunc] if set, else 200 with a default message, or a
// clean stream if the request asked for one. Any other method or path gets
// a 404 not_found_error. Every request is logged (see [Server.Requests]),
// with secrets redacted. Made with [Bedrock] or [Vertex], it serves that
// platform's paths instead, through the SDK's bedrock or vertex package,
// and checks what the platform would check before a step answers.
//
// Every response carries a request-id header, req_dampertest_<scenario>_<n>,
// unless its step sets one; error bodies and SSE error events repeat it as
// request_id.
//
// A Server is safe for concurrent use. Close it when done.
type Server struct {
	ts       *httptest.Server // nil for a server made with InMemory
	memory   bool
	clock    *Clock                                     // nil: real time
	sleep    func(context.Context, time.Duration) error // nil: use clock
	stepFor  func(Request) Step                         // nil: the default answer
	grace    time.Duration
	limits   *limiter      // nil: no rate limits
	logMax   int           // entries the log keeps; 0: every one
	logBody  int           // bytes of a body the log keeps, with logMax
	platform platform      // what the server fakes
	closing  chan struct{} // closed by Close, to release held responses
	once     sync.Once

	mu      sync.Mutex
	scripts map[string]script
	counts  map[string]int // Messages requests per scenario, and platform refusals
	taken   map[string]int // of which took a step: all but the limits' refusals
	log     []Request
}

// ServerOption configures a Server.
type ServerOption func(*Server)

// WithClock puts the server on the fake clock c: the log's At times come
// from c, and a step's Delay advances c by Delay instead of taking time.
//
// A client whose per-attempt timeout is c.AfterFunc(timeout, cancel) on the
// same clock thus sees a Delay longer than its timeout fire that timeout.
// The advance stops at the instant the client gives up, as the client's
// world would, and nothing is sent; so after such a call c reads the
// timeout's deadline, not the end of the Delay. Over [Transport] the server
// sees the cancellation at once. Over the loopback connection it sees it
// only when the closed connection is noticed, so after each timer the
// advance fires it waits up to 2 s of real time for the request's context
// to end, and goes on if it does not: an unrelated timer costs that wait, an
// advance that fires no timer costs none.
func WithClock(c *Clock) ServerOption {
	return func(s *Server) { s.clock = c }
}

// WithSleep makes a step's Delay call sleep(ctx, Delay), with the request's
// context, for clocks other than [Clock]. If sleep returns an error, or the
// context has ended when it returns, nothing is sent. It takes precedence
// over WithClock for delays; WithClock still dates the log.
func WithSleep(sleep func(ctx context.Context, d time.Duration) error) ServerOption {
	return func(s *Server) { s.sleep = sleep }
}

// WithStepFunc makes the server answer a Messages request whose scenario has
// no script (see [Server.Script]) with the step f returns for it, so that a
// test can decide each request's answer as it comes, from a table of its
// own or from the request itself. f gets the request as the log records it:
// its Scenario and N say which request of which scenario it is. It is called
// once per request, on the request's goroutine and concurrently with other
// requests; it must not change r's Header or Body, which the log shares,
// and should not block: a step's Delay is the way to make a request wait.
func WithStepFunc(f func(r Request) Step) ServerOption {
	return func(s *Server) { s.stepFor = f }
}

// WithLogLimit makes the server keep, in its log (see [Server.Requests]),
// only the last entries requests (at least 1), and of each request's body
// only its first bodyBytes bytes (none for 0 or less), so that a server
// that runs for long, such as a fake API serving other processes, holds a
// bounded log. [Server.Count], the scripts and the rate limits still see
// every request, and the answers are those of the whole body. Without it
// the log keeps every request whole.
func WithLogLimit(entries, bodyBytes int) ServerOption {
	return func(s *Server) { s.logMax, s.logBody = max(entries, 1), max(bodyBytes, 0) }
}

// InMemory makes a server that listens on no address: a client reaches it
// through [Transport], as [Server.Options] sets up, and its URL is
// [MemoryURL].
//
// Such a server starts no goroutine of its own, so one made inside a
// testing/synctest bubble belongs to the bubble: without WithClock or
// WithSleep a step's Delay waits on the bubble's clock, and a stall (a
// [FaultStall] stream or a [StallMidBody] body) leaves its handler durably
// blocked until the request's context ends.
func InMemory() ServerOption {
	return func(s *Server) { s.memory = true }
}

// MemoryURL is the base URL of a server made with [InMemory]. Its domain
// is reserved for invalid names: a client that bypasses Transport reaches
// no host.
const MemoryURL = "http://dampertest.invalid"

// NewServer starts a Server on a loopback address, or, with [InMemory],
// makes one that listens nowhere.
//
// Without WithClock or WithSleep a step's Delay waits on real time, ending
// early if the request's context ends.
func NewServer(opts ...ServerOption) *Server {
	s := &Server{
		grace:   defaultGrace,
		closing: make(chan struct{}),
		scripts: map[string]script{},
		counts:  map[string]int{},
		taken:   map[string]int{},
	}
	for _, o := range opts {
		o(s)
	}
	if s.limits != nil {
		s.limits.now = s.now // after the options: WithClock may come later
	}
	s.platform.name = cmp.Or(s.platform.name, platformAnthropic)
	if !s.memory {
		s.ts = httptest.NewServer(s.Handler())
	}
	return s
}

// URL returns the server's base URL, such as http://127.0.0.1:41234, or
// [MemoryURL] for a server made with [InMemory].
func (s *Server) URL() string {
	if s.ts == nil {
		return MemoryURL
	}
	return s.ts.URL
}

// Options returns the SDK options that point a client at the server, and
// nothing else. Append option.WithMaxRetries(0) to see every response
// yourself.
//
// For the first-party server: option.WithBaseURL(s.URL()) and
// option.WithAPIKey("test-key").
//
// For a server made with [Bedrock]: bedrock.WithConfig with an aws.Config
// of the server's region and static credentials, [BedrockAccessKeyID] and
// [BedrockSecretKey], so that the SDK's bedrock package rewrites and
// signs each request as for Amazon Bedrock, then option.WithBaseURL(s.URL())
// after it, as it sets its own.
//
// For a server made with [Vertex]: option.WithHTTPClient, then
// vertex.WithCredentials with the server's region and project and the
// static token [VertexToken], which wraps that client with the SDK's OAuth
// transport, then option.WithBaseURL(s.URL()). The vertex package comes
// from package github.com/damper-ai/damper-go/dampertest/vertexclient,
// which the test must import; without it these options fail every
// request with an error that says so.
//
// For a server made with [InMemory], the HTTP client is one with
// [Transport] of [Server.Handler].
func (s *Server) Options() []option.RequestOption {
	switch s.platform.name {
	case platformBedrock:
		return s.bedrockOptions()
	case platformVertex:
		return s.vertexOptions()
	}
	opts := []option.RequestOption{option.WithBaseURL(s.URL()), option.WithAPIKey("test-key")}
	if s.ts == nil {
		opts = append(opts, option.WithHTTPClient(&http.Client{Transport: Transport(s.Handler())}))
	}
	return opts
}

// Close releases every held response (delays and stalls end by cutting the
// connection), shuts the server down and waits for its handlers to return;
// for a server made with [InMemory] it does not wait, as each handler runs
// on the goroutine Transport gave its request and returns once released.
// Close may be called more than once.
func (s *Server) Close() {
	s.once.Do(func() { close(s.closing) })
	if s.ts != nil {
		s.ts.Close()
	}
}

// Script sets the steps of a scenario: the n-th request of the scenario
// received after the call gets steps[n-1], and once the steps are used up
// the last one repeats. Requests refused by the server's rate limits (see
// [WithRateLimits]) or by a platform's checks (see [Bedrock] and [Vertex])
// take no step and are not counted here. Calling Script again replaces the
// script and starts it over; with no steps, the scenario goes back to the
// default answer.
// Counts and the log are not reset.
func (s *Server) Script(scenario string, steps ...Step) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(steps) == 0 {
		delete(s.scripts, scenario)
		return
	}
	sc := script{steps: make([]Step, len(steps)), base: s.taken[scenario]}
	for i, st := range steps {
		sc.steps[i] = st.clone()
	}
	s.scripts[scenario] = sc
}

// Requests returns a copy of the request log, in arrival order: the
// last requests alone on a server made with [WithLogLimit].
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	log := s.log
	if s.logMax > 0 && len(log) > s.logMax {
		log = log[len(log)-s.logMax:]
	}
	out := make([]Request, len(log))
	for i, r := range log {
		out[i] = r.clone()
	}
	return out
}

// Count returns the number of Messages requests received for a scenario,
// including those refused by the server's rate limits (see
// [WithRateLimits]). Requests to other endpoints of the first-party server
// are logged but not counted; on Bedrock and Vertex every request is
// counted, those refused by the platform's checks included.
func (s *Server) Count(scenario string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts[scenario]
}

// Handler returns the server's behaviour as an http.Handler, sharing its
// scripts, counts and log. Serve it with [Transport] to run without a
// network. It cuts connections (drops, resets, Close) by panicking with
// http.ErrAbortHandler, which net/http and Transport both handle; a
// middleware around it must let that panic through.
func (s *Server) Handler() http.Handler {
	return http.HandlerFunc(s.serveHTTP)
}

func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body) // a body cut short is logged as far as it came
	scenario := r.Header.Get(ScenarioHeader)
	in := s.inbound(r, body)
	_, _, maxTokens := parseBody(body)
	entry := Request{
		Scenario: scenario, Method: r.Method, Path: r.URL.Path,
		Header: redact(r.Header), Body: body, Stream: in.stream, At: s.now(),
		Platform: s.platform.name, Model: in.model, SignedAt: in.signedAt, Signature: in.signature,
	}
	if in.refusal != nil {
		entry.AuthError = in.refusal.message
	}
	c := call{model: cmp.Or(in.model, DefaultModel), stream: in.stream, inputTokens: defaultInputTokens}
	if s.limits != nil {
		c.inputTokens = inputTokensOf(body)
	}

	var step Step
	var adm admission
	scripted, refused := false, false
	s.mu.Lock()
	if in.counted {
		s.counts[scenario]++
		entry.N = s.counts[scenario]
	}
	if in.counted && in.refusal == nil {
		if s.limits != nil {
			// Under s.mu, so that a refused request and the next one's step
			// are decided in arrival order.
			adm = s.limits.admit(entry.At, int64(c.inputTokens), maxTokens)
			refused = adm.ticket == nil
			entry.RateLimited = refused && adm.err == nil
		}
		if !refused {
			s.taken[scenario]++
			if sc, ok := s.scripts[scenario]; ok {
				step, scripted = sc.step(s.taken[scenario]), true
			}
		}
	}
	s.appendLog(entry)
	s.mu.Unlock()

	c.requestID = "req_dampertest_" + scenario + "_" + strconv.Itoa(entry.N)
	if s.platform.name == platformBedrock {
		w.Header().Set("X-Amzn-Requestid", c.requestID)
	}
	switch {
	case in.refusal != nil:
		w.Header().Set("Request-Id", c.requestID)
		s.writeRefusal(w, r, *in.refusal)
		return
	case !in.counted:
		w.Header().Set("Request-Id", c.requestID)
		s.writeBody(r.Context(), w, http.StatusNotFound, errorJSON("not_found_error", "", "Not found: "+r.Method+" "+r.URL.Path, c.requestID), DropNone)
		return
	case refused:
		s.refuse(w, r, adm, c.requestID)
		return
	}
	// Whatever ends the answer, a drop included, gives back what it did
	// not settle.
	defer adm.ticket.settle(0)
	if !scripted && s.stepFor != nil {
		step = s.stepFor(entry) // outside the lock: f may call the server
	}
	c.header, c.ticket = adm.header, adm.ticket
	if s.platform.name != platformAnthropic {
		c.header = nil // the API's rate-limit headers: the platforms send none
	}
	s.respond(w, r, step, c)
}

// appendLog adds entry to the log, within WithLogLimit's bounds; s.mu is
// held.
func (s *Server) appendLog(entry Request) {
	if s.logMax == 0 {
		s.log = append(s.log, entry)
		return
	}
	entry.Body = bytes.Clone(entry.Body[:min(len(entry.Body), s.logBody)])
	s.log = append(s.log, entry)
	// Compacted at twice the bound, so that a request moves O(1) entries
	// on average.
	if len(s.log) >= 2*s.logMax {
		n := copy(s.log, s.log[len(s.log)-s.logMax:])
		clear(s.log[n:])
		s.log = s.log[:n]
	}
}

func (s *Server) now() time.Time {
	if s.clock != nil {
		return s.clock.Now()
	}
	return time.Now()
}
