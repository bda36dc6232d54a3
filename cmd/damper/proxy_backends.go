package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2/bedrock"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/anthropics/anthropic-sdk-go/v2/vertex"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"golang.org/x/oauth2/google"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/conf"
	"github.com/damper-ai/damper-go/fleet"
)

// The proxy's fallback backends: the file's backends list, each entry
// built into a damper.Backend that a call falls back to, in order, after
// the upstream.

// backendFile is one entry of the file's backends list. The keys a
// provider takes and needs are checked by checkBackendFile.
type backendFile struct {
	// Name labels the backend in reports, metrics and logs.
	Name string `key:"name"`
	// Provider is anthropic, bedrock or vertex.
	Provider string `key:"provider"`
	// BaseURL is the backend's endpoint: required by none, the
	// platform's own by default (https://api.anthropic.com for anthropic).
	BaseURL string `key:"base_url"`
	// APIKeyEnv names the environment variable holding an anthropic
	// backend's API key: the key itself is never in the file.
	APIKeyEnv string `key:"api_key_env"`
	// Region is a bedrock or vertex backend's region.
	Region string `key:"region"`
	// Project is a vertex backend's Google Cloud project.
	Project string `key:"project"`
	// Models maps a model, as callers name it, to this backend's ID for
	// it (damper.Backend.Models).
	Models map[string]string `key:"models" max:"1000" unit:"models"`
	// Weight is the backend's weight under spread routing
	// (policy.fallback.routing: damper.Backend.Weight).
	Weight int `key:"weight" default:"1" min:"1" max:"1000"`
}

// What a file may put in a backend's keys.
const (
	maxBackendName = 32
	maxModelName   = 256
	maxRegion      = 64
	maxProject     = 128
	maxBaseURL     = 2048
)

// The providers a file names, and the platform each is.
var backendProviders = map[string]string{
	"anthropic": damper.ProviderAnthropic,
	"bedrock":   damper.ProviderBedrock,
	"vertex":    damper.ProviderVertex,
}

// providerKeys are the keys each provider takes besides name, provider,
// base_url and models, and whether each is required.
var providerKeys = map[string]map[string]bool{
	"anthropic": {"api_key_env": true},
	"bedrock":   {"region": true},
	"vertex":    {"region": true, "project": true},
}

func init() { conf.Register(checkBackendFile) }

// checkBackendFile is what the tags of backendFile cannot say: the name's
// form, the provider, the keys that belong to it, and each value's form.
func checkBackendFile(b *backendFile, _ backendFile) error {
	bad := func(field string, v any, why string) error {
		return &conf.FieldError{Field: field, Value: v, Why: why}
	}
	switch {
	case b.Name == "":
		return bad("Name", conf.Text("nothing"), "a name is required")
	case len(b.Name) > maxBackendName || !nameChars(b.Name):
		return bad("Name", conf.Text(shown(b.Name)), fmt.Sprintf("want 1 to %d letters, digits, '-' or '_'", maxBackendName))
	case b.Name == damper.PrimaryBackend:
		return bad("Name", b.Name, "is the upstream's own name: pick another")
	}
	if _, ok := backendProviders[b.Provider]; !ok {
		return bad("Provider", conf.Text(shown(b.Provider)), "want anthropic, bedrock or vertex")
	}
	for _, k := range []struct {
		field, key, value string
	}{{"APIKeyEnv", "api_key_env", b.APIKeyEnv}, {"Region", "region", b.Region}, {"Project", "project", b.Project}} {
		required, takes := providerKeys[b.Provider][k.key]
		switch {
		case k.value != "" && !takes:
			return bad(k.field, conf.Text(shown(k.value)), fmt.Sprintf("provider %s takes no %s", b.Provider, k.key))
		case k.value == "" && required:
			return bad(k.field, conf.Text("nothing"), fmt.Sprintf("required for provider %s", b.Provider))
		}
	}
	if b.BaseURL != "" {
		u, err := parseBaseURL(b.BaseURL)
		if err != nil {
			return bad("BaseURL", conf.Text(shownURL(b.BaseURL)), err.Error())
		}
		// The SDK's platform clients rewrite /v1/messages alone: behind a
		// path it would go out unsigned and untranslated.
		if b.Provider != "anthropic" && strings.Trim(u.Path, "/") != "" {
			return bad("BaseURL", conf.Text(shownURL(b.BaseURL)), fmt.Sprintf("a %s base URL has no path", b.Provider))
		}
	}
	if b.APIKeyEnv != "" {
		switch {
		case checkEnvName(b.APIKeyEnv) != nil:
			// Not shown: it may be the key itself, written where its
			// variable's name goes.
			return bad("APIKeyEnv", conf.Text("(not shown)"), fmt.Sprintf("want the name of the environment variable that holds the key, not the key: at most %d letters, digits or '_', not starting with a digit", maxEnvName))
		case os.Getenv(b.APIKeyEnv) == "": // the value is never shown, only the name
			return bad("APIKeyEnv", b.APIKeyEnv, "the environment variable is unset or empty: it must hold the backend's API key")
		}
	}
	if b.Region != "" && (len(b.Region) > maxRegion || !regionChars(b.Region)) {
		return bad("Region", conf.Text(shown(b.Region)), fmt.Sprintf("want a region such as us-east-1: at most %d lowercase letters, digits or '-'", maxRegion))
	}
	if b.Project != "" && (len(b.Project) > maxProject || !projectChars(b.Project)) {
		return bad("Project", conf.Text(shown(b.Project)), fmt.Sprintf("want a project ID: at most %d letters, digits, '-', '.' or ':'", maxProject))
	}
	for from, to := range b.Models {
		for _, m := range []string{from, to} {
			if m == "" || len(m) > maxModelName || !modelChars(m) {
				return bad("Models", conf.Text(shown(from)+": "+shown(to)),
					fmt.Sprintf("a model and its ID are each 1 to %d ASCII letters, digits or -._:@/", maxModelName))
			}
		}
	}
	return nil
}

