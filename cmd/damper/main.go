// Command damper shows, offline, what Damper does for a Go service that
// calls Claude through the official SDK.
//
// Usage:
//
//	damper demo [flags]        the outage demo: naive retries vs Damper, without and with its breaker
//	damper scenarios [flags]   the SDK failure catalogue, bare SDK vs Damper
//	damper proxy [flags]       the Messages API served through Damper, for other languages
//	damper key                 a new client key for the proxy, and its hash
//	damper fake [flags]        a fake Messages API with scripted faults, on loopback
//	damper version             the versions and the commit the binary was built from
//	damper help [command]      help for a command
//
// demo runs in memory on a virtual clock and finishes in about a second;
// it exits with status 1 when Damper's amplification is above the limit.
// scenarios runs on a loopback fake API in real time, every row at once,
// and finishes within its --deadline (10 s by default).
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

// Exit statuses.
const (
	exitOK    = 0
	exitFail  = 1 // the run worked and its check failed
	exitUsage = 2 // bad command line, as with the flag package
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

type command struct {
	name    string
	summary string
	run     func(args []string, stdout, stderr io.Writer) int
}

func commands() []command {
	return []command{
		{"demo", "the outage demo: 1,000 requests, naive retries vs Damper, without and with its breaker (offline, virtual time)", runDemo},
		{"scenarios", "the SDK failure catalogue, bare SDK vs Damper, side by side (loopback, real time)", runScenarios},
		{"proxy", "serve the Messages API through Damper, for services not written in Go", runProxy},
		{"key", "make a client key for the proxy, and the hash its file names it by", runKey},
		{"fake", "serve a fake Messages API with scripted faults, for testing a service and the proxy offline", runFake},
		{"version", "the versions of the command, the commit it was built from, and its key dependencies", runVersion},
	}
}

// run is the command line, separate from main so that tests can drive it.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	name, rest := args[0], args[1:]
	switch name {
	case "help", "-h", "-help", "--help":
		if len(rest) > 0 {
			return run([]string{rest[0], "-h"}, stdout, stderr)
		}
		usage(stdout)
		return exitOK
	}
	for _, c := range commands() {
		if c.name == name {
			return c.run(rest, stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "damper: unknown command %q\n\n", name)
	usage(stderr)
	return exitUsage
}

// parseFlags parses a command's flags with fs. What the flag package
// prints goes to stdout when help was asked for (-h, -help), which ends
// the command with status 0, and to stderr otherwise, with the error
// that ends it with status 2; fs writes to stderr afterwards.
func parseFlags(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) error {
	var printed bytes.Buffer
	fs.SetOutput(&printed)
	err := fs.Parse(args)
	fs.SetOutput(stderr)
	if errors.Is(err, flag.ErrHelp) {
		stdout.Write(printed.Bytes())
	} else {
		stderr.Write(printed.Bytes())
	}
	return err
}

// badFlags is how a command ends when parsing its flags failed with err:
// stop is false when err is nil; else the status to exit with, after
// saying why on stderr (flag.ErrHelp, the usage already printed, is no
// failure).
func badFlags(name string, err error, stderr io.Writer) (code int, stop bool) {
	switch {
	case err == nil:
		return 0, false
	case errors.Is(err, flag.ErrHelp):
		return exitOK, true
	}
	fmt.Fprintf(stderr, "damper %s: %v\n", name, err)
	return exitUsage, true
}

func usage(w io.Writer) {
	fmt.Fprint(w, `damper shows what Damper, retry ownership for the Anthropic Go SDK, does.
Everything runs offline: no API key, no network beyond loopback.

Usage:

	damper <command> [flags]

Commands:

`)
	for _, c := range commands() {
		fmt.Fprintf(w, "\t%-10s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, `
Run "damper help <command>" or "damper <command> -h" for a command's flags.
Start with:

	go run ./cmd/damper demo
`)
}
