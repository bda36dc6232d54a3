package main

import (
	"bufio"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/damper-ai/damper-go/conf"
)

// imageSpec is what the repository's Dockerfile says the image is.
type imageSpec struct {
	builder    string            // the first stage's base image
	final      string            // the last stage's
	buildEnv   []string          // the go build line's variables
	buildArgs  []string          // go build's arguments
	binary     string            // where go build writes the binary (-o)
	files      map[string]string // the final stage's files: path in the image -> path in the builder
	written    map[string]string // files the builder writes with echo: path -> content
	uid, gid   int
	entrypoint []string
	expose     []int
}

// parseDockerfile reads ../../Dockerfile, as far as the tests need it.
func parseDockerfile(t *testing.T) imageSpec {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	spec := imageSpec{files: map[string]string{}, written: map[string]string{}, uid: -1, gid: -1}
	stages := 0
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		inst, rest, _ := strings.Cut(line, " ")
		rest = strings.TrimSpace(rest)
		switch strings.ToUpper(inst) {
		case "FROM":
			stages++
			base := strings.Fields(rest)[0]
			if stages == 1 {
				spec.builder = base
			}
			spec.final = base
			spec.files = map[string]string{} // only the last stage's count
		case "RUN":
			for _, cmd := range strings.Split(rest, "&&") {
				cmd = strings.TrimSpace(cmd)
				if m := regexp.MustCompile(`^echo '([^']*)' > (\S+)$`).FindStringSubmatch(cmd); m != nil {
					spec.written[m[2]] = m[1] + "\n"
					continue
				}
				words := shellWords(t, cmd)
				i := slices.Index(words, "go")
				if i < 0 || i+1 >= len(words) || words[i+1] != "build" {
					t.Fatalf("Dockerfile: a RUN the test does not know: %s", cmd)
				}
				spec.buildEnv, spec.buildArgs = words[:i], words[i+2:]
				if o := slices.Index(spec.buildArgs, "-o"); o >= 0 && o+1 < len(spec.buildArgs) {
					spec.binary = spec.buildArgs[o+1]
				}
			}
		case "COPY":
			f := strings.Fields(rest)
			if len(f) == 3 && f[0] == "--from=build" {
				spec.files[f[2]] = f[1]
			}
		case "USER":
			u, g, _ := strings.Cut(rest, ":")
			spec.uid, _ = strconv.Atoi(u)
			spec.gid, _ = strconv.Atoi(g)
			if strconv.Itoa(spec.uid) != u || strconv.Itoa(spec.gid) != g {
				t.Errorf("Dockerfile: USER %s: want a numeric uid:gid, which Kubernetes' runAsNonRoot can check", rest)
			}
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(rest), &spec.entrypoint); err != nil {
				t.Errorf("Dockerfile: ENTRYPOINT %s: want the exec form, a JSON list", rest)
			}
		case "EXPOSE":
			for _, p := range strings.Fields(rest) {
				n, err := strconv.Atoi(p)
				if err != nil {
					t.Errorf("Dockerfile: EXPOSE %s", p)
				}
				spec.expose = append(spec.expose, n)
			}
		}
	}
	return spec
}

