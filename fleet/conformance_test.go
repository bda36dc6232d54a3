package fleet_test

import (
	"testing"

	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/fleet/fleettest"
)

// TestMemoryStoreConformance: MemoryStore keeps the contract of every
// part; each value it makes is its own, so each store is a fleet of one.
func TestMemoryStoreConformance(t *testing.T) {
	fleettest.Run(t, func(*testing.T) fleet.Store { return fleet.MemoryStore{} }, fleettest.Options{})
}
