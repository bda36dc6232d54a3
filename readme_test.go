package damper_test

import (
	"os"
	"strings"
	"testing"
)

// TestREADMELength: the README is a landing page; the reference lives in
// the guides under docs/guide.
func TestREADMELength(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	const most = 350
	if n := strings.Count(string(readme), "\n"); n > most || n == 0 {
		t.Errorf("README.md has %d lines; want at most %d (move the detail to a guide under docs/guide)", n, most)
	}
}
