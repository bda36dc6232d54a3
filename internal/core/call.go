package core

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/damper-ai/damper-go/fleet"
)

// Call is what a gate sees of a call: the engine's call implements it.
type Call interface {
	// Context is the caller's context, with the call's own values.
	Context() context.Context
	// Tenant is the call's tenant, nil for none.
	Tenant() *Tenant
	// Model is the model of the call's route, as the caller (or the
	// fallback policy, for a sibling) names it.
	Model() string
	InputTokens() int
	MaxTokens() int
	// Attempts is the attempts started so far; RouteFrom those started
	// before the call's current route.
	Attempts() int
	RouteFrom() int
	// RetryCost is the summed estimated cost of the retries and hedges
	// sent; RouteCost the estimated cost of one attempt on the current
	// route, when priced.
	RetryCost() float64
	RouteCost() (cost float64, priced bool)
	// RouteState is a slot, kept with the call's current route, for one
	// gate's state of the route (the rate limiter's group and cost).
	RouteState() *any
	// Note notes n in the call's report, with the report's lock held.
	Note(n Note)
	// StoreError logs a failure of part's store, in op.
	StoreError(part StorePart, op string, err error)
	// Wait is an attempt gate's wait, until until: it first asks the gates
	// after after whether they would refuse the attempt by then (no wait
	// is started that a later gate would refuse), then sleeps on the
	// Damper's clock, and reports a refusal, or whether the caller's
	// context ended.
	Wait(after AttemptGate, until time.Time) (refused *Denial, canceled bool)
	// LaterRefusal asks the attempt gates after after whether they would
	// refuse the attempt at until, taking nothing.
	LaterRefusal(after AttemptGate, now, until time.Time) *Denial
}

// Attempt is what a gate sees of an attempt: its number in the call, from
// 1, and whether it is a hedge.
type Attempt struct {
	N     int
	Hedge bool
}

// Backend is what a gate's part sees of its backend.
type Backend struct {
	Name     string
	Provider string      // "" for the primary: the request's own
	Store    fleet.Store // where its parts keep their state
	// Budget is the backend's retry budget: one given to it, or the one
	// the budget gate makes from its store.
	Budget fleet.Budget
}

// Tenant is what a gate sees of a tenant of a Proxy. A call's *Tenant is
// the tenant's one, so that a gate may key its state by it.
type Tenant struct {
	Name   string
	Weight int
	// Shares: its calls take its weighted share of each limit group's
	// rate limit; set when its Proxy has other tenants to share with.
	Shares bool
	// RetryBudget: its own settings of its retry budget, when Set.
	RetryBudget struct {
		Set       bool
		Ratio     float64
		MinTokens int
	}
}

// ShareWeight is t's weight in shares: its Weight, or 1 for no tenant.
func (t *Tenant) ShareWeight() int {
	if t == nil || t.Weight < 1 {
		return 1
	}
	return t.Weight
}

// Env is what a gate sees of the Damper its parts belong to.
type Env struct {
	Clock Clock
	Services
}

// Services are the Damper's telemetry services to its gates.
type Services interface {
	// LogStoreError counts a failure of part's store and logs it, paced.
	LogStoreError(ctx context.Context, part StorePart, op string, err error)
	// Instruments is what the Instruments func of the gate refusing with
	// outcome made, or nil.
	Instruments(outcome Outcome) any
	// Attrs is the options of a measurement with kvs and the Damper's
	// name, if any; With those of one with the name alone.
	Attrs(kvs ...attribute.KeyValue) metric.MeasurementOption
	With() []metric.ObserveOption
	// BackendLabel is the damper.backend attribute of backend, when the
	// Damper's metrics name backends.
	BackendLabel(backend string) (attribute.KeyValue, bool)
	// Name is the damper.name attribute, when the Damper has a name.
	Name() (attribute.KeyValue, bool)
	// GroupLabel is a limit group's name as a bounded metric label.
	GroupLabel(group string) string
	// Logger is the Damper's logger; nil for none.
	Logger() *slog.Logger
}

