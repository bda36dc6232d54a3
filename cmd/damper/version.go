package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"
)

// versionDeps are the modules damper version names, in the order shown:
// the library, and what decides how it calls and what it reports.
var versionDeps = []string{
	"github.com/damper-ai/damper-go",
	"github.com/damper-ai/damper-go/redisstore",
	"github.com/anthropics/anthropic-sdk-go/v2",
	"go.opentelemetry.io/otel",
	"go.opentelemetry.io/otel/sdk/metric",
	"github.com/redis/go-redis/v9",
}

func runVersion(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		if args[0] == "-h" || args[0] == "-help" || args[0] == "--help" {
			fmt.Fprint(stdout, "Usage: damper version\n\nPrints the command's module version, the commit it was built from (and\nwhether the tree had changes), the Go version, and the versions of its\nkey dependencies.\n")
			return exitOK
		}
		fmt.Fprintf(stderr, "damper version: takes no arguments, got %q\n", args)
		return exitUsage
	}
	bi, ok := debug.ReadBuildInfo()
	fmt.Fprint(stdout, versionText(bi, ok))
	return exitOK
}

// versionText is what damper version prints for the build information bi.
func versionText(bi *debug.BuildInfo, ok bool) string {
	var b strings.Builder
	if !ok || bi == nil {
		fmt.Fprintf(&b, "damper: no build information (a binary built without module support)\ngo       %s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
		return b.String()
	}
	fmt.Fprintf(&b, "damper   %s %s\n", bi.Main.Path, orDevel(bi.Main.Version))
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	if rev := settings["vcs.revision"]; rev != "" {
		line := rev
		if t := settings["vcs.time"]; t != "" {
			line += " " + t
		}
		if settings["vcs.modified"] == "true" {
			line += " (modified)"
		}
		fmt.Fprintf(&b, "commit   %s\n", line)
	} else {
		fmt.Fprintf(&b, "commit   unknown (built outside a checkout, or with -buildvcs=false)\n")
	}
	goVersion := bi.GoVersion
	if goVersion == "" {
		goVersion = runtime.Version()
	}
	fmt.Fprintf(&b, "go       %s %s/%s\n", goVersion, runtime.GOOS, runtime.GOARCH)
	for _, path := range versionDeps {
		for _, d := range bi.Deps {
			if d.Path != path {
				continue
			}
			v := orDevel(d.Version)
			if d.Replace != nil {
				v += " => " + d.Replace.Path
				if d.Replace.Version != "" {
					v += " " + d.Replace.Version
				}
			}
			fmt.Fprintf(&b, "dep      %s %s\n", d.Path, v)
		}
	}
	return b.String()
}

func orDevel(v string) string {
	if v == "" {
		return "(devel)"
	}
	return v
}