// shellWords splits a simple shell command: words, and single-quoted
// strings taken as they are.
func shellWords(t *testing.T, s string) []string {
	var words []string
	var cur strings.Builder
	quoted, inWord := false, false
	for _, r := range s {
		switch {
		case r == '\'':
			quoted, inWord = !quoted, true
		case r == ' ' && !quoted:
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
			}
			inWord = false
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if quoted {
		t.Fatalf("Dockerfile: an unclosed quote in %s", s)
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}

// TestDockerfile: the image is built as the documentation says, static
// and stripped, and runs as a non-root user with the CA certificates,
// the binary its entrypoint, the proxy's ports exposed.
func TestDockerfile(t *testing.T) {
	spec := parseDockerfile(t)
	if !strings.HasPrefix(spec.builder, "golang:1.26") {
		t.Errorf("the builder is %s, want golang:1.26 (the go directive of the modules)", spec.builder)
	}
	if spec.final != "scratch" && !strings.HasPrefix(spec.final, "gcr.io/distroless/static") {
		t.Errorf("the final stage is %s, want scratch or distroless static", spec.final)
	}
	if !slices.Equal(spec.buildEnv, []string{"CGO_ENABLED=0"}) ||
		!slices.Equal(spec.buildArgs, []string{"-trimpath", "-ldflags=-s -w", "-o", "/out/damper", "./cmd/damper"}) {
		t.Errorf("the build: %q go build %q; want CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o /out/damper ./cmd/damper", spec.buildEnv, spec.buildArgs)
	}
	want := map[string]string{
		"/damper":                            spec.binary,
		"/etc/ssl/certs/ca-certificates.crt": "/etc/ssl/certs/ca-certificates.crt",
		"/etc/passwd":                        "/out/passwd",
		"/etc/group":                         "/out/group",
	}
	if fmt.Sprint(spec.files) != fmt.Sprint(want) {
		t.Errorf("the image's files: %v, want %v", spec.files, want)
	}
	if spec.uid <= 0 || spec.gid <= 0 {
		t.Errorf("USER %d:%d: want a user other than root", spec.uid, spec.gid)
	}
	passwd := spec.written["/out/passwd"]
	if !strings.HasPrefix(passwd, fmt.Sprintf("damper:x:%d:%d:", spec.uid, spec.gid)) || spec.written["/out/group"] != fmt.Sprintf("damper:x:%d:\n", spec.gid) {
		t.Errorf("/etc/passwd %q, /etc/group %q: want the user %d:%d", passwd, spec.written["/out/group"], spec.uid, spec.gid)
	}
	if !slices.Equal(spec.entrypoint, []string{"/damper"}) {
		t.Errorf("ENTRYPOINT %q, want [\"/damper\"]", spec.entrypoint)
	}
	// The proxy's default port, and the admin port of the examples.
	_, port, _ := strings.Cut(conf.Defaults(proxyFile{}).Listen, ":")
	if !slices.Contains(spec.expose, mustAtoi(t, port)) || !slices.Contains(spec.expose, 9464) {
		t.Errorf("EXPOSE %v: want the proxy's %s and the admin port 9464", spec.expose, port)
	}
	ignore, err := os.ReadFile(filepath.Join("..", "..", ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{".git", "**/node_modules"} {
		if !slices.Contains(strings.Split(string(ignore), "\n"), p) {
			t.Errorf(".dockerignore does not leave out %s", p)
		}
	}
}

func mustAtoi(t *testing.T, s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestImageRootFS builds the binary as the Dockerfile does, lays out a
// root file system holding exactly what the image holds, and runs it
// there as the image would: chrooted, as the image's user, with no
// environment (as root, which can chroot; else the binary runs from that
// root as its working directory, with no environment). damper version
// answers; damper fake and damper proxy, from that binary, serve, the
// proxy's /healthz and /readyz answering on its admin port.
func TestImageRootFS(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the command without the race detector: a full build")
	}
	spec := parseDockerfile(t)
	root := t.TempDir()
	bin := filepath.Join(root, "damper")
	args := slices.Clone(spec.buildArgs)
	args[slices.Index(args, "-o")+1] = bin
	build := exec.Command("go", append([]string{"build"}, args...)...)
	build.Dir = filepath.Join("..", "..")
	build.Env = append(os.Environ(), spec.buildEnv...)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build %q: %v\n%s", args, err, out)
	}

	// Static and stripped: no interpreter, no shared library, no symbols.
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("the binary has a %v program header: it is not static", p.Type)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("the binary needs %v", libs)
	}
	if _, err := f.Symbols(); !errors.Is(err, elf.ErrNoSymbols) {
		t.Errorf("the binary has its symbol table (%v): -s did not strip it", err)
	}
	f.Close()
	info, _ := os.Stat(bin)
	t.Logf("the binary: %.1f MB", float64(info.Size())/1e6)

	// The image's other files, where it has them.
	ca, err := os.ReadFile("/etc/ssl/certs/ca-certificates.crt")
	if err != nil {
		t.Skipf("the CA bundle the image copies from the builder (Debian's /etc/ssl/certs/ca-certificates.crt) is not on this host: %v", err)
	}
	for dest, src := range spec.files {
		if dest == "/damper" {
			continue
		}
		content, ok := spec.written[src]
		if src == "/etc/ssl/certs/ca-certificates.crt" {
			content, ok = string(ca), true
		}
		if !ok {
			t.Fatalf("the image's %s comes from %s, which the test cannot make", dest, src)
		}
		path := filepath.Join(root, dest)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The proxy's file, as a ConfigMap mounts it; what it names is on
	// loopback.
	config := filepath.Join(root, "etc", "damper", "proxy.yaml")
	os.MkdirAll(filepath.Dir(config), 0o755)
	var held []string
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			rel, _ := filepath.Rel(root, p)
			held = append(held, "/"+rel)
		}
		return os.Chmod(p, map[bool]fs.FileMode{true: 0o755, false: 0o644}[d.IsDir() || p == bin])
	})
	if want := []string{"/damper", "/etc/group", "/etc/passwd", "/etc/ssl/certs/ca-certificates.crt"}; !slices.Equal(held, want) {
		t.Fatalf("the root holds %v, want what the image holds, %v", held, want)
	}

	chroot := os.Getuid() == 0
	if chroot {
		// Whether this host lets root chroot (a container may not).
		probe := exec.Command("/damper", "version")
		probe.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
		if err := probe.Run(); err != nil {
			t.Logf("chroot is refused here (%v): the binary runs from the root as its working directory instead", err)
			chroot = false
		}
	}
	if chroot {
		t.Logf("running chrooted in the image's root, as %d:%d, with no environment", spec.uid, spec.gid)
	}
	command := func(args ...string) *exec.Cmd {
		cmd := exec.Command(bin, args...)
		cmd.Env = []string{} // none, as the image sets none
		cmd.Dir = root
		if chroot {
			cmd.Path, cmd.Dir = "/damper", "/"
			cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root, Credential: &syscall.Credential{Uid: uint32(spec.uid), Gid: uint32(spec.gid)}}
		}
		return cmd
	}

	out, err := command("version").Output()
	if err != nil || !strings.Contains(string(out), "damper   github.com/damper-ai/damper-go/cmd/damper") || !strings.Contains(string(out), "go       go1.26") {
		t.Errorf("damper version in the image: %v\n%s", err, out)
	}

	fakeAddr := serveIn(t, command("fake", "-listen", "127.0.0.1:0"), "damper fake: serving")["listen"]
	if err := os.WriteFile(config, []byte("listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nupstream: http://"+fakeAddr+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chmod(config, 0o644)
	configPath := "/etc/damper/proxy.yaml"
	if !chroot {
		configPath = config
	}
	proxy := serveIn(t, command("proxy", "-config", configPath), "damper proxy: serving")
	for _, path := range []string{"/healthz", "/readyz"} {
		res, err := fakeClient.Get("http://" + proxy["admin_listen"] + path)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Errorf("%s: %d", path, res.StatusCode)
		}
	}
	status, _, body, err := fakePost(t, "http://"+proxy["listen"], fakeCall)
	if err != nil || status != 200 || !strings.Contains(body, "Hello from damper fake.") {
		t.Errorf("a call through the proxy to the fake, both in the image: %d %v %q", status, err, body)
	}
}

// serveIn starts cmd, a damper command that logs JSON lines, and returns
// the string fields of its line whose msg is ready; at cleanup it gets
// SIGTERM and must exit with status 0.
func serveIn(t *testing.T, cmd *exec.Cmd, ready string) map[string]string {
	t.Helper()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	fields := make(chan map[string]string, 1)
	read := make(chan struct{})
	go func() {
		defer close(read)
		for sc := bufio.NewScanner(stderr); sc.Scan(); {
			logs.Write(append(sc.Bytes(), '\n'))
			var line map[string]any
			if json.Unmarshal(sc.Bytes(), &line) == nil && line["msg"] == ready {
				m := map[string]string{}
				for k, v := range line {
					if s, ok := v.(string); ok {
						m[k] = s
					}
				}
				fields <- m
			}
		}
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		<-read
		if err := cmd.Wait(); err != nil {
			t.Errorf("%s: %v\n%s", cmd.Args, err, logs.String())
		}
	})
	select {
	case m := <-fields:
		return m
	case <-read:
		t.Fatalf("%s exited at start:\n%s", cmd.Args, logs.String())
	case <-time.After(processWait):
		t.Fatalf("%s did not serve within %v", cmd.Args, processWait)
	}
	return nil
}
