package damper_test

import (
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/internal/conf"
)

func TestPolicyDefaults(t *testing.T) {
	d, err := damper.New(damper.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	p := d.Policy()
	want := damper.Policy{
		MaxAttempts: 3, PerAttemptTimeout: time.Minute, RetryBudgetRatio: 0.1,
		RetryBudgetWindow: time.Minute, RetryBudgetMinTokens: 10, BackoffBase: time.Second,
		BackoffMax: 30 * time.Second, MaxRetryAfter: time.Minute, PriceTable: damper.DefaultPriceTable(),
		MaxHoldBack: defaults.MaxHoldBack, MaxEventBytes: defaults.MaxEventBytes,
	}
	if !reflect.DeepEqual(p, want) {
		t.Errorf("defaults = %+v\nwant %+v", p, want)
	}
}

func TestPolicyValidation(t *testing.T) {
	tests := []struct {
		p    damper.Policy
		want string // the field and the value the error must name
	}{
		{damper.Policy{MaxAttempts: -1}, "MaxAttempts = -1"},
		{damper.Policy{PerAttemptTimeout: -time.Second}, "PerAttemptTimeout = -1s"},
		{damper.Policy{MaxRetryCostUSD: math.NaN()}, "MaxRetryCostUSD = NaN"},
		{damper.Policy{MaxRetryCostUSD: math.Inf(1)}, "MaxRetryCostUSD = +Inf"},
		{damper.Policy{MaxRetryCostUSD: -0.01}, "MaxRetryCostUSD = -0.01"},
		{damper.Policy{RetryBudgetRatio: -0.1}, "RetryBudgetRatio = -0.1"},
		{damper.Policy{RetryBudgetRatio: math.NaN()}, "RetryBudgetRatio = NaN"},
		{damper.Policy{RetryBudgetWindow: -time.Minute}, "RetryBudgetWindow = -1m0s"},
		{damper.Policy{RetryBudgetMinTokens: -3}, "RetryBudgetMinTokens = -3"},
		{damper.Policy{BackoffBase: -2}, "BackoffBase = -2ns"},
		{damper.Policy{BackoffMax: -1}, "BackoffMax = -1ns"},
		{damper.Policy{BackoffBase: time.Minute}, "BackoffBase = 1m0s: must not exceed BackoffMax (30s)"},
		{damper.Policy{MaxRetryAfter: -2}, "MaxRetryAfter = -2ns"},
		{damper.Policy{OnBudgetExhausted: 7}, "OnBudgetExhausted = 7: must be unset or PassthroughBudgetExhausted"},
	}
	for _, tt := range tests {
		_, err := damper.New(tt.p)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("New(%+v) error = %v, want one naming %q", tt.p, err, tt.want)
		}
	}
}

