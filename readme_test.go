package damper_test

import (
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestREADMELayout: the README's layout table names every directory of
// the repository, or one above it, and every file of the root package.
func TestREADMELayout(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(readme), "\n## Layout\n")
	if !ok {
		t.Fatal("README.md has no Layout section")
	}
	table, _, _ = strings.Cut(table, "\n## ")
	var listed []string // the table's paths: files, globs and directories ending in /
	for _, line := range strings.Split(table, "\n") {
		first, _, _ := strings.Cut(strings.TrimPrefix(line, "| "), " | ")
		for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(first, -1) {
			listed = append(listed, m[1])
		}
	}
	covered := func(p string, dir bool) bool {
		for _, l := range listed {
			if dir && (l == p+"/" || strings.HasPrefix(p+"/", l) && strings.HasSuffix(l, "/")) {
				return true
			}
			if m, _ := path.Match(l, p); !dir && m {
				return true
			}
		}
		return false
	}
	err = filepath.WalkDir(".", func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		p = filepath.ToSlash(p)
		switch {
		case p == ".":
			return nil
		case e.IsDir() && (p == ".git" || e.Name() == "testdata" || e.Name() == "node_modules"):
			return filepath.SkipDir
		case e.IsDir() && covered(p, true):
			return filepath.SkipDir // a listed directory's row speaks for its contents
		case e.IsDir():
			for _, l := range listed {
				if strings.HasPrefix(l, p+"/") {
					return nil // listed below: each of its directories must be
				}
			}
			t.Errorf("the layout table names no %s/", p)
			return filepath.SkipDir
		case !strings.Contains(p, "/") && strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, "_test.go"):
			if !covered(p, false) {
				t.Errorf("the layout table names no %s", p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
