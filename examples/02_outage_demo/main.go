// Example 02_outage_demo runs the outage demo as a small program: 1,000
// logical requests, each failing twice with 529 before it succeeds, sent
// through the official SDK to a fake API in memory on a virtual clock,
// first with a naive three-attempt retry loop, then with Damper, then with
// Damper's circuit breaker and retry throttle added.
//
//	go run ./examples/02_outage_demo
//
// It prints 3,000 attempts (3.00x) for the naive loop, 1,010 attempts
// (1.01x, 995 budget-exhausted events) for Damper, and 20 attempts (986
// requests refused by the open breaker) with the breaker. `go run
// ./cmd/damper demo` is the same run with flags, JSON and a chart.
package main

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/internal/outage"
)

func main() {
	cfg := outage.DefaultConfig() // 1,000 requests, 2 failures each, one at a time
	cfg.Policy = damper.Policy{}  // Damper's defaults: 3 attempts, 10 budget units + 0.1 per first-attempt success per minute

	res, err := outage.Simulate(context.Background(), cfg)
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range []outage.Run{res.Naive, res.Damper, res.Breaker} {
		fmt.Printf("%s:\n", r.Name)
		fmt.Printf("  logical requests:        %d\n", r.Requests)
		fmt.Printf("  provider attempts:       %d\n", r.Attempts)
		fmt.Printf("  amplification:           %.2fx\n", r.Amplification)
		fmt.Printf("  budget exhausted events: %d\n", r.BudgetExhausted)
		fmt.Printf("  circuit open events:     %d\n", r.CircuitOpen)
	}
	if res.Damper.Amplification > 1.10 {
		fmt.Println("FAIL: Damper's amplification is above 1.10x")
		os.Exit(1)
	}
}
