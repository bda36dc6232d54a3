package main

import (
	"bytes"
	"context"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/damper-ai/damper-go/internal/conf"
)

// readmeProxySection is the README's section on damper proxy: its prose,
// and its code blocks by language.
func readmeProxySection(t *testing.T) (prose string, blocks map[string][]string) {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n## Other languages: `damper proxy`\n")
	if !ok {
		t.Fatal("README.md has no section \"Other languages: `damper proxy`\"")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	blocks = map[string][]string{}
	var text strings.Builder
	for i, part := range strings.Split(section, "```") {
		if i%2 == 0 {
			text.WriteString(part)
			continue
		}
		lang, body, _ := strings.Cut(part, "\n")
		blocks[lang] = append(blocks[lang], body)
	}
	return text.String(), blocks
}

// TestREADMEProxyFile: the README's proxy.yaml is one the proxy reads,
// and the prose beside it names what it needs before it starts: each
// variable it names, the store's address, and the credentials of each
// backend's platform.
func TestREADMEProxyFile(t *testing.T) {
	cloudEnv(t, false)
	prose, blocks := readmeProxySection(t)
	var file string
	for _, b := range blocks["yaml"] {
		if strings.HasPrefix(b, "# proxy.yaml\n") {
			file = b
		}
	}
	if file == "" {
		t.Fatal("the README's proxy section has no yaml block starting # proxy.yaml")
	}
	prose = strings.Join(strings.Fields(prose), " ")
	for _, m := range regexp.MustCompile(`(?m)^\s*-?\s*\w+_env:\s*(\w+)`).FindAllStringSubmatch(file, -1) {
		t.Setenv(m[1], "set-for-the-test")
		if !strings.Contains(prose, "`"+m[1]+"`") {
			t.Errorf("the README's proxy.yaml needs the variable %s, which its prose does not name", m[1])
		}
	}
	s, err := parseProxyFile(t, file)
	if err != nil {
		t.Fatalf("the README's proxy.yaml: %v", err)
	}
	if s.store != nil && !strings.Contains(prose, s.store.base.Addr) {
		t.Errorf("the README's proxy.yaml needs Redis at %s, which its prose does not name", s.store.base.Addr)
	}
	u, _ := url.Parse(s.upstream)
	if !strings.Contains(prose, u.Hostname()) {
		t.Errorf("the README's proxy.yaml reaches %s at start, which its prose does not name", u.Hostname())
	}
	for _, b := range s.backends {
		need := map[string]string{"bedrock": "AWS credentials", "vertex": "Google credentials"}[b.Provider]
		if need != "" && !strings.Contains(prose, need) {
			t.Errorf("the README's proxy.yaml has a %s backend, which needs %s: its prose does not say so", b.Provider, need)
		}
	}
}

// TestREADMEOfflineQuickStart runs the README's offline quick start as
// written: damper fake, the proxy in front of it and the curl call, with
// the test's own free ports for 8787 and 8788, which tests running at
// once on one machine cannot share; the answer is the fake's, on the
// second attempt.
func TestREADMEOfflineQuickStart(t *testing.T) {
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Skip("curl is not installed")
	}
	_, blocks := readmeProxySection(t)
	var lines []string
	for _, b := range blocks["sh"] {
		if strings.Contains(b, "damper fake") {
			lines = strings.Split(strings.ReplaceAll(b, "\\\n", ""), "\n")
		}
	}
	const (
		fakeCmd  = "go run ./cmd/damper fake "
		proxyCmd = "go run ./cmd/damper proxy "
	)
	var fakeArgs, proxyArgs []string
	var curlLine string
	for _, l := range lines {
		l, _, _ = strings.Cut(l, "#")
		l = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(l), "&"))
		switch {
		case strings.HasPrefix(l, fakeCmd):
			fakeArgs = strings.Fields(strings.TrimPrefix(l, fakeCmd))
		case strings.HasPrefix(l, proxyCmd):
			proxyArgs = strings.Fields(strings.TrimPrefix(l, proxyCmd))
		case strings.HasPrefix(l, "curl "):
			curlLine = l
		}
	}
	if fakeArgs == nil || proxyArgs == nil || curlLine == "" {
		t.Fatalf("the README's offline quick start lacks damper fake's line, the proxy's or curl's:\n%s", strings.Join(lines, "\n"))
	}
	const fakeAddr, proxyAddr = "127.0.0.1:8788", "127.0.0.1:8787"
	port0 := func(args []string, addr string) []string {
		out := make([]string, len(args))
		for i, a := range args {
			out[i] = strings.ReplaceAll(a, addr, "127.0.0.1:0")
		}
		return out
	}
	// The fake listens where the proxy's -upstream points: by its
	// default, unless the line says -listen.
	args := port0(fakeArgs, fakeAddr)
	if !slices.Contains(fakeArgs, "-listen") {
		if d := conf.Defaults(fakeFile{}).Listen; d != fakeAddr {
			t.Fatalf("damper fake listens on %s by default; the README's proxy expects it on %s", d, fakeAddr)
		}
		args = append(args, "-listen", "127.0.0.1:0")
	}
	fake := fakeProcess(t, args...)

	args = port0(proxyArgs, proxyAddr)
	for i := range args {
		args[i] = strings.ReplaceAll(args[i], "http://"+fakeAddr, fake)
	}
	p := startProxyArgs(t, "readme-offline", args)

	line := strings.ReplaceAll(curlLine, "http://"+proxyAddr, p.url)
	ctx, cancel := context.WithTimeout(context.Background(), processWait)
	defer cancel()
	out, err := exec.CommandContext(ctx, "sh", "-c", strings.Replace(line, "curl ", curl+" ", 1)).Output()
	if err != nil {
		t.Fatalf("%s: %v", line, err)
	}
	head, body, _ := bytes.Cut(bytes.ReplaceAll(out, []byte("\r\n"), []byte("\n")), []byte("\n\n"))
	if !bytes.HasPrefix(head, []byte("HTTP/1.1 200 ")) || !regexp.MustCompile(`(?mi)^Damper-Attempts: 2$`).Match(head) ||
		!bytes.Contains(body, []byte(`"text":"Hello from damper fake."`)) {
		t.Errorf("the README's call answered:\n%s", out)
	}
}
