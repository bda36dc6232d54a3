package engine

import (
	"context"

	"github.com/damper-ai/damper-go/internal/core"
)

// What the adapters in front of the engine (the root package's SDK option
// and proxy) read of a Damper, beyond what a call hands back.

// Clock is the clock the Damper reads time and waits on, for the
// adapters' own deadlines.
func (d *Damper) Clock() Clock { return d.clock }

// MaxEventBytes is Policy.MaxEventBytes, the bound of one SSE event, for
// the proxy's pass-through of a stream.
func (d *Damper) MaxEventBytes() int { return d.policy.MaxEventBytes }

// FirstFallback is the name of the Damper's first fallback backend, ""
// when it has none, for the proxy's check of its key mode.
func (d *Damper) FirstFallback() string {
	if len(d.fallbacks) == 0 {
		return ""
	}
	return d.fallbacks[0].name
}

// LogStoreError logs a store's error as the engine does its own, for an
// adapter that reads a store (the proxy's spend check at its door).
func (d *Damper) LogStoreError(ctx context.Context, part core.StorePart, op string, err error) {
	d.tel.logStoreError(ctx, part, op, err)
}
