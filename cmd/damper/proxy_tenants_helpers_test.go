package main

import (
	"testing"

	"github.com/damper-ai/damper-go"
)

// upstreamKey is the operator's key for the upstream in key mode.
const upstreamKey = "sk-ant-api03-operatorupstreamsecret"

// upstreamKeyEnv holds upstreamKey for the files of key mode.
const upstreamKeyEnv = "DAMPER_TEST_UPSTREAM_KEY"

// tenantsYAML is a file's tenants in key mode: one tenant, "svc", whose
// key is testKey, and the operator's upstream key from upstreamKeyEnv.
var tenantsYAML = "upstream_api_key_env: " + upstreamKeyEnv + "\ntenants:\n  - {name: svc, key_sha256: ['" + damper.ClientKeyHash(testKey) + "']}\n"

// keyMode puts settings in key mode: tenantsYAML's, read.
func keyMode(s *proxySettings) {
	s.tenants = []damper.Tenant{{Name: "svc", KeySHA256: []string{damper.ClientKeyHash(testKey)}}}
	s.upstreamKey = upstreamKey
}

// setUpstreamKey sets upstreamKeyEnv for a file of tenantsYAML.
func setUpstreamKey(t *testing.T) {
	t.Helper()
	t.Setenv(upstreamKeyEnv, upstreamKey)
}
