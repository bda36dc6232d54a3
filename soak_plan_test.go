package damper_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// faultKind is how one attempt goes wrong.
type faultKind int

const (
	fOK                faultKind = iota
	fStatusHint                  // a retryable status with retry-after or retry-after-ms within MaxRetryAfter
	fStatusNoHint                // a retryable status without a hint
	fStatusLongHint              // a retryable status whose hint exceeds MaxRetryAfter
	fStatusFinal                 // 4xx, a spend limit, or x-should-retry: false
	fDropBeforeHeaders           // the connection closes before any byte
	fDropMidBody                 // half the body, then the connection closes
	fSlowHeaders                 // headers after a delay, sometimes past PerAttemptTimeout
	fStall                       // the body stops (a plain call: half the body; a stream: at a random event) and never ends
	fSSEError                    // a stream's `event: error` at a random event
	fReset                       // a stream's connection reset at a random event
	fTruncate                    // a stream ends cleanly at a random event, without message_stop
	fHoldBack                    // a stream sends more than MaxHoldBack before its content
	nFaultKinds
)

var faultNames = [nFaultKinds]string{
	"ok", "status with hint", "status without hint", "status with too long a hint", "final status",
	"drop before headers", "drop mid-body", "slow headers", "stall", "SSE error event",
	"reset mid-stream", "truncated stream", "hold-back overflow",
}

// attemptPlan is the scripted answer to one attempt.
type attemptPlan struct {
	kind    faultKind
	status  int
	header  http.Header
	errType string
	errCode string
	delay   time.Duration
	msgID   string            // unique per attempt, so that events of two attempts never look alike
	text    string            // the answer of a plain call
	st      dampertest.Stream // the stream of a streaming call
}

// reqPlan is one logical request.
type reqPlan struct {
	id       int
	damper   int
	model    string // the model its call names: its Damper's profile's
	stream   bool
	deadline time.Duration
	cancelAt time.Duration // 0: the caller does not cancel
	sdkLimit time.Duration // option.WithRequestTimeout given to the call; 0: none
	attempts []attemptPlan // one per attempt the Damper may make
}

// limit is when the caller stops waiting: its deadline or its cancellation.
func (p reqPlan) limit() time.Duration {
	if p.cancelAt > 0 {
		return min(p.deadline, p.cancelAt)
	}
	return p.deadline
}

// firstEnd is when the first context of the call ends: the caller's, or the
// SDK's request timeout, which wraps Damper's loop.
func (p reqPlan) firstEnd() time.Duration {
	if p.sdkLimit > 0 {
		return min(p.limit(), p.sdkLimit)
	}
	return p.limit()
}

// soakProfile is one Damper of the soak, with what its draw needs to know:
// the model its calls name, the deadlines its callers set and how late a
// caller may cancel.
type soakProfile struct {
	name      string
	policy    damper.Policy
	model     string
	deadlines []time.Duration
	cancelBy  time.Duration
}

// faultRate is the share of attempts that fail: the soak alternates calm
// spells of requests, where the budget covers every retry, with storms,
// where it runs out.
func faultRate(id, spell int) float64 {
	if id/spell%2 == 0 {
		return 0.1
	}
	return 0.6
}

