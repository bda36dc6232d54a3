package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/module"
	"golang.org/x/mod/sumdb/dirhash"
	modzip "golang.org/x/mod/zip"

	"github.com/damper-ai/damper-go/tools/internal/modules"
)

// TestGoInstallFromAModuleProxy: the checkout, released by the release
// command at a test version in a copy, serves its published modules from
// a module proxy in a directory, made from the tags as the public proxy
// makes them (git archive of the tag, the root's LICENSE in a nested
// module); the go.sum lines the release wrote match those zips; and
// go install github.com/damper-ai/damper-go/cmd/damper@version, from a
// fresh GOPATH outside any module, installs a damper whose version names
// the modules at that version and whose demo runs.
//
// The module cache is the machine's, so that the third-party modules are
// not downloaded again; the test version is new on each run, so no
// earlier run's modules can stand in for this one's, and the test removes
// its own from the cache at the end.
func TestGoInstallFromAModuleProxy(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the damper command from a module proxy: a minute or more")
	}
	src := stagedRepo(t)
	version := fmt.Sprintf("v0.999.0-installtest.%d", time.Now().UnixNano())
	var out bytes.Buffer
	if err := release(src, version, false, &out); err != nil {
		t.Fatalf("release: %v", err)
	}
	t.Logf("release:\n%s", out.String())

	work := t.TempDir()
	proxy := filepath.Join(work, "proxy")
	zips := map[string]string{}
	for _, m := range modules.List {
		if !m.Published {
			continue
		}
		tag := m.Tag(version)
		subdir := ""
		if m.Dir != "." {
			subdir = m.Dir
		}
		esc, err := module.EscapePath(m.Path)
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(proxy, filepath.FromSlash(esc), "@v")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		zipPath := filepath.Join(dir, version+".zip")
		f, err := os.Create(zipPath)
		if err != nil {
			t.Fatal(err)
		}
		if err := modzip.CreateFromVCS(f, module.Version{Path: m.Path, Version: version}, src, tag, subdir); err != nil {
			t.Fatalf("zip of %s: %v", m.Path, err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		zips[m.Path] = zipPath
		gomod, err := modules.Git(src, "show", tag+":"+strings.TrimPrefix(subdir+"/go.mod", "/"))
		if err != nil {
			t.Fatal(err)
		}
		when, err := modules.Git(src, "log", "-1", "--format=%cI", tag)
		if err != nil {
			t.Fatal(err)
		}
		ct, err := time.Parse(time.RFC3339, strings.TrimSpace(when))
		if err != nil {
			t.Fatal(err)
		}
		info, _ := json.Marshal(map[string]any{"Version": version, "Time": ct.UTC()})
		for name, data := range map[string]string{version + ".mod": gomod, version + ".info": string(info), "list": version + "\n"} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}

	// The release's go.sum lines are the hashes of what the proxy serves.
	sum, err := modules.Git(src, "show", modules.List[2].Tag(version)+":cmd/damper/go.sum")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range modules.List[:2] {
		h, err := dirhash.HashZip(zips[m.Path], dirhash.Hash1)
		if err != nil {
			t.Fatal(err)
		}
		if line := m.Path + " " + version + " " + h + "\n"; !strings.Contains(sum, line) {
			t.Errorf("cmd/damper/go.sum at its tag has no line %q", line)
		}
	}

	goEnv := func(name string) string {
		v, err := exec.Command("go", "env", name).Output()
		if err != nil {
			t.Fatalf("go env %s: %v", name, err)
		}
		return strings.TrimSpace(string(v))
	}
	modcache, upstream := goEnv("GOMODCACHE"), goEnv("GOPROXY")
	t.Cleanup(func() { forget(modcache, version) })
	gopath, bin := filepath.Join(work, "gopath"), filepath.Join(work, "bin")
	env := []string{
		"GOWORK=off",
		"GOFLAGS=-mod=mod -modcacherw",
		"GOPROXY=file://" + filepath.ToSlash(proxy) + "," + upstream,
		"GONOSUMDB=github.com/damper-ai/*",
		"GONOPROXY=", "GOPRIVATE=", "GOINSECURE=",
		"GOPATH=" + gopath, "GOBIN=" + bin, "GOMODCACHE=" + modcache,
		"GOTOOLCHAIN=local",
	}
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()
	runIn := func(dir string, env []string, name string, args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), env...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		start := time.Now()
		if err := cmd.Run(); err != nil {
			t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, stdout.String(), stderr.String())
		}
		t.Logf("%s %s: %v", filepath.Base(name), strings.Join(args, " "), time.Since(start).Round(time.Millisecond))
		return stdout.String()
	}
	runIn(work, env, "go", "install", "github.com/damper-ai/damper-go/cmd/damper@"+version)

	damper := filepath.Join(bin, "damper")
	got := runIn(work, env, damper, "version")
	for _, want := range []string{
		"damper   github.com/damper-ai/damper-go/cmd/damper " + version + "\n",
		"dep      github.com/damper-ai/damper-go " + version + "\n",
		"dep      github.com/damper-ai/damper-go/redisstore " + version + "\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("damper version has no line %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "=>") {
		t.Errorf("damper version names a replacement:\n%s", got)
	}
	if demo := runIn(work, env, damper, "demo"); !strings.Contains(demo, "PASS: Damper's amplification") {
		t.Errorf("damper demo:\n%s", demo)
	}

	// go install checks the modules against the checksum database alone;
	// a build in the released module itself checks them against its
	// go.sum, which must hold every line it needs, the modules' own among
	// them.
	readonly := append(env[:len(env):len(env)], "GOFLAGS=-mod=readonly -modcacherw")
	runIn(filepath.Join(src, "cmd", "damper"), readonly, "go", "build", "-o", filepath.Join(work, "damper-from-tag"), ".")
}

// forget removes the published modules at version from the module cache
// modcache: their files, their line in the cache's version lists, and the
// directories that leaves empty.
func forget(modcache, version string) {
	removeEmpty := func(dir string) {
		for dir != modcache && strings.HasPrefix(dir, modcache) && os.Remove(dir) == nil {
			dir = filepath.Dir(dir)
		}
	}
	for _, m := range modules.List {
		if !m.Published {
			continue
		}
		esc, err := module.EscapePath(m.Path)
		if err != nil {
			continue
		}
		extracted := filepath.Join(modcache, filepath.FromSlash(esc)+"@"+version)
		os.RemoveAll(extracted)
		removeEmpty(filepath.Dir(extracted))
		dl := filepath.Join(modcache, "cache", "download", filepath.FromSlash(esc), "@v")
		matches, _ := filepath.Glob(filepath.Join(dl, version+".*"))
		for _, name := range matches {
			os.Remove(name)
		}
		if data, err := os.ReadFile(filepath.Join(dl, "list")); err == nil {
			var keep []string
			for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
				if l != "" && l != version {
					keep = append(keep, l)
				}
			}
			if len(keep) == 0 {
				os.Remove(filepath.Join(dl, "list"))
			} else {
				os.WriteFile(filepath.Join(dl, "list"), []byte(strings.Join(keep, "\n")+"\n"), 0o644)
			}
		}
		removeEmpty(dl)
	}
}
