package engine

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"

	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/core"
	"github.com/damper-ai/damper-go/internal/gates/ratelimit"
)

// Damper owns the retries of Messages calls for every client built with the
// root package's Damper.Option and every proxy made over it. It holds one retry budget, shared by all those calls and
// by no other Damper. A Damper is safe for concurrent use by any number of
// goroutines; its Policy is fixed at [New].
type Damper struct {
	policy Policy
	clock  Clock
	rand   func() float64
	// realClock is whether clock is the wall clock, so that an attempt's
	// timeout can be its context's deadline; timeoutCause is the error of
	// an attempt that ran out of PerAttemptTimeout.
	realClock    bool
	timeoutCause error
	tel          *telemetry
	env          *core.Env          // what the gates see of the Damper
	backoff      core.BackoffPolicy // what a retry's wait is drawn from
	telCfg       telemetryConfig    // as the Settings left it, until New builds tel

	// primary is the backend of a call's own client; fallbacks are the
	// backends of WithBackends, in order (backend.go). Each holds the
	// engine's hooks (gates.go) for its attempts: gates that admit every
	// attempt, and observers that hear every attempt's end.
	primary      *backend
	fallbacks    []*backend
	backendSpecs []Backend // as WithBackends gave them, until New builds them

	budget fleet.Budget // WithBudget's, until New gives it to the primary
	store  fleet.Store  // where the primary's gates keep their state
	hedge  *hedger      // nil without Policy.Hedge
	spread *spread      // nil but with spread routing and backends (routing.go)
	// affinity is the cache affinity table; nil but with spread routing
	// and FallbackPolicy.CacheAffinity (affinity.go).
	affinity *affinity

	// callContexts are the stores and budget that keep a note of each
	// call, in its context.
	callContexts []fleet.CallContexter
}

// Setting configures what a Damper runs on rather than how it behaves:
// its clock, randomness, budget store and telemetry.
type Setting func(*Damper) error

// WithClock makes the Damper read time and wait on c. Use a virtual clock
// (dampertest.NewClock) for exact tests and simulations.
func WithClock(c Clock) Setting {
	return func(d *Damper) error {
		if c == nil {
			return fmt.Errorf("damper: WithClock(nil): a clock is required")
		}
		d.clock = c
		return nil
	}
}

// WithRand makes the Damper draw its jitter from f, which must return
// numbers in [0, 1) and be safe for concurrent use.
func WithRand(f func() float64) Setting {
	return func(d *Damper) error {
		if f == nil {
			return fmt.Errorf("damper: WithRand(nil): a random source is required")
		}
		d.rand = f
		return nil
	}
}

// WithBudget replaces the in-memory retry budget built from the Policy with
// b, such as one shared by a fleet, for the client's own backend; the
// backends of [WithBackends] keep their own. b has its own values: [New]
// refuses a Policy that sets RetryBudgetRatio, RetryBudgetWindow or
// RetryBudgetMinTokens as well, rather than leave them unused.
func WithBudget(b fleet.Budget) Setting {
	return func(d *Damper) error {
		if b == nil {
			return fmt.Errorf("damper: WithBudget(nil): a budget is required")
		}
		d.budget = b
		return nil
	}
}

