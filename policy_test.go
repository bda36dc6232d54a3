package damper_test

import (
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/damper-ai/damper-go"
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
		MaxHoldBack: damper.DefaultMaxHoldBack, MaxEventBytes: damper.DefaultMaxEventBytes,
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
		{damper.Policy{OnBudgetExhausted: 7}, "OnBudgetExhausted = 7"},
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
	if !reflect.DeepEqual(wantB, damper.BreakerPolicy{FailureRatio: damper.DefaultBreakerFailureRatio, MinAttempts: damper.DefaultBreakerMinAttempts,
		Window: damper.DefaultBreakerWindow, OpenFor: damper.DefaultBreakerOpenFor, MaxOpenFor: damper.DefaultBreakerMaxOpenFor}) ||
		wantT != (damper.ThrottlePolicy{MaxTokens: damper.DefaultThrottleMaxTokens, TokenRatio: damper.DefaultThrottleTokenRatio}) {
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
