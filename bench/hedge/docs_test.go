package hedge

import (
	"os"
	"path/filepath"
	"testing"
)

func TestRewriteSection(t *testing.T) {
	path := filepath.Join(t.TempDir(), "BENCHMARKS.md")
	orig := "# Benchmarks\n\n## Brownout\n\ntext\n\n## Streaming\n\nmore\n"
	if err := os.WriteFile(path, []byte(orig), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{"first\n", "second\n\n### sub\n\nrest\n"} {
		if err := RewriteSection(path, Heading+"\n\n"+body); err != nil {
			t.Fatal(err)
		}
		got, _ := os.ReadFile(path)
		want := "# Benchmarks\n\n## Brownout\n\ntext\n\n" + Heading + "\n\n" + body + "\n## Streaming\n\nmore\n"
		if string(got) != want {
			t.Errorf("got\n%s\nwant\n%s", got, want)
		}
	}
	if err := RewriteSection(filepath.Join(t.TempDir(), "missing.md"), Heading); err == nil {
		t.Error("no error for a missing file")
	}
}
