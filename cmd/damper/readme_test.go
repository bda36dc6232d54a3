package main

import (
	"context"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/damper-ai/damper-go/conf"
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
	u, _ := url.Parse(s.Upstream)
	if !strings.Contains(prose, u.Hostname()) {
		t.Errorf("the README's proxy.yaml reaches %s at start, which its prose does not name", u.Hostname())
	}
	for _, b := range s.Backends {
		need := map[string]string{"bedrock": "AWS credentials", "vertex": "Google credentials"}[b.Provider]
		if need != "" && !strings.Contains(prose, need) {
			t.Errorf("the README's proxy.yaml has a %s backend, which needs %s: its prose does not say so", b.Provider, need)
		}
	}
}

// TestREADMEOfflineQuickStart runs the README's offline quick start as
// written: two damper fakes (the upstream in an outage, a healthy second
// API), the proxy from deploy/quickstart.yaml in front of them with the
// variables the export line sets, and the TypeScript SDK's call, with the
// test's own free ports for 8787, 8788 and 8789, which tests running at
// once on one machine cannot share. The call is answered by the fallback
// backend, after three attempts at the upstream, as the README says.
func TestREADMEOfflineQuickStart(t *testing.T) {
	node := needNode(t)
	prose, blocks := readmeProxySection(t)
	var lines []string
	for _, b := range blocks["sh"] {
		if strings.Contains(b, "damper fake") {
			lines = strings.Split(b, "\n")
		}
	}
	const (
		fakeCmd   = "go run ./cmd/damper fake "
		proxyCmd  = "go run ./cmd/damper proxy "
		nodeCmd   = "node "
		exportCmd = "export "
	)
	var fakes [][]string
	var proxyArgs []string
	var script string
	for _, l := range lines {
		l, _, _ = strings.Cut(l, "#")
		l = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(l), "&"))
		switch {
		case strings.HasPrefix(l, fakeCmd):
			fakes = append(fakes, strings.Fields(strings.TrimPrefix(l, fakeCmd)))
		case strings.HasPrefix(l, proxyCmd):
			proxyArgs = strings.Fields(strings.TrimPrefix(l, proxyCmd))
		case strings.HasPrefix(l, exportCmd):
			for _, kv := range strings.Fields(strings.TrimPrefix(l, exportCmd)) {
				k, v, _ := strings.Cut(kv, "=")
				t.Setenv(k, v)
			}
		case strings.HasPrefix(l, nodeCmd):
			script = strings.TrimSpace(strings.TrimPrefix(l, nodeCmd))
		}
	}
	if len(fakes) != 2 || len(proxyArgs) != 2 || proxyArgs[0] != "-config" || script == "" {
		t.Fatalf("the README's offline quick start lacks its two damper fakes, the proxy's -config line or node's:\n%s", strings.Join(lines, "\n"))
	}
	// Each fake on a free port: the first where its default would be.
	addrs := []string{conf.Defaults(fakeFile{}).Listen, ""}
	urls := make([]string, 2)
	for i, args := range fakes {
		if j := slices.Index(args, "-listen"); j >= 0 && j+1 < len(args) {
			addrs[i] = args[j+1]
			args = slices.Delete(slices.Clone(args), j, j+2)
		}
		urls[i] = fakeProcess(t, append(args, "-listen", "127.0.0.1:0")...)
	}
	// The proxy's file, with those ports and a free one of its own.
	file, err := os.ReadFile(filepath.Join("..", "..", proxyArgs[1]))
	if err != nil {
		t.Fatalf("the README's proxy file: %v", err)
	}
	config := strings.ReplaceAll(string(file), "http://"+addrs[0], urls[0])
	config = strings.ReplaceAll(config, "http://"+addrs[1], urls[1])
	const proxyAddr = "127.0.0.1:8787"
	if !strings.Contains(config, "listen: "+proxyAddr) {
		t.Fatalf("%s does not listen on %s, where the client calls", proxyArgs[1], proxyAddr)
	}
	config = strings.Replace(config, "listen: "+proxyAddr, "listen: 127.0.0.1:0", 1)
	p := startProxyArgs(t, "readme-offline", []string{"-config", writeFile(t, "quickstart.yaml", config)})

	ctx, cancel := context.WithTimeout(context.Background(), processWait)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, filepath.Join("..", "..", script))
	cmd.Env = append(os.Environ(), "QUICKSTART_PROXY_URL="+p.url)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node %s: %v\n%s\nproxy:\n%s", script, err, out, p.logs)
	}
	want := "Hello from damper fake. (answered by second-api after 4 attempts)"
	if got := strings.TrimSpace(string(out)); got != want {
		t.Errorf("node %s printed %q, want %q", script, got, want)
	}
	if !strings.Contains(strings.Join(strings.Fields(prose), " "), "It prints `"+want+"`") {
		t.Errorf("the README does not say the call prints %q", want)
	}
}
