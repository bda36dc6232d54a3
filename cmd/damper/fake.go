package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/damper-ai/damper-go/conf"
)

// damper fake serves package dampertest's fake Messages API on an address
// of its own, so that a service in any language, and damper proxy, can be
// tried and tested offline against scripted faults.

// fakeMaxBody bounds a request's body: the API's own limit on a Messages
// request.
const fakeMaxBody = 32 << 20

// maxFakeText bounds the text of the fake's answers.
const maxFakeText = 4096

// maxFakeModel bounds a request's model, as the proxy does.
const maxFakeModel = 256

// fakeFaults are the faults a phase names, and what each does; the
// usage text and the guide say the same.
var fakeFaults = []struct{ name, does string }{
	{"ok", "200: the message, or a clean stream"},
	{"overloaded", "529 overloaded_error"},
	{"server_error", "500 api_error"},
	{"rate_limited", "429 rate_limit_error with retry-after (retry_after)"},
	{"slow", "the healthy answer, its first byte held for slow_first_byte"},
	{"stream_cut", "a stream cut (the connection closed) after its first content; a plain answer cut halfway"},
	{"overloaded_event", "a stream whose first content is an overloaded_error event; a plain answer is healthy"},
}

func fakeFaultNames() []string {
	names := make([]string, len(fakeFaults))
	for i, f := range fakeFaults {
		names[i] = f.name
	}
	return names
}

// fakeFile is damper fake's file, JSON or YAML:
//
//	phases:              # in order, from the start (or POST /_fake/reset)
//	  - fault: overloaded
//	    for: 30s
//	  - fault: rate_limited
//	    requests: 5
//	retry_after: 2s
//	rate_limits: {requests_per_minute: 50}
type fakeFile struct {
	Listen string `key:"listen" default:"127.0.0.1:8788"`
	// Keep is how many requests /_fake/requests shows, the last ones.
	Keep int `key:"keep" default:"100" min:"1" max:"10000" unit:"requests"`
	// Text is the healthy answer's text, plain or streamed.
	Text          string        `key:"text" default:"Hello from damper fake."`
	RetryAfter    time.Duration `key:"retry_after" default:"1s" min:"1s" max:"1h"`
	SlowFirstByte time.Duration `key:"slow_first_byte" default:"5s" min:">0" max:"10m"`
	// RateLimits are enforced on every Messages request, whatever its
	// phase, with the API's rate-limit headers (dampertest.WithRateLimits).
	RateLimits *fakeLimits `key:"rate_limits"`
	// Phases follow one another from the start; after the last, every
	// request is answered healthy.
	Phases []fakePhase `key:"phases" max:"100" unit:"phases"`
}

type fakeLimits struct {
	RequestsPerMinute     int `key:"requests_per_minute" min:"0" max:"1000000000" zero:"not enforced"`
	InputTokensPerMinute  int `key:"input_tokens_per_minute" min:"0" max:"1000000000" zero:"not enforced"`
	OutputTokensPerMinute int `key:"output_tokens_per_minute" min:"0" max:"1000000000" zero:"not enforced"`
}

// fakePhase is one fault, for a time or a number of Messages requests,
// whichever ends first; with neither, for good.
type fakePhase struct {
	Fault    string        `key:"fault"`
	For      time.Duration `key:"for" min:"0" max:"720h" zero:"no time limit"`
	Requests int           `key:"requests" min:"0" max:"1000000000" zero:"no request limit"`
	// Every makes the fault hit the 1st, (1+every)th, ... request of the
	// phase, the others answered healthy.
	Every int `key:"every" default:"1" min:"1" max:"1000"`
}

func init() {
	conf.Register(checkFakeFile)
	conf.Register(checkFakePhase)
}

func checkFakeFile(f *fakeFile, _ fakeFile) error {
	if err := checkListen(f.Listen); err != nil {
		return &conf.FieldError{Field: "Listen", Value: conf.Text(shown(f.Listen)), Why: err.Error()}
	}
	if len(f.Text) > maxFakeText {
		return &conf.FieldError{Field: "Text", Value: conf.Text(shown(f.Text)), Why: fmt.Sprintf("%d bytes: want at most %d", len(f.Text), maxFakeText)}
	}
	if f.RetryAfter%time.Second != 0 {
		return &conf.FieldError{Field: "RetryAfter", Value: f.RetryAfter, Why: "want whole seconds: retry-after is sent in seconds"}
	}
	return nil
}

func checkFakePhase(p *fakePhase, _ fakePhase) error {
	if !slices.Contains(fakeFaultNames(), p.Fault) {
		v := conf.Text(shown(p.Fault))
		if p.Fault == "" {
			v = "nothing"
		}
		return &conf.FieldError{Field: "Fault", Value: v, Why: "want " + strings.Join(fakeFaultNames(), ", ")}
	}
	return nil
}

