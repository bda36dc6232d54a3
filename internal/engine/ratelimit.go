package engine

import (
	"github.com/tidwall/gjson"

	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/gates/ratelimit"
)

// The rate limiter's names (package internal/gates/ratelimit).

// OutcomeRateLimited: the rate limiter could not admit the attempt in time.
const OutcomeRateLimited = ratelimit.OutcomeRateLimited

// ErrRateLimited: the rate limiter could not admit the attempt within
// RateLimitPolicy.MaxWait and the caller's deadline, so nothing was
// sent. [Error.AdmitAt] holds when it could have been admitted, and
// [Error.RetryAfter] the time until then.
var ErrRateLimited = ratelimit.ErrRateLimited

// RateLimitPolicy configures the rate limiter: it keeps every goroutine of
// a Damper under the API's rate limits together, so that attempts wait in
// line on the Damper instead of each finding the limit in a 429. The API
// limits requests, input tokens and output tokens per minute for each
// limit group, a model family (see [LimitGroup]); the limiter keeps the
// same three buckets per group, configured in Limits or learned from the
// anthropic-ratelimit-* headers. An attempt that finds no room waits in
// line, within its priority (see [ContextWithPriority]), for at most
// MaxWait, else fails at once with [ErrRateLimited].
//
// The zero value learns every limit and has the defaults written beside
// each field; a nil *RateLimitPolicy in a Policy means no limiter.
type RateLimitPolicy = ratelimit.Policy

// RateLimits are the per-minute limits of one limit group (requests,
// input tokens, output tokens); zero means learned from the API's headers.
// Each is at most 1,000,000,000.
type RateLimits = fleet.RateLimits

// LimitGroup returns the rate-limit group of a model ID, which a key of
// [RateLimitPolicy.Limits] configures: the API limits a model family as a whole, so
// every dated, platform and minor version of one family and major version
// shares a group. "claude-sonnet-4-5-20250929" and "claude-sonnet-4-6" are
// "claude-sonnet-4"; "claude-3-5-haiku-20241022" is "claude-3-5-haiku". An
// ID of another shape is its own group, without its date, in lower case;
// but one whose group would be empty, longer than 128 bytes or hold bytes
// other than the letters, digits and . _ : @ / - of model IDs is in the
// group "(other)", so that a group's name is always short and printable.
func LimitGroup(model string) string { return ratelimit.LimitGroup(model) }

// RateLimitState is one bucket of the rate limiter, as [Damper.RateLimits]
// reads it: its group (see [LimitGroup]), its kind, its limit and what
// remains, whether the limit was learned, and the end of a pause.
type RateLimitState = fleet.RateLimitState

// RateLimits returns every bucket of the Damper's rate limiter, by group
// then bucket; nil without Policy.RateLimit.
func (d *Damper) RateLimits() []RateLimitState {
	if d.primary.limiter == nil {
		return nil
	}
	return d.primary.limiter.State(d.clock.Now())
}

// usage is an answer's token usage.
type usage struct {
	input, cacheCreation, cacheRead, output int64
	known                                   bool
}

// answerUsage reads the usage of a plain answer.
func answerUsage(body []byte) usage {
	u := gjson.GetBytes(body, "usage")
	if !u.IsObject() {
		return usage{}
	}
	return usage{
		input:         u.Get("input_tokens").Int(),
		cacheCreation: u.Get("cache_creation_input_tokens").Int(),
		cacheRead:     u.Get("cache_read_input_tokens").Int(),
		output:        u.Get("output_tokens").Int(),
		known:         true,
	}
}

// public is u as a Report and the gates say it.
func (u usage) public() Usage {
	return Usage{InputTokens: u.input, CacheCreationInputTokens: u.cacheCreation,
		CacheReadInputTokens: u.cacheRead, OutputTokens: u.output, Known: u.known}
}
