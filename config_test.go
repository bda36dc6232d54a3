package damper_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// fullPolicy sets every field a file can hold to a value that is not its
// default, None in each field that takes it.
func fullPolicy() damper.Policy {
	return damper.Policy{
		MaxAttempts:          5,
		PerAttemptTimeout:    45 * time.Second,
		MaxRetryCostUSD:      0.25,
		RetryBudgetRatio:     damper.None,
		RetryBudgetWindow:    90 * time.Second,
		RetryBudgetMinTokens: damper.None,
		BackoffBase:          damper.None,
		BackoffMax:           20 * time.Second,
		IgnoreRetryAfter:     true,
		MaxRetryAfter:        damper.None,
		OnBudgetExhausted:    damper.PassthroughBudgetExhausted,
		MaxHoldBack:          4096,
		MaxEventBytes:        1 << 20,
		StreamIdleTimeout:    time.Minute + 500*time.Millisecond,
		Breaker: &damper.BreakerPolicy{
			FailureRatio: 0.6, MinAttempts: 7, Window: 10 * time.Second,
			OpenFor: 2 * time.Second, MaxOpenFor: 15 * time.Second,
		},
		Throttle: &damper.ThrottlePolicy{MaxTokens: 40, TokenRatio: 0.15},
		RateLimit: &damper.RateLimitPolicy{
			Limits: map[string]damper.RateLimits{
				"claude-sonnet-4":  {RequestsPerMinute: 4000, InputTokensPerMinute: 2_000_000, OutputTokensPerMinute: 400_000},
				"claude-3-5-haiku": {OutputTokensPerMinute: 100_000},
			},
			MaxWait:    12 * time.Second,
			Priority:   damper.Batch,
			BatchShare: 0.5,
		},
		Hedge: &damper.HedgePolicy{Quantile: 0.9, MinDelay: 250 * time.Millisecond, Window: 500, MinSamples: 50, OnlyWhenAsked: true},
	}
}

// The policies that the round trip must preserve.
func roundTripPolicies() map[string]damper.Policy {
	other := fullPolicy()
	other.RetryBudgetRatio, other.RetryBudgetMinTokens = 0.3, 25
	other.BackoffBase, other.MaxRetryAfter = 250*time.Millisecond, 2*time.Minute
	return map[string]damper.Policy{
		"full":        fullPolicy(),
		"full values": other,
		"zero":        {},
		"empty subs":  {Breaker: &damper.BreakerPolicy{}, Throttle: &damper.ThrottlePolicy{}, RateLimit: &damper.RateLimitPolicy{}},
		"recommended": damper.RecommendedPolicy(),
		"one none":    {RetryBudgetRatio: damper.None, RetryBudgetMinTokens: 10},
		"never wait":  {RateLimit: &damper.RateLimitPolicy{MaxWait: damper.None}},
		"fixed hedge": {Hedge: &damper.HedgePolicy{Delay: 2 * time.Second}},
		"empty hedge": {Hedge: &damper.HedgePolicy{}},
		"fallback": {Fallback: &damper.FallbackPolicy{OnSpendLimit: true,
			Models: map[string][]string{"claude-opus-4-5": {"claude-sonnet-4-5", "claude-haiku-4-5"}}}},
		"empty fallback": {Fallback: &damper.FallbackPolicy{}},
	}
}

func TestPolicyFileRoundTrip(t *testing.T) {
	for name, p := range roundTripPolicies() {
		t.Run(name, func(t *testing.T) {
			if _, err := damper.New(p); err != nil {
				t.Fatalf("the policy itself is not valid: %v", err)
			}
			js, err := json.Marshal(p)
			if err != nil {
				t.Fatal(err)
			}
			got, err := damper.ParsePolicyJSON(js)
			if err != nil {
				t.Fatalf("ParsePolicyJSON(%s): %v", js, err)
			}
			if !reflect.DeepEqual(got, p) {
				t.Fatalf("through JSON %s:\n got %+v\nwant %+v", js, got, p)
			}

			ys, err := yaml.Marshal(p)
			if err != nil {
				t.Fatal(err)
			}
			got, err = damper.ParsePolicyYAML(ys)
			if err != nil {
				t.Fatalf("ParsePolicyYAML(%s): %v", ys, err)
			}
			if !reflect.DeepEqual(got, p) {
				t.Fatalf("through YAML\n%s\n got %+v\nwant %+v", ys, got, p)
			}
		})
	}
}

