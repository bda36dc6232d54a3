// Example 07_fallback falls back from the first-party API to Amazon
// Bedrock through an outage, and back once it is over.
//
//	go run ./examples/07_fallback
//
// The caller's client reaches the first-party API, the Damper's "primary"
// backend; damper.WithBackends adds Bedrock, configured with the SDK's own
// bedrock.WithConfig. Damper sends each Bedrock attempt through a client
// of its own built from those options, so the bedrock package rewrites it
// for its endpoint (the model as Bedrock names it, in the path), signs it
// with SigV4 and turns its event stream into SSE, every time; the caller's
// code does not change.
//
// The primary is out: every attempt gets 529. The first calls use their
// attempts there, then move to Bedrock; once the primary's breaker opens,
// calls go straight to Bedrock. When the primary recovers and the breaker's
// open period ends, one probe finds it and the calls come back.
//
// Nothing reaches the network and no cloud account is needed: both APIs
// are dampertest fakes, in memory. The fake Bedrock checks what Bedrock
// checks (the SigV4 signature and its date, the path, the body's shape),
// and refuses a request that fails them. To use real Bedrock, give
// bedrock.WithConfig an aws.Config from config.LoadDefaultConfig (see the
// README, "Fallback across Anthropic, Bedrock and Vertex").
//
// The program exits with status 1 if a call failed, went to the wrong
// backend, or reached Bedrock unsigned or under the wrong model ID.
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	os.Unsetenv("AWS_BEARER_TOKEN_BEDROCK") // else the SDK sends it in place of SigV4

	primary := dampertest.NewServer(dampertest.InMemory())
	defer primary.Close()
	bedrockAPI := dampertest.NewServer(dampertest.InMemory(), dampertest.Bedrock("us-east-1"))
	defer bedrockAPI.Close()
	bedrockAPI.Script("", dampertest.OK().WithText("Hello from the fake Bedrock."))

	// A virtual clock makes the breaker's open period pass at once.
	clock := dampertest.NewClock(time.Now())
	d, err := damper.New(damper.RecommendedPolicy(), damper.WithClock(clock),
		damper.WithBackends(damper.Backend{
			Name:     "bedrock",
			Provider: damper.ProviderBedrock,
			// bedrock.WithConfig(cfg) and where the fake listens.
			Options: bedrockAPI.Options(),
		}))
	if err != nil {
		return err
	}
	client := anthropic.NewClient(append([]option.RequestOption{d.Option()}, primary.Options()...)...)

	call := func(i int, wantBackend string, show bool) error {
		var rep damper.Report
		msg, err := client.Messages.New(ctx, anthropic.MessageNewParams{
			Model:     anthropic.ModelClaudeOpus4_5,
			MaxTokens: 256,
			Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Say hello."))},
		}, damper.ReportInto(&rep))
		if err != nil {
			return fmt.Errorf("call %d: %w", i, err)
		}
		var path []string
		for _, a := range rep.AttemptLog {
			path = append(path, a.Backend)
		}
		why := ""
		for _, f := range rep.Fallbacks {
			why += fmt.Sprintf(" (moved %s → %s: %s)", f.From, f.To, f.Reason)
		}
		if show {
			fmt.Printf("  call %2d: attempts on %-32s answered by %-7s %q%s\n", i, strings.Join(path, ","), rep.Backend, msg.Content[0].Text, why)
		}
		if rep.Backend != wantBackend {
			return fmt.Errorf("call %d was answered by %s, want %s", i, rep.Backend, wantBackend)
		}
		return nil
	}

	fmt.Println("The first-party API is out (529 to every attempt):")
	primary.Script("", dampertest.Status(529))
	const calls = 30
	for i := 1; i <= calls; i++ {
		if i == 4 {
			fmt.Println("  ...")
		}
		if err := call(i, "bedrock", i <= 3 || i > calls-2); err != nil {
			return err
		}
	}
	outage := primary.Count("")
	fmt.Printf("  the primary got %d attempts in all: its breaker opened at the 20th, and no call has tried it since\n", outage)

	fmt.Println("\nThe first-party API recovers; the breaker's open period ends:")
	primary.Script("", dampertest.OK().WithText("Hello from the first-party API."))
	clock.Advance(time.Minute)
	for i := calls + 1; i <= calls+3; i++ {
		if err := call(i, damper.PrimaryBackend, true); err != nil {
			return err
		}
	}

	for _, r := range bedrockAPI.Requests() {
		if r.AuthError != "" {
			return fmt.Errorf("the fake Bedrock refused a request: %s", r.AuthError)
		}
		if r.Model != "global.anthropic.claude-opus-4-5-20251101-v1:0" {
			return fmt.Errorf("Bedrock got model %q, want the global inference profile's ID", r.Model)
		}
	}
	fmt.Printf("\nBedrock answered %d calls, each attempt SigV4-signed at its own time, model %s.\n",
		bedrockAPI.Count(""), bedrockAPI.Requests()[0].Model)
	if outage != d.Policy().Breaker.MinAttempts {
		return fmt.Errorf("the primary got %d attempts through the outage, want its breaker to stop them", outage)
	}
	return nil
}