func TestPolicyBreakerThrottleValidation(t *testing.T) {
	tests := []struct {
		p    damper.Policy
		want string // the field and the value the error must name
	}{
		{damper.Policy{Breaker: &damper.BreakerPolicy{FailureRatio: -0.1}}, "Policy.Breaker.FailureRatio = -0.1"},
		{damper.Policy{Breaker: &damper.BreakerPolicy{FailureRatio: 1.5}}, "Policy.Breaker.FailureRatio = 1.5"},
		{damper.Policy{Breaker: &damper.BreakerPolicy{FailureRatio: math.NaN()}}, "Policy.Breaker.FailureRatio = NaN"},
		{damper.Policy{Breaker: &damper.BreakerPolicy{FailureRatio: math.Inf(1)}}, "Policy.Breaker.FailureRatio = +Inf"},
		{damper.Policy{Breaker: &damper.BreakerPolicy{MinAttempts: -1}}, "Policy.Breaker.MinAttempts = -1"},
		{damper.Policy{Breaker: &damper.BreakerPolicy{Window: -time.Second}}, "Policy.Breaker.Window = -1s"},
		{damper.Policy{Breaker: &damper.BreakerPolicy{Window: 10}}, "Policy.Breaker.Window = 10ns: must be at least 30ns"},
		{damper.Policy{Breaker: &damper.BreakerPolicy{OpenFor: -time.Second}}, "Policy.Breaker.OpenFor = -1s"},
		{damper.Policy{Breaker: &damper.BreakerPolicy{MaxOpenFor: -time.Second}}, "Policy.Breaker.MaxOpenFor = -1s"},
		{damper.Policy{Breaker: &damper.BreakerPolicy{MaxOpenFor: 10 * time.Second}}, "Policy.Breaker.MaxOpenFor = 10s: must not be shorter than OpenFor (30s)"},
		{damper.Policy{Breaker: &damper.BreakerPolicy{OpenFor: 10 * time.Minute}}, "Policy.Breaker.MaxOpenFor = 5m0s: must not be shorter than OpenFor (10m0s)"},
		{damper.Policy{Throttle: &damper.ThrottlePolicy{MaxTokens: -1}}, "Policy.Throttle.MaxTokens = -1"},
		{damper.Policy{Throttle: &damper.ThrottlePolicy{MaxTokens: 1001}}, "Policy.Throttle.MaxTokens = 1001"},
		{damper.Policy{Throttle: &damper.ThrottlePolicy{TokenRatio: -0.2}}, "Policy.Throttle.TokenRatio = -0.2"},
		{damper.Policy{Throttle: &damper.ThrottlePolicy{TokenRatio: 1.5}}, "Policy.Throttle.TokenRatio = 1.5"},
		{damper.Policy{Throttle: &damper.ThrottlePolicy{TokenRatio: math.NaN()}}, "Policy.Throttle.TokenRatio = NaN"},
		{damper.Policy{Throttle: &damper.ThrottlePolicy{TokenRatio: 0.0004}}, "Policy.Throttle.TokenRatio = 0.0004: must be at least 0.001"},
		// The first bad field is named, the Breaker's before the Throttle's.
		{damper.Policy{Breaker: &damper.BreakerPolicy{MinAttempts: -2}, Throttle: &damper.ThrottlePolicy{MaxTokens: -3}}, "Policy.Breaker.MinAttempts = -2"},
	}
	for _, tt := range tests {
		d, err := damper.New(tt.p)
		if err == nil || d != nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("New(%+v) error = %v, want one naming %q", tt.p, err, tt.want)
		}
	}
	// The extremes that are allowed.
	for _, p := range []damper.Policy{
		{Breaker: &damper.BreakerPolicy{FailureRatio: 1, MinAttempts: 1, Window: 30, OpenFor: 1, MaxOpenFor: 1}},
		{Breaker: &damper.BreakerPolicy{OpenFor: time.Minute, MaxOpenFor: time.Minute}},
		{Throttle: &damper.ThrottlePolicy{MaxTokens: 1000, TokenRatio: 1}},
		{Throttle: &damper.ThrottlePolicy{MaxTokens: 1, TokenRatio: 0.001}},
	} {
		if _, err := damper.New(p); err != nil {
			t.Errorf("New(%+v): %v", p, err)
		}
	}
}