// TestPolicyFileWrites: None is written 0, a default is left out, and
// durations are strings.
func TestPolicyFileWrites(t *testing.T) {
	js, err := json.Marshal((damper.Policy{
		RetryBudgetRatio: damper.None, BackoffBase: damper.None, MaxAttempts: 4, BackoffMax: 90 * time.Second,
		Breaker: &damper.BreakerPolicy{}, RateLimit: &damper.RateLimitPolicy{Priority: damper.Batch},
	}))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"max_attempts":4,"retry_budget_ratio":0,"backoff_base":"0s","backoff_max":"1m30s","breaker":{},"rate_limit":{"priority":"batch"}}`
	if string(js) != want {
		t.Errorf("JSON = %s\nwant   %s", js, want)
	}
	// What a file cannot hold is left out.
	js, err = json.Marshal(damper.Policy{
		PriceTable: damper.DefaultPriceTable(),
		Classifier: func(_ damper.Failure, c damper.Classification) damper.Classification { return c },
		Breaker:    &damper.BreakerPolicy{OnStateChange: func(damper.CircuitChange) {}},
	})
	if err != nil {
		t.Fatal(err)
	}
	p, err := damper.ParsePolicyJSON(js)
	if err != nil || p.PriceTable != nil || p.Classifier != nil || p.Breaker == nil || p.Breaker.OnStateChange != nil {
		t.Errorf("Policy() = %+v, %v; want the breaker alone", p, err)
	}
}

// exampleYAML is the example of docs/guide/configuration.md, "Policy from
// a file" (TestParsePolicyExample).
const exampleYAML = `
max_attempts: 4
per_attempt_timeout: 45s
retry_budget_ratio: 0        # explicitly zero: the budget never grows
retry_budget_min_tokens: 20
on_budget_exhausted: passthrough   # or raise
breaker:                     # RecommendedPolicy's breaker
  open_for: 2s
  max_open_for: 10s
throttle: {}                 # a throttle with its defaults
rate_limit:
  max_wait: 1m30s
  priority: batch            # or interactive
  limits:                    # by limit group, or by a model ID of the group
    claude-sonnet-4: {requests_per_minute: 4000}
