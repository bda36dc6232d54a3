package engine

import (
	"slices"

	"github.com/damper-ai/damper-go/internal/core"
)

// Hooks for the root package's tests of its adapters over engine
// internals; nothing else calls them.

// AddGateForTest places e last in the gate list, for a test of a gate
// added by one line; restore puts the list back. Not safe to call while
// a Damper is being made.
func AddGateForTest(e core.Entry[Policy]) (restore func()) {
	saved := gateList
	gateList = append(slices.Clip(gateList), e)
	return func() { gateList = saved }
}

// ConcurrencyHeldForTest is the slots held, and the attempts waiting, on
// the primary's concurrency limit, for a test that a call through an
// adapter gives its slot back.
func (d *Damper) ConcurrencyHeldForTest() (held, waiting int) { return d.primary.conc.Held() }

// SkipNoModelIDForTest is the Reason of a Skip whose backend has no ID
// for the model, for the root package's tests.
const SkipNoModelIDForTest = skipNoModelID

// ModelFamilyForTest and ClassifyForTest are the engine's model family
// and built-in verdict on a failure, for the root package's tests.
var (
	ModelFamilyForTest = modelFamily
	ClassifyForTest    = classifyFailure
)