// OtherLabel is the label of the values a bounded label does not name.
const OtherLabel = "other"

// StorePart is a part of a Damper's state that a fleet.Store may keep,
// made by NewStorePart beside the gate whose part it is.
type StorePart uint8

// StorePartInfo names a part: its value of damper.store.part, and the log
// message of its store's errors.
type StorePartInfo struct{ Name, Message string }

var storeParts []StorePartInfo

// NewStorePart adds a part; it is called once per part, as a package's
// variables are initialized.
func NewStorePart(name, message string) StorePart {
	storeParts = append(storeParts, StorePartInfo{name, message})
	return StorePart(len(storeParts) - 1)
}

// StoreParts are every part, by StorePart.
func StoreParts() []StorePartInfo { return storeParts }

// FromStore makes a part with made, when store implements P (the part's
// interface), or in memory when it does not or keeps none.
func FromStore[P, S, T any](part string, store fleet.Store, made func(P, S) (T, error), inMemory func(fleet.MemoryStore, S) (T, error), s S) (T, error) {
	if p, ok := store.(P); ok {
		t, err := made(p, s)
		if err != nil {
			return t, fmt.Errorf("damper: the store's %s: %w", part, err)
		}
		if any(t) != nil {
			return t, nil
		}
	}
	// The policy was validated: the store in memory cannot fail.
	return inMemory(fleet.MemoryStore{}, s)
}

// KeepGoing returns ctx without its cancellation, for a part's store to
// finish what the call began; a part in memory needs no context, and is
// spared the allocation.
func KeepGoing(ctx context.Context, part any) context.Context {
	if fleet.InMemory(part) {
		return ctx
	}
	return context.WithoutCancel(ctx)
}

// Instrument returns the instrument a meter created or, when the meter
// refused it, hands the error to otel.Handle and returns the fallback.
func Instrument[T any](inst T, err error) func(fallback T, _ error) T {
	return func(fallback T, _ error) T {
		if err != nil {
			otel.Handle(err)
			return fallback
		}
		return inst
	}
}

// MinAttempt is the least time worth giving another attempt: a retry or
// hedge whose least attempt would end past the caller's deadline is not
// made.
const MinAttempt = 500 * time.Millisecond

// RetryAsk is the retry a retry check is asked about: the one that would
// follow failed attempt N (counted on the call's backend), whose failure
// is Failure, at Now, with RetryCost spent on retries so far.
type RetryAsk struct {
	N         int
	Failure   *Failure
	Now       time.Time
	RetryCost float64
	Policy    *BackoffPolicy
	Rnd       func() float64
	wait      RetryWait // once drawn
	drawn     bool
}

// BackoffPolicy is what a retry's wait is drawn from.
type BackoffPolicy struct {
	Base, Max, MaxRetryAfter time.Duration
	IgnoreRetryAfter         bool
}

// RetryWait is the wait before a retry: full jitter, or the provider's
// delay (Hint), honoured up to MaxRetryAfter.
type RetryWait struct {
	Wait, Hint time.Duration
	HasHint    bool
}

// Backoff is r's wait, drawn once, by the first check that needs it: the
// attempts gate, first in the list, needs none, so that a call's last
// attempt draws nothing.
func (r *RetryAsk) Backoff() RetryWait {
	if !r.drawn {
		p, w := r.Policy, &r.wait
		if !p.IgnoreRetryAfter && r.Failure.Header != nil {
			w.Hint, w.HasHint = ParseRetryAfter(r.Failure.Header, r.Now)
		}
		w.Wait = Backoff(r.N, p.Base, p.Max, min(w.Hint, p.MaxRetryAfter), w.HasHint, p.MaxRetryAfter, r.Rnd())
		r.drawn = true
	}
	return r.wait
}
