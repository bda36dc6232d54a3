package redisstore_test

import (
	"os"
	"testing"
)

// TestMain runs a fleet worker instead of the tests when the test binary
// was started as one (see fleet_test.go).
func TestMain(m *testing.M) {
	if spec := os.Getenv(workerEnv); spec != "" {
		os.Exit(runWorker(spec))
	}
	os.Exit(m.Run())
}