func TestPolicyBreakerThrottleDefaults(t *testing.T) {
	bp := &damper.BreakerPolicy{MinAttempts: 4}
	tp := &damper.ThrottlePolicy{MaxTokens: 20}
	d, err := damper.New(damper.Policy{Breaker: bp, Throttle: tp})
	if err != nil {
		t.Fatal(err)
	}
	p := d.Policy()
	wantB := damper.BreakerPolicy{FailureRatio: 0.5, MinAttempts: 4, Window: 30 * time.Second, OpenFor: 30 * time.Second, MaxOpenFor: 300 * time.Second}
	wantT := damper.ThrottlePolicy{MaxTokens: 20, TokenRatio: 0.2}
	if p.Breaker == nil || !reflect.DeepEqual(*p.Breaker, wantB) || p.Throttle == nil || *p.Throttle != wantT {
		t.Fatalf("Breaker %+v, Throttle %+v; want %+v, %+v", p.Breaker, p.Throttle, wantB, wantT)
	}
	// New copies the caller's policies, and fills in its copies only.
	if !reflect.DeepEqual(*bp, damper.BreakerPolicy{MinAttempts: 4}) || *tp != (damper.ThrottlePolicy{MaxTokens: 20}) || p.Breaker == bp || p.Throttle == tp {
		t.Fatalf("the caller's policies changed: %+v, %+v", *bp, *tp)
	}
	bp.MinAttempts, tp.MaxTokens = 99, 99
	p.Breaker.MinAttempts, p.Throttle.MaxTokens = 98, 98 // the copy Policy returned
	if p := d.Policy(); p.Breaker.MinAttempts != 4 || p.Throttle.MaxTokens != 20 {
		t.Fatalf("a change after New reached the Damper: %+v, %+v", p.Breaker, p.Throttle)
	}

	// The zero policies are the defaults.
	d, err = damper.New(damper.Policy{Breaker: &damper.BreakerPolicy{}, Throttle: &damper.ThrottlePolicy{}})
	if err != nil {
		t.Fatal(err)
	}
	wantB.MinAttempts = 20
	wantT.MaxTokens = 10
	if p := d.Policy(); !reflect.DeepEqual(*p.Breaker, wantB) || *p.Throttle != wantT {
		t.Fatalf("Breaker %+v, Throttle %+v; want %+v, %+v", p.Breaker, p.Throttle, wantB, wantT)
	}
	if !reflect.DeepEqual(wantB, damper.BreakerPolicy{FailureRatio: defaults.Breaker.FailureRatio, MinAttempts: defaults.Breaker.MinAttempts,
		Window: defaults.Breaker.Window, OpenFor: defaults.Breaker.OpenFor, MaxOpenFor: defaults.Breaker.MaxOpenFor}) ||
		wantT != (damper.ThrottlePolicy{MaxTokens: defaults.Throttle.MaxTokens, TokenRatio: defaults.Throttle.TokenRatio}) {
		t.Error("the Default constants disagree with the documented defaults")
	}

	// RecommendedPolicy has both, with their defaults but for the
	// breaker's shorter open periods; the zero Policy has neither.
	rec := damper.RecommendedPolicy()
	if rec.Breaker == nil || rec.Throttle == nil || *rec.Throttle != (damper.ThrottlePolicy{}) {
		t.Fatalf("RecommendedPolicy() = %+v, want a breaker and a throttle", rec)
	}
	d, err = damper.New(rec)
	if err != nil {
		t.Fatal(err)
	}
	wantB.OpenFor, wantB.MaxOpenFor = 2*time.Second, 10*time.Second
	if p := d.Policy(); !reflect.DeepEqual(*p.Breaker, wantB) || *p.Throttle != wantT {
		t.Fatalf("recommended: Breaker %+v, Throttle %+v; want %+v, %+v", p.Breaker, p.Throttle, wantB, wantT)
	}
	if rec2 := damper.RecommendedPolicy(); rec2.Breaker == rec.Breaker || rec2.Throttle == rec.Throttle {
		t.Error("RecommendedPolicy() shares its policies between calls")
	}
	d, err = damper.New(damper.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	if p := d.Policy(); p.Breaker != nil || p.Throttle != nil {
		t.Fatalf("zero Policy: Breaker %+v, Throttle %+v; want neither", p.Breaker, p.Throttle)
	}
}

// TestPolicyBounds: every sized field has an upper bound, and a value past
// it is an error naming the field and the value, never a Damper whose
// first call panics or allocates without limit.
func TestPolicyBounds(t *testing.T) {
	const day = 24 * time.Hour
	tests := []struct {
		p    damper.Policy
		want string
	}{
		{damper.Policy{MaxAttempts: 101}, "Policy.MaxAttempts = 101: must be at most 100"},
		{damper.Policy{PerAttemptTimeout: day + 1}, "Policy.PerAttemptTimeout = 24h0m0.000000001s: must be at most 24h0m0s"},
		{damper.Policy{MaxRetryCostUSD: 1e6 + 1}, "Policy.MaxRetryCostUSD = 1.000001e+06: must be at most 1e+06"},
		{damper.Policy{RetryBudgetRatio: 1000.5}, "Policy.RetryBudgetRatio = 1000.5: must be at most 1000"},
		{damper.Policy{RetryBudgetWindow: day + time.Second}, "Policy.RetryBudgetWindow = 24h0m1s: must be at most 24h0m0s"},
		{damper.Policy{RetryBudgetMinTokens: 1_000_001}, "Policy.RetryBudgetMinTokens = 1000001: must be at most 1000000"},
		{damper.Policy{BackoffBase: 2 * day, BackoffMax: 3 * day}, "Policy.BackoffBase = 48h0m0s: must be at most 24h0m0s"},
		{damper.Policy{BackoffMax: 3 * day}, "Policy.BackoffMax = 72h0m0s: must be at most 24h0m0s"},
		{damper.Policy{MaxRetryAfter: math.MaxInt64}, "Policy.MaxRetryAfter = 2562047h47m16.854775807s: must be at most 24h0m0s"},
		{damper.Policy{MaxHoldBack: 64<<20 + 1}, "Policy.MaxHoldBack = 67108865: must be at most 67108864"},
		{damper.Policy{MaxEventBytes: math.MaxInt}, "Policy.MaxEventBytes = 9223372036854775807: must be at most 33554432"},
		{damper.Policy{MaxEventBytes: 32<<20 + 1}, "Policy.MaxEventBytes = 33554433: must be at most 33554432"},
		{damper.Policy{Hedge: &damper.HedgePolicy{MinSamples: 10_001}}, "Policy.Hedge.MinSamples = 10001: must be at most 10000"},
		{damper.Policy{StreamIdleTimeout: day + 1}, "Policy.StreamIdleTimeout = 24h0m0.000000001s: must be at most 24h0m0s"},
		{damper.Policy{Breaker: &damper.BreakerPolicy{MinAttempts: 1_000_001}}, "Policy.Breaker.MinAttempts = 1000001: must be at most 1000000"},
		{damper.Policy{Breaker: &damper.BreakerPolicy{Window: day + 1}}, "Policy.Breaker.Window = 24h0m0.000000001s: must be at most 24h0m0s"},
		{damper.Policy{Breaker: &damper.BreakerPolicy{OpenFor: math.MaxInt64, MaxOpenFor: math.MaxInt64}}, "Policy.Breaker.OpenFor = 2562047h47m16.854775807s: must be at most 24h0m0s"},
		{damper.Policy{Breaker: &damper.BreakerPolicy{MaxOpenFor: day + 1}}, "Policy.Breaker.MaxOpenFor = 24h0m0.000000001s: must be at most 24h0m0s"},
		{damper.Policy{Hedge: &damper.HedgePolicy{Delay: day + 1}}, "Policy.Hedge.Delay = 24h0m0.000000001s: must be at most 24h0m0s"},
		{damper.Policy{Hedge: &damper.HedgePolicy{MinDelay: day + 1}}, "Policy.Hedge.MinDelay = 24h0m0.000000001s: must be at most 24h0m0s"},
		{damper.Policy{Hedge: &damper.HedgePolicy{Window: 1e18}}, "Policy.Hedge.Window = 1000000000000000000: must be at most 10000"},
		{damper.Policy{Hedge: &damper.HedgePolicy{Window: 10_001, MinSamples: 20}}, "Policy.Hedge.Window = 10001: must be at most 10000"},
		{damper.Policy{RateLimit: &damper.RateLimitPolicy{MaxWait: day + 1}}, "Policy.RateLimit.MaxWait = 24h0m0.000000001s: must be at most 24h0m0s"},
		{damper.Policy{RateLimit: &damper.RateLimitPolicy{Limits: map[string]damper.RateLimits{"claude-sonnet-4": {RequestsPerMinute: 1e9 + 1}}}},
			`Policy.RateLimit.Limits["claude-sonnet-4"].RequestsPerMinute = 1000000001: must be at most 1000000000`},
		{damper.Policy{RateLimit: &damper.RateLimitPolicy{Limits: map[string]damper.RateLimits{"claude-sonnet-4": {InputTokensPerMinute: math.MaxInt}}}},
			`Policy.RateLimit.Limits["claude-sonnet-4"].InputTokensPerMinute = 9223372036854775807: must be at most 1000000000`},
		{damper.Policy{RateLimit: &damper.RateLimitPolicy{Limits: map[string]damper.RateLimits{"claude-sonnet-4": {OutputTokensPerMinute: 1e9 + 1}}}},
			`Policy.RateLimit.Limits["claude-sonnet-4"].OutputTokensPerMinute = 1000000001: must be at most 1000000000`},
		{damper.Policy{Fallback: &damper.FallbackPolicy{Models: map[string][]string{"claude-a": siblings(17)}}},
			`Policy.Fallback.Models["claude-a"] = 17 siblings: must be at most 16`},
		{damper.Policy{Fallback: &damper.FallbackPolicy{Models: models(1001, []string{"claude-b"})}},
			`Policy.Fallback.Models = 1001 models: must be at most 1000`},
		{damper.Policy{Fallback: &damper.FallbackPolicy{Models: map[string][]string{strings.Repeat("m", 257): {"claude-b"}}}},
			`Policy.Fallback.Models = "` + strings.Repeat("m", 64) + `"...: a model name is at most 256 bytes of UTF-8`},
		{damper.Policy{Fallback: &damper.FallbackPolicy{Models: map[string][]string{"claude-a": {"bad\xff"}}}},
			`Policy.Fallback.Models["claude-a"] = "bad\xff": a model name is at most 256 bytes of UTF-8`},
		{damper.Policy{RateLimit: &damper.RateLimitPolicy{Limits: limits(257)}},
			`Policy.RateLimit.Limits = 257 groups: must be at most 256`},
	}
	for _, tt := range tests {
		d, err := damper.New(tt.p)
		if err == nil || d != nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("error = %v, want one naming %q", err, tt.want)
		}
	}
	// The bounds themselves are allowed.
	for _, p := range []damper.Policy{
		{MaxAttempts: 100, PerAttemptTimeout: day, MaxRetryCostUSD: 1e6, RetryBudgetRatio: 1000, RetryBudgetWindow: day,
			RetryBudgetMinTokens: 1_000_000, BackoffBase: day, BackoffMax: day, MaxRetryAfter: day, MaxHoldBack: 64 << 20, MaxEventBytes: 32 << 20, StreamIdleTimeout: day,
			Breaker:   &damper.BreakerPolicy{MinAttempts: 1_000_000, Window: day, OpenFor: day, MaxOpenFor: day},
			Throttle:  &damper.ThrottlePolicy{MaxTokens: 1000},
			Hedge:     &damper.HedgePolicy{MinDelay: day, Window: 10_000, MinSamples: 10_000},
			RateLimit: &damper.RateLimitPolicy{MaxWait: day, Limits: map[string]damper.RateLimits{"claude-sonnet-4": {RequestsPerMinute: 1e9, InputTokensPerMinute: 1e9, OutputTokensPerMinute: 1e9}}},
			Fallback:  &damper.FallbackPolicy{Models: map[string][]string{"claude-a": siblings(16)}}},
		{RateLimit: &damper.RateLimitPolicy{Limits: limits(256)}, Fallback: &damper.FallbackPolicy{Models: models(1000, []string{"claude-b"})}},
		{Hedge: &damper.HedgePolicy{Delay: day}},
	} {
		if _, err := damper.New(p); err != nil {
			t.Errorf("New(%+v): %v", p, err)
		}
	}
}

