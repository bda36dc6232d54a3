package damper_test

import (
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/damper-ai/damper-go"
)

// TestRepositoryLayout: the last section of docs/ARCHITECTURE.md,
// "Repository layout", names every directory the repository tracks, or one
// above it, and every file of the root package; and everything it names
// exists. Folders the repository does not track (an editor's, a scratch
// one) are not its to name.
func TestRepositoryLayout(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("docs", "ARCHITECTURE.md"))
	if err != nil {
		t.Fatal(err)
	}
	listed := layoutPaths(t, string(doc))
	tracked, ok := trackedFiles(t, ".")
	for _, p := range layoutProblems(os.DirFS("."), listed, tracked, ok) {
		t.Error(p)
	}
	if !ok {
		// An unpacked module (the module cache) has no .git, and lacks the
		// workspace's other modules the table names: only the root
		// package's files could be checked.
		t.Skip("not a git checkout: only the root package's files were checked; the repository's directories are checked where git lists them")
	}
}

// layoutPaths returns the paths the first column of ARCHITECTURE.md's
// Repository layout table names: files, globs and directories ending in /.
func layoutPaths(t *testing.T, doc string) []string {
	t.Helper()
	_, table, ok := strings.Cut(doc, "\n## Repository layout\n")
	if !ok {
		t.Fatal("docs/ARCHITECTURE.md has no Repository layout section")
	}
	table, _, _ = strings.Cut(table, "\n## ")
	var listed []string
	for _, line := range strings.Split(table, "\n") {
		if !strings.HasPrefix(line, "| ") {
			continue
		}
		first, _, _ := strings.Cut(strings.TrimPrefix(line, "| "), " | ")
		for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(first, -1) {
			listed = append(listed, m[1])
		}
	}
	if len(listed) == 0 {
		t.Fatal("the Repository layout section has no table")
	}
	return listed
}

// layoutProblems checks the layout table's paths against the repository in
// fsys: each root package file (every non-test .go file at the root,
// tracked or not, since it compiles into the package) is named; and, when
// hasTracked, each path names something that exists and each directory of
// a tracked file is named or has a named directory above it. testdata and
// node_modules directories belong to the row above them.
func layoutProblems(fsys fs.FS, listed, tracked []string, hasTracked bool) []string {
	var problems []string
	for _, l := range listed {
		if !hasTracked {
			break // an unpacked module lacks the workspace's other modules
		}
		if matches, err := fs.Glob(fsys, strings.TrimSuffix(l, "/")); err != nil || len(matches) == 0 {
			problems = append(problems, fmt.Sprintf("the layout table names %s, which does not exist", l))
		}
	}
	covered := func(p string, dir bool) bool {
		for _, l := range listed {
			if dir && (l == p+"/" || strings.HasPrefix(p+"/", l) && strings.HasSuffix(l, "/")) {
				return true
			}
			if m, _ := path.Match(l, p); !dir && m {
				return true
			}
		}
		return false
	}
	root, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return append(problems, err.Error())
	}
	for _, e := range root {
		if n := e.Name(); !e.IsDir() && strings.HasSuffix(n, ".go") && !strings.HasSuffix(n, "_test.go") && !covered(n, false) {
			problems = append(problems, fmt.Sprintf("the layout table names no %s", n))
		}
	}
	if !hasTracked {
		return problems
	}
	reported := map[string]bool{}
	for _, f := range tracked {
		parts := strings.Split(f, "/")
		for i := 1; i < len(parts); i++ { // each directory above the file, outermost first
			d := strings.Join(parts[:i], "/")
			if name := parts[i-1]; name == "testdata" || name == "node_modules" || covered(d, true) {
				break
			}
			if slices.ContainsFunc(listed, func(l string) bool { return strings.HasPrefix(l, d+"/") }) {
				continue // listed below: each of its directories must be
			}
			if !reported[d] {
				reported[d] = true
				problems = append(problems, fmt.Sprintf("the layout table names no %s/", d))
			}
			break
		}
	}
	return problems
}