hedge: {quantile: 0.9, min_delay: 250ms}
`

const exampleJSON = `{
  "max_attempts": 4,
  "per_attempt_timeout": "45s",
  "retry_budget_ratio": 0,
  "retry_budget_min_tokens": 20,
  "on_budget_exhausted": "passthrough",
  "breaker": {"open_for": "2s", "max_open_for": "10s"},
  "throttle": {},
  "rate_limit": {
    "max_wait": "1m30s",
    "priority": "batch",
    "limits": {"claude-sonnet-4": {"requests_per_minute": 4000}}
  },
  "hedge": {"quantile": 0.9, "min_delay": "250ms"}
}`

func examplePolicy() damper.Policy {
	return damper.Policy{
		MaxAttempts: 4, PerAttemptTimeout: 45 * time.Second,
		RetryBudgetRatio: damper.None, RetryBudgetMinTokens: 20,
		OnBudgetExhausted: damper.PassthroughBudgetExhausted,
		Breaker:           &damper.BreakerPolicy{OpenFor: 2 * time.Second, MaxOpenFor: 10 * time.Second},
		Throttle:          &damper.ThrottlePolicy{},
		RateLimit: &damper.RateLimitPolicy{
			MaxWait: 90 * time.Second, Priority: damper.Batch,
			Limits: map[string]damper.RateLimits{"claude-sonnet-4": {RequestsPerMinute: 4000}},
		},
		Hedge: &damper.HedgePolicy{Quantile: 0.9, MinDelay: 250 * time.Millisecond},
	}
}

// TestPolicyFileZeroAndAbsent: an absent key is the default, a written 0
// is zero, and {} is a sub-policy with its defaults.
func TestPolicyFileZeroAndAbsent(t *testing.T) {
	tests := []struct {
		doc  string
		want damper.Policy
	}{
		{``, damper.Policy{}},
		{`{}`, damper.Policy{}},
		{`null`, damper.Policy{}},
		{`retry_budget_ratio: 0`, damper.Policy{RetryBudgetRatio: damper.None}},
		{`retry_budget_ratio: 0.0`, damper.Policy{RetryBudgetRatio: damper.None}},
		{`retry_budget_min_tokens: 0`, damper.Policy{RetryBudgetMinTokens: damper.None}},
		{`backoff_base: 0`, damper.Policy{BackoffBase: damper.None}},
		{`backoff_base: 0s`, damper.Policy{BackoffBase: damper.None}},
		{`max_retry_after: "0"`, damper.Policy{MaxRetryAfter: damper.None}},
		{`max_retry_cost_usd: 0`, damper.Policy{}},
		{`stream_idle_timeout: 0s`, damper.Policy{}},
		{`ignore_retry_after: false`, damper.Policy{}},
		{`on_budget_exhausted: raise`, damper.Policy{}},
		{`max_attempts: 1e1`, damper.Policy{MaxAttempts: 10}},
		{`breaker: {}`, damper.Policy{Breaker: &damper.BreakerPolicy{}}},
		{`rate_limit: {max_wait: 0}`, damper.Policy{RateLimit: &damper.RateLimitPolicy{MaxWait: damper.None}}},
		{`rate_limit: {priority: interactive, limits: {}}`, damper.Policy{RateLimit: &damper.RateLimitPolicy{}}},
		{`rate_limit: {limits: {claude-opus-4: {requests_per_minute: 0}}}`, damper.Policy{RateLimit: &damper.RateLimitPolicy{
			Limits: map[string]damper.RateLimits{"claude-opus-4": {}}}}},
	}
	for _, tt := range tests {
		p, err := damper.ParsePolicyYAML([]byte(tt.doc))
		if err != nil {
			t.Errorf("%q: %v", tt.doc, err)
			continue
		}
		if !reflect.DeepEqual(p, tt.want) {
			t.Errorf("%q:\n got %+v\nwant %+v", tt.doc, p, tt.want)
		}
	}
}

// TestPolicyFileErrors: every error names the key's path and the value
// as written, in JSON and in YAML alike.
func TestPolicyFileErrors(t *testing.T) {
	tests := []struct {
		doc  string // JSON, and so YAML too
		path string // the ConfigError's Path
		want string // in its message
	}{
		// Durations.
		{`{"breaker": {"open_for": "3x"}}`, "breaker.open_for", `breaker.open_for: "3x": time: unknown unit "x" in duration "3x"`},
		{`{"per_attempt_timeout": "soon"}`, "per_attempt_timeout", `per_attempt_timeout: "soon": time: invalid duration`},
		{`{"per_attempt_timeout": 30}`, "per_attempt_timeout", `per_attempt_timeout: 30: want a duration with its unit, such as "30s"`},
		{`{"rate_limit": {"max_wait": true}}`, "rate_limit.max_wait", `rate_limit.max_wait: true: want a duration`},
		// Negative values, None's -1 among them.
		{`{"max_attempts": -1}`, "max_attempts", `max_attempts: -1: must be at least 1 (leave the key out for the default, 3)`},
		{`{"retry_budget_ratio": -1}`, "retry_budget_ratio", `retry_budget_ratio: -1: must be a finite number, at least 0 (leave the key out for the default, 0.1)`},
		{`{"retry_budget_min_tokens": -1}`, "retry_budget_min_tokens", `retry_budget_min_tokens: -1: must be at least 0`},
		{`{"backoff_base": "-1ns"}`, "backoff_base", `backoff_base: "-1ns": must be at least 0`},
		{`{"max_retry_after": "-1s"}`, "max_retry_after", `max_retry_after: "-1s": must be at least 0`},
		{`{"max_retry_cost_usd": -1}`, "max_retry_cost_usd", `max_retry_cost_usd: -1: must be a finite number of dollars, at least 0 (0 means no ceiling)`},
		{`{"stream_idle_timeout": "-1ns"}`, "stream_idle_timeout", `stream_idle_timeout: "-1ns": must be positive`},
		{`{"rate_limit": {"limits": {"claude-sonnet-4": {"requests_per_minute": -5}}}}`, "rate_limit.limits.claude-sonnet-4.requests_per_minute",
			`rate_limit.limits.claude-sonnet-4.requests_per_minute: -5: must be at least 0 (0 means learned)`},
		// A 0 that a field cannot take.
		{`{"max_attempts": 0}`, "max_attempts", `max_attempts: 0: must be at least 1 (leave the key out for the default, 3)`},
		{`{"per_attempt_timeout": "0s"}`, "per_attempt_timeout", `per_attempt_timeout: "0s": must be positive (leave the key out for the default, 60s)`},
		{`{"max_hold_back": 0}`, "max_hold_back", `max_hold_back: 0: must be a positive number of bytes`},
		{`{"max_event_bytes": -5}`, "max_event_bytes", `max_event_bytes: -5: must be a positive number of bytes`},
		{`{"breaker": {"failure_ratio": 0}}`, "breaker.failure_ratio", `breaker.failure_ratio: 0: must be a share in (0, 1] (leave the key out for the default, 0.5)`},
		{`{"throttle": {"max_tokens": 0}}`, "throttle.max_tokens", `throttle.max_tokens: 0: must be in [1, 1000]`},
		{`{"rate_limit": {"batch_share": 0}}`, "rate_limit.batch_share", `rate_limit.batch_share: 0: must be a share in (0, 1]`},
		// Out of range, and wrong together.
		{`{"breaker": {"failure_ratio": 1.5}}`, "breaker.failure_ratio", `breaker.failure_ratio: 1.5: must be a share in (0, 1]`},
		{`{"throttle": {"max_tokens": 1001}}`, "throttle.max_tokens", `throttle.max_tokens: 1001: must be in [1, 1000]`},
		{`{"throttle": {"token_ratio": 0.0004}}`, "throttle.token_ratio", `throttle.token_ratio: 0.0004: must be at least 0.001`},
		{`{"backoff_base": "1m"}`, "backoff_base", `backoff_base: "1m0s": must not exceed backoff_max (30s)`},
		{`{"breaker": {"open_for": "10m"}}`, "breaker.max_open_for", `breaker.max_open_for: "5m0s" (the default): must not be shorter than open_for (10m0s)`},
		{`{"rate_limit": {"limits": {"": {}}}}`, "rate_limit.limits", `rate_limit.limits: "": a limit group needs a name`},
		// Above the largest value.
		{`{"hedge": {"window": 1000000000000000000}}`, "hedge.window", `hedge.window: 1000000000000000000: must be at most 10000`},
		{`{"max_attempts": 101}`, "max_attempts", `max_attempts: 101: must be at most 100`},
		{`{"per_attempt_timeout": "25h"}`, "per_attempt_timeout", `per_attempt_timeout: "25h0m0s": must be at most 24h0m0s`},
		{`{"max_retry_cost_usd": 1e7}`, "max_retry_cost_usd", `max_retry_cost_usd: 1e+07: must be at most 1e+06`},
		{`{"retry_budget_ratio": 1001}`, "retry_budget_ratio", `retry_budget_ratio: 1001: must be at most 1000`},
		{`{"retry_budget_window": "2562047h"}`, "retry_budget_window", `retry_budget_window: "2562047h0m0s": must be at most 24h0m0s`},
		{`{"retry_budget_min_tokens": 1e18}`, "retry_budget_min_tokens", `retry_budget_min_tokens: 1000000000000000000: must be at most 1000000`},
		{`{"backoff_max": "100h"}`, "backoff_max", `backoff_max: "100h0m0s": must be at most 24h0m0s`},
		{`{"max_retry_after": "1000h"}`, "max_retry_after", `max_retry_after: "1000h0m0s": must be at most 24h0m0s`},
		{`{"max_hold_back": 1e12}`, "max_hold_back", `max_hold_back: 1000000000000: must be at most 67108864`},
		{`{"stream_idle_timeout": "48h"}`, "stream_idle_timeout", `stream_idle_timeout: "48h0m0s": must be at most 24h0m0s`},
		{`{"breaker": {"min_attempts": 9e15}}`, "breaker.min_attempts", `breaker.min_attempts: 9000000000000000: must be at most 1000000`},
		{`{"breaker": {"window": "25h"}}`, "breaker.window", `breaker.window: "25h0m0s": must be at most 24h0m0s`},
		{`{"breaker": {"open_for": "25h", "max_open_for": "25h"}}`, "breaker.open_for", `breaker.open_for: "25h0m0s": must be at most 24h0m0s`},
		{`{"hedge": {"delay": "25h"}}`, "hedge.delay", `hedge.delay: "25h0m0s": must be at most 24h0m0s`},
		{`{"hedge": {"min_delay": "25h"}}`, "hedge.min_delay", `hedge.min_delay: "25h0m0s": must be at most 24h0m0s`},
		{`{"rate_limit": {"max_wait": "25h"}}`, "rate_limit.max_wait", `rate_limit.max_wait: "25h0m0s": must be at most 24h0m0s`},
		{`{"rate_limit": {"limits": {"claude-sonnet-4": {"output_tokens_per_minute": 1e10}}}}`, "rate_limit.limits.claude-sonnet-4.output_tokens_per_minute",
			`rate_limit.limits.claude-sonnet-4.output_tokens_per_minute: 10000000000: must be at most 1000000000`},
		{`{"fallback": {"models": {"claude-a": ["b1","b2","b3","b4","b5","b6","b7","b8","b9","b10","b11","b12","b13","b14","b15","b16","b17"]}}}`,
			"fallback.models.claude-a", `fallback.models.claude-a: 17 siblings: must be at most 16`},
		{`{"rate_limit": {"limits": {"claude-sonnet-4-5": {}, "claude-sonnet-4-6-20260101": {}}}}`, "rate_limit.limits.claude-sonnet-4-6-20260101",
			`rate_limit.limits.claude-sonnet-4-6-20260101: "claude-sonnet-4-6-20260101": names the limit group "claude-sonnet-4", as "claude-sonnet-4-5" does`},
		{`{"rate_limit": {"limits": {"claude-opus-4": {}, "Claude-Opus-4-1": {}}}}`, "rate_limit.limits.claude-opus-4",
			`rate_limit.limits.claude-opus-4: "claude-opus-4": names the limit group "claude-opus-4", as "Claude-Opus-4-1" does`},
		{`{"rate_limit": {"limits": {"` + strings.Repeat("m", 300) + `": {}}}}`, "rate_limit.limits",
			`rate_limit.limits: "` + strings.Repeat("m", 64) + `"...: a key is a model ID or a limit group's name, at most 256 bytes of UTF-8`},
		// Names.
		{`{"on_budget_exhausted": "retry"}`, "on_budget_exhausted", `on_budget_exhausted: "retry": want "raise" or "passthrough"`},
		{`{"on_budget_exhausted": "Raise"}`, "on_budget_exhausted", `on_budget_exhausted: "Raise": want "raise" or "passthrough"`},
		{`{"hedge": {"quantile": 1}}`, "hedge.quantile", `hedge.quantile: 1: must be in (0, 1)`},
		{`{"hedge": {"window": 10, "min_samples": 20}}`, "hedge.min_samples", `hedge.min_samples: 20: must not exceed window (10)`},
		{`{"hedge": {"delay": "-1s"}}`, "hedge.delay", `hedge.delay: "-1s": must be positive`},
		{`{"fallback": {"models": {"claude-a": "claude-b"}}}`, "fallback.models.claude-a", `fallback.models.claude-a: "claude-b": want a list`},
		{`{"fallback": {"models": {"claude-a": [1]}}}`, "fallback.models.claude-a[0]", `fallback.models.claude-a[0]: 1: want a string`},
		{`{"fallback": {"models": {"claude-a": ["claude-a"]}}}`, "fallback.models.claude-a", `fallback.models.claude-a: ["claude-a"]: siblings must be other, non-empty model names`},
		{`{"rate_limit": {"priority": "urgent"}}`, "rate_limit.priority", `rate_limit.priority: "urgent": want "interactive" or "batch"`},
		// Unknown keys.
		{`{"max_attempt": 3}`, "max_attempt", `max_attempt: unknown key (known: max_attempts, per_attempt_timeout,`},
		{`{"MaxAttempts": 3}`, "MaxAttempts", `MaxAttempts: unknown key`},
		{`{"breaker": {"failure_rate": 0.5}}`, "breaker.failure_rate", `breaker.failure_rate: unknown key (known: failure_ratio, min_attempts, window, open_for, max_open_for)`},
		{`{"rate_limit": {"limits": {"claude-sonnet-4": {"rpm": 5}}}}`, "rate_limit.limits.claude-sonnet-4.rpm", `rate_limit.limits.claude-sonnet-4.rpm: unknown key`},
		{`{"classifier": "mine"}`, "classifier", `classifier: unknown key`},
		{`{"price_table": {}}`, "price_table", `price_table: unknown key`},
		// Wrong types.
		{`{"max_attempts": "three"}`, "max_attempts", `max_attempts: "three": want a whole number`},
		{`{"max_attempts": 2.5}`, "max_attempts", `max_attempts: 2.5: want a whole number`},
		{`{"max_attempts": [3]}`, "max_attempts", `max_attempts: a list: want a whole number`},
		{`{"retry_budget_ratio": "0.1"}`, "retry_budget_ratio", `retry_budget_ratio: "0.1": want a number`},
		{`{"ignore_retry_after": "true"}`, "ignore_retry_after", `ignore_retry_after: "true": want true or false`},
		{`{"on_budget_exhausted": 1}`, "on_budget_exhausted", `on_budget_exhausted: 1: want a string`},
		{`{"breaker": 5}`, "breaker", `breaker: 5: want an object`},
		{`{"breaker": null}`, "breaker", `breaker: null: leave the key out for none, or write {} for one with its defaults`},
		{`{"max_attempts": null}`, "max_attempts", `max_attempts: null: leave the key out for the default`},
		{`{"rate_limit": {"limits": []}}`, "rate_limit.limits", `rate_limit.limits: a list: want an object`},
		{`[]`, "", `damper: policy config: a list: want an object`},
		{`"max_attempts"`, "", `damper: policy config: "max_attempts": want an object`},
	}
	for _, tt := range tests {
		for name, parse := range map[string]func([]byte) (damper.Policy, error){"json": damper.ParsePolicyJSON, "yaml": damper.ParsePolicyYAML} {
			_, err := parse([]byte(tt.doc))
			var ce *damper.ConfigError
			if !errors.As(err, &ce) {
				t.Errorf("%s %s: error %v, want a *ConfigError", name, tt.doc, err)
				continue
			}
			if ce.Path != tt.path || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("%s %s:\n error %q (path %q)\n  want %q (path %q)", name, tt.doc, err, ce.Path, tt.want, tt.path)
			}
		}
	}
}

