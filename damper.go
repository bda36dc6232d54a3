package damper

import (
	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/engine"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"log/slog"
)

// Setting configures what a Damper runs on rather than how it behaves:
// its clock, randomness, budget store and telemetry.
type Setting = engine.Setting

// WithClock makes the Damper read time and wait on c. Use a virtual clock
// (dampertest.NewClock) for exact tests and simulations.
func WithClock(c Clock) Setting { return engine.WithClock(c) }

// WithRand makes the Damper draw its jitter from f, which must return
// numbers in [0, 1) and be safe for concurrent use.
func WithRand(f func() float64) Setting { return engine.WithRand(f) }

// WithBudget replaces the in-memory retry budget built from the Policy with
// b, such as one shared by a fleet, for the client's own backend; the
// backends of [WithBackends] keep their own. b has its own values: [New]
// refuses a Policy that sets RetryBudgetRatio, RetryBudgetWindow or
// RetryBudgetMinTokens as well, rather than leave them unused.
func WithBudget(b fleet.Budget) Setting { return engine.WithBudget(b) }

// WithStore keeps the Damper's state in s, such as Redis shared by a
// fleet: the retry budget, and each other part (throttle, breaker,
// rate-limit buckets) whose interface s implements ([fleet.ThrottleStore],
// [fleet.BreakerStore], [fleet.LimitStore]); the others stay in memory.
// [WithBudget] given as well overrides s for the budget.
func WithStore(s fleet.Store) Setting { return engine.WithStore(s) }

// WithTracerProvider makes the Damper create its spans with tp instead of
// the provider registered with otel.SetTracerProvider.
//
// Each logical Messages request gets one damper.request span, and each
// provider attempt one damper.attempt span under it. The SDK's own
// anthropic.messages.create span, when the SDK's tracing is on, is the
// parent of damper.request: Damper is middleware inside the SDK's call, so
// the tree is
//
//	anthropic.messages.create        (the SDK: one per method call)
//	└── damper.request               (Damper: one per logical request)
//	    ├── damper.attempt           (one per provider attempt)
//	    │   └── HTTP client span     (your transport's instrumentation, if any)
//	    └── damper.attempt ...
//
// Attempts are counted once, by the damper.attempt spans: the SDK makes one
// call of its own retry loop (Damper switches the SDK's retries off), and
// its http.request.resend_count counts Damper's retries, the same requests
// seen from outside. Without the SDK's span, damper.request is a child of
// whatever span the call's context holds.
//
// Span times come from the Damper's [Clock], so that a virtual clock gives
// exact durations in tests. Spans carry no request or response content and
// no credential.
func WithTracerProvider(tp trace.TracerProvider) Setting { return engine.WithTracerProvider(tp) }

// WithMeterProvider makes the Damper create its metric instruments with mp
// instead of the provider registered with otel.SetMeterProvider. The
// instruments are created once, by [New]: Damper's own damper.* metrics and
// the client metrics of the OpenTelemetry GenAI semantic conventions
// (gen_ai.client.operation.duration, gen_ai.client.token.usage and
// gen_ai.client.operation.time_to_first_chunk, as of v1.41.0); see the
// README's Telemetry section for their names, units and attributes. A
// caller can name any model, and an upstream any answering model, so a
// model reaches a metric only in the first 8 combinations of models,
// server and provider (and the first 4 with each failure) of the models
// the price table prices, and apart of the others; a limit group only if
// the price table's models or the rate limiter's configuration name it,
// or among the first 8 others seen. Any other is "other".
func WithMeterProvider(mp metric.MeterProvider) Setting { return engine.WithMeterProvider(mp) }

// WithLogger makes the Damper write one structured line to l for each
// retry decision: an authorized retry at Info, a retry refused by an
// admission gate at Warn, and a failure that is not retried at all
// (not retryable, ambiguous, cancelled) at Info. Without it Damper logs
// nothing.
func WithLogger(l *slog.Logger) Setting { return engine.WithLogger(l) }

// WithName names the Damper in its telemetry: every metric it records and
// every damper.request span carry damper.name, and every log line a
// "damper" field, so that two Dampers on one MeterProvider (one per tenant,
// say) keep separate series. Without it they carry none. The name must be
// 1 to 64 printable ASCII characters: it is a label, not a free text.
func WithName(name string) Setting { return engine.WithName(name) }

// Damper owns the retries of Messages calls for every client built with its
// [Damper.Option], and for every [Proxy] made with it. It holds one retry
// budget, shared by all those calls and by no other Damper. A Damper is
// safe for concurrent use by any number of goroutines; its Policy is fixed
// at [New].
type Damper struct {
	e *engine.Damper // the call engine, which the adapters hand calls to
}

// New returns a Damper with policy p. It returns an error that names the
// field and its value when p holds a value that cannot be used.
func New(p Policy, settings ...Setting) (*Damper, error) {
	e, err := engine.New(p, settings...)
	if err != nil {
		return nil, err
	}
	return &Damper{e: e}, nil
}

// Policy returns a copy of the Damper's policy, with every default filled
// in; changing it changes nothing in the Damper.
func (d *Damper) Policy() Policy { return d.e.Policy() }

// Budget returns the Damper's retry budget.
func (d *Damper) Budget() fleet.Budget { return d.e.Budget() }

// RateLimits returns every bucket of the Damper's rate limiter, by group
// then bucket; nil without Policy.RateLimit.
func (d *Damper) RateLimits() []fleet.RateLimitState { return d.e.RateLimits() }

// Close unregisters the callbacks of the Damper's gauges
// (damper.retry_budget.balance, damper.ratelimit.limit and
// damper.ratelimit.remaining, damper.concurrency.limit and
// damper.concurrency.in_flight) from its MeterProvider, so that a Damper
// made to replace it on the same provider, such as one built from a
// configuration read again, is the only one to report them. Without
// Close they go when the Damper is garbage collected. Close neither waits
// for nor ends calls: those in flight, and any made later, run as
// before, and their counters and histograms are still recorded. It
// returns the provider's errors; a second Close does nothing.
func (d *Damper) Close() error { return d.e.Close() }
