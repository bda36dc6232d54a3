package main

import (
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// entry is one situation of the failure catalogue: what the fake API
// answers, how the bare SDK is configured for it, and the Damper policy
// that matches that configuration.
type entry struct {
	// id names the entry's scenario on the fake API; name is the situation
	// as the catalogue describes it.
	id, name string
	steps    []dampertest.Step
	stream   bool
	// bare are the per-call options of the bare SDK run, on top of the
	// SDK's defaults (two retries).
	bare   []option.RequestOption
	policy damper.Policy
	// note is printed under the table for this row.
	note string
}

// catalogue is the SDK's failure catalogue, row for row: how the SDK alone
// handles each provider failure, followed by a spend-limit 429 and three
// stream failures (after message_start, mid-stream, and an end without
// message_stop).
func catalogue() []entry {
	ok := dampertest.OK()
	rateLimited := dampertest.Status(429)
	streamFault := func(f dampertest.Fault, at int) dampertest.Step {
		return ok.WithStream(dampertest.Stream{Text: "a streamed answer", Fault: f, At: at})
	}
	clean := dampertest.Stream{Text: "a streamed answer"}
	return []entry{
		{id: "429-default", name: "429 forever / default retries",
			steps: []dampertest.Step{rateLimited}},
		{id: "429-no-retries", name: "429 forever / max retries 0",
			steps: []dampertest.Step{rateLimited},
			bare:  []option.RequestOption{option.WithMaxRetries(0)}, policy: damper.Policy{MaxAttempts: 1}},
		{id: "429-five-retries", name: "429 forever / max retries 5",
			steps: []dampertest.Step{rateLimited},
			bare:  []option.RequestOption{option.WithMaxRetries(5)}, policy: damper.Policy{MaxAttempts: 6},
			note: "Damper starts no wait that cannot end, with time for an attempt, before the deadline."},
		{id: "429-retry-after-2", name: "429 + retry-after: 2",
			steps: []dampertest.Step{rateLimited.RetryAfter("2"), ok}},
		{id: "429-retry-after-ms", name: "429 + retry-after-ms: 300",
			steps: []dampertest.Step{rateLimited.RetryAfterMs("300"), ok}},
		{id: "429-retry-after-120", name: "429 + retry-after: 120",
			steps: []dampertest.Step{rateLimited.RetryAfter("120"), ok},
			note: "The bare SDK sleeps the full 120 s it is told to; only the deadline stops it. Damper refuses at " +
				"once: the delay is over MaxRetryAfter (60 s) and cannot fit the deadline; its error carries the delay."},
		{id: "529-twice", name: "529 overloaded twice",
			steps: []dampertest.Step{dampertest.Status(529), dampertest.Status(529), ok}},
		{id: "400", name: "400 invalid_request",
			steps: []dampertest.Step{dampertest.Status(400)}},
		{id: "500-should-retry-false", name: "500 + x-should-retry: false",
			steps: []dampertest.Step{dampertest.Status(500).ShouldRetry(false)}},
		{id: "400-should-retry-true", name: "400 + x-should-retry: true",
			steps: []dampertest.Step{dampertest.Status(400).ShouldRetry(true), ok}},
		{id: "connection-dropped", name: "connection dropped",
			steps: []dampertest.Step{ok.WithDrop(dampertest.DropBeforeHeaders)}},
		{id: "slow-response", name: "3 s response / 1 s timeout",
			steps: []dampertest.Step{ok.WithDelay(3 * time.Second)},
			bare:  []option.RequestOption{option.WithRequestTimeout(time.Second)}, policy: damper.Policy{PerAttemptTimeout: time.Second}},
		{id: "spend-limit", name: "429 spend limit, no retry-after",
			steps: []dampertest.Step{dampertest.SpendLimit()},
			note:  "Waiting does not clear a spend limit: Damper returns it after one attempt."},
		{id: "stream-dropped", name: "stream: dropped after message_start", stream: true,
			steps: []dampertest.Step{streamFault(dampertest.FaultReset, 1), ok.WithStream(clean)},
			note:  "The SDK does not retry a stream once its response has begun; Damper does while no content has reached the caller."},
		{id: "stream-error-event", name: "stream: error event after message_start", stream: true,
			steps: []dampertest.Step{streamFault(dampertest.FaultErrorEvent, 1), ok.WithStream(clean)}},
		{id: "stream-truncated", name: "stream: no message_stop, after content", stream: true,
			steps: []dampertest.Step{streamFault(dampertest.FaultTruncate, clean.ContentIndex()+1)},
			note:  "After content, a retry could duplicate the answer: Damper does not retry but reports the cut instead of a silent success."},
	}
}
