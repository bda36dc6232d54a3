// Example 02_outage_demo sends 200 concurrent requests to a provider in a
// full outage, every attempt answered 529 overloaded, first with the SDK's
// own retries, then with Damper, and prints how many attempts the provider
// received for each.
//
//	go run ./examples/02_outage_demo
//
// The SDK retries every request twice on its own, so the provider sees
// three times its normal load just when it can least take it: 600
// attempts (3.00x). Damper's retries share one budget, of 10 retries per
// minute plus 0.1 per first attempt that succeeds; in an outage none does,
// so the provider sees 210 attempts (1.05x), and most requests fail at
// once, with damper.ErrRetryBudgetExhausted, instead of waiting to fail.
// Both counts are the same on every run, however the goroutines are
// scheduled (which requests get the 10 retries is not). The program exits
// with status 1 if Damper's amplification is above 1.10x.
//
// It runs offline, in a couple of seconds: the fake API of package
// dampertest is served in memory, and Damper waits on a virtual clock. The
// SDK's backoffs (about 0.5 s, then 1 s) cannot be moved off real time, so
// its 200 requests wait them out together. The repository's `damper demo`
// command runs a larger simulation, with a circuit breaker and a throttle.
package main

import (
	"context"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

const requests = 200

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	ctx := context.Background()

	// One fake API in memory, each run in a scenario of its own so that
	// it counts its attempts apart. No attempt ever succeeds.
	api := dampertest.NewServer(dampertest.InMemory())
	defer api.Close()
	api.Script("sdk", dampertest.Status(529))
	api.Script("damper", dampertest.Status(529))

	// The SDK alone: its default of 2 retries per request, written out.
	sdkOnly := anthropic.NewClient(append(api.Options(), option.WithMaxRetries(2))...)
	sendAll(ctx, sdkOnly, "sdk")

	// Damper with its default policy. The virtual clock starts on a minute
	// boundary so that the whole run falls within one budget window: a
	// new window would bring 10 more retries.
	clock := dampertest.NewClock(time.Now().Truncate(time.Minute))
	d, err := damper.New(damper.Policy{}, damper.WithClock(clock))
	if err != nil {
		return err
	}
	withDamper := anthropic.NewClient(append([]option.RequestOption{d.Option()}, api.Options()...)...)
	sendAll(ctx, withDamper, "damper")

	sdkAmp := report("The SDK's own retries (3 attempts per request)", api.Count("sdk"))
	damperAmp := report("Damper (3 attempts per request, one retry budget for all)", api.Count("damper"))
	if damperAmp > 1.10 || damperAmp >= sdkAmp {
		return fmt.Errorf("damper's amplification is %.2fx, want at most 1.10x", damperAmp)
	}
	return nil
}

// sendAll sends every request at once, in the scenario of the same name,
// and waits for them all. Every one fails: the outage never ends.
func sendAll(ctx context.Context, client anthropic.Client, scenario string) {
	var wg sync.WaitGroup
	for range requests {
		wg.Go(func() {
			_, _ = client.Messages.New(ctx, anthropic.MessageNewParams{
				Model:     anthropic.ModelClaudeSonnet5_5,
				MaxTokens: 256,
				Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Summarize this ticket."))},
			}, dampertest.Scenario(scenario))
		})
	}
	wg.Wait()
}

// report prints one run and returns its amplification: attempts sent per
// request made.
func report(name string, attempts int) float64 {
	amp := float64(attempts) / requests
	fmt.Printf("%s:\n", name)
	fmt.Printf("  requests:           %d\n", requests)
	fmt.Printf("  provider attempts:  %d (%d retries)\n", attempts, attempts-requests)
	fmt.Printf("  amplification:      %.2fx\n", amp)
	return amp
}