// TestPolicyFileDocumentErrors: documents that are not JSON, or not
// YAML, or repeat a key.
func TestPolicyFileDocumentErrors(t *testing.T) {
	tests := []struct {
		parse func([]byte) (damper.Policy, error)
		doc   string
		want  string
	}{
		{damper.ParsePolicyJSON, `{"max_attempts": }`, `damper: policy config: line 1, column 18: invalid character '}'`},
		{damper.ParsePolicyJSON, "{\n  \"max_attempts\": 3,\n  \"breaker\": {]\n}", `line 3, column 15: invalid character ']'`},
		{damper.ParsePolicyJSON, `{} {}`, `invalid character '{' after top-level value`},
		{damper.ParsePolicyJSON, ``, `unexpected end of JSON input`},
		{damper.ParsePolicyJSON, `{"max_attempts": 1, "max_attempts": 2}`, `damper: policy config: max_attempts: repeated key`},
		{damper.ParsePolicyJSON, `{"breaker": {"window": "1m", "window": "2m"}}`, `breaker.window: repeated key`},
		{damper.ParsePolicyYAML, "breaker:\n  open_for: 2s\n open_for: 3s\n", `damper: policy config: yaml: line 2: did not find expected key`},
		{damper.ParsePolicyYAML, "retry_budget_ratio: .nan\n", `NaN: no key takes a value that is not a finite number`},
		{damper.ParsePolicyYAML, "max_retry_cost_usd: .inf\n", `+Inf: no key takes a value that is not a finite number`},
		{damper.ParsePolicyYAML, "- max_attempts: 3\n", `damper: policy config: a list: want an object`},
	}
	for _, tt := range tests {
		_, err := tt.parse([]byte(tt.doc))
		var ce *damper.ConfigError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: error %v, want a *ConfigError with %q", tt.doc, err, tt.want)
		}
	}
}

