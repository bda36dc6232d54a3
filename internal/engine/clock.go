package engine

import "github.com/damper-ai/damper-go/internal/core"

// realClock is the wall clock.
type realClock = core.WallClock
