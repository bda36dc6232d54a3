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
		MaxHoldBack: damper.DefaultMaxHoldBack,
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
		{damper.Policy{BackoffBase: -1}, "BackoffBase = -1ns"},
		{damper.Policy{BackoffMax: -1}, "BackoffMax = -1ns"},
		{damper.Policy{BackoffBase: time.Minute}, "BackoffBase = 1m0s: must not exceed BackoffMax (30s)"},
		{damper.Policy{MaxRetryAfter: -1}, "MaxRetryAfter = -1ns"},
		{damper.Policy{OnBudgetExhausted: 7}, "OnBudgetExhausted = 7"},
	}
	for _, tt := range tests {
		_, err := damper.New(tt.p)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("New(%+v) error = %v, want one naming %q", tt.p, err, tt.want)
		}
	}
}
