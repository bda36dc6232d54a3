package damper

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestNestedModulesImportNoInternal: no nested module (a directory with a
// go.mod of its own: the command, the Redis store, the examples, the
// benchmarks, the tools) imports the library module's internal packages
// from the code it publishes. Go checks an internal import by path alone,
// so the nested module would build, yet its version would be tied to the
// library's internals by nothing its go.mod states: what they share is a
// public package of the library (conf, fleet, dampertest) or a copy of
// the module's own. Tests are not published with the code an importer
// builds, and may use the library's test helpers (internal/redistest).
func TestNestedModulesImportNoInternal(t *testing.T) {
	const internal = "github.com/damper-ai/damper-go/internal"
	modules := nestedModules(t, ".")
	if !slices.Contains(modules, "cmd/damper") {
		t.Fatalf("found the nested modules %q, not cmd/damper's", modules)
	}
	fset := token.NewFileSet()
	for _, m := range modules {
		err := filepath.WalkDir(m, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if p != m && (skipDir(p) || isModule(p)) { // a module of its own is checked as one
					return filepath.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
				return nil
			}
			f, err := parser.ParseFile(fset, p, nil, parser.ImportsOnly)
			if err != nil {
				return err
			}
			for _, imp := range f.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				if path == internal || strings.HasPrefix(path, internal+"/") {
					t.Errorf("module %s: %s imports %s, the library module's internal package", m, filepath.ToSlash(p), path)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// nestedModules returns the directories below root with a go.mod of their
// own, slash-separated.
func nestedModules(t *testing.T, root string) []string {
	t.Helper()
	var modules []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() || p == root {
			return nil
		}
		if skipDir(p) {
			return filepath.SkipDir
		}
		if isModule(p) {
			modules = append(modules, filepath.ToSlash(p))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return modules
}

// skipDir reports whether directory p holds no module's code: testdata,
// node_modules, and hidden directories (.git).
func skipDir(p string) bool {
	name := filepath.Base(p)
	return name == "testdata" || name == "node_modules" || strings.HasPrefix(name, ".")
}

// isModule reports whether directory p has a go.mod.
func isModule(p string) bool {
	_, err := os.Stat(filepath.Join(p, "go.mod"))
	return err == nil
}

// maxFileLines bounds a production file: past it a file holds more than
// one concern, and is split by them.
const maxFileLines = 600

// TestNoProductionFileTooLong: no Go file of any module but a test, a
// fixture or generated code is longer than maxFileLines.
func TestNoProductionFileTooLong(t *testing.T) {
	checked := 0
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != "." && (d.Name() == "testdata" || d.Name() == "node_modules" || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if strings.Contains(string(b), "\n// Code generated ") {
			return nil
		}
		checked++
		if n := strings.Count(string(b), "\n"); n > maxFileLines {
			t.Errorf("%s has %d lines, over %d: split it by concern", p, n, maxFileLines)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 100 {
		t.Fatalf("checked %d production files; the walk missed the tree", checked)
	}
}
