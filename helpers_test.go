package damper_test

import (
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// half is a random source fixed at the middle of [0, 1), so that every
// jittered wait is exactly half of its range.
func half() float64 { return 0.5 }

// rig is a Damper on a virtual clock in front of a fake API.
type rig struct {
	clock  *dampertest.Clock
	srv    *dampertest.Server
	d      *damper.Damper
	client anthropic.Client
}

func newRig(t *testing.T, p damper.Policy, settings ...damper.Setting) *rig {
	t.Helper()
	// The clock starts at the next whole minute, so that a test's virtual
	// time falls in one budget window, and in the future, so that deadlines
	// taken from it have not passed in real time.
	clk := dampertest.NewClock(time.Now().Truncate(time.Minute).Add(time.Minute))
	srv := dampertest.NewServer(dampertest.WithClock(clk))
	t.Cleanup(srv.Close)
	d, err := damper.New(p, append([]damper.Setting{damper.WithClock(clk), damper.WithRand(half)}, settings...)...)
	if err != nil {
		t.Fatal(err)
	}
	opts := append([]option.RequestOption{d.Option()}, srv.Options()...)
	return &rig{clock: clk, srv: srv, d: d, client: anthropic.NewClient(opts...)}
}

func params(model string) anthropic.MessageNewParams {
	return anthropic.MessageNewParams{
		Model:     anthropic.Model(model),
		MaxTokens: 1024,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Explain retry storms"))},
	}
}

// mustBudget returns a window budget with valid arguments.
func mustBudget(tb testing.TB, ratio float64, window time.Duration, minTokens int) *damper.WindowBudget {
	tb.Helper()
	b, err := damper.NewWindowBudget(ratio, window, minTokens)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}
