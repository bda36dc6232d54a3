package damper

import (
	"net/http"

	"github.com/damper-ai/damper-go/internal/core"
	"github.com/damper-ai/damper-go/internal/engine"
)

// Names the engine keeps to itself, for the tests outside the package.
const (
	HeaderTimeout          = headerTimeout
	HeaderStainlessTimeout = headerStainlessTimeout
	HeaderAttempts         = headerAttempts
	HeaderOutcome          = headerOutcome
	HeaderRetryCost        = headerRetryCost
)

const SkipNoModelID = engine.SkipNoModelIDForTest

var (
	ParseRetryAfter = core.ParseRetryAfter
	ModelFamily     = engine.ModelFamilyForTest
	Classify        = engine.ClassifyForTest
	// LimitGroupForTest and DefaultModelIDForTest are the rules the
	// guides state in words: a model's limit group and its platform IDs.
	LimitGroupForTest     = engine.LimitGroup
	DefaultModelIDForTest = engine.DefaultModelID
)

// SignedByForTest lets the platform tests of package damper_test see where
// Damper would tell the caller to move its option, for the request Damper
// sees.
func SignedByForTest(req *http.Request) string { return engine.SignedBy(req) }
