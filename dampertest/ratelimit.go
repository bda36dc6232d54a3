package dampertest

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// RateLimits are the per-minute limits a [Server] enforces, as the
// Anthropic API enforces an organization's limits, when it is made with
// [WithRateLimits]. A limit of 0 is not enforced, and its headers are not
// sent.
//
// Each enforced limit L is a token bucket of capacity L that starts full
// and refills continuously at L a minute, on the server's clock (see
// [WithClock]). One bucket of each kind is shared by every scenario of the
// server. A Messages request costs:
//
//   - 1 request;
//   - its input tokens: ceil(len(body)/4), at least 1, where body is the
//     request body as received. The answers report the same count in
//     usage.input_tokens, plain and in a stream's message_start;
//   - its max_tokens in output tokens, reserved when it is admitted and
//     settled when its answer is finished: the answer's usage.output_tokens
//     is charged and the rest given back (an answer longer than max_tokens
//     takes the difference too, which may put the bucket below 0). An error
//     answer, a dropped or stalled response and a client that gives up give
//     the whole reservation back.
//
// A request is admitted only if every enforced bucket holds its whole cost
// at that instant; then it takes from all of them, otherwise from none and
// the server answers 429 itself (see [WithRateLimits]).
type RateLimits struct {
	// RequestsPerMinute is the RPM limit; 0 means not enforced.
	RequestsPerMinute int
	// InputTokensPerMinute is the ITPM limit; 0 means not enforced.
	InputTokensPerMinute int
	// OutputTokensPerMinute is the OTPM limit; 0 means not enforced.
	OutputTokensPerMinute int
	// TokenRounding, when above 1, rounds the remaining counts of the
	// token headers (input, output and combined tokens) down to a multiple
	// of it, as the API rounds them (to the thousand). 0 or 1 sends them
	// exact. Limits, request counts and the admission itself are exact.
	TokenRounding int
}

// maxRateLimit is the largest limit RateLimits accepts, per minute: far
// above any real one, and small enough for exact integer arithmetic.
const maxRateLimit = 1_000_000_000

// Validate reports an error for each field of l that is out of range: a
// limit below 0 or above 1,000,000,000 (far above any real limit), a
// TokenRounding below 0. The error names the field and its value.
func (l RateLimits) Validate() error {
	var errs []error
	for _, f := range []struct {
		name  string
		value int
	}{
		{"RequestsPerMinute", l.RequestsPerMinute},
		{"InputTokensPerMinute", l.InputTokensPerMinute},
		{"OutputTokensPerMinute", l.OutputTokensPerMinute},
	} {
		if f.value < 0 || f.value > maxRateLimit {
			errs = append(errs, fmt.Errorf("dampertest: RateLimits.%s is %d; want 0 (not enforced) to %d", f.name, f.value, maxRateLimit))
		}
	}
	if l.TokenRounding < 0 {
		errs = append(errs, fmt.Errorf("dampertest: RateLimits.TokenRounding is %d; want 0 (exact) or more", l.TokenRounding))
	}
	return errors.Join(errs...)
}

// WithRateLimits makes the server enforce l (see [RateLimits]) on Messages
// requests; other endpoints are not limited.
//
// The limits are checked when a request arrives, before its scenario's
// step is taken: a request they refuse takes no step of the script (and
// [WithStepFunc]'s function is not asked), is marked RateLimited in the log
// and still counts in [Server.Count]. It gets a 429 rate_limit_error whose
// message names the first limit that lacks room, in the order requests,
// input tokens, output tokens, with a retry-after header: the whole seconds
// (at least 1) until every bucket that lacked room holds this request's
// cost, if nothing else takes from it meanwhile. A request whose cost is
// above a limit itself is refused every time; its retry-after is the time
// until the bucket is full.
//
// Every Messages response, the 429s included, carries for each enforced
// limit the headers anthropic-ratelimit-requests-limit, -remaining and
// -reset (likewise input-tokens and output-tokens): the limit; the
// bucket's level after the request took its cost, rounded down and never
// below 0 (on a 429, its level, as nothing was taken); and the time, in
// RFC 3339 UTC rounded up to the second, at which the bucket would be full
// again. When both token limits are enforced, anthropic-ratelimit-tokens-*
// repeat those of the one with less remaining (input on a tie), as the API
// reports its most restrictive token limit. The values are those of the
// instant the request was admitted; a step's own Header replaces any of
// them.
//
// If l is not valid (see [RateLimits.Validate]) NewServer still succeeds,
// but every Messages request gets a 500 api_error whose message is the
// error; call Validate first to fail a test earlier.
func WithRateLimits(l RateLimits) ServerOption {
	return func(s *Server) {
		s.limits = &limiter{config: l, err: l.Validate()}
	}
}

