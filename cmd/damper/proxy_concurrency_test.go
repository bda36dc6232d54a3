package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The proxy's file takes the concurrency limit under its policy, and names
// the key of a bad value.
func TestProxyConcurrencySettings(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	s, err := parseProxy([]string{"-config", write("good.yaml", "policy:\n  concurrency:\n    adaptive: true\n    max_wait: 500ms\n")}, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c := s.policy.Concurrency; c == nil || !c.Adaptive || c.MaxWait != 500*time.Millisecond {
		t.Errorf("policy.concurrency read as %+v", c)
	}
	_, err = parseProxy([]string{"-config", write("bad.yaml", "policy:\n  concurrency: {max: 0}\n")}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "policy.concurrency.max: 0") {
		t.Errorf("a fixed limit without max: %v, want an error naming policy.concurrency.max", err)
	}
}