// TestPolicyYAMLRepeatedKey: a key repeated in YAML is a ConfigError with
// the key's path, as in JSON, wherever it is, and however it is written.
func TestPolicyYAMLRepeatedKey(t *testing.T) {
	tests := []struct{ doc, path string }{
		{"max_attempts: 1\nmax_attempts: 2\n", "max_attempts"},
		{"breaker:\n  open_for: 2s\n  window: 1m\n  open_for: 3s\n", "breaker.open_for"},
		{"breaker: {open_for: 2s}\nthrottle: {}\nbreaker: {open_for: 3s}\n", "breaker"},
		{"rate_limit:\n  limits:\n    claude-sonnet-4: {requests_per_minute: 1}\n    claude-sonnet-4: {requests_per_minute: 2}\n", "rate_limit.limits.claude-sonnet-4"},
		{"rate_limit: {limits: {claude-sonnet-4: {requests_per_minute: 1, requests_per_minute: 2}}}", "rate_limit.limits.claude-sonnet-4.requests_per_minute"},
		// Two keys that YAML tells apart and JSON does not.
		{"fallback: {models: {1: [a], \"1\": [b]}}", "fallback.models.1"},
		{"fallback: {models: {claude-a: [{x: 1, x: 2}]}}", "fallback.models.claude-a[0].x"},
	}
	for _, tt := range tests {
		_, err := damper.ParsePolicyYAML([]byte(tt.doc))
		var ce *damper.ConfigError
		if !errors.As(err, &ce) || ce.Path != tt.path || !strings.HasSuffix(err.Error(), tt.path+": repeated key") {
			t.Errorf("%q: error %v, want a *ConfigError for the repeated key %s", tt.doc, err, tt.path)
		}
	}
}

