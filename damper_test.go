package damper_test

import (
	"strings"
	"testing"

	"github.com/damper-ai/damper-go"
)

func TestSettingsRejectNil(t *testing.T) {
	for name, s := range map[string]damper.Setting{
		"WithClock":  damper.WithClock(nil),
		"WithRand":   damper.WithRand(nil),
		"WithBudget": damper.WithBudget(nil),
	} {
		if _, err := damper.New(damper.Policy{}, s); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s(nil): error = %v", name, err)
		}
	}
}
