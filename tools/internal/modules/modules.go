// Package modules knows the repository's modules: which there are, in what
// order they require each other, and how to set the version at which they
// do, with the go.sum lines and the zips the go command checks them
// against.
package modules

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	"golang.org/x/mod/sumdb/dirhash"
	modzip "golang.org/x/mod/zip"
)

// Module is one module of the repository.
type Module struct {
	Path string // module path
	Dir  string // slash path from the repository's root; "." for the root
	// Published modules are tagged at a release and can be fetched with
	// the go command; the others only live in the workspace.
	Published bool
}

// List is the repository's modules in dependency order: a module
// requires only modules listed before it.
var List = []Module{
	{"github.com/damper-ai/damper-go", ".", true},
	{"github.com/damper-ai/damper-go/redisstore", "redisstore", true},
	{"github.com/damper-ai/damper-go/cmd/damper", "cmd/damper", true},
	{"github.com/damper-ai/damper-go/bench", "bench", false},
	{"github.com/damper-ai/damper-go/examples", "examples", false},
}

// Internal returns the repository's module whose path is path.
func Internal(path string) (Module, bool) {
	for _, m := range List {
		if m.Path == path {
			return m, true
		}
	}
	return Module{}, false
}

// Tag is the git tag the go command looks for to find m at version:
// a nested module's tags carry its directory.
func (m Module) Tag(version string) string {
	if m.Dir == "." {
		return version
	}
	return m.Dir + "/" + version
}

