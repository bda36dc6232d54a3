package engine

import (
	"context"
	"time"

	"github.com/damper-ai/damper-go/internal/core"
)

// gateCall is a call as its gates see it (core.Call): the call itself,
// under a type of its own, so that the gates' view of it is one place.
type gateCall call

// keepGoing returns ctx without its cancellation for a part's store
// (core.KeepGoing).
func keepGoing(ctx context.Context, part any) context.Context { return core.KeepGoing(ctx, part) }

// forGates is c as its gates see it.
func (c *call) forGates() core.Call { return (*gateCall)(c) }

func (g *gateCall) Context() context.Context { return g.ctx }
func (g *gateCall) Tenant() *core.Tenant     { return g.tenant.forGates() }
func (g *gateCall) Model() string            { return g.route.model }
func (g *gateCall) InputTokens() int         { return g.inputTokens }
func (g *gateCall) MaxTokens() int           { return g.maxTokens }
func (g *gateCall) Attempts() int            { return g.report.Attempts }
func (g *gateCall) RouteFrom() int           { return g.routeFrom }
func (g *gateCall) RetryCost() float64       { return g.retryCost }
func (g *gateCall) RouteState() *any         { return &g.route.gateState }

func (g *gateCall) RouteCost() (float64, bool) { return g.route.cost, g.route.priced }

func (g *gateCall) Note(n core.Note) { g.report.note(n) }

func (g *gateCall) StoreError(part core.StorePart, op string, err error) {
	(*call)(g).storeError(part, op, err)
}

func (g *gateCall) Wait(after core.AttemptGate, until time.Time) (*core.Denial, bool) {
	return waitUntil((*call)(g), after, until)
}

func (g *gateCall) LaterRefusal(after core.AttemptGate, now, until time.Time) *core.Denial {
	return laterRefusal((*call)(g), after, now, until)
}
