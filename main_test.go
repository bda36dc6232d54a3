package damper_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/damper-ai/damper-go/dampertest/vertexclient"
)

func TestMain(m *testing.M) {
	// The SDK's vertex package, which the fake Vertex's client links,
	// starts a goroutine at init that never ends.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction(vertexclient.InitGoroutine))
}
