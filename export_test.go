package damper

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
	ParseRetryAfter = parseRetryAfter
	ModelFamily     = modelFamily
	Classify        = classifyFailure
)