// models returns n distinct models, each with the siblings given.
func models(n int, sib []string) map[string][]string {
	m := make(map[string][]string, n)
	for i := range n {
		m[fmt.Sprintf("claude-m%d", i)] = sib
	}
	return m
}

// limits returns n distinct limit groups, each limited.
func limits(n int) map[string]damper.RateLimits {
	m := make(map[string]damper.RateLimits, n)
	for i := range n {
		m[fmt.Sprintf("claude-g%d", i)] = damper.RateLimits{RequestsPerMinute: 10}
	}
	return m
}

// siblings returns n distinct model names.
func siblings(n int) []string {
	s := make([]string, n)
	for i := range s {
		s[i] = "claude-sibling-" + strconv.Itoa(i)
	}
	return s
}

// defaults is the zero Policy, with every part, as New fills it in: each
// field's default as its declaration's tag gives it.
var defaults = func() damper.Policy {
	d, err := damper.New(damper.Policy{Breaker: &damper.BreakerPolicy{}, Throttle: &damper.ThrottlePolicy{},
		RateLimit: &damper.RateLimitPolicy{}, Hedge: &damper.HedgePolicy{}, Fallback: &damper.FallbackPolicy{}})
	if err != nil {
		panic(err)
	}
	return d.Policy()
}()

