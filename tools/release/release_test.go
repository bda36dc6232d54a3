package main

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/mod/modfile"

	"github.com/damper-ai/damper-go/tools/internal/modules"
)

// repoRoot is the checkout these tests run in.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.work")); err != nil {
		t.Fatalf("the repository's root is not two directories up: %v", err)
	}
	return root
}

// TestNoPublishedGoModHasAReplace: no go.mod of the repository holds a
// replace (the go command refuses to go install from a module with one,
// and a user's build ignores it), the modules require each other at one
// version, go.work uses every module and replaces that version of the
// required ones by the work tree, and the list of modules the release
// tags is every go.mod there is.
func TestNoPublishedGoModHasAReplace(t *testing.T) {
	root := repoRoot(t)
	var found []string
	version := ""
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (d.Name() == "node_modules" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) {
			return filepath.SkipDir
		}
		if d.Name() != "go.mod" {
			return nil
		}
		dir, _ := filepath.Rel(root, filepath.Dir(path))
		dir = filepath.ToSlash(dir)
		found = append(found, dir)
		f, err := modules.ReadMod(filepath.Dir(path))
		if err != nil {
			t.Error(err)
			return nil
		}
		for _, r := range f.Require {
			if _, ok := modules.Internal(r.Mod.Path); ok && version == "" {
				version = r.Mod.Version
			}
		}
		for _, p := range modules.CheckMod(f, version) {
			t.Error(p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, m := range modules.List {
		want = append(want, m.Dir)
		if m.Path != "github.com/damper-ai/damper-go" && m.Path != "github.com/damper-ai/damper-go/"+m.Dir {
			t.Errorf("module %s is not at its path's directory %s", m.Path, m.Dir)
		}
	}
	want = append(want, "tools")
	slices.Sort(found)
	slices.Sort(want)
	if !slices.Equal(found, want) {
		t.Errorf("go.mod files in %v, want the repository's modules and tools: %v", found, want)
	}
	if version == "" {
		t.Fatal("no module requires another")
	}
	problems, err := modules.CheckWork(root, version)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
}

// TestCheckModFindsAReplace: the check above fails on a go.mod with a
// replace or a require at another version.
func TestCheckModFindsAReplace(t *testing.T) {
	f, err := modfile.Parse("go.mod", []byte("module github.com/damper-ai/damper-go/redisstore\n\ngo 1.26.0\n\nrequire github.com/damper-ai/damper-go v0.3.0\n\nreplace github.com/damper-ai/damper-go => ../\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	got := modules.CheckMod(f, "v0.4.0")
	want := []string{
		"github.com/damper-ai/damper-go/redisstore's go.mod replaces github.com/damper-ai/damper-go: the go command refuses to install from a module with a replace, and the workspace (go.work) already builds the modules against each other",
		"github.com/damper-ai/damper-go/redisstore's go.mod requires github.com/damper-ai/damper-go v0.3.0, not v0.4.0 like the other modules",
	}
	if !slices.Equal(got, want) {
		t.Errorf("CheckMod:\n%q\nwant\n%q", got, want)
	}
}

func TestCheckVersion(t *testing.T) {
	for _, v := range []string{"v0.4.0", "v1.0.0", "v0.10.2", "v0.4.0-rc.1"} {
		if err := modules.CheckVersion(v); err != nil {
			t.Errorf("CheckVersion(%q): %v", v, err)
		}
	}
	for v, want := range map[string]string{
		"0.4.0":        `version "0.4.0" is not of the form vX.Y.Z (such as v0.4.0, or v0.4.0-rc.1)`,
		"v0.4":         `version "v0.4" is not of the form vX.Y.Z (such as v0.4.0, or v0.4.0-rc.1)`,
		"v0.04.0":      `version "v0.04.0" is not of the form vX.Y.Z (such as v0.4.0, or v0.4.0-rc.1)`,
		"v0.4.0+build": `version "v0.4.0+build" is not of the form vX.Y.Z (such as v0.4.0, or v0.4.0-rc.1)`,
		"":             `version "" is not of the form vX.Y.Z (such as v0.4.0, or v0.4.0-rc.1)`,
		"v2.0.0":       `version "v2.0.0": a major version above v1 needs the suffix /v2 in every module path first`,
	} {
		if err := modules.CheckVersion(v); err == nil || err.Error() != want {
			t.Errorf("CheckVersion(%q) = %v, want %s", v, err, want)
		}
	}
}

// stagedRepo is a git repository in a temporary directory holding what
// the checkout would commit, committed.
func stagedRepo(t *testing.T) string {
	t.Helper()
	for k, v := range map[string]string{
		"GIT_AUTHOR_NAME": "release test", "GIT_AUTHOR_EMAIL": "release@test.invalid",
		"GIT_COMMITTER_NAME": "release test", "GIT_COMMITTER_EMAIL": "release@test.invalid",
		"GIT_CONFIG_GLOBAL": os.DevNull, "GIT_CONFIG_NOSYSTEM": "1",
	} {
		t.Setenv(k, v)
	}
	src := filepath.Join(t.TempDir(), "src")
	if err := modules.Stage(repoRoot(t), src); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"init", "-q"}, {"add", "-A"}, {"commit", "-q", "-m", "the checkout"}} {
		if _, err := modules.Git(src, args...); err != nil {
			t.Fatal(err)
		}
	}
	return src
}

// TestReleaseRefuses: a bad version, a tree with changes not committed and
// a tag that exists already are refused, with the tree left as it was.
func TestReleaseRefuses(t *testing.T) {
	src := stagedRepo(t)
	var out bytes.Buffer
	if err := release(src, "v0.4", false, &out); err == nil || !strings.Contains(err.Error(), `version "v0.4" is not of the form vX.Y.Z`) {
		t.Errorf("bad version: %v", err)
	}
	if err := os.WriteFile(filepath.Join(src, "NOTES"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := release(src, "v0.4.0", false, &out); err == nil || !strings.Contains(err.Error(), "has changes not committed") || !strings.Contains(err.Error(), "?? NOTES") {
		t.Errorf("dirty tree: %v", err)
	}
	os.Remove(filepath.Join(src, "NOTES"))
	if _, err := modules.Git(src, "tag", "redisstore/v0.4.0"); err != nil {
		t.Fatal(err)
	}
	if err := release(src, "v0.4.0", false, &out); err == nil || err.Error() != "tag redisstore/v0.4.0 exists already: a released version is never moved" {
		t.Errorf("existing tag: %v", err)
	}
	if err := release(src, "v0.5.0", true, &out); err != nil {
		t.Fatal(err)
	}
	if want := "would commit that and tag: v0.5.0 redisstore/v0.5.0 cmd/damper/v0.5.0\n"; !strings.HasSuffix(out.String(), want) {
		t.Errorf("dry run printed\n%s\nwant it to end with\n%s", out.String(), want)
	}
	if status, err := modules.Git(src, "status", "--porcelain"); err != nil || status != "" {
		t.Errorf("the tree changed: %q %v", status, err)
	}
	if tags, err := modules.Git(src, "tag", "-l"); err != nil || tags != "redisstore/v0.4.0\n" {
		t.Errorf("tags: %q %v", tags, err)
	}
}