// TestPolicyFileUnmarshalFails: json.Unmarshal of a bad document leaves
// the Policy as it was.
func TestPolicyFileUnmarshalFails(t *testing.T) {
	p := damper.RecommendedPolicy()
	p.MaxAttempts, p.Breaker.OpenFor = 5, 3*time.Second
	before, _ := json.Marshal(p)
	breaker := p.Breaker
	err := json.Unmarshal([]byte(`{"max_attempts": 6, "breaker": {"open_for": "4s", "max_open_for": true}}`), &p)
	var ce *damper.ConfigError
	if !errors.As(err, &ce) || ce.Path != "breaker.max_open_for" {
		t.Fatalf("error %v, want a *ConfigError for breaker.max_open_for", err)
	}
	if after, _ := json.Marshal(p); string(after) != string(before) || p.Breaker != breaker || breaker.OpenFor != 3*time.Second {
		t.Fatalf("a failed decoding changed the policy: %s, was %s", after, before)
	}
}

// TestPolicyFileEmbedded: a larger configuration file, such as the
// proxy's, holds a Policy as one of its fields.
func TestPolicyFileEmbedded(t *testing.T) {
	type proxyConfig struct {
		Listen string        `json:"listen"`
		Policy damper.Policy `json:"policy"`
	}
	var pc proxyConfig
	doc := "listen: :8080\npolicy:\n  max_attempts: 2\n  retry_budget_min_tokens: 0\n  throttle: {}\n"
	if err := yaml.UnmarshalStrict([]byte(doc), &pc); err != nil {
		t.Fatal(err)
	}
	p := pc.Policy
	want := damper.Policy{MaxAttempts: 2, RetryBudgetMinTokens: damper.None, Throttle: &damper.ThrottlePolicy{}}
	if pc.Listen != ":8080" || !reflect.DeepEqual(p, want) {
		t.Fatalf("got %q, %+v; want :8080, %+v", pc.Listen, p, want)
	}

	err := yaml.UnmarshalStrict([]byte("listen: :8080\npolicy:\n  breaker: {window: 1}\n"), &pc)
	var ce *damper.ConfigError
	if !errors.As(err, &ce) || ce.Path != "breaker.window" {
		t.Fatalf("error %v, want a *ConfigError for breaker.window", err)
	}
}