// drawPlan draws request id's plan: each attempt fails with probability
// faultRate(id, spell), in a way drawn uniformly from the fault kinds.
func drawPlan(rng *rand.Rand, id, spell int, profiles []soakProfile) reqPlan {
	p := reqPlan{id: id, damper: rng.IntN(len(profiles)), stream: rng.IntN(2) == 0}
	pol := profiles[p.damper].policy
	maxAttempts := cmpOr(pol.MaxAttempts, defaults.MaxAttempts)
	perAttempt := pol.PerAttemptTimeout
	maxAfter := cmpOr(pol.MaxRetryAfter, defaults.MaxRetryAfter)
	pr := profiles[p.damper]
	p.model = pr.model
	p.deadline = pr.deadlines[rng.IntN(len(pr.deadlines))]
	if rng.IntN(100) < 15 {
		// An odd number of nanoseconds, so that a cancellation never falls
		// on the instant a scripted delay ends.
		p.cancelAt = time.Duration(rng.Int64N(int64(pr.cancelBy))) | 1
	}
	if rng.IntN(100) < 10 {
		// The SDK's own request timeout, which wraps Damper's whole loop.
		p.sdkLimit = time.Duration(rng.Int64N(int64(pr.cancelBy))) | 1
	}
	for k := range maxAttempts {
		a := attemptPlan{msgID: fmt.Sprintf("msg_soak_%d_%d", id, k+1)}
		a.text = fmt.Sprintf("r%d a%d: %s", id, k+1, strings.Repeat("é-ü ", rng.IntN(12)))
		a.st = dampertest.Stream{Text: a.text, ChunkSize: 12 + rng.IntN(8), Pings: rng.IntN(3)}
		if rng.Float64() < faultRate(id, spell) {
			a.kind = faultKind(1 + rng.IntN(int(nFaultKinds)-1))
		}
		if !p.stream && a.kind >= fSSEError {
			a.kind = fDropMidBody
		}
		if a.kind == fHoldBack && pol.MaxHoldBack == 0 {
			a.kind = fStall
		}
		events := len(a.st.Events())
		switch a.kind {
		case fStatusHint:
			a.status = []int{429, 503, 529}[rng.IntN(3)]
			if maxAfter >= time.Second && rng.IntN(2) == 0 {
				a.header = http.Header{"Retry-After": {strconv.Itoa(1 + rng.IntN(int(maxAfter/time.Second)))}}
			} else {
				a.header = http.Header{"Retry-After-Ms": {strconv.Itoa(1 + rng.IntN(int(maxAfter/time.Millisecond)))}}
			}
		case fStatusNoHint:
			a.status = []int{429, 500, 502, 503, 504, 529}[rng.IntN(6)]
		case fStatusLongHint:
			a.status = []int{429, 529}[rng.IntN(2)]
			a.header = http.Header{"Retry-After": {strconv.Itoa(int(maxAfter/time.Second) + 1 + rng.IntN(600))}}
		case fStatusFinal:
			switch rng.IntN(4) {
			case 0:
				a.status = []int{400, 401, 403, 404, 413}[rng.IntN(5)]
			case 1:
				a.status, a.errCode = 429, "enforced_spend_limit_reached"
			case 2:
				a.status, a.header = 529, http.Header{"X-Should-Retry": {"false"}}
			default:
				a.status, a.header = 400, http.Header{"X-Should-Retry": {"true"}} // the API's word: retryable
			}
		case fSlowHeaders:
			a.delay = time.Duration(rng.Int64N(int64(perAttempt * 3 / 2)))
		case fStall, fSSEError, fReset, fTruncate:
			a.st.At = rng.IntN(events + 1)
			a.st.Fault = map[faultKind]dampertest.Fault{
				fStall: dampertest.FaultStall, fSSEError: dampertest.FaultErrorEvent,
				fReset: dampertest.FaultReset, fTruncate: dampertest.FaultTruncate,
			}[a.kind]
			if a.kind == fSSEError {
				a.st.ErrorType = []string{"overloaded_error", "api_error", "rate_limit_error", "invalid_request_error"}[rng.IntN(4)]
			}
		case fHoldBack:
			a.st.PreContentBytes = pol.MaxHoldBack + 1 + rng.IntN(4096)
		}
		p.attempts = append(p.attempts, a)
	}
	return p
}

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// events returns the data of the events a caller sees of a stream
// attempt (the SDK skips pings), as the server sends them: with the
// attempt's message ID and the model of the request.
func (a attemptPlan) events(model string) []string {
	var seen []string
	for i, e := range a.st.Events() {
		if i == 0 {
			e.Data = bytes.Replace(e.Data, []byte(`"msg_dampertest"`), []byte(strconv.Quote(a.msgID)), 1)
			e.Data = bytes.Replace(e.Data, []byte(strconv.Quote(dampertest.DefaultModel)), []byte(strconv.Quote(model)), 1)
		}
		if e.Name != "ping" {
			seen = append(seen, string(e.Data))
		}
	}
	return seen
}

// step turns an attempt's plan into the fake API's script. A plain call's
// stall sends its headers and half its body, then nothing; over loopback
// its headers never come.
func (a attemptPlan) step(stream, loopback bool) dampertest.Step {
	s := dampertest.Step{Status: a.status, Header: a.header, ErrorType: a.errType, ErrorCode: a.errCode, Delay: a.delay, MessageID: a.msgID}
	switch a.kind {
	case fDropBeforeHeaders:
		s.Drop = dampertest.DropBeforeHeaders
	case fDropMidBody:
		s.Drop = dampertest.DropMidBody
	case fStall:
		switch {
		case stream:
		case loopback:
			s.Delay = time.Hour // the attempt's timeout ends it
		default:
			s.Drop = dampertest.StallMidBody
		}
	}
	if stream {
		return s.WithStream(a.st)
	}
	return s.WithText(a.text)
}

// stepFor answers in memory the n-th attempt of request id with its plan's
// step, the last one again beyond the plan, as a script does.
func stepFor(plans []reqPlan) func(dampertest.Request) dampertest.Step {
	return func(r dampertest.Request) dampertest.Step {
		id, err := strconv.Atoi(r.Scenario)
		if err != nil || id < 0 || id >= len(plans) {
			return dampertest.Status(http.StatusTeapot) // not a plan's request
		}
		p := plans[id]
		return p.attempts[min(r.N, len(p.attempts))-1].step(p.stream, false)
	}
}