// RateLimitStats counts what the rate limits of a server did (see
// [WithRateLimits] and [Server.RateLimitStats]). Token counts cover every
// admitted request, whether or not their limit is enforced.
type RateLimitStats struct {
	// Admitted is the number of Messages requests the limits let through.
	Admitted int
	// Limited is the number of Messages requests they refused with a 429.
	Limited int
	// InputTokens is the sum of the input tokens of the admitted requests.
	InputTokens int
	// OutputTokens is the sum of the output tokens charged for finished
	// answers (0 for an error, a drop or an abandoned answer).
	OutputTokens int
	// OutputReserved is the max_tokens still reserved by admitted requests
	// whose answer is not finished yet.
	OutputReserved int
}

// RateLimitStats returns what the server's rate limits have done so far;
// all zero for a server made without [WithRateLimits].
func (s *Server) RateLimitStats() RateLimitStats {
	if s.limits == nil {
		return RateLimitStats{}
	}
	s.limits.mu.Lock()
	defer s.limits.mu.Unlock()
	return s.limits.stats
}

// Buckets, in the order a refusal names them.
const (
	bucketRequests = iota
	bucketInput
	bucketOutput
	numBuckets
)

// bucketHeader is each bucket's part of its header names.
var bucketHeader = [numBuckets]string{"requests", "input-tokens", "output-tokens"}

// bucketUnit is what each bucket counts, as a refusal's message says it.
var bucketUnit = [numBuckets]string{"requests", "input tokens", "output tokens"}

// unitsPerToken is a bucket's fixed-point scale: microseconds in a minute,
// so that a bucket of limit L refills exactly L units a microsecond and
// never loses a fraction to rounding.
const unitsPerToken = int64(time.Minute / time.Microsecond)

// maxCost bounds the output reservation read from a request body, so that
// a huge max_tokens cannot overflow: it is above any limit anyway.
const maxCost = maxRateLimit + 1

// limiter holds the buckets of a server made with WithRateLimits.
type limiter struct {
	config RateLimits
	err    error            // from Validate: every Messages request gets a 500
	now    func() time.Time // the server's clock

	mu      sync.Mutex
	started bool
	buckets [numBuckets]bucket
	stats   RateLimitStats
}

// bucket is one token bucket. Requires limiter.mu.
type bucket struct {
	limit int64     // per minute; 0: not enforced
	level int64     // in units; below 0 when output settled above its reservation
	at    time.Time // the time level is up to date with
}

// full returns the bucket's capacity in units.
func (b *bucket) full() int64 { return b.limit * unitsPerToken }

// refill brings the bucket up to date with now. Time before b.at (requests
// that read the clock before another was admitted) adds nothing.
func (b *bucket) refill(now time.Time) {
	d := now.Sub(b.at)
	if b.limit == 0 || d <= 0 {
		return
	}
	us := int64(d / time.Microsecond)
	if us >= ceilDiv(b.full()-b.level, b.limit) {
		b.level, b.at = b.full(), now // a full bucket banks no idle time
		return
	}
	b.level += us * b.limit
	b.at = b.at.Add(time.Duration(us) * time.Microsecond) // keep the sub-µs rest
}

// wait returns how long until the bucket holds cost tokens, or is full if
// cost is above its limit.
func (b *bucket) wait(cost int64) time.Duration {
	need := b.full()
	if cost <= b.limit {
		need = cost * unitsPerToken
	}
	return time.Duration(max(ceilDiv(need-b.level, b.limit), 0)) * time.Microsecond
}

// remaining is the bucket's level in whole tokens, rounded down, never
// below 0.
func (b *bucket) remaining() int64 { return max(b.level, 0) / unitsPerToken }

// reset is when the bucket would be full again, rounded up to the second.
func (b *bucket) reset() time.Time {
	t := b.at.Add(b.wait(b.limit))
	if t.Truncate(time.Second).Equal(t) {
		return t
	}
	return t.Truncate(time.Second).Add(time.Second)
}

func ceilDiv(a, b int64) int64 {
	if a <= 0 {
		return a / b // rounds toward 0, which is up for a < 0
	}
	return (a + b - 1) / b
}

// admission is the limiter's verdict on one Messages request.
type admission struct {
	err        error       // the configuration is invalid: answer 500
	refused    string      // the 429's message; "" if admitted
	retryAfter int64       // seconds, for a 429
	header     http.Header // the rate-limit headers of the response
	ticket     *ticket     // nil unless admitted
}