// trackedFiles returns the files the git repository at dir tracks (its
// index, so a file added but not yet committed counts), slash-separated and
// relative to dir. ok is false when dir has no .git (an unpacked module, a
// source archive) or the machine has no git: then what the repository
// tracks is unknown. A .git that git cannot read fails the test, so that
// the check cannot quietly stop; one owned by another user is read all the
// same (safe.directory), as a checkout made by another user often is.
func trackedFiles(t *testing.T, dir string) (files []string, ok bool) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(dir, ".git")); err != nil {
		return nil, false
	}
	if _, err := exec.LookPath("git"); err != nil {
		return nil, false
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	git := func(args ...string) string {
		cmd := exec.Command("git", append([]string{"-c", "safe.directory=" + abs, "-C", dir}, args...)...)
		// Variables a git hook may set would point git at another repository.
		for _, kv := range os.Environ() {
			if k, _, _ := strings.Cut(kv, "="); !slices.Contains([]string{"GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_COMMON_DIR", "GIT_OBJECT_DIRECTORY", "GIT_PREFIX"}, k) {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s has a .git, and git %s failed: %v: %s (the layout check lists what the repository tracks with git)", dir, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
		}
		return string(out)
	}
	top := strings.TrimSpace(git("rev-parse", "--show-toplevel"))
	if a, b := resolved(t, top), resolved(t, abs); a != b {
		t.Fatalf("%s has a .git, but git says the repository's top is %s", b, a)
	}
	for _, f := range strings.Split(git("ls-files", "-z"), "\x00") {
		if f != "" {
			files = append(files, f)
		}
	}
	return files, true
}

// A folder on disk the repository does not track needs no row; a tracked
// directory without one, or a root package file without one, still fails.
func TestRepositoryLayoutTracked(t *testing.T) {
	listed := []string{"doc.go", "docs/", "cmd/damper/"}
	fsys := fstest.MapFS{
		"doc.go":                  {},
		"extra.go":                {}, // compiles into the package, tracked or not
		"extra_test.go":           {},
		"docs/a.md":               {},
		"cmd/damper/main.go":      {},
		"cmd/other/main.go":       {},
		"undocumented/notes.txt":  {},
		"internal/x/testdata/a":   {},
		".vscode/settings.json":   {},
		"scratch/try.go":          {},
		"scratch/deeper/more.txt": {},
	}
	tracked := []string{"doc.go", "docs/a.md", "cmd/damper/main.go", "cmd/other/main.go",
		"undocumented/notes.txt", "undocumented/more.txt", "testdata/x"}
	want := []string{
		"the layout table names no extra.go",
		"the layout table names no cmd/other/",
		"the layout table names no undocumented/",
	}
	if got := layoutProblems(fsys, listed, tracked, true); !slices.Equal(got, want) {
		t.Errorf("with the tracked listing:\n got %q\nwant %q", got, want)
	}
	if got := layoutProblems(fsys, listed, nil, false); !slices.Equal(got, want[:1]) {
		t.Errorf("without a listing:\n got %q\nwant %q", got, want[:1])
	}
	if got := layoutProblems(fsys, append(listed, "gone/"), tracked, true); !slices.Contains(got, "the layout table names gone/, which does not exist") {
		t.Errorf("a row naming nothing: got %q", got)
	}
}

// trackedFiles lists a git repository's index, not its disk, and nothing
// where there is no .git.
func TestTrackedFiles(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	dir := t.TempDir()
	if _, ok := trackedFiles(t, dir); ok {
		t.Fatalf("%s has no .git, and trackedFiles listed it", dir)
	}
	for _, f := range []string{"a.go", "sub/b.md", ".vscode/settings.json", "scratch/c.go"} {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, args := range [][]string{{"init", "-q"}, {"add", "a.go", "sub/b.md"}} {
		if out, err := exec.Command("git", append([]string{"-C", dir}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v: %s", args, err, out)
		}
	}
	got, ok := trackedFiles(t, dir)
	if want := []string{"a.go", "sub/b.md"}; !ok || !slices.Equal(got, want) {
		t.Errorf("trackedFiles = %q, %v; want %q, true", got, ok, want)
	}
}

// resolved returns p with its symbolic links resolved.
func resolved(t *testing.T, p string) string {
	t.Helper()
	r, err := filepath.EvalSymlinks(p)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestDocLinks: every relative link of the repository's Markdown (the
// README, docs/ and its guides) reaches a file or directory that exists,
// and a link to a heading (#...) reaches a heading of its file. The
// Markdown is what the repository tracks, not a user's own.
func TestDocLinks(t *testing.T) {
	tracked, ok := trackedFiles(t, ".")
	if !ok {
		// An unpacked module lacks the workspace's other modules, which
		// the Markdown links to.
		t.Skip("not a git checkout: the links are checked where git lists the repository's files")
	}
	var files []string
	for _, f := range tracked {
		if _, err := os.Stat(f); err == nil && strings.HasSuffix(f, ".md") && !strings.Contains("/"+f, "/testdata/") {
			files = append(files, filepath.FromSlash(f))
		}
	}
	for _, want := range []string{"README.md", filepath.Join("docs", "ARCHITECTURE.md"), filepath.Join("docs", "guide", "retries.md")} {
		if !strings.Contains("\n"+strings.Join(files, "\n")+"\n", "\n"+want+"\n") {
			t.Fatalf("found no %s among %q", want, files)
		}
	}
	anchors := map[string]map[string]bool{} // a Markdown file's heading anchors
	anchorsOf := func(file string) map[string]bool {
		if a, ok := anchors[file]; ok {
			return a
		}
		text, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		anchors[file] = headingAnchors(string(text))
		return anchors[file]
	}
	link := regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	for _, file := range files {
		text, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, line := range proseLines(string(text)) {
			for _, m := range link.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				n++
				p, anchor, _ := strings.Cut(target, "#")
				dest := file
				if p != "" {
					dest = filepath.Join(filepath.Dir(file), filepath.FromSlash(p))
					st, err := os.Stat(dest)
					if err != nil {
						t.Errorf("%s: the link %s reaches nothing: %v", file, target, err)
						continue
					}
					if st.IsDir() || !strings.HasSuffix(dest, ".md") {
						if anchor != "" {
							t.Errorf("%s: the link %s has a heading in a file that has none", file, target)
						}
						continue
					}
				}
				if anchor != "" && !anchorsOf(dest)[anchor] {
					t.Errorf("%s: the link %s names no heading of %s", file, target, dest)
				}
			}
		}
		if file == "README.md" && n < 10 {
			t.Errorf("README.md has %d relative links; the link check found too few to be reading it right", n)
		}
	}
}

// proseLines returns a Markdown text's lines outside fenced code blocks,
// with their code spans removed.
func proseLines(text string) []string {
	var lines []string
	fenced := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			lines = append(lines, regexp.MustCompile("`[^`]*`").ReplaceAllString(line, ""))
		}
	}
	return lines
}

// headingAnchors returns the anchors GitHub gives a Markdown text's
// headings: lower case, punctuation dropped, spaces as hyphens, and a
// repeated one numbered.
func headingAnchors(text string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	fenced := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		title, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " ")
		if fenced || !ok || !strings.HasPrefix(line, "#") {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(strings.TrimSpace(title)) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
				b.WriteRune(r)
			}
		}
		a := b.String()
		if k := seen[a]; k > 0 {
			anchors[a+"-"+strconv.Itoa(k)] = true
		} else {
			anchors[a] = true
		}
		seen[a]++
	}
	return anchors
}