// TestPolicyTags: every field of Policy, of its parts and of ProxyConfig
// is declared by its tags (a key, or "-" for code), each default parses
// and lies inside its bounds, and the file format and the struct agree:
// a Policy with every field a file holds set to another value than its
// default, written and read back, is the same, and New takes it.
func TestPolicyTags(t *testing.T) {
	for _, v := range []any{damper.Policy{}, damper.ProxyConfig{}} {
		if err := conf.Check(reflect.TypeOf(v)); err != nil {
			t.Errorf("%T: %v", v, err)
		}
	}
	for _, none := range []bool{false, true} {
		var p damper.Policy
		if err := conf.Sample(&p, none); err != nil {
			t.Fatal(err)
		}
		if p.Breaker == nil || p.RateLimit == nil || len(p.RateLimit.Limits) != 1 || p.Fallback == nil || len(p.Fallback.Models) != 1 ||
			p.MaxAttempts == defaults.MaxAttempts || p.Hedge.Quantile == defaults.Hedge.Quantile || !p.IgnoreRetryAfter {
			t.Fatalf("sample %+v: a field is left at its default", p)
		}
		if none && (p.RetryBudgetRatio != damper.None || p.MaxRetryAfter != damper.None || p.RateLimit.MaxWait != damper.None) {
			t.Fatalf("sample %+v: None is not set", p)
		}
		if _, err := damper.New(p); err != nil {
			t.Fatalf("New(sample): %v", err)
		}
		js, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := damper.ParsePolicyJSON(js); err != nil || !reflect.DeepEqual(got, p) {
			t.Fatalf("through JSON %s:\n got %+v, %v\nwant %+v", js, got, err, p)
		}
		ys, err := yaml.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := damper.ParsePolicyYAML(ys); err != nil || !reflect.DeepEqual(got, p) {
			t.Fatalf("through YAML\n%s\n got %+v, %v\nwant %+v", ys, got, err, p)
		}
		// Every field a file holds is written: as many keys as tags.
		var doc map[string]any
		if err := json.Unmarshal(js, &doc); err != nil {
			t.Fatal(err)
		}
		if n, want := countKeys(doc), countTags(reflect.TypeFor[damper.Policy]()); n != want {
			t.Errorf("%d keys written, %d fields with a key: %s", n, want, js)
		}
	}
}

