// Package coretest is a harness for a gate's tests: a call, an
// environment and a clock that a gate's part runs against with no engine.
package coretest

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/damper-ai/damper-go/internal/core"
)

// Call is a call as a gate sees it, its answers set by its fields. Its
// Wait sleeps on Clock, when set, after asking Later; its notes and store
// errors are kept.
type Call struct {
	Ctx         context.Context
	T           *core.Tenant
	M           string
	Input, Max  int
	N, From     int
	Retry, Cost float64
	Priced      bool
	Clock       core.Clock
	Later       []core.AttemptGate // the attempt gates after the one tested, for Wait and LaterRefusal
	State       any
	mu          sync.Mutex
	Notes       []core.Note
	StoreErrors []error
}

var _ core.Call = (*Call)(nil)

func (c *Call) Context() context.Context {
	if c.Ctx == nil {
		return context.Background()
	}
	return c.Ctx
}
func (c *Call) Tenant() *core.Tenant       { return c.T }
func (c *Call) Model() string              { return c.M }
func (c *Call) InputTokens() int           { return c.Input }
func (c *Call) MaxTokens() int             { return c.Max }
func (c *Call) Attempts() int              { return c.N }
func (c *Call) RouteFrom() int             { return c.From }
func (c *Call) RetryCost() float64         { return c.Retry }
func (c *Call) RouteCost() (float64, bool) { return c.Cost, c.Priced }
func (c *Call) RouteState() *any           { return &c.State }

func (c *Call) Note(n core.Note) {
	c.mu.Lock()
	c.Notes = append(c.Notes, n)
	c.mu.Unlock()
}

func (c *Call) StoreError(_ core.StorePart, _ string, err error) {
	if err != nil {
		c.mu.Lock()
		c.StoreErrors = append(c.StoreErrors, err)
		c.mu.Unlock()
	}
}

func (c *Call) Wait(after core.AttemptGate, until time.Time) (*core.Denial, bool) {
	now := c.Clock.Now()
	if !until.After(now) {
		return nil, false
	}
	if refused := c.LaterRefusal(after, now, until); refused != nil {
		return refused, false
	}
	return nil, c.Clock.Sleep(c.Context(), until.Sub(now)) != nil
}

func (c *Call) LaterRefusal(_ core.AttemptGate, now, until time.Time) *core.Denial {
	for _, g := range c.Later {
		if refused := g.RefusesAt(c, now, until); refused != nil {
			return refused
		}
	}
	return nil
}

// Env is an environment on clock whose services record nothing.
func Env(clock core.Clock) *core.Env { return &core.Env{Clock: clock, Services: Services{}} }

// Services record nothing and log nowhere.
type Services struct{}

func (Services) LogStoreError(context.Context, core.StorePart, string, error) {}
func (Services) Instruments(core.Outcome) any                                 { return nil }
func (Services) Attrs(kvs ...attribute.KeyValue) metric.MeasurementOption {
	return metric.WithAttributes(kvs...)
}
func (Services) With() []metric.ObserveOption                   { return nil }
func (Services) BackendLabel(string) (attribute.KeyValue, bool) { return attribute.KeyValue{}, false }
func (Services) Name() (attribute.KeyValue, bool)               { return attribute.KeyValue{}, false }
func (Services) GroupLabel(group string) string                 { return group }
func (Services) Logger() *slog.Logger                           { return nil }

// RealClock is the wall clock (inside a synctest bubble, the bubble's).
type RealClock = core.WallClock
