package brownout

import (
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

// fallbackSuite is the fallback scenario with 2 replicas, whose figures
// that matter are per replica or shares, so that the run stays short
// under -race; the command runs the published 10.
var fallbackSuite = sync.OnceValues(func() (*FallbackSuite, error) {
	return RunFallback(FallbackScenario(2), FallbackContenders())
})

func TestFallbackTargets(t *testing.T) {
	s, err := fallbackSuite()
	if err != nil {
		t.Fatal(err)
	}
	checks := s.Checks()
	if len(checks) != 5 {
		t.Fatalf("got %d fallback checks, want 5", len(checks))
	}
	for _, c := range checks {
		if !c.Pass {
			t.Errorf("target missed: %s (%s)", c.Target, c.Detail)
		}
	}
	f := s.figures()
	// Without a backend, a contender only ever reaches the primary, and
	// answers next to nothing of the outage.
	for _, name := range []string{sdkName, recommendedName} {
		x := f[name]
		if x.SecondaryAttempts != 0 || x.BySecondary != 0 || x.SuccessShare > 0.05 {
			t.Errorf("%s: %d attempts at the secondary, %d answered by it, %.3f of the outage answered; want none, none, under 0.05", name, x.SecondaryAttempts, x.BySecondary, x.SuccessShare)
		}
	}
	// The SDK's loop makes its 3 attempts at the primary; the breakers
	// send most requests of the outage straight on.
	c, sdk := f[fallbackName], f[sdkName]
	if sdk.PrimaryAttempts < 2*sdk.Requests || c.PrimaryAttempts*10 > sdk.PrimaryAttempts {
		t.Errorf("primary attempts during the outage: %s %d for %d requests, %s %d; want above 2 a request, and a tenth of that at most",
			sdkName, sdk.PrimaryAttempts, sdk.Requests, fallbackName, c.PrimaryAttempts)
	}
	if c.Skipped < c.Requests*3/4 || c.Moves["circuit_open"] < c.Skipped {
		t.Errorf("%s: %d of %d requests of the outage sent straight on, %d moves on circuit_open; want three quarters at least, each a circuit_open move",
			fallbackName, c.Skipped, c.Requests, c.Moves["circuit_open"])
	}
	// Damper's reports and the providers agree: a request that succeeded
	// after a move was answered by the secondary, and one answered by the
	// secondary had moved.
	for _, name := range []string{fallbackName, fallbackNoBreakerName} {
		r, _ := s.result(name)
		for i, q := range r.Requests {
			if q.OK && (q.Moved != "") != q.BySecondary {
				t.Fatalf("%s, request %d: moved %q but answered by the secondary %v", name, i, q.Moved, q.BySecondary)
			}
		}
	}

	md := s.Markdown()
	for _, want := range []string{FallbackHeading + "\n", "| " + fallbackName + " | ", "| " + fallbackNoBreakerName + " | ",
		"#### Fallback targets", "**Why the breaker matters.**", "on `circuit_open`"} {
		if !strings.Contains(md, want) {
			t.Errorf("fallback report lacks %q", want)
		}
	}
}

// TestFallbackDeterministic runs the fallback scenario twice with the
// recommended policy and its backend: the second provider's draws and
// Damper's backend client must not make runs differ.
func TestFallbackDeterministic(t *testing.T) {
	sc := FallbackScenario(1)
	sc.Duration = 240 * time.Second
	a, err := Run(sc, DamperFallback())
	if err != nil {
		t.Fatal(err)
	}
	b, err := Run(sc, DamperFallback())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a.Requests, b.Requests) || !reflect.DeepEqual(a.Attempts, b.Attempts) ||
		!reflect.DeepEqual(a.SecondaryAttempts, b.SecondaryAttempts) || !reflect.DeepEqual(a.Circuit, b.Circuit) {
		t.Error("two runs of the fallback scenario differ")
	}
	if len(a.SecondaryAttempts) == 0 {
		t.Error("no attempt reached the secondary provider")
	}
}

func TestFallbackNeedsASecondary(t *testing.T) {
	sc := FallbackScenario(1)
	sc.Secondary = nil
	if _, err := RunFallback(sc, FallbackContenders()); err == nil || !strings.Contains(err.Error(), "Secondary is nil") {
		t.Errorf("RunFallback without a secondary: err = %v, want one naming Secondary", err)
	}
	if _, err := Run(sc, DamperFallback()); err == nil || !strings.Contains(err.Error(), "no Secondary provider") {
		t.Errorf("Run of %s without a secondary: err = %v, want one naming Secondary", fallbackName, err)
	}
}