// New returns a Damper with policy p. It returns an error that names the
// field and its value when p holds a value that cannot be used.
func New(p Policy, settings ...Setting) (*Damper, error) {
	given := p
	p, err := p.withDefaults()
	if err != nil {
		return nil, err
	}
	d := &Damper{policy: p, clock: realClock{}, rand: rand.Float64}
	for _, s := range settings {
		if err := s(d); err != nil {
			return nil, err
		}
	}
	if d.budget != nil {
		if err := checkBudgetFields(given); err != nil {
			return nil, err
		}
	}
	_, d.realClock = d.clock.(realClock)
	d.timeoutCause = attemptTimeoutError{d: p.PerAttemptTimeout}
	if d.store == nil {
		d.store = fleet.MemoryStore{}
	}
	d.noteCalls(d.store)
	d.noteCalls(d.budget)
	d.primary = d.newBackend(PrimaryBackend, d.store, d.budget)
	d.budget = nil
	for _, spec := range d.backendSpecs {
		s := spec.Store
		if s == nil {
			s = fleet.MemoryStore{}
		}
		d.noteCalls(s)
		b := d.newBackend(spec.Name, s, nil)
		b.provider, b.models, b.client = spec.Provider, spec.Models, newBackendClient(spec.Options)
		b.weight = max(spec.Weight, 1)
		d.fallbacks = append(d.fallbacks, b)
	}
	d.primary.weight = 1
	if f := p.Fallback; f != nil {
		d.primary.weight = f.PrimaryWeight
		if f.Routing == routingSpread && len(d.fallbacks) > 0 {
			d.spread = new(spread)
			if f.CacheAffinity > 0 {
				d.affinity = newAffinity(f.CacheAffinity)
			}
		}
	}
	d.tel = newTelemetry(d.telCfg, &d.policy, d.clock)
	d.tel.m.backends = len(d.fallbacks) > 0
	if d.spread != nil {
		d.tel.m.routingChoices = newRoutingChoices(d.tel.m.meter)
	}
	if d.affinity != nil {
		d.tel.m.routingAffinity = newRoutingAffinity(d.tel.m.meter)
	}
	d.env = newGateEnv(d.clock, d.tel)
	d.backoff = backoffOf(&d.policy)
	if err := d.wire(d.primary); err != nil {
		return nil, err
	}
	for _, b := range d.fallbacks {
		if err := d.wire(b); err != nil {
			return nil, fmt.Errorf("%w (backend %q)", err, b.name)
		}
	}
	d.tel.m.registerGates(d)
	d.backendSpecs = nil
	if p.Hedge != nil {
		d.hedge = newHedger(*p.Hedge, d.clock)
	}
	return d, nil
}

// Policy returns a copy of the Damper's policy, with every default filled
// in; changing it changes nothing in the Damper.
func (d *Damper) Policy() Policy {
	p := d.policy
	v := reflect.ValueOf(&p).Elem()
	for i := range v.NumField() {
		if f := v.Field(i); f.Kind() == reflect.Pointer && !f.IsNil() && strings.HasSuffix(f.Type().Elem().Name(), "Policy") {
			f.Set(clonePart(f))
		}
	}
	return p
}

// clonePart copies the part f points to, so that the copy shares no
// memory with the Damper's: by the part's own clone when it holds maps or
// slices, else whole.
func clonePart(f reflect.Value) reflect.Value {
	switch c := f.Interface().(type) {
	case interface{ clonePolicy() any }:
		return reflect.ValueOf(c.clonePolicy())
	case *RateLimitPolicy:
		return reflect.ValueOf(ratelimit.Clone(c))
	}
	cp := reflect.New(f.Type().Elem())
	cp.Elem().Set(f.Elem())
	return cp
}

// checkBudgetFields refuses the budget's fields of p, given with
// WithBudget, whose budget has values of its own.
func checkBudgetFields(p Policy) error {
	var set []string
	if p.RetryBudgetRatio != 0 {
		set = append(set, fmt.Sprintf("RetryBudgetRatio = %v", p.RetryBudgetRatio))
	}
	if p.RetryBudgetWindow != 0 {
		set = append(set, fmt.Sprintf("RetryBudgetWindow = %v", p.RetryBudgetWindow))
	}
	if p.RetryBudgetMinTokens != 0 {
		set = append(set, fmt.Sprintf("RetryBudgetMinTokens = %d", p.RetryBudgetMinTokens))
	}
	if len(set) == 0 {
		return nil
	}
	return fmt.Errorf("damper: Policy.%s set with WithBudget: the budget given to WithBudget has its own ratio, window and minimum tokens, and would leave them unused; leave them zero", strings.Join(set, ", Policy."))
}

// noteCalls keeps x if it keeps a note of each call.
func (d *Damper) noteCalls(x any) {
	if c, ok := x.(fleet.CallContexter); ok {
		d.callContexts = append(d.callContexts, c)
	}
}

// backoffOf is what a retry's wait is drawn from under p.
func backoffOf(p *Policy) core.BackoffPolicy {
	return core.BackoffPolicy{Base: p.BackoffBase, Max: p.BackoffMax, MaxRetryAfter: p.MaxRetryAfter, IgnoreRetryAfter: p.IgnoreRetryAfter}
}

// Budget returns the Damper's retry budget.
func (d *Damper) Budget() fleet.Budget { return d.primary.budget }

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
func (d *Damper) Close() error {
	return d.tel.unregisterGauges()
}