// TestParsePolicyExample: the policy file of the configuration guide, "Policy
// from a file", is the one tested, and reads as the Policy it means.
func TestParsePolicyExample(t *testing.T) {
	guide, err := os.ReadFile(filepath.Join("docs", "guide", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(guide), "\n## Policy from a file\n")
	if !ok {
		t.Fatal("docs/guide/configuration.md has no section Policy from a file")
	}
	_, block, _ := strings.Cut(section, "```yaml\n")
	block, _, _ = strings.Cut(block, "```")
	if "\n"+block != exampleYAML {
		t.Errorf("docs/guide/configuration.md's example:\n%s\nis not the one tested:%s", block, exampleYAML)
	}

	want := examplePolicy()
	for name, parse := range map[string]func() (damper.Policy, error){
		"yaml":         func() (damper.Policy, error) { return damper.ParsePolicyYAML([]byte(exampleYAML)) },
		"json":         func() (damper.Policy, error) { return damper.ParsePolicyJSON([]byte(exampleJSON)) },
		"json as yaml": func() (damper.Policy, error) { return damper.ParsePolicyYAML([]byte(exampleJSON)) },
	} {
		p, err := parse()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !reflect.DeepEqual(p, want) {
			t.Fatalf("%s:\n got %+v\nwant %+v", name, p, want)
		}
	}
	d, err := damper.New(want)
	if err != nil {
		t.Fatal(err)
	}
	if got := d.Policy(); got.RetryBudgetRatio != 0 || got.RetryBudgetMinTokens != 20 || got.RetryBudgetWindow != time.Minute {
		t.Errorf("filled in: ratio %v, min tokens %v, window %v; want 0, 20, 1m0s", got.RetryBudgetRatio, got.RetryBudgetMinTokens, got.RetryBudgetWindow)
	}
}