// checkListen checks a listen address: host:port, of a bounded length.
func checkListen(addr string) error {
	if len(addr) > maxAdminListen {
		return fmt.Errorf("%d bytes: must be at most %d", len(addr), maxAdminListen)
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return errors.New("want host:port")
	}
	return nil
}

// parseFake reads damper fake's command line, and the file it names.
func parseFake(args []string, stdout, stderr io.Writer) (fakeFile, error) {
	var f fakeFile
	fs := flag.NewFlagSet("fake", flag.ContinueOnError)
	d := conf.Defaults(fakeFile{})
	config := fs.String("config", "", "read the settings and the phases from this JSON or YAML `file`; flags given override it")
	listen := fs.String("listen", d.Listen, "address to listen on; a non-loopback address serves other hosts")
	fault := fs.String("fault", "", "one phase of this fault, in place of the file's phases: "+strings.Join(fakeFaultNames(), ", "))
	forD := fs.Duration("for", 0, "how long -fault's phase lasts; 0: no time limit")
	requests := fs.Int("requests", 0, "how many Messages requests -fault's phase lasts; 0: no limit")
	every := fs.Int("every", 1, "-fault hits every `n`th request of its phase (the 1st, the n+1th, ...), the others answered healthy")
	retryAfter := fs.Duration("retry-after", d.RetryAfter, "rate_limited's retry-after, whole seconds")
	slow := fs.Duration("slow-first-byte", d.SlowFirstByte, "how long slow holds an answer's first byte")
	text := fs.String("text", d.Text, "the healthy answer's text")
	rpm := fs.Int("rpm", 0, "enforce a requests-per-minute limit, with the API's rate-limit headers; 0: none")
	itpm := fs.Int("itpm", 0, "enforce an input-tokens-per-minute limit; 0: none")
	otpm := fs.Int("otpm", 0, "enforce an output-tokens-per-minute limit; 0: none")
	keep := fs.Int("keep", d.Keep, "how many of the last requests /_fake/requests shows")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: damper fake [flags]

Serves a fake Anthropic Messages API (package dampertest's), for trying
damper proxy and testing a service, in any language, offline: POST
/v1/messages, plain and streaming, answered healthy unless a phase says
otherwise; any other path gets 404 not_found_error. It takes any API key
and keeps none.

Faults come in phases, one after another from the start: from -fault
(with -for, -requests and -every), or from the file's "phases" (each a
fault, and "for", "requests", "every"). A phase ends after its "for" or
its "requests" Messages requests, whichever comes first, and never with
neither; after the last, every answer is healthy. The faults:

`)
		for _, ft := range fakeFaults {
			fmt.Fprintf(fs.Output(), "\t%-17s %s\n", ft.name, ft.does)
		}
		fmt.Fprint(fs.Output(), `
What it received: GET /_fake/requests, a JSON summary (the counts by
fault and by status, and the last requests: method, path, model, stream,
fault, whether an x-api-key came, never its value). POST /_fake/reset
starts the phases, the counts and the rate limits over.

The file holds every setting under its snake_case name (listen, keep,
text, retry_after, slow_first_byte), "rate_limits" (requests_per_minute,
input_tokens_per_minute, output_tokens_per_minute) and "phases".

Flags:
`)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, stdout, stderr); err != nil {
		return f, err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return f, fmt.Errorf("fake takes no arguments, got %q", fs.Args())
	}
	if *config != "" {
		if err := loadFakeFile(*config, &f); err != nil {
			return f, err
		}
	}
	var errs []error
	bad := func(name string, v any, why string) { errs = append(errs, fmt.Errorf("-%s %v: %s", name, v, why)) }
	limits := func() *fakeLimits {
		if f.RateLimits == nil {
			f.RateLimits = &fakeLimits{}
		}
		return f.RateLimits
	}
	given := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { given[fl.Name] = true })
	fs.Visit(func(fl *flag.Flag) {
		switch fl.Name {
		case "listen":
			if err := checkListen(*listen); err != nil {
				bad(fl.Name, shown(*listen), err.Error())
			}
			f.Listen = *listen
		case "fault":
			if !slices.Contains(fakeFaultNames(), *fault) {
				bad(fl.Name, shown(*fault), "want "+strings.Join(fakeFaultNames(), ", "))
			}
		case "for", "requests", "every":
			if !given["fault"] {
				bad(fl.Name, fl.Value, "sets -fault's phase: give -fault too")
			}
		case "retry-after":
			if *retryAfter < time.Second || *retryAfter > time.Hour || *retryAfter%time.Second != 0 {
				bad(fl.Name, *retryAfter, "want whole seconds, 1s to 1h0m0s")
			}
			f.RetryAfter = *retryAfter
		case "slow-first-byte":
			if *slow <= 0 || *slow > 10*time.Minute {
				bad(fl.Name, *slow, "want above 0, at most 10m0s")
			}
			f.SlowFirstByte = *slow
		case "text":
			if *text == "" || len(*text) > maxFakeText {
				bad(fl.Name, shown(*text), fmt.Sprintf("want 1 to %d bytes", maxFakeText))
			}
			f.Text = *text
		case "rpm", "itpm", "otpm":
			v := map[string]*int{"rpm": rpm, "itpm": itpm, "otpm": otpm}[fl.Name]
			if *v < 0 || *v > 1_000_000_000 {
				bad(fl.Name, *v, "want 0 (none) to 1000000000")
			}
			l := limits()
			*map[string]*int{"rpm": &l.RequestsPerMinute, "itpm": &l.InputTokensPerMinute, "otpm": &l.OutputTokensPerMinute}[fl.Name] = *v
		case "keep":
			if *keep < 1 || *keep > 10000 {
				bad(fl.Name, *keep, "want 1 to 10000")
			}
			f.Keep = *keep
		}
	})
	if given["fault"] {
		switch {
		case *forD < 0 || *forD > 720*time.Hour:
			bad("for", *forD, "want 0 (no time limit) to 720h0m0s")
		case *requests < 0 || *requests > 1_000_000_000:
			bad("requests", *requests, "want 0 (no limit) to 1000000000")
		case *every < 1 || *every > 1000:
			bad("every", *every, "want 1 to 1000")
		}
		f.Phases = []fakePhase{{Fault: *fault, For: *forD, Requests: *requests, Every: *every}}
	}
	if err := errors.Join(errs...); err != nil {
		return f, err
	}
	if err := conf.Fill(&f); err != nil {
		return f, err // the flags are checked above: this is a bug
	}
	return f, nil
}

// loadFakeFile reads the file name into f, strictly: its errors name the
// file, the key and the value.
func loadFakeFile(name string, f *fakeFile) error {
	info, err := os.Stat(name)
	if err != nil {
		return err
	}
	if info.Size() > 1<<20 {
		return fmt.Errorf("%s: %d bytes: a fake's file holds at most 1 MiB", name, info.Size())
	}
	data, err := os.ReadFile(name)
	if err != nil {
		return err
	}
	if strings.EqualFold(filepath.Ext(name), ".json") {
		err = conf.DecodeJSON(data, f)
	} else {
		err = conf.DecodeYAML(data, f)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

func runFake(args []string, stdout, stderr io.Writer) int {
	f, err := parseFake(args, stdout, stderr)
	if code, stop := badFlags("fake", err, stderr); stop {
		return code
	}
	logger := newLogger(stderr, slog.LevelInfo)
	ln, err := net.Listen("tcp", f.Listen)
	if err != nil {
		logger.Error("damper fake: cannot listen", "listen", f.Listen, "error", err.Error())
		return exitFail
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := serveFake(ctx, f, ln, logger); err != nil {
		logger.Error("damper fake: stopped", "error", err.Error())
		return exitFail
	}
	return exitOK
}

// serveFake serves the fake API on ln until ctx ends.
func serveFake(ctx context.Context, f fakeFile, ln net.Listener, logger *slog.Logger) error {
	api := newFakeServer(f, time.Now)
	defer api.close()
	srv := &http.Server{
		Handler:           api,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	logger.Info("damper fake: serving", "listen", ln.Addr().String(), "phases", describePhases(f.Phases), "rate_limits", f.RateLimits != nil)
	if beyond, _ := beyondLoopback(f.Listen); beyond {
		logger.Warn("damper fake: listening beyond loopback: other hosts can reach this fake API and read what it received", "listen", f.Listen)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	api.close() // ends the answers held (slow) at once
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		srv.Close()
	}
	<-served
	logger.Info("damper fake: stopped")
	return nil
}

// describePhases is the phases as the start's log line shows them.
func describePhases(phases []fakePhase) string {
	if len(phases) == 0 {
		return "healthy"
	}
	parts := make([]string, 0, len(phases)+1)
	for _, p := range phases {
		s := p.Fault
		if p.Every > 1 {
			s += " every " + strconv.Itoa(p.Every)
		}
		var ends []string
		if p.For > 0 {
			ends = append(ends, p.For.String())
		}
		if p.Requests > 0 {
			ends = append(ends, strconv.Itoa(p.Requests)+" requests")
		}
		if len(ends) > 0 {
			s += " for " + strings.Join(ends, " or ")
		} else {
			s += " for good"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", then ")
}