// checkBackendNames checks what no one entry can: that no two backends
// share a name.
func checkBackendNames(backends []backendFile) error {
	first := map[string]int{}
	for i, b := range backends {
		if j, ok := first[b.Name]; ok {
			return &conf.Error{Path: fmt.Sprintf("backends[%d].name", i), Err: fmt.Errorf("%q: backends[%d] has this name already", b.Name, j)}
		}
		first[b.Name] = i
	}
	return nil
}

// parseBaseURL reads a base_url: an http or https URL with a host, and no
// credentials, query or fragment.
func parseBaseURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	switch {
	case len(s) > maxBaseURL:
		return nil, fmt.Errorf("a URL is at most %d bytes", maxBaseURL)
	case err != nil:
		return nil, errors.New("not a URL")
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, errors.New("want an http or https URL, such as https://api.anthropic.com")
	case u.Host == "" || u.Hostname() == "":
		return nil, errors.New("the URL has no host")
	case u.User != nil:
		return nil, errors.New("a base URL holds no credentials")
	case u.RawQuery != "" || u.Fragment != "" || u.ForceQuery:
		return nil, errors.New("a base URL has no query or fragment")
	}
	return u, nil
}

func allChars(s string, ok func(c byte) bool) bool {
	for i := 0; i < len(s); i++ {
		if !ok(s[i]) {
			return false
		}
	}
	return s != ""
}

