package damper

import "github.com/damper-ai/damper-go/internal/core"

// Names the engine keeps to itself, for the tests outside the package.
const (
	HeaderTimeout          = headerTimeout
	HeaderStainlessTimeout = headerStainlessTimeout
	HeaderAttempts         = headerAttempts
	HeaderOutcome          = headerOutcome
	HeaderRetryCost        = headerRetryCost
)

const SkipNoModelID = skipNoModelID

var (
	ParseRetryAfter = core.ParseRetryAfter
	ModelFamily     = modelFamily
	Classify        = classifyFailure
)
