package main

import (
	"bytes"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestUsage(t *testing.T) {
	tests := []struct {
		args     []string
		code     int
		out, err string
	}{
		{nil, exitUsage, "", "Commands:"},
		{[]string{"help"}, exitOK, "go run ./cmd/damper demo", ""},
		{[]string{"--help"}, exitOK, "scenarios", ""},
		{[]string{"help", "demo"}, exitOK, "", "Usage: damper demo"},
		{[]string{"help", "scenarios"}, exitOK, "", "Usage: damper scenarios"},
		{[]string{"help", "proxy"}, exitOK, "", "Usage: damper proxy"},
		{[]string{"frobnicate"}, exitUsage, "", `unknown command "frobnicate"`},
	}
	for _, tt := range tests {
		var out, errb bytes.Buffer
		if code := run(tt.args, &out, &errb); code != tt.code {
			t.Errorf("damper %q: exit %d, want %d", tt.args, code, tt.code)
		}
		if !strings.Contains(out.String(), tt.out) || !strings.Contains(errb.String(), tt.err) {
			t.Errorf("damper %q: stdout %q, stderr %q; want them to hold %q and %q", tt.args, out.String(), errb.String(), tt.out, tt.err)
		}
	}
}
