// Command tidy runs go mod tidy in each of the repository's modules, as the
// workspace (go.work) builds them, and in tools. go mod tidy alone ignores
// go.work, and a module's require of another at a version not yet
// published cannot resolve without it.
//
// Usage, from the repository's root:
//
//	(cd tools && GOWORK=off go run ./tidy)
package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/damper-ai/damper-go/tools/internal/modules"
)

func main() {
	if len(os.Args) > 1 {
		fmt.Fprintf(os.Stderr, "Usage: tidy (takes no arguments, got %q)\n", os.Args[1:])
		os.Exit(2)
	}
	top, err := modules.Git(".", "rev-parse", "--show-toplevel")
	if err == nil {
		err = modules.Tidy(strings.TrimSpace(top), os.Stderr)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "tidy: %v\n", err)
		os.Exit(1)
	}
}
