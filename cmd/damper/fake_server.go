package main

// The fake's server: its control paths, its counts, and the phases'
// schedule, each request answered with the fault of its phase.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/damper-ai/damper-go/dampertest"
)

// fakeServer is the fake's handler: its control paths, then the phase's
// fault as the scenario of a dampertest server.
type fakeServer struct {
	cfg fakeFile
	now func() time.Time

	mu       sync.Mutex
	srv      *dampertest.Server
	old      []*dampertest.Server // replaced by a reset, closed with the fake
	sched    *fakeSchedule
	received int
	byFault  map[string]int // keys: the faults
	byStatus map[string]int // keys: statuses sent, and "none"
}

func newFakeServer(cfg fakeFile, now func() time.Time) *fakeServer {
	a := &fakeServer{cfg: cfg, now: now}
	a.reset()
	return a
}

// reset starts everything over: a new server (its log and rate limits),
// the phases from now, the counts. Answers in flight finish on the old
// server.
func (a *fakeServer) reset() {
	opts := []dampertest.ServerOption{
		dampertest.InMemory(), // served on the fake's own listener
		dampertest.WithLogLimit(a.cfg.Keep, 0),
		dampertest.WithStepFunc(func(r dampertest.Request) dampertest.Step { return a.step(r.Scenario, r.Stream) }),
	}
	if l := a.cfg.RateLimits; l != nil {
		opts = append(opts, dampertest.WithRateLimits(dampertest.RateLimits{
			RequestsPerMinute: l.RequestsPerMinute, InputTokensPerMinute: l.InputTokensPerMinute, OutputTokensPerMinute: l.OutputTokensPerMinute,
		}))
	}
	srv := dampertest.NewServer(opts...)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.srv != nil {
		a.old = append(a.old, a.srv)
		if len(a.old) > 16 { // each holds a bounded log; the oldest have long finished
			a.old = slices.Delete(a.old, 0, 1)
		}
	}
	a.srv = srv
	a.sched = &fakeSchedule{phases: a.cfg.Phases, start: a.now()}
	a.received = 0
	a.byFault = map[string]int{}
	a.byStatus = map[string]int{}
}

// close ends every answer held and releases the servers.
func (a *fakeServer) close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, s := range append(a.old, a.srv) {
		s.Close()
	}
}

// step is the answer of a fault to a request, plain or streaming.
func (a *fakeServer) step(fault string, stream bool) dampertest.Step {
	text := a.cfg.Text
	ok := dampertest.OK().WithText(text)
	switch fault {
	case "overloaded":
		return dampertest.Status(529)
	case "server_error":
		return dampertest.Status(500)
	case "rate_limited":
		return dampertest.Status(429).RetryAfter(strconv.Itoa(int(a.cfg.RetryAfter / time.Second)))
	case "slow":
		return ok.WithDelay(a.cfg.SlowFirstByte)
	case "stream_cut":
		if !stream {
			return ok.WithDrop(dampertest.DropMidBody)
		}
		st := dampertest.Stream{Text: text, Fault: dampertest.FaultReset}
		st.At = st.ContentIndex() + 1
		return ok.WithStream(st)
	case "overloaded_event":
		if !stream {
			return ok
		}
		st := dampertest.Stream{Text: text, Fault: dampertest.FaultErrorEvent, ErrorType: "overloaded_error"}
		st.At = st.ContentIndex()
		return ok.WithStream(st)
	}
	return ok
}

func (a *fakeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Host == "" && strings.HasPrefix(r.URL.Path, "/_fake/") {
		a.control(w, r)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, fakeMaxBody))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			a.count("", http.StatusRequestEntityTooLarge)
			fakeError(w, http.StatusRequestEntityTooLarge, "request_too_large", fmt.Sprintf("damper fake: the body is above %d bytes", fakeMaxBody))
		}
		return // else the client has gone
	}
	// What the log keeps of a request is bounded: the model's length,
	// and of the headers only whether an API key came.
	var named struct {
		Model json.RawMessage `json:"model"`
	}
	if json.Unmarshal(body, &named) == nil && len(named.Model) > maxFakeModel+2 {
		a.count("", http.StatusBadRequest)
		fakeError(w, http.StatusBadRequest, "invalid_request_error", fmt.Sprintf("damper fake: model: %d bytes: want at most %d", len(named.Model)-2, maxFakeModel))
		return
	}
	hasKey := len(r.Header.Values("X-Api-Key")) > 0
	r.Header = http.Header{}
	if hasKey {
		r.Header.Set("X-Api-Key", dampertest.Redacted)
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	a.mu.Lock()
	srv, sched := a.srv, a.sched
	a.mu.Unlock()
	// The fault is the request's scenario (the client's own scenario
	// header is gone with the others), so that scenarios are the faults
	// alone.
	fault := ""
	if r.Method == http.MethodPost && r.URL.Path == "/v1/messages" {
		fault = sched.next(a.now())
		r.Header.Set(dampertest.ScenarioHeader, fault)
	}
	sw := &statusWriter{ResponseWriter: w}
	defer func() { a.count(fault, sw.status) }() // on a cut connection too
	srv.Handler().ServeHTTP(sw, r)
}

