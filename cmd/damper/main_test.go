package main

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

// TestMain runs the damper command with the binary's arguments instead of
// the tests when the environment says so (see startProxyProcess), so that
// a test can start proxies as processes of their own without building a
// binary.
func TestMain(m *testing.M) {
	if os.Getenv(runAsDamperEnv) == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	// The vertex package's Google libraries start opencensus's worker
	// when imported, once, for the life of the process.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"))
}

// TestUsage: help asked for goes to stdout with status 0, from damper and
// from each of its commands alike; a bad command line goes to stderr with
// status 2, and nothing to stdout.
func TestUsage(t *testing.T) {
	tests := []struct {
		args     []string
		code     int
		out, err string
	}{
		{nil, exitUsage, "", "Commands:"},
		{[]string{"help"}, exitOK, "go run ./cmd/damper demo", ""},
		{[]string{"-h"}, exitOK, "Commands:", ""},
		{[]string{"--help"}, exitOK, "scenarios", ""},
		{[]string{"help", "demo"}, exitOK, "Usage: damper demo", ""},
		{[]string{"help", "scenarios"}, exitOK, "Usage: damper scenarios", ""},
		{[]string{"help", "proxy"}, exitOK, "Usage: damper proxy", ""},
		{[]string{"demo", "-h"}, exitOK, "Usage: damper demo", ""},
		{[]string{"scenarios", "--help"}, exitOK, "Usage: damper scenarios", ""},
		{[]string{"proxy", "-help"}, exitOK, "Usage: damper proxy", ""},
		{[]string{"frobnicate"}, exitUsage, "", `unknown command "frobnicate"`},
		{[]string{"demo", "--frobnicate"}, exitUsage, "", "flag provided but not defined: -frobnicate\nUsage: damper demo"},
		{[]string{"scenarios", "--frobnicate"}, exitUsage, "", "flag provided but not defined: -frobnicate\nUsage: damper scenarios"},
		{[]string{"proxy", "--frobnicate"}, exitUsage, "", "flag provided but not defined: -frobnicate\nUsage: damper proxy"},
		{[]string{"demo", "extra"}, exitUsage, "", "Usage: damper demo"},
		{[]string{"help", "fake"}, exitOK, "Usage: damper fake", ""},
		{[]string{"fake", "--frobnicate"}, exitUsage, "", "flag provided but not defined: -frobnicate\nUsage: damper fake"},
		{[]string{"version", "-h"}, exitOK, "Usage: damper version", ""},
	}
	for _, tt := range tests {
		var out, errb bytes.Buffer
		if code := run(tt.args, &out, &errb); code != tt.code {
			t.Errorf("damper %q: exit %d, want %d", tt.args, code, tt.code)
		}
		// The stream that is not written to stays empty.
		if !strings.Contains(out.String(), tt.out) || !strings.Contains(errb.String(), tt.err) ||
			(tt.out == "") != (out.Len() == 0) || (tt.err == "") != (errb.Len() == 0) {
			t.Errorf("damper %q: stdout %q, stderr %q; want them to hold %q and %q, and nothing else", tt.args, out.String(), errb.String(), tt.out, tt.err)
		}
	}
}