// countKeys counts the keys of a document, nested objects' included, a
// map's entries counted once (as one entry's keys).
func countKeys(doc map[string]any) int {
	n := 0
	for k, v := range doc {
		n++
		if m, ok := v.(map[string]any); ok {
			if k == "limits" || k == "models" {
				for _, e := range m {
					if em, ok := e.(map[string]any); ok {
						n += countKeys(em)
					}
					break
				}
				continue
			}
			n += countKeys(m)
		}
	}
	return n
}

// countTags counts the fields of t, and of the structs it holds, that a
// file holds.
func countTags(t reflect.Type) int {
	n := 0
	for f := range t.Fields() {
		key := f.Tag.Get("key")
		if key == "-" || !f.IsExported() {
			continue
		}
		n++
		switch ft := f.Type; {
		case ft.Kind() == reflect.Pointer && ft.Elem().Kind() == reflect.Struct:
			n += countTags(ft.Elem())
		case ft.Kind() == reflect.Map && ft.Elem().Kind() == reflect.Struct:
			n += countTags(ft.Elem())
		}
	}
	return n
}

// TestPolicyFileZeroRules: what a 0 written in a file means follows from a
// field's tags alone: None where the field takes it, zero where it has no
// default, an error elsewhere; -1 is never None in a file.
func TestPolicyFileZeroRules(t *testing.T) {
	for _, tt := range []struct {
		doc  string
		want damper.Policy
		err  string
	}{
		{doc: `{"rate_limit": {"max_wait": 0}}`, want: damper.Policy{RateLimit: &damper.RateLimitPolicy{MaxWait: damper.None}}},
		{doc: `{"hedge": {"delay": "0s", "min_delay": 0}}`, want: damper.Policy{Hedge: &damper.HedgePolicy{}}},
		{doc: `{"hedge": {"window": 0}}`, err: `hedge.window: 0: must be at least 1 (leave the key out for the default, 200)`},
		{doc: `{"rate_limit": {"max_wait": "-1ns"}}`, err: `rate_limit.max_wait: "-1ns": must be positive (leave the key out for the default, 30s)`},
		{doc: `{"max_event_bytes": 0}`, err: `max_event_bytes: 0: must be a positive number of bytes (leave the key out for the default, 16777216)`},
	} {
		p, err := damper.ParsePolicyJSON([]byte(tt.doc))
		switch {
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("%s: error %v, want %q", tt.doc, err, tt.err)
		case tt.err == "" && (err != nil || !reflect.DeepEqual(p, tt.want)):
			t.Errorf("%s: %+v, %v; want %+v", tt.doc, p, err, tt.want)
		}
	}
}

// TestTenantPriorityDefault: a tenant's priority "policy" in a file is the
// zero value, which has no Go name of its own, and an error for a value
// past the enum names the values a Go user can write.
func TestTenantPriorityDefault(t *testing.T) {
	hash := damper.ClientKeyHash("x")
	for file, want := range map[string]damper.TenantPriority{"policy": 0, "interactive": damper.TenantInteractive, "batch": damper.TenantBatch} {
		var tn damper.Tenant
		if err := conf.DecodeYAML([]byte("name: a\nkey_sha256: ['"+hash+"']\npriority: "+file+"\n"), &tn); err != nil || tn.Priority != want {
			t.Errorf("priority: %s: %v, %v; want %v", file, tn.Priority, err, want)
		}
	}
	tn := damper.Tenant{Name: "a", KeySHA256: []string{hash}, Priority: 7}
	if err := conf.Fill(&tn); err == nil || err.Error() != "Priority = 7: must be unset, TenantInteractive or TenantBatch" {
		t.Errorf("Priority 7: %v", err)
	}
}
