package dampertest_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go/dampertest"
)

var params = anthropic.MessageNewParams{
	Model:     "claude-sonnet-5-5",
	MaxTokens: 256,
	Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Hello"))},
}

// A scenario scripts one response per request: here an overloaded API, then
// a retry-after hint, then success.
func ExampleServer() {
	srv := dampertest.NewServer()
	defer srv.Close()
	srv.Script("busy",
		dampertest.Status(529),
		dampertest.Status(429).RetryAfter("2"),
		dampertest.OK().WithText("Hi!"),
	)

	// Retries off, to see every response.
	client := anthropic.NewClient(append(srv.Options(), option.WithMaxRetries(0))...)
	ctx := context.Background()
	for range 3 {
		msg, err := client.Messages.New(ctx, params, dampertest.Scenario("busy"))
		var apiErr *anthropic.Error
		if errors.As(err, &apiErr) {
			fmt.Println(apiErr.StatusCode, apiErr.Type(), apiErr.RequestID, "retry-after="+apiErr.Response.Header.Get("retry-after"))
			continue
		}
		fmt.Println(msg.Content[0].Text, msg.Model)
	}
	fmt.Println(srv.Count("busy"), "requests")
	// Output:
	// 529 overloaded_error req_dampertest_busy_1 retry-after=
	// 429 rate_limit_error req_dampertest_busy_2 retry-after=2
	// Hi! claude-sonnet-5-5
	// 3 requests
}

// A spend-limit 429 carries its cause in error.details.error_code.
func ExampleSpendLimit() {
	srv := dampertest.NewServer()
	defer srv.Close()
	srv.Script("capped", dampertest.SpendLimit())

	client := anthropic.NewClient(append(srv.Options(), option.WithMaxRetries(0))...)
	_, err := client.Messages.New(context.Background(), params, dampertest.Scenario("capped"))
	var apiErr *anthropic.Error
	if errors.As(err, &apiErr) {
		fmt.Println(apiErr.StatusCode, apiErr.ErrorCode())
	}
	// Output:
	// 429 enforced_spend_limit_reached
}

// A stream that fails with an error event after some content: the caller
// holds part of the answer and an error on a 200 response.
func ExampleStream() {
	srv := dampertest.NewServer()
	defer srv.Close()
	st := dampertest.Stream{Text: "The answer is 42.", ChunkSize: 8, Fault: dampertest.FaultErrorEvent}
	st.At = st.ContentIndex() + 1 // after the first chunk
	srv.Script("overloaded", dampertest.OK().WithStream(st))

	client := anthropic.NewClient(srv.Options()...)
	stream := client.Messages.NewStreaming(context.Background(), params, dampertest.Scenario("overloaded"))
	defer stream.Close()
	var msg anthropic.Message
	for stream.Next() {
		msg.Accumulate(stream.Current())
	}
	var apiErr *anthropic.Error
	if errors.As(stream.Err(), &apiErr) {
		fmt.Printf("got %q, then %d %s\n", msg.Content[0].Text, apiErr.StatusCode, apiErr.Type())
	}
	// Output:
	// got "The answ", then 200 overloaded_error
}

// Transport serves the fake API in memory, for simulations without a
// network.
func ExampleTransport() {
	srv := dampertest.NewServer()
	defer srv.Close()
	client := anthropic.NewClient(
		option.WithBaseURL("http://dampertest.invalid"),
		option.WithAPIKey("test-key"),
		option.WithHTTPClient(&http.Client{Transport: dampertest.Transport(srv.Handler())}),
	)
	msg, err := client.Messages.New(context.Background(), params)
	if err != nil {
		panic(err)
	}
	fmt.Println(msg.Content[0].Text, srv.Requests()[0].Header.Get("Authorization"))
	// Output:
	// ok REDACTED
}

// A fake clock fires timers as it is moved, and records every sleep.
func ExampleClock() {
	clock := dampertest.NewClock(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := clock.AfterFunc(10*time.Second, func() {
		fmt.Println("timeout at", clock.Now().Format(time.TimeOnly))
		cancel()
	})
	defer stop()

	fmt.Println(clock.Sleep(ctx, 4*time.Second))
	fmt.Println(clock.Sleep(ctx, 30*time.Second)) // cut short by the timeout
	fmt.Println(clock.Now().Format(time.TimeOnly), clock.Sleeps())
	// Output:
	// <nil>
	// timeout at 00:00:10
	// context canceled
	// 00:00:10 [4s 30s]
}

// With WithClock, a slow response moves the fake clock instead of taking
// time, and fires a client's timeout set on the same clock: the clock stops
// when the client gives up.
func ExampleWithClock() {
	clock := dampertest.NewClock(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC))
	srv := dampertest.NewServer(dampertest.WithClock(clock))
	defer srv.Close()
	srv.Script("slow", dampertest.OK().WithDelay(2*time.Minute))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	defer clock.AfterFunc(time.Minute, cancel)() // the caller's per-attempt timeout

	client := anthropic.NewClient(append(srv.Options(), option.WithMaxRetries(0))...)
	_, err := client.Messages.New(ctx, params, dampertest.Scenario("slow"))
	fmt.Println(errors.Is(err, context.Canceled), clock.Now().Format(time.TimeOnly))
	// Output:
	// true 00:01:00
}