func TestLoadPolicyFile(t *testing.T) {
	dir := t.TempDir()
	for name, doc := range map[string]string{"damper.yaml": exampleYAML, "damper.yml": exampleYAML, "damper.json": exampleJSON, "damper.conf": exampleYAML} {
		file := filepath.Join(dir, name)
		if err := os.WriteFile(file, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		p, err := damper.LoadPolicyFile(file)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !reflect.DeepEqual(p, examplePolicy()) {
			t.Fatalf("%s:\n got %+v\nwant %+v", name, p, examplePolicy())
		}
	}

	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("breaker:\n  open_for: 3x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := damper.LoadPolicyFile(bad)
	var ce *damper.ConfigError
	if !errors.As(err, &ce) || ce.File != bad || err.Error() != "damper: "+bad+`: breaker.open_for: "3x": time: unknown unit "x" in duration "3x"` {
		t.Errorf("error %v, want one naming the file and the key", err)
	}
	// A tab-indented JSON file is read as JSON.
	tabs := filepath.Join(dir, "tabs.json")
	if err := os.WriteFile(tabs, []byte("{\n\t\"max_attempts\": 2\n}"), 0o600); err != nil {
		t.Fatal(err)
	}
	if p, err := damper.LoadPolicyFile(tabs); err != nil || p.MaxAttempts != 2 {
		t.Errorf("tabs.json: %+v, %v", p, err)
	}
	if _, err := damper.LoadPolicyFile(filepath.Join(dir, "missing.yaml")); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Errorf("missing file: error %v", err)
	}
}

// TestPolicyFileDurations: a duration is a string with its unit, or the
// number 0.
func TestPolicyFileDurations(t *testing.T) {
	for in, want := range map[string]time.Duration{`"1m30s"`: 90 * time.Second, `0`: 0, `"0"`: 0, `"250ms"`: 250 * time.Millisecond} {
		p, err := damper.ParsePolicyJSON([]byte(`{"stream_idle_timeout": ` + in + `}`))
		if err != nil || p.StreamIdleTimeout != want {
			t.Errorf("%s: %v, %v; want %v", in, p.StreamIdleTimeout, err, want)
		}
	}
	for _, in := range []string{`30`, `"3x"`, `{}`} {
		if p, err := damper.ParsePolicyJSON([]byte(`{"stream_idle_timeout": ` + in + `}`)); err == nil {
			t.Errorf("%s: accepted as %v", in, p.StreamIdleTimeout)
		}
	}
	if js, _ := json.Marshal(damper.Policy{StreamIdleTimeout: 90 * time.Second}); string(js) != `{"stream_idle_timeout":"1m30s"}` {
		t.Errorf("Marshal = %s", js)
	}
}

// TestPolicyNone: None is accepted where documented and becomes 0 in the
// filled-in policy; elsewhere, and any other negative value, is an error.
func TestPolicyNone(t *testing.T) {
	d, err := damper.New(damper.Policy{RetryBudgetRatio: damper.None, RetryBudgetMinTokens: damper.None, BackoffBase: damper.None, MaxRetryAfter: damper.None})
	if err != nil {
		t.Fatal(err)
	}
	p := d.Policy()
	if p.RetryBudgetRatio != 0 || p.RetryBudgetMinTokens != 0 || p.BackoffBase != 0 || p.MaxRetryAfter != 0 || p.BackoffMax != defaults.BackoffMax {
		t.Errorf("filled in: %+v", p)
	}
	tests := []struct {
		p    damper.Policy
		want string
	}{
		{damper.Policy{RetryBudgetRatio: -2}, "RetryBudgetRatio = -2: must be a finite number, at least 0 (0 means the default, 0.1; None means 0)"},
		{damper.Policy{RetryBudgetRatio: -0.5}, "RetryBudgetRatio = -0.5"},
		{damper.Policy{RetryBudgetMinTokens: -2}, "RetryBudgetMinTokens = -2"},
		{damper.Policy{BackoffBase: -time.Second}, "BackoffBase = -1s"},
		{damper.Policy{MaxRetryAfter: -2}, "MaxRetryAfter = -2ns"},
		// Fields whose zero cannot be used take no None.
		{damper.Policy{MaxAttempts: damper.None}, "MaxAttempts = -1"},
		{damper.Policy{PerAttemptTimeout: damper.None}, "PerAttemptTimeout = -1ns"},
		{damper.Policy{MaxRetryCostUSD: damper.None}, "MaxRetryCostUSD = -1"},
		{damper.Policy{RetryBudgetWindow: damper.None}, "RetryBudgetWindow = -1ns"},
		{damper.Policy{BackoffMax: damper.None}, "BackoffMax = -1ns"},
		{damper.Policy{MaxHoldBack: damper.None}, "MaxHoldBack = -1"},
		{damper.Policy{MaxEventBytes: damper.None}, "MaxEventBytes = -1"},
		{damper.Policy{StreamIdleTimeout: damper.None}, "StreamIdleTimeout = -1ns"},
		{damper.Policy{Breaker: &damper.BreakerPolicy{FailureRatio: damper.None}}, "Breaker.FailureRatio = -1"},
		{damper.Policy{Throttle: &damper.ThrottlePolicy{TokenRatio: damper.None}}, "Throttle.TokenRatio = -1"},
		{damper.Policy{RateLimit: &damper.RateLimitPolicy{BatchShare: damper.None}}, "RateLimit.BatchShare = -1"},
	}
	for _, tt := range tests {
		if _, err := damper.New(tt.p); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("New(%+v) error = %v, want one naming %q", tt.p, err, tt.want)
		}
	}
}

// TestBudgetZero: a budget with no starting units and no growth refuses
// every retry; one with no growth grants exactly its starting units.
func TestBudgetZero(t *testing.T) {
	b := mustBudget(t, 0, time.Minute, 0)
	for range 100 {
		b.FirstAttemptSucceeded(t0)
	}
	if b.TryAcquire(t0) || b.Balance(t0) != 0 {
		t.Fatalf("a budget of ratio 0 and no starting units granted a retry (balance %v)", b.Balance(t0))
	}

	b = mustBudget(t, 0, time.Minute, 10)
	for window := range 3 {
		now := t0.Add(time.Duration(window) * time.Minute)
		granted := 0
		for range 50 {
			b.FirstAttemptSucceeded(now)
			if b.TryAcquire(now) {
				granted++
			}
		}
		if granted != 10 {
			t.Errorf("window %d granted %d retries, want 10", window, granted)
		}
	}

	// The same through a Policy, against a provider that always fails.
	for _, tt := range []struct {
		minTokens, attempts int
	}{{damper.None, 50}, {10, 60}} {
		r := newRig(t, damper.Policy{RetryBudgetRatio: damper.None, RetryBudgetMinTokens: tt.minTokens})
		r.srv.Script("", dampertest.Status(529))
		for range 50 {
			var rep damper.Report
			_, _ = r.client.Messages.New(context.Background(), params("claude-sonnet-4-6"), damper.ReportInto(&rep))
			if rep.Attempts > 1 && rep.Outcome != damper.OutcomeBudgetExhausted && rep.Outcome != damper.OutcomeAttemptsExhausted {
				t.Fatalf("outcome %s", rep.Outcome)
			}
		}
		if got := r.srv.Count(""); got != tt.attempts {
			t.Errorf("min tokens %d: provider attempts = %d, want %d", tt.minTokens, got, tt.attempts)
		}
	}
}

