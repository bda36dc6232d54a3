package damper_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// Put Damper in charge of a client's Messages calls and read the report of
// a call that succeeded on its third attempt.
func Example() {
	api := dampertest.NewServer() // a fake Anthropic API; use your real key in production
	defer api.Close()
	api.Script("", dampertest.Status(529).RetryAfterMs("10"), dampertest.Status(529).RetryAfterMs("10"), dampertest.OK())

	d, err := damper.New(damper.Policy{MaxRetryCostUSD: 0.05})
	if err != nil {
		panic(err)
	}
	client := anthropic.NewClient(append([]option.RequestOption{d.Option()}, api.Options()...)...)

	var rep damper.Report
	msg, err := client.Messages.New(context.Background(), anthropic.MessageNewParams{
		Model:     anthropic.ModelClaudeSonnet4_6,
		MaxTokens: 512,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Explain retry storms"))},
	}, damper.ReportInto(&rep))
	if err != nil {
		panic(err)
	}
	fmt.Println(msg.Content[0].Text)
	fmt.Println("attempts:", rep.Attempts, "outcome:", rep.Outcome)
	fmt.Printf("retry cost: $%.4f\n", rep.RetryCostUSD)
	// Output:
	// ok
	// attempts: 3 outcome: success
	// retry cost: $0.0156
}

// A provider delay longer than MaxRetryAfter fails the call at once; the
// error carries the delay so that a queue can reschedule the work.
func ExampleError_retryAfter() {
	api := dampertest.NewServer()
	defer api.Close()
	api.Script("", dampertest.Status(429).RetryAfter("120"))

	d, err := damper.New(damper.Policy{})
	if err != nil {
		panic(err)
	}
	client := anthropic.NewClient(append([]option.RequestOption{d.Option()}, api.Options()...)...)
	_, err = client.Messages.New(context.Background(), anthropic.MessageNewParams{
		Model:     anthropic.ModelClaudeSonnet4_6,
		MaxTokens: 512,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))},
	})

	var derr *damper.Error
	var apiErr *anthropic.Error
	if errors.Is(err, damper.ErrRetryAfterTooLong) && errors.As(err, &derr) && errors.As(err, &apiErr) {
		fmt.Println("reschedule in", derr.RetryAfter, "after HTTP", apiErr.StatusCode)
	}
	// Output:
	// reschedule in 2m0s after HTTP 429
}

// New validates the policy and names the field that is wrong.
func ExampleNew() {
	_, err := damper.New(damper.Policy{MaxAttempts: -1})
	fmt.Println(err)
	// Output:
	// damper: Policy.MaxAttempts = -1: must be at least 1 (0 means the default, 3)
}

// Serve the Messages API through a Damper, for clients in any language:
// the proxy sends every call to its one upstream, retries it there under
// the Damper's policy, and says what it did in the Damper-* headers.
func ExampleNewProxy() {
	api := dampertest.NewServer() // a fake Anthropic API; https://api.anthropic.com in production
	defer api.Close()
	api.Script("", dampertest.Status(529).RetryAfterMs("10"), dampertest.OK())

	d, err := damper.New(damper.Policy{})
	if err != nil {
		panic(err)
	}
	proxy, err := damper.NewProxy(d, damper.ProxyConfig{Upstream: api.URL()})
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(proxy) // http.ListenAndServe("127.0.0.1:8787", proxy) in a service
	defer srv.Close()

	// What a client in any language sends, with its own key.
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/messages", strings.NewReader(
		`{"model":"claude-sonnet-4-6","max_tokens":64,"messages":[{"role":"user","content":"Hello"}]}`))
	req.Header.Set("X-Api-Key", "sk-ant-...")
	req.Header.Set("Anthropic-Version", "2023-06-01")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		panic(err)
	}
	defer res.Body.Close()
	fmt.Println(res.StatusCode, res.Header.Get("Damper-Outcome"), "after", res.Header.Get("Damper-Attempts"), "attempts")
	// Output: 200 success after 2 attempts
}
