package main

import (
	"bytes"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

// TestVersionText: damper version names the module and its version, the
// commit, its time and whether the tree was modified, the Go version, and
// the key dependencies with their replacements, in a fixed order.
func TestVersionText(t *testing.T) {
	bi := &debug.BuildInfo{
		GoVersion: "go1.26.8",
		Main:      debug.Module{Path: "github.com/damper-ai/damper-go/cmd/damper", Version: "v0.4.0"},
		Deps: []*debug.Module{
			{Path: "github.com/redis/go-redis/v9", Version: "v9.23.0"},
			{Path: "github.com/anthropics/anthropic-sdk-go/v2", Version: "v2.15.0"},
			{Path: "go.opentelemetry.io/otel", Version: "v1.47.0"},
			{Path: "go.opentelemetry.io/otel/trace", Version: "v1.47.0"},
			{Path: "github.com/damper-ai/damper-go", Version: "v0.0.0", Replace: &debug.Module{Path: "../.."}},
		},
		Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "0123456789abcdef"},
			{Key: "vcs.time", Value: "2026-05-01T10:00:00Z"},
			{Key: "vcs.modified", Value: "true"},
		},
	}
	want := `damper   github.com/damper-ai/damper-go/cmd/damper v0.4.0
commit   0123456789abcdef 2026-05-01T10:00:00Z (modified)
go       go1.26.8 ` + runtime.GOOS + "/" + runtime.GOARCH + `
dep      github.com/damper-ai/damper-go v0.0.0 => ../..
dep      github.com/anthropics/anthropic-sdk-go/v2 v2.15.0
dep      go.opentelemetry.io/otel v1.47.0
dep      github.com/redis/go-redis/v9 v9.23.0
`
	if got := versionText(bi, true); got != want {
		t.Errorf("versionText:\n%s\nwant:\n%s", got, want)
	}
	bi.Settings, bi.Main.Version = nil, ""
	if got := versionText(bi, true); !strings.Contains(got, "cmd/damper (devel)\ncommit   unknown") {
		t.Errorf("without VCS information:\n%s", got)
	}
	if got := versionText(nil, false); !strings.Contains(got, "no build information") {
		t.Errorf("without build information:\n%s", got)
	}

	// The command itself: this test binary's own build information.
	var out, errb bytes.Buffer
	if code := run([]string{"version"}, &out, &errb); code != exitOK || !strings.Contains(out.String(), "go       "+runtime.Version()) ||
		!strings.Contains(out.String(), "dep      github.com/anthropics/anthropic-sdk-go/v2 v2.") {
		t.Errorf("damper version: %d\n%s%s", code, out.String(), errb.String())
	}
	if code := run([]string{"version", "extra"}, &out, &errb); code != exitUsage {
		t.Errorf("damper version extra: exit %d, want %d", code, exitUsage)
	}
}
