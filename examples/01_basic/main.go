// Example 01_basic wraps an Anthropic SDK client with Damper and reads the
// report of a call. It runs offline, against dampertest's fake Messages API
// on loopback, scripted to be overloaded twice before it answers.
//
//	go run ./examples/01_basic
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

func main() {
	// A fake API in place of api.anthropic.com: two 529s, then an answer;
	// then a spend-limit 429 for the second scenario.
	srv := dampertest.NewServer()
	defer srv.Close()
	srv.Script("busy", dampertest.Status(529), dampertest.Status(529), dampertest.OK().WithText("Hello from the fake API."))
	srv.Script("spend-limit", dampertest.SpendLimit())

	// One Damper owns the retries, and the retry budget, of every client
	// built with its Option. Short backoffs keep the example quick.
	d, err := damper.New(damper.Policy{
		MaxAttempts: 3,
		BackoffBase: 50 * time.Millisecond,
		BackoffMax:  time.Second,
	})
	if err != nil {
		log.Fatal(err)
	}
	// In a real service: anthropic.NewClient(d.Option()), with the API key
	// from ANTHROPIC_API_KEY.
	client := anthropic.NewClient(append([]option.RequestOption{d.Option()}, srv.Options()...)...)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	params := anthropic.MessageNewParams{
		Model:     anthropic.ModelClaudeSonnet5_5,
		MaxTokens: 1024,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Say hello."))},
	}

	// The caller keeps calling the SDK; ReportInto hands back what Damper did.
	var rep damper.Report
	msg, err := client.Messages.New(ctx, params, damper.ReportInto(&rep), dampertest.Scenario("busy"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("answer:   %s\n", msg.Content[0].Text)
	printReport(rep)
	if rep.Attempts != 3 || rep.Outcome != damper.OutcomeSuccess {
		log.Fatalf("want an answer on the third attempt, got %d attempts, outcome %s", rep.Attempts, rep.Outcome)
	}

	// A spend limit does not clear by waiting: Damper returns it after one
	// attempt, and the SDK's own error is still there for errors.As.
	rep = damper.Report{}
	_, err = client.Messages.New(ctx, params, damper.ReportInto(&rep), dampertest.Scenario("spend-limit"))
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) {
		log.Fatalf("want the SDK's *anthropic.Error, got %v", err)
	}
	fmt.Printf("\nspend limit: HTTP %d, error code %s\n", apiErr.StatusCode, apiErr.ErrorCode())
	printReport(rep)
	if rep.Attempts != 1 {
		log.Fatalf("want one attempt at a spend limit, got %d", rep.Attempts)
	}
}

func printReport(rep damper.Report) {
	fmt.Printf("outcome:  %s after %d attempt(s), %v in all\n", rep.Outcome, rep.Attempts, rep.Duration.Round(time.Millisecond))
	fmt.Printf("cost:     about $%.4f per attempt, $%.4f spent on retries\n", rep.EstimatedCostUSD, rep.RetryCostUSD)
	fmt.Printf("budget:   %.1f retry units left in this window\n", rep.BudgetBalance)
	for i, a := range rep.AttemptLog {
		line := fmt.Sprintf("  attempt %d: HTTP %d", i+1, a.StatusCode)
		if a.Kind != "" {
			line += " " + a.Kind
		}
		line += ", request " + a.RequestID
		if a.Backoff > 0 {
			line += fmt.Sprintf(", then waited %v", a.Backoff.Round(time.Millisecond))
		}
		fmt.Println(line)
	}
}