func alnum(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' }

func nameChars(s string) bool {
	return allChars(s, func(c byte) bool { return alnum(c) || c == '-' || c == '_' })
}

func regionChars(s string) bool {
	return allChars(s, func(c byte) bool { return 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' })
}

func projectChars(s string) bool {
	return allChars(s, func(c byte) bool { return alnum(c) || c == '-' || c == '.' || c == ':' })
}

// modelChars: the characters of model IDs, as the proxy accepts them in
// a request.
func modelChars(s string) bool {
	return allChars(s, func(c byte) bool { return alnum(c) || strings.IndexByte("-._:@/", c) >= 0 })
}

// fallbackBackend is a backend of the file, built: what Damper gets, and
// what the checks at start look at.
type fallbackBackend struct {
	index   int
	name    string
	backend damper.Backend
	// endpoint is where the backend's attempts go.
	endpoint *url.URL
	// credentials, when not nil, gets the backend's credentials, as its
	// first attempt would.
	credentials func(ctx context.Context) error
}

// label names the backend in errors: backends[1] ("bedrock").
func (b *fallbackBackend) label() string { return fmt.Sprintf("backends[%d] (%q)", b.index, b.name) }

// buildBackends builds one damper.Backend per entry of files, in order.
// storeFor, when not nil, gives each backend the store of its state.
// Building reads configuration and credential files but sends nothing:
// the checks at start (startChecks) do. The platform SDKs' own messages go
// to logger; nil drops them.
func buildBackends(ctx context.Context, files []backendFile, storeFor func(backendName string) (fleet.Store, error), logger *slog.Logger) ([]fallbackBackend, error) {
	out := make([]fallbackBackend, 0, len(files))
	for i, f := range files {
		fb := fallbackBackend{index: i, name: f.Name}
		fb.backend = damper.Backend{Name: f.Name, Provider: backendProviders[f.Provider], Models: f.Models, Weight: f.Weight}
		var base *url.URL
		if f.BaseURL != "" {
			var err error
			if base, err = parseBaseURL(f.BaseURL); err != nil {
				return nil, fmt.Errorf("%s: base_url %s: %w", fb.label(), shownURL(f.BaseURL), err)
			}
		}
		var opts []option.RequestOption
		switch f.Provider {
		case "anthropic":
			if base == nil {
				base, _ = url.Parse(defaultProxyUpstream)
			}
			key := os.Getenv(f.APIKeyEnv)
			if key == "" {
				return nil, fmt.Errorf("%s: the environment variable %s is unset or empty", fb.label(), f.APIKeyEnv)
			}
			opts = []option.RequestOption{option.WithAPIKey(key), option.WithBaseURL(base.String())}
		case "bedrock":
			cfg, err := config.LoadDefaultConfig(ctx, config.WithRegion(f.Region), config.WithLogger(awsLogger(logger)))
			if err != nil {
				return nil, fmt.Errorf("%s: the AWS configuration: %w", fb.label(), err)
			}
			opts = []option.RequestOption{bedrock.WithConfig(cfg)}
			if base != nil {
				opts = append(opts, option.WithBaseURL(base.String())) // after WithConfig, which sets its own
			} else {
				base, _ = url.Parse("https://bedrock-runtime." + f.Region + ".amazonaws.com")
			}
			fb.credentials = bedrockCredentials(cfg)
		case "vertex":
			creds, err := google.FindDefaultCredentials(ctx, "https://www.googleapis.com/auth/cloud-platform")
			if err != nil {
				return nil, fmt.Errorf("%s: no Google credentials (Application Default Credentials): %w", fb.label(), err)
			}
			opt, err := vertexOption(ctx, f.Region, f.Project, creds)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", fb.label(), err)
			}
			opts = []option.RequestOption{opt}
			if base != nil {
				opts = append(opts, option.WithBaseURL(base.String()))
			} else {
				base = vertexEndpoint(f.Region)
			}
			fb.credentials = func(context.Context) error {
				if _, err := creds.TokenSource.Token(); err != nil {
					return fmt.Errorf("no Google credentials: %w", err)
				}
				return nil
			}
		default:
			return nil, fmt.Errorf("%s: provider %s: want anthropic, bedrock or vertex", fb.label(), shown(f.Provider))
		}
		fb.backend.Options, fb.endpoint = opts, base
		if storeFor != nil {
			s, err := storeFor(f.Name)
			if err != nil {
				return nil, fmt.Errorf("%s: its store: %w", fb.label(), err)
			}
			fb.backend.Store = s
		}
		out = append(out, fb)
	}
	return out, nil
}

// bedrockCredentials gets the credentials of the AWS default chain as
// Bedrock's first attempt would; a bearer token in
// AWS_BEARER_TOKEN_BEDROCK, which the SDK takes over them, needs none.
func bedrockCredentials(cfg aws.Config) func(context.Context) error {
	return func(ctx context.Context) error {
		if os.Getenv("AWS_BEARER_TOKEN_BEDROCK") != "" {
			return nil
		}
		if cfg.Credentials == nil {
			return errors.New("no AWS credentials: the default chain found none")
		}
		if _, err := cfg.Credentials.Retrieve(ctx); err != nil {
			return fmt.Errorf("no AWS credentials: %w", err)
		}
		return nil
	}
}

// vertexOption is vertex.WithCredentials, whose failure to make its HTTP
// client (a bad client-certificate setting in the environment) is a panic.
func vertexOption(ctx context.Context, region, project string, creds *google.Credentials) (opt option.RequestOption, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("the Vertex AI client: %v", r)
		}
	}()
	return vertex.WithCredentials(ctx, region, project, creds), nil
}

// vertexEndpoint is the endpoint the SDK's vertex package picks for region.
func vertexEndpoint(region string) *url.URL {
	host := region + "-aiplatform.googleapis.com"
	switch region {
	case "global":
		host = "aiplatform.googleapis.com"
	case "us", "eu":
		host = "aiplatform." + region + ".rep.googleapis.com"
	}
	return &url.URL{Scheme: "https", Host: host}
}