// InMemory serves the fake API with no network. Made inside a
// testing/synctest bubble, its delays take none of the test's time.
func ExampleInMemory() {
	srv := dampertest.NewServer(dampertest.InMemory())
	defer srv.Close()
	srv.Script("slow", dampertest.OK().WithDelay(10*time.Millisecond).WithText("late"))

	client := anthropic.NewClient(srv.Options()...) // reaches srv through dampertest.Transport
	msg, err := client.Messages.New(context.Background(), params, dampertest.Scenario("slow"))
	if err != nil {
		panic(err)
	}
	fmt.Println(srv.URL(), msg.Content[0].Text)
	// Output:
	// http://dampertest.invalid late
}

// WithStepFunc decides each request's answer as it comes: here every
// scenario's first attempt is overloaded and its second succeeds, each
// message with an id of its own.
func ExampleWithStepFunc() {
	srv := dampertest.NewServer(dampertest.WithStepFunc(func(r dampertest.Request) dampertest.Step {
		if r.N == 1 {
			return dampertest.Status(529)
		}
		return dampertest.OK().WithMessageID(fmt.Sprintf("msg_%s_%d", r.Scenario, r.N))
	}))
	defer srv.Close()

	client := anthropic.NewClient(append(srv.Options(), option.WithMaxRetries(0))...)
	for _, scenario := range []string{"a", "a", "b", "b"} {
		msg, err := client.Messages.New(context.Background(), params, dampertest.Scenario(scenario))
		if err != nil {
			fmt.Println(scenario, "failed")
			continue
		}
		fmt.Println(scenario, msg.ID)
	}
	// Output:
	// a failed
	// a msg_a_2
	// b failed
	// b msg_b_2
}

// WithRateLimits makes the fake enforce per-minute limits as the API does,
// to test code that must pace itself. Here the code under test waits, on
// the fake clock, for as long as retry-after says after each 429.
func ExampleWithRateLimits() {
	clock := dampertest.NewClock(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC))
	srv := dampertest.NewServer(dampertest.WithClock(clock),
		dampertest.WithRateLimits(dampertest.RateLimits{RequestsPerMinute: 2, OutputTokensPerMinute: 8000}))
	defer srv.Close()
	client := anthropic.NewClient(append(srv.Options(), option.WithMaxRetries(0))...)

	ctx := context.Background()
	for sent := 0; sent < 4; {
		var resp *http.Response
		_, err := client.Messages.New(ctx, params, option.WithResponseInto(&resp))
		var apiErr *anthropic.Error
		if errors.As(err, &apiErr) && apiErr.StatusCode == http.StatusTooManyRequests {
			wait, _ := strconv.Atoi(apiErr.Response.Header.Get("retry-after"))
			fmt.Printf("%s 429, retry after %ds\n", clock.Now().Format(time.TimeOnly), wait)
			clock.Sleep(ctx, time.Duration(wait)*time.Second)
			continue
		}
		if err != nil {
			panic(err)
		}
		sent++
		fmt.Printf("%s ok, %s requests left\n", clock.Now().Format(time.TimeOnly), resp.Header.Get("anthropic-ratelimit-requests-remaining"))
	}
	stats := srv.RateLimitStats()
	fmt.Println(stats.Admitted, "admitted,", stats.Limited, "limited")
	// Output:
	// 00:00:00 ok, 1 requests left
	// 00:00:00 ok, 0 requests left
	// 00:00:00 429, retry after 30s
	// 00:00:30 ok, 0 requests left
	// 00:00:30 429, retry after 30s
	// 00:01:00 ok, 0 requests left
	// 4 admitted, 2 limited
}

// A fake Bedrock, reached through the SDK's own bedrock package: each
// request is rewritten to Bedrock's path, signed with SigV4 and checked,
// and a 529 comes back as Bedrock's 503.
func ExampleBedrock() {
	srv := dampertest.NewServer(dampertest.Bedrock("us-east-1"))
	defer srv.Close()
	srv.Script("busy", dampertest.Status(529), dampertest.OK().WithText("Hi from Bedrock!"))

	client := anthropic.NewClient(append(srv.Options(), option.WithMaxRetries(0))...)
	p := params
	p.Model = "anthropic.claude-sonnet-4-5-20250929-v1:0"
	for range 2 {
		msg, err := client.Messages.New(context.Background(), p, dampertest.Scenario("busy"))
		var apiErr *anthropic.Error
		if errors.As(err, &apiErr) {
			fmt.Println(apiErr.StatusCode, apiErr.Response.Header.Get("x-amzn-ErrorType"))
			continue
		}
		fmt.Println(msg.Content[0].Text)
	}
	for _, r := range srv.Requests() {
		fmt.Println(r.Platform, r.Path, "signed:", len(r.Signature) == 64, "refused:", r.AuthError != "")
	}
	// Output:
	// 503 ServiceUnavailableException
	// Hi from Bedrock!
	// bedrock /model/anthropic.claude-sonnet-4-5-20250929-v1:0/invoke signed: true refused: false
	// bedrock /model/anthropic.claude-sonnet-4-5-20250929-v1:0/invoke signed: true refused: false
}
