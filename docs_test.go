package damper_test

import (
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/damper-ai/damper-go"
)

// TestRepositoryLayout: the last section of docs/ARCHITECTURE.md,
// "Repository layout", names every directory of the repository, or one
// above it, and every file of the root package; and everything it names
// exists.
func TestRepositoryLayout(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("docs", "ARCHITECTURE.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(doc), "\n## Repository layout\n")
	if !ok {
		t.Fatal("docs/ARCHITECTURE.md has no Repository layout section")
	}
	table, _, _ = strings.Cut(table, "\n## ")
	var listed []string // the table's paths: files, globs and directories ending in /
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
	for _, l := range listed {
		if matches, err := filepath.Glob(filepath.FromSlash(strings.TrimSuffix(l, "/"))); err != nil || len(matches) == 0 {
			t.Errorf("the layout table names %s, which does not exist", l)
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
	err = filepath.WalkDir(".", func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		p = filepath.ToSlash(p)
		switch {
		case p == ".":
			return nil
		case e.IsDir() && (p == ".git" || e.Name() == "testdata" || e.Name() == "node_modules"):
			return filepath.SkipDir
		case e.IsDir() && covered(p, true):
			return filepath.SkipDir // a listed directory's row speaks for its contents
		case e.IsDir():
			for _, l := range listed {
				if strings.HasPrefix(l, p+"/") {
					return nil // listed below: each of its directories must be
				}
			}
			t.Errorf("the layout table names no %s/", p)
			return filepath.SkipDir
		case !strings.Contains(p, "/") && strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, "_test.go"):
			if !covered(p, false) {
				t.Errorf("the layout table names no %s", p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestDocLinks: every relative link of the repository's Markdown (the
// README, docs/ and its guides) reaches a file or directory that exists,
// and a link to a heading (#...) reaches a heading of its file.
func TestDocLinks(t *testing.T) {
	var files []string
	err := filepath.WalkDir(".", func(p string, e fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case e.IsDir() && (p == ".git" || e.Name() == "testdata" || e.Name() == "node_modules"):
			return filepath.SkipDir
		case !e.IsDir() && strings.HasSuffix(p, ".md"):
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
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