var versionRE = regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$`)

// CheckVersion accepts vX.Y.Z, with an optional pre-release suffix
// (v0.4.0-rc.1), for major versions 0 and 1: a v2 needs /v2 in every
// module path first.
func CheckVersion(v string) error {
	if !versionRE.MatchString(v) || !semver.IsValid(v) || semver.Canonical(v) != v {
		return fmt.Errorf("version %q is not of the form vX.Y.Z (such as v0.4.0, or v0.4.0-rc.1)", v)
	}
	if major := semver.Major(v); major != "v0" && major != "v1" {
		return fmt.Errorf("version %q: a major version above v1 needs the suffix /%s in every module path first", v, major)
	}
	return nil
}

// ReadMod parses dir's go.mod.
func ReadMod(dir string) (*modfile.File, error) {
	name := filepath.Join(dir, "go.mod")
	data, err := os.ReadFile(name)
	if err != nil {
		return nil, err
	}
	return modfile.Parse(name, data, nil)
}

// CheckMod returns the problems of a module's go.mod: any replace, and
// a require of another of the repository's modules at a version other
// than want (any one version when want is empty).
func CheckMod(f *modfile.File, want string) []string {
	var problems []string
	name := f.Module.Mod.Path
	for _, r := range f.Replace {
		problems = append(problems, fmt.Sprintf("%s's go.mod replaces %s: the go command refuses to install from a module with a replace, and the workspace (go.work) already builds the modules against each other", name, r.Old.Path))
	}
	for _, r := range f.Require {
		if _, ok := Internal(r.Mod.Path); !ok {
			continue
		}
		if want != "" && r.Mod.Version != want {
			problems = append(problems, fmt.Sprintf("%s's go.mod requires %s %s, not %s like the other modules", name, r.Mod.Path, r.Mod.Version, want))
		}
	}
	return problems
}

// WorkReplaces are the replace directives the workspace (go.work) needs
// so that the modules' requires of each other at version resolve to the
// work tree, before that version is published: one for each module that
// another requires.
func WorkReplaces(root, version string) ([]*modfile.Replace, error) {
	var reps []*modfile.Replace
	required := map[string]bool{}
	for _, m := range List {
		f, err := ReadMod(filepath.Join(root, filepath.FromSlash(m.Dir)))
		if err != nil {
			return nil, err
		}
		for _, r := range f.Require {
			if _, ok := Internal(r.Mod.Path); ok {
				required[r.Mod.Path] = true
			}
		}
	}
	for _, m := range List {
		if required[m.Path] {
			reps = append(reps, &modfile.Replace{
				Old: module.Version{Path: m.Path, Version: version},
				New: module.Version{Path: "./" + strings.TrimPrefix(m.Dir, ".")},
			})
		}
	}
	return reps, nil
}

// CheckWork returns the problems of the workspace's go.work under root:
// a module not used, or a replace other than WorkReplaces at version.
func CheckWork(root, version string) ([]string, error) {
	data, err := os.ReadFile(filepath.Join(root, "go.work"))
	if err != nil {
		return nil, err
	}
	wf, err := modfile.ParseWork("go.work", data, nil)
	if err != nil {
		return nil, err
	}
	var problems []string
	used := map[string]bool{}
	for _, u := range wf.Use {
		used[strings.TrimSuffix(strings.TrimPrefix(u.Path, "./"), "/")] = true
	}
	for _, m := range List {
		dir := m.Dir
		if dir == "." {
			dir = ""
		}
		if !used[dir] && !(dir == "" && used["."]) {
			problems = append(problems, fmt.Sprintf("go.work does not use %s", m.Dir))
		}
	}
	want, err := WorkReplaces(root, version)
	if err != nil {
		return nil, err
	}
	have := map[string]string{}
	for _, r := range wf.Replace {
		have[r.Old.String()] = r.New.Path
	}
	for _, r := range want {
		if got, ok := have[r.Old.String()]; !ok || got != r.New.Path {
			problems = append(problems, fmt.Sprintf("go.work does not replace %s by %s, so that the workspace builds the modules' requires of each other from the work tree", r.Old, r.New.Path))
		}
		delete(have, r.Old.String())
	}
	for old, dir := range have {
		problems = append(problems, fmt.Sprintf("go.work replaces %s by %s, which no module requires", old, dir))
	}
	slices.Sort(problems)
	return problems, nil
}

// setWork sets go.work's replaces under root to WorkReplaces at version.
func setWork(root, version string) error {
	name := filepath.Join(root, "go.work")
	data, err := os.ReadFile(name)
	if err != nil {
		return err
	}
	wf, err := modfile.ParseWork(name, data, nil)
	if err != nil {
		return err
	}
	for _, r := range slices.Clone(wf.Replace) {
		if _, ok := Internal(r.Old.Path); ok {
			if err := wf.DropReplace(r.Old.Path, r.Old.Version); err != nil {
				return err
			}
		}
	}
	reps, err := WorkReplaces(root, version)
	if err != nil {
		return err
	}
	for _, r := range reps {
		if err := wf.AddReplace(r.Old.Path, r.Old.Version, r.New.Path, ""); err != nil {
			return err
		}
	}
	wf.Cleanup()
	return os.WriteFile(name, modfile.Format(wf.Syntax), 0o644)
}

// setRequires sets every require of another of the repository's modules,
// in every module under root, to version, and go.work's replaces with
// them.
func setRequires(root, version string) error {
	for _, m := range List {
		dir := filepath.Join(root, filepath.FromSlash(m.Dir))
		f, err := ReadMod(dir)
		if err != nil {
			return err
		}
		if problems := CheckMod(f, ""); len(problems) > 0 {
			return errors.New(strings.Join(problems, "\n"))
		}
		for _, r := range f.Require {
			if _, ok := Internal(r.Mod.Path); ok {
				if err := f.AddRequire(r.Mod.Path, version); err != nil {
					return err
				}
			}
		}
		if err := writeMod(dir, f); err != nil {
			return err
		}
	}
	return setWork(root, version)
}

// Stage copies, from the repository at repo into dst, every file
// git tracks or would track (tracked, and untracked but not ignored): what
// a commit of the tree holds.
func Stage(repo, dst string) error {
	out, err := Git(repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	if err != nil {
		return err
	}
	for _, name := range strings.Split(strings.TrimRight(out, "\x00"), "\x00") {
		if name == "" {
			continue
		}
		src := filepath.Join(repo, filepath.FromSlash(name))
		info, err := os.Lstat(src)
		if errors.Is(err, os.ErrNotExist) {
			continue // deleted in the work tree
		}
		if err != nil {
			return err
		}
		if !info.Mode().IsRegular() {
			continue
		}
		if err := copyFile(src, filepath.Join(dst, filepath.FromSlash(name)), info.Mode().Perm()); err != nil {
			return err
		}
	}
	return nil
}

func copyFile(src, dst string, perm os.FileMode) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	return os.WriteFile(dst, data, perm)
}

// Zip writes the zip the go command downloads for m at version,
// made from m's directory under root, to the file zipPath.
func Zip(root string, m Module, version, zipPath string) error {
	f, err := os.Create(zipPath)
	if err != nil {
		return err
	}
	err = modzip.CreateFromDir(f, module.Version{Path: m.Path, Version: version}, filepath.Join(root, filepath.FromSlash(m.Dir)))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// sumLines are the two go.sum lines of m at version, made from m's
// directory under root: the hash of its zip and of its go.mod.
func sumLines(root string, m Module, version, tmp string) ([]string, error) {
	zipPath := filepath.Join(tmp, strings.ReplaceAll(m.Path, "/", "_")+"@"+version+".zip")
	if err := Zip(root, m, version, zipPath); err != nil {
		return nil, err
	}
	zipHash, err := dirhash.HashZip(zipPath, dirhash.Hash1)
	if err != nil {
		return nil, err
	}
	gomod, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(m.Dir), "go.mod"))
	if err != nil {
		return nil, err
	}
	modHash, err := dirhash.Hash1([]string{"go.mod"}, func(string) (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(gomod)), nil
	})
	if err != nil {
		return nil, err
	}
	return []string{
		fmt.Sprintf("%s %s %s", m.Path, version, zipHash),
		fmt.Sprintf("%s %s/go.mod %s", m.Path, version, modHash),
	}, nil
}

// SetSums replaces, in the go.sum file name, the lines of the
// repository's modules by lines, keeping the go command's order.
func SetSums(name string, lines []string) error {
	data, err := os.ReadFile(name)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	var keep []string
	for _, l := range strings.Split(string(data), "\n") {
		if l == "" {
			continue
		}
		if path, _, _ := strings.Cut(l, " "); path != "" {
			if _, ok := Internal(path); ok {
				continue
			}
		}
		keep = append(keep, l)
	}
	keep = append(keep, lines...)
	slices.SortStableFunc(keep, func(a, b string) int {
		pa, ra, _ := strings.Cut(a, " ")
		pb, rb, _ := strings.Cut(b, " ")
		if c := strings.Compare(pa, pb); c != 0 {
			return c
		}
		va, _, _ := strings.Cut(ra, " ")
		vb, _, _ := strings.Cut(rb, " ")
		va, fa, _ := strings.Cut(va, "/")
		vb, fb, _ := strings.Cut(vb, "/")
		if c := semver.Compare(va, vb); c != 0 {
			return c
		}
		return strings.Compare(fa, fb)
	})
	return os.WriteFile(name, []byte(strings.Join(keep, "\n")+"\n"), 0o644)
}

// Prepare sets, in the staged tree root (a copy: it changes more than the
// go.mod and go.sum files), every internal require to version, go.work's
// replaces, and every module's go.sum lines for the others, in dependency
// order: a module's hash covers its go.sum, so the modules it requires
// are hashed first.
func Prepare(root, version string) error {
	if err := setRequires(root, version); err != nil {
		return err
	}
	// A nested module without a LICENSE gets the root's in its zip.
	for _, m := range List {
		license := filepath.Join(root, filepath.FromSlash(m.Dir), "LICENSE")
		if _, err := os.Stat(license); errors.Is(err, os.ErrNotExist) {
			if err := copyFile(filepath.Join(root, "LICENSE"), license, 0o644); err != nil {
				return err
			}
		}
	}
	tmp, err := os.MkdirTemp("", "damper-release-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	sums := map[string][]string{} // a module's own two lines
	deps := map[string][]string{} // the internal modules a module needs, itself included
	for _, m := range List {
		dir := filepath.Join(root, filepath.FromSlash(m.Dir))
		f, err := ReadMod(dir)
		if err != nil {
			return err
		}
		need := []string{}
		for _, r := range f.Require {
			if _, ok := Internal(r.Mod.Path); ok {
				d, ok := deps[r.Mod.Path]
				if !ok {
					return fmt.Errorf("%s requires %s, which is not listed before it", m.Path, r.Mod.Path)
				}
				need = append(need, d...)
			}
		}
		slices.Sort(need)
		need = slices.Compact(need)
		var lines []string
		for _, p := range need {
			lines = append(lines, sums[p]...)
		}
		deps[m.Path] = append(need, m.Path)
		if len(lines) > 0 {
			if err := SetSums(filepath.Join(dir, "go.sum"), lines); err != nil {
				return err
			}
		}
		if sums[m.Path], err = sumLines(root, m, version, tmp); err != nil {
			return err
		}
	}
	return nil
}

// Git runs git in dir and returns its standard output.
func Git(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("git %s in %s: %v: %s", strings.Join(args, " "), dir, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// Tidy runs go mod tidy in each of the repository's modules under root as
// the workspace builds them: go mod tidy ignores go.work, so a module's
// requires of the others point at the work tree for the run alone, by
// replaces it removes afterwards, keeping the go.sum lines a release wrote
// for the others.
func Tidy(root string, stderr io.Writer) error {
	version := "v0.0.0"
	for _, m := range List {
		f, err := ReadMod(filepath.Join(root, filepath.FromSlash(m.Dir)))
		if err != nil {
			return err
		}
		for _, r := range f.Require {
			if _, ok := Internal(r.Mod.Path); ok {
				version = r.Mod.Version
			}
		}
	}
	for _, m := range List {
		dir := filepath.Join(root, filepath.FromSlash(m.Dir))
		orig, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err != nil {
			return err
		}
		sum, err := os.ReadFile(filepath.Join(dir, "go.sum"))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		var keep []string
		for _, l := range strings.Split(string(sum), "\n") {
			if path, _, _ := strings.Cut(l, " "); path != "" {
				if _, ok := Internal(path); ok {
					keep = append(keep, l)
				}
			}
		}
		f, err := modfile.Parse("go.mod", orig, nil)
		if err != nil {
			return err
		}
		if problems := CheckMod(f, ""); len(problems) > 0 {
			return errors.New(strings.Join(problems, "\n"))
		}
		for _, o := range List {
			if o.Path == m.Path {
				continue
			}
			rel, err := filepath.Rel(dir, filepath.Join(root, filepath.FromSlash(o.Dir)))
			if err != nil {
				return err
			}
			rel = filepath.ToSlash(rel)
			if !strings.HasPrefix(rel, "..") {
				rel = "./" + rel
			}
			if err := f.AddReplace(o.Path, "", rel, ""); err != nil {
				return err
			}
		}
		if err := writeMod(dir, f); err != nil {
			return err
		}
		cmd := exec.Command("go", "mod", "tidy")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK=off")
		cmd.Stdout, cmd.Stderr = stderr, stderr
		terr := cmd.Run()
		if terr != nil {
			// Leave the module as it was.
			if err := os.WriteFile(filepath.Join(dir, "go.mod"), orig, 0o644); err != nil {
				return err
			}
			return fmt.Errorf("go mod tidy in %s: %v", m.Dir, terr)
		}
		if f, err = ReadMod(dir); err != nil {
			return err
		}
		for _, r := range slices.Clone(f.Replace) {
			if _, ok := Internal(r.Old.Path); ok {
				if err := f.DropReplace(r.Old.Path, r.Old.Version); err != nil {
					return err
				}
			}
		}
		for _, r := range f.Require {
			if _, ok := Internal(r.Mod.Path); ok && r.Mod.Version != version {
				if err := f.AddRequire(r.Mod.Path, version); err != nil {
					return err
				}
			}
		}
		if err := writeMod(dir, f); err != nil {
			return err
		}
		if err := SetSums(filepath.Join(dir, "go.sum"), keep); err != nil {
			return err
		}
	}
	cmd := exec.Command("go", "mod", "tidy")
	cmd.Dir = filepath.Join(root, "tools")
	cmd.Env = append(os.Environ(), "GOWORK=off")
	cmd.Stdout, cmd.Stderr = stderr, stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go mod tidy in tools: %v", err)
	}
	return nil
}

func writeMod(dir string, f *modfile.File) error {
	f.Cleanup()
	data, err := f.Format()
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "go.mod"), data, 0o644)
}