// admit decides on a request that arrived at now costing input tokens and
// reserving output tokens, and takes its cost if it fits.
func (l *limiter) admit(now time.Time, input, output int64) admission {
	if l.err != nil {
		return admission{err: l.err}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.started {
		// Made lazily: full at the first request is full since the server
		// started.
		l.started = true
		for i, lim := range [numBuckets]int{l.config.RequestsPerMinute, l.config.InputTokensPerMinute, l.config.OutputTokensPerMinute} {
			l.buckets[i] = bucket{limit: int64(lim), at: now}
			l.buckets[i].level = l.buckets[i].full()
		}
	}
	cost := [numBuckets]int64{1, input, output}
	refused := -1
	var wait time.Duration
	for i := range l.buckets {
		b := &l.buckets[i]
		b.refill(now)
		if b.limit == 0 || (cost[i] <= b.limit && b.level >= cost[i]*unitsPerToken) {
			continue
		}
		if refused < 0 {
			refused = i
		}
		wait = max(wait, b.wait(cost[i]))
	}
	var a admission
	if refused >= 0 {
		l.stats.Limited++
		a.retryAfter = max(1, ceilDiv(int64(wait), int64(time.Second)))
		a.refused = "This request would exceed the rate limit for your organization of " +
			commas(l.buckets[refused].limit) + " " + bucketUnit[refused] + " per minute. " +
			"You can see the response headers for current usage. " +
			"Please reduce the prompt length or the maximum tokens requested, or try again later."
	} else {
		for i := range l.buckets {
			if l.buckets[i].limit > 0 {
				l.buckets[i].level -= cost[i] * unitsPerToken
			}
		}
		l.stats.Admitted++
		l.stats.InputTokens += int(input)
		l.stats.OutputReserved += int(output)
		a.ticket = &ticket{l: l, reserved: output}
	}
	a.header = l.headers()
	return a
}

// headers returns the rate-limit headers for the buckets as they are.
// Requires l.mu.
func (l *limiter) headers() http.Header {
	h := http.Header{}
	set := func(name string, b *bucket, round bool) {
		rem := b.remaining()
		if r := int64(l.config.TokenRounding); round && r > 1 {
			rem -= rem % r
		}
		h.Set("anthropic-ratelimit-"+name+"-limit", strconv.FormatInt(b.limit, 10))
		h.Set("anthropic-ratelimit-"+name+"-remaining", strconv.FormatInt(rem, 10))
		h.Set("anthropic-ratelimit-"+name+"-reset", b.reset().UTC().Format(time.RFC3339))
	}
	for i := range l.buckets {
		if l.buckets[i].limit > 0 {
			set(bucketHeader[i], &l.buckets[i], i != bucketRequests)
		}
	}
	in, out := &l.buckets[bucketInput], &l.buckets[bucketOutput]
	if in.limit > 0 && out.limit > 0 {
		tighter := in
		if out.level < in.level {
			tighter = out
		}
		set("tokens", tighter, true)
	}
	return h
}

// ticket is an admitted request's output reservation. It is used by the
// request's handler goroutine only.
type ticket struct {
	l        *limiter
	reserved int64
	done     bool
}

// settle charges output tokens for the finished answer instead of the
// reservation, once; later calls do nothing. A nil ticket does nothing.
func (t *ticket) settle(output int64) {
	if t == nil || t.done {
		return
	}
	t.done = true
	output = min(max(output, 0), maxCost)
	l := t.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if b := &l.buckets[bucketOutput]; b.limit > 0 {
		// Up to date first: the refill before now is capped at full, and
		// an answer longer than its reservation takes from what is there.
		b.refill(l.now())
		b.level = min(b.level+(t.reserved-output)*unitsPerToken, b.full())
	}
	l.stats.OutputReserved -= int(t.reserved)
	l.stats.OutputTokens += int(output)
}

// inputTokensOf is the input tokens a request costs and, on a server with
// rate limits, reports: about four bytes of body a token, at least 1.
func inputTokensOf(body []byte) int {
	return max(1, (len(body)+3)/4)
}

// bodyOutputTokens reads usage.output_tokens from a raw step body; 0 if it
// has none.
func bodyOutputTokens(body []byte) int64 {
	var m struct {
		Usage struct {
			OutputTokens int64 `json:"output_tokens"`
		} `json:"usage"`
	}
	_ = json.Unmarshal(body, &m)
	return m.Usage.OutputTokens
}

// refuse answers a Messages request that took no step: the limiter's 429,
// or a 500 when the limits are not valid, in the platform's shape. Bedrock
// and Vertex get retry-after but none of the API's rate-limit headers,
// which they do not send.
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, a admission, requestID string) {
	h := w.Header()
	h.Set("Request-Id", requestID)
	status, msg := http.StatusTooManyRequests, a.refused
	if a.err != nil {
		status, msg = http.StatusInternalServerError, a.err.Error()
	} else {
		h.Set("Retry-After", strconv.FormatInt(a.retryAfter, 10))
	}
	if s.platform.name != platformAnthropic {
		s.writeRefusal(w, r, refusal{status, s.platform.kind(status), msg})
		return
	}
	if a.err == nil {
		for k, vs := range a.header {
			h[k] = vs
		}
	}
	s.writeBody(r.Context(), w, status, errorJSON(DefaultErrorType(status), "", msg, requestID), DropNone)
}

// commas writes n with thousands separators, as the API's messages do.
func commas(n int64) string {
	s := strconv.FormatInt(n, 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
