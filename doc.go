// Package damper is reliability control for calls to the Anthropic
// Messages API through the official Go SDK: the one owner of retries for
// POST /v1/messages, plain and streaming, in place of every client's own.
//
//	d, err := damper.New(damper.Policy{MaxRetryCostUSD: 0.05})
//	client := anthropic.NewClient(d.Option())
//	var rep damper.Report
//	msg, err := client.Messages.New(ctx, params, damper.ReportInto(&rep))
//
// Every call through one [Damper] shares one retry budget, so retries stop
// when first attempts stop succeeding; each call's retries are capped in
// estimated cost and fitted to its deadline. [RecommendedPolicy] adds a
// circuit breaker and a retry throttle; a [Policy] also sets a rate limiter,
// a concurrency limit, hedging and fallback to other backends; [WithStore]
// shares state across a fleet. Other endpoints pass through, with the SDK's own retries.
//
// # Streams
//
// A stream is retried only until its first content, its events before it
// held back; a failure after it is an [*Error] whose Reason is
// [ErrAmbiguous], never retried.
//
// Guides, one per capability: https://github.com/damper-ai/damper-go/tree/main/docs/guide
package damper
