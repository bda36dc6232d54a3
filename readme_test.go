package damper_test

import (
	"os"
	"path/filepath"
	"regexp"
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

// TestREADMEBrownoutFigures: the README's brownout table quotes
// docs/BENCHMARKS.md, which the simulator regenerates: every figure in it
// is one the benchmarks show.
func TestREADMEBrownoutFigures(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	bench, err := os.ReadFile(filepath.Join("docs", "BENCHMARKS.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(readme), "\n| incident |")
	if !ok {
		t.Fatal("README.md has no brownout table (a header starting | incident |)")
	}
	table, _, _ = strings.Cut(table, "\n\n")
	figures := regexp.MustCompile(`\d+\.\d+`).FindAllString(table, -1)
	if len(figures) < 9 {
		t.Fatalf("the brownout table has %d figures, want at least 9:\n%s", len(figures), table)
	}
	for _, f := range figures {
		if !regexp.MustCompile(`(^|[^\d.])` + regexp.QuoteMeta(f) + `([^\d]|$)`).Match(bench) {
			t.Errorf("README.md's brownout table has %s, which docs/BENCHMARKS.md does not", f)
		}
	}
}
