// Command release prepares a release of the repository's modules at one
// version: it sets every require of one of the repository's modules by
// another to that version, writes the go.sum lines the go command checks
// them against, commits that, and tags each published module the way the
// go command finds a nested module's versions (v0.4.0,
// redisstore/v0.4.0, cmd/damper/v0.4.0). It pushes nothing.
//
// Usage, from the repository's root:
//
//	(cd tools && GOWORK=off go run ./release [-n] vX.Y.Z)
//
// -n prints what it would change and tag, and changes nothing. It refuses
// a version not of the form vX.Y.Z, a tree with changes not committed, a
// go.mod with a replace, and a tag that exists already.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/damper-ai/damper-go/tools/internal/modules"
)

func main() {
	fs := flag.NewFlagSet("release", flag.ContinueOnError)
	dryRun := fs.Bool("n", false, "print what would be changed and tagged, and change nothing")
	repo := fs.String("C", "", "the repository's root (default: the one holding the current directory)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: release [-n] [-C dir] vX.Y.Z\n\nSets every require between the repository's modules to vX.Y.Z with their\ngo.sum lines and go.work's replaces, commits that, and tags the published modules.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if fs.NArg() != 1 {
		fs.Usage()
		os.Exit(2)
	}
	if err := run(*repo, fs.Arg(0), *dryRun, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "release: %v\n", err)
		os.Exit(1)
	}
}

func run(repo, version string, dryRun bool, out io.Writer) error {
	if repo == "" {
		top, err := modules.Git(".", "rev-parse", "--show-toplevel")
		if err != nil {
			return err
		}
		repo = strings.TrimSpace(top)
	}
	return release(repo, version, dryRun, out)
}

// release releases the repository at repo as version; see the command's
// documentation.
func release(repo, version string, dryRun bool, out io.Writer) error {
	if err := modules.CheckVersion(version); err != nil {
		return err
	}
	status, err := modules.Git(repo, "status", "--porcelain")
	if err != nil {
		return err
	}
	if status != "" {
		return fmt.Errorf("the tree at %s has changes not committed; commit or stash them first, so that the tags name exactly what is released:\n%s", repo, strings.TrimRight(status, "\n"))
	}
	var tags []string
	for _, m := range modules.List {
		if !m.Published {
			continue
		}
		tag := m.Tag(version)
		if _, err := modules.Git(repo, "rev-parse", "-q", "--verify", "refs/tags/"+tag); err == nil {
			return fmt.Errorf("tag %s exists already: a released version is never moved", tag)
		}
		tags = append(tags, tag)
	}

	staged, err := os.MkdirTemp("", "damper-release-tree-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(staged)
	if err := modules.Stage(repo, staged); err != nil {
		return err
	}
	if err := modules.Prepare(staged, version); err != nil {
		return err
	}
	var files []string
	for _, m := range modules.List {
		for _, name := range []string{"go.mod", "go.sum"} {
			files = append(files, filepath.Join(filepath.FromSlash(m.Dir), name))
		}
	}
	files = append(files, "go.work")
	var changed []string
	for _, rel := range files {
		want, err := os.ReadFile(filepath.Join(staged, rel))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		have, err := os.ReadFile(filepath.Join(repo, rel))
		if err == nil && bytes.Equal(have, want) {
			continue
		}
		changed = append(changed, filepath.ToSlash(rel))
		if !dryRun {
			if err := os.WriteFile(filepath.Join(repo, rel), want, 0o644); err != nil {
				return err
			}
		}
	}
	if dryRun {
		fmt.Fprintf(out, "would set the modules' requires of each other to %s in: %s\n", version, listOrNone(changed))
		fmt.Fprintf(out, "would commit that and tag: %s\n", strings.Join(tags, " "))
		return nil
	}
	if len(changed) > 0 {
		if _, err := modules.Git(repo, append([]string{"add", "--"}, changed...)...); err != nil {
			return err
		}
		if _, err := modules.Git(repo, "commit", "-q", "-m", "Release "+version+": the modules require each other at "+version); err != nil {
			return err
		}
	}
	for _, tag := range tags {
		if _, err := modules.Git(repo, "tag", tag); err != nil {
			return err
		}
	}
	head, err := modules.Git(repo, "rev-parse", "HEAD")
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "set the modules' requires of each other to %s in: %s\n", version, listOrNone(changed))
	fmt.Fprintf(out, "tagged %s at %s\n", strings.Join(tags, " "), strings.TrimSpace(head))
	fmt.Fprintf(out, "publish with: git push origin HEAD %s\n", strings.Join(tags, " "))
	return nil
}

func listOrNone(names []string) string {
	if len(names) == 0 {
		return "none (already at that version)"
	}
	return strings.Join(names, " ")
}