// damperBackends are the backends as damper.WithBackends takes them.
func damperBackends(built []fallbackBackend) []damper.Backend {
	out := make([]damper.Backend, len(built))
	for i, b := range built {
		out[i] = b.backend
	}
	return out
}

// startChecks are the checks made before the proxy listens: each
// backend's credentials, and a TCP connection to each backend and to the
// upstream (or to the HTTP proxy that would carry their requests). They
// run at once, all of them within timeout.
type startChecks struct {
	dial    func(ctx context.Context, network, addr string) (net.Conn, error)
	proxy   func(*http.Request) (*url.URL, error) // the HTTP proxy of a request; nil for none
	timeout time.Duration
}

func defaultStartChecks() startChecks {
	return startChecks{dial: (&net.Dialer{}).DialContext, proxy: http.ProxyFromEnvironment, timeout: 5 * time.Second}
}

// run makes the checks and returns the failures, one per backend or
// upstream, each naming it.
func (c startChecks) run(ctx context.Context, upstream string, backends []fallbackBackend) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	type check struct {
		label string
		run   func(ctx context.Context) error
	}
	var checks []check
	if u, err := parseBaseURL(upstream); err == nil { // a bad upstream is refused when the settings are read
		checks = append(checks, check{"upstream", func(ctx context.Context) error {
			if err := c.reach(ctx, u); err != nil {
				return fmt.Errorf("%w (every call goes to the upstream, %s: set upstream in the file, or --upstream, to an API this host reaches; offline, a fake API on loopback, as in the README's quick start)", err, maskURL(upstream))
			}
			return nil
		}})
	}
	for _, b := range backends {
		checks = append(checks, check{b.label(), func(ctx context.Context) error {
			if b.credentials != nil {
				if err := b.credentials(ctx); err != nil {
					return err
				}
			}
			return c.reach(ctx, b.endpoint)
		}})
	}
	errs := make([]error, len(checks))
	var wg sync.WaitGroup
	for i, ch := range checks {
		done := make(chan error, 1) // a check that ignores ctx is left behind, not waited for
		go func() { done <- ch.run(ctx) }()
		wg.Go(func() {
			select {
			case err := <-done:
				errs[i] = err
			case <-ctx.Done():
				errs[i] = fmt.Errorf("no answer within %v", c.timeout)
			}
			if errs[i] != nil {
				errs[i] = fmt.Errorf("%s: %w", ch.label, errs[i])
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// reach opens, and closes, a TCP connection to u's host, or to the HTTP
// proxy that a request to u would go through.
func (c startChecks) reach(ctx context.Context, u *url.URL) error {
	addr := hostPort(u)
	via := ""
	if c.proxy != nil {
		p, err := c.proxy(&http.Request{Method: http.MethodPost, URL: u, Header: http.Header{}})
		if err != nil {
			// Not err: it repeats the proxy's URL, credentials and all.
			return fmt.Errorf("the HTTP proxy for %s: the proxy URL in HTTPS_PROXY or HTTP_PROXY is not valid", addr)
		}
		if p != nil {
			via = addr
			addr = hostPort(p)
		}
	}
	conn, err := c.dial(ctx, "tcp", addr)
	if err != nil {
		if via != "" {
			return fmt.Errorf("cannot reach the HTTP proxy %s (for %s): %w", addr, via, err)
		}
		return fmt.Errorf("cannot reach %s: %w", addr, err)
	}
	return conn.Close()
}

// hostPort is u's host and port, the scheme's when u names none.
func hostPort(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = "443"
		if u.Scheme == "http" {
			port = "80"
		}
	}
	return net.JoinHostPort(u.Hostname(), port)
}

// startBackends builds the backends of s and makes the checks at start,
// for runProxy: an error names each backend, or the upstream, that
// cannot be used.
func startBackends(ctx context.Context, s proxySettings, c startChecks, logger *slog.Logger) ([]fallbackBackend, error) {
	storeFor := s.fleet.storeFor()
	if s.stores != nil {
		storeFor = s.stores.storeFor
	}
	built, err := buildBackends(ctx, s.Backends, storeFor, logger)
	if err != nil {
		return nil, err
	}
	if err := c.run(ctx, s.Upstream, built); err != nil {
		return nil, err
	}
	return built, nil
}