// TestBackoffAndRetryAfterNone: with BackoffBase None a retry waits only
// for a provider delay, with no spread; with MaxRetryAfter None a call
// given a delay fails at once.
func TestBackoffAndRetryAfterNone(t *testing.T) {
	r := newRig(t, damper.Policy{BackoffBase: damper.None})
	r.srv.Script("", dampertest.Status(529), dampertest.Status(429).RetryAfter("2"), dampertest.OK())
	var rep damper.Report
	if _, err := r.client.Messages.New(context.Background(), params("claude-sonnet-4-6"), damper.ReportInto(&rep)); err != nil {
		t.Fatal(err)
	}
	if len(rep.AttemptLog) != 3 || rep.AttemptLog[0].Backoff != 0 || rep.AttemptLog[1].Backoff != 2*time.Second {
		t.Fatalf("attempts %+v; want backoffs 0 and exactly 2s", rep.AttemptLog)
	}

	r = newRig(t, damper.Policy{MaxRetryAfter: damper.None})
	r.srv.Script("", dampertest.Status(429).RetryAfter("1"), dampertest.OK())
	rep = damper.Report{}
	_, err := r.client.Messages.New(context.Background(), params("claude-sonnet-4-6"), damper.ReportInto(&rep))
	if !errors.Is(err, damper.ErrRetryAfterTooLong) || rep.Attempts != 1 {
		t.Fatalf("error %v after %d attempts; want ErrRetryAfterTooLong after 1", err, rep.Attempts)
	}
	// A failure with no delay is still retried, after the backoff.
	r.srv.Script("", dampertest.Status(529), dampertest.OK())
	rep = damper.Report{}
	if _, err := r.client.Messages.New(context.Background(), params("claude-sonnet-4-6"), damper.ReportInto(&rep)); err != nil || rep.Attempts != 2 {
		t.Fatalf("error %v after %d attempts; want success after 2", err, rep.Attempts)
	}
}

func ExampleParsePolicyYAML() {
	p, err := damper.ParsePolicyYAML([]byte(`
max_attempts: 4
retry_budget_ratio: 0   # explicitly zero: each window has its 10 starting units, no more
breaker:
  open_for: 2s
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	d, err := damper.New(p)
	if err != nil {
		fmt.Println(err)
		return
	}
	got := d.Policy()
	fmt.Println(got.MaxAttempts, got.RetryBudgetRatio, got.RetryBudgetMinTokens, got.Breaker.OpenFor, got.Breaker.MaxOpenFor)

	_, err = damper.ParsePolicyYAML([]byte("breaker: {open_for: 3x}"))
	fmt.Println(err)
	// Output:
	// 4 0 10 2s 5m0s
	// damper: policy config: breaker.open_for: "3x": time: unknown unit "x" in duration "3x"
}

// FuzzParsePolicy: the parsers never panic, fail only with a ConfigError,
// and a document they accept is a valid Policy that survives the round
// trip through JSON and YAML.
func FuzzParsePolicy(f *testing.F) {
	f.Add([]byte(exampleYAML))
	f.Add([]byte(exampleJSON))
	f.Add([]byte(`{"breaker": {"open_for": "3x"}}`))
	f.Add([]byte(`{"rate_limit": {"limits": {"claude-sonnet-4": {"requests_per_minute": -5}}}}`))
	f.Add([]byte("retry_budget_ratio: 0\nbackoff_base: 0\nmax_retry_after: 0s\nretry_budget_min_tokens: 0\n"))
	f.Add([]byte("max_attempts: 1\nmax_attempts: 2\n"))
	f.Add([]byte("rate_limit: {limits: {'': {}}}"))
	for _, p := range roundTripPolicies() {
		js, _ := json.Marshal(p)
		f.Add(js)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for name, parse := range map[string]func([]byte) (damper.Policy, error){"json": damper.ParsePolicyJSON, "yaml": damper.ParsePolicyYAML} {
			p, err := parse(data)
			if err != nil {
				var ce *damper.ConfigError
				if !errors.As(err, &ce) {
					t.Fatalf("%s: error %v is not a *ConfigError", name, err)
				}
				continue
			}
			if _, err := damper.New(p); err != nil {
				t.Fatalf("%s: accepted %+v, which New rejects: %v", name, p, err)
			}
			js, err := json.Marshal(p)
			if err != nil {
				t.Fatal(err)
			}
			if got, err := damper.ParsePolicyJSON(js); err != nil || !reflect.DeepEqual(got, p) {
				t.Fatalf("%s: through JSON %s: %+v, %v; want %+v", name, js, got, err, p)
			}
			ys, err := yaml.Marshal(p)
			if err != nil {
				t.Fatal(err)
			}
			if got, err := damper.ParsePolicyYAML(ys); err != nil || !reflect.DeepEqual(got, p) {
				t.Fatalf("%s: through YAML\n%s: %+v, %v; want %+v", name, ys, got, err, p)
			}
		}
	})
}