// count adds one request's fault ("" for none) and status (0: nothing
// was sent).
func (a *fakeServer) count(fault string, status int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.received++
	if fault != "" {
		a.byFault[fault]++
	}
	key := "none"
	if status != 0 {
		key = strconv.Itoa(status)
	}
	a.byStatus[key]++
}

// fakeRequest is one request as /_fake/requests shows it.
type fakeRequest struct {
	At          time.Time `json:"at"`
	Method      string    `json:"method"`
	Path        string    `json:"path"`
	Model       string    `json:"model,omitempty"`
	Stream      bool      `json:"stream"`
	Fault       string    `json:"fault,omitempty"`
	RateLimited bool      `json:"rate_limited,omitempty"`
	APIKey      bool      `json:"api_key"`
}

// fakeSummary is the body of GET /_fake/requests.
type fakeSummary struct {
	Received int            `json:"received"`
	ByFault  map[string]int `json:"by_fault"`
	ByStatus map[string]int `json:"by_status"`
	Requests []fakeRequest  `json:"requests"`
}

// maxShownPath bounds a path as /_fake/requests shows it.
const maxShownPath = 256

func (a *fakeServer) control(w http.ResponseWriter, r *http.Request) {
	var method string
	switch r.URL.Path {
	case "/_fake/requests":
		method = http.MethodGet
	case "/_fake/reset":
		method = http.MethodPost
	default:
		fakeError(w, http.StatusNotFound, "not_found_error", "damper fake: "+shown(r.URL.Path)+": want GET /_fake/requests or POST /_fake/reset")
		return
	}
	if r.Method != method {
		w.Header().Set("Allow", method)
		fakeError(w, http.StatusMethodNotAllowed, "invalid_request_error", "damper fake: "+r.URL.Path+" takes "+method)
		return
	}
	if method == http.MethodPost {
		a.reset()
		w.WriteHeader(http.StatusNoContent)
		return
	}
	a.mu.Lock()
	sum := fakeSummary{Received: a.received, ByFault: cloneCounts(a.byFault), ByStatus: cloneCounts(a.byStatus), Requests: []fakeRequest{}}
	srv := a.srv
	a.mu.Unlock()
	for _, q := range srv.Requests() {
		path := q.Path
		if len(path) > maxShownPath {
			path = path[:maxShownPath] + "..."
		}
		sum.Requests = append(sum.Requests, fakeRequest{
			At: q.At.UTC(), Method: q.Method, Path: path, Model: q.Model, Stream: q.Stream,
			Fault: q.Scenario, RateLimited: q.RateLimited, APIKey: len(q.Header.Values("X-Api-Key")) > 0,
		})
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(sum)
}

func cloneCounts(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// fakeError answers as the API answers an error.
func fakeError(w http.ResponseWriter, status int, kind, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	b, _ := json.Marshal(map[string]any{"type": "error", "error": map[string]string{"type": kind, "message": msg}})
	w.Write(b)
}

// statusWriter notes the status a handler sends; its Unwrap lets
// http.ResponseController flush through it.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 && code >= 200 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// fakeSchedule walks the phases: each Messages request takes the fault of
// the phase it arrives in.
type fakeSchedule struct {
	mu     sync.Mutex
	phases []fakePhase
	i      int       // the phase now; len(phases): after the last
	start  time.Time // when phase i began
	n      int       // Messages requests of phase i so far
}

// next returns the fault of a Messages request arriving at now.
func (s *fakeSchedule) next(now time.Time) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.i < len(s.phases) {
		p := s.phases[s.i]
		switch {
		case p.For > 0 && now.Sub(s.start) >= p.For:
			s.start = s.start.Add(p.For)
		case p.Requests > 0 && s.n >= p.Requests:
			s.start = now
		default:
			s.n++
			if (s.n-1)%p.Every != 0 {
				return "ok"
			}
			return p.Fault
		}
		s.i, s.n = s.i+1, 0
	}
	return "ok"
}
