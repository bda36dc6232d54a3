package damper_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	anthropicaws "github.com/anthropics/anthropic-sdk-go/v2/aws"
	"github.com/anthropics/anthropic-sdk-go/v2/bedrock"
	"github.com/anthropics/anthropic-sdk-go/v2/foundry"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// bedrockFake answers Bedrock's invoke path: 529 first, then a message. It
// records the signature of every attempt.
type bedrockFake struct {
	mu    sync.Mutex
	paths []string
	auths []string
}

func (f *bedrockFake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.paths = append(f.paths, r.URL.Path)
	f.auths = append(f.auths, r.Header.Get("Authorization"))
	n := len(f.paths)
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if n == 1 {
		w.WriteHeader(529)
		w.Write([]byte(`{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`))
		return
	}
	writeMessage(w)
}

func writeMessage(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	w.Write([]byte(`{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-6","content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","usage":{"input_tokens":1,"output_tokens":1}}`))
}

// memHTTP serves every request with h in memory, whatever its host, so
// that a client keeps a platform's real host name without the network.
func memHTTP(h http.Handler) option.RequestOption {
	return option.WithHTTPClient(&http.Client{Transport: dampertest.Transport(h)})
}

// bedrockClient keeps the host bedrock.WithConfig sets, the one Damper
// names the provider from, and serves it with h in memory.
func bedrockClient(t *testing.T, h http.Handler, damperFirst bool, d *damper.Damper) anthropic.Client {
	t.Setenv("AWS_BEARER_TOKEN_BEDROCK", "")
	cfg := aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", "")}
	opts := []option.RequestOption{bedrock.WithConfig(cfg), memHTTP(h)}
	if damperFirst {
		opts = append([]option.RequestOption{d.Option()}, opts...)
	} else {
		opts = append(opts, d.Option())
	}
	return anthropic.NewClient(opts...)
}

func TestBedrockEachAttemptSignedAfresh(t *testing.T) {
	fake := &bedrockFake{}
	d, err := damper.New(damper.Policy{BackoffBase: 1, BackoffMax: 1})
	if err != nil {
		t.Fatal(err)
	}
	var rep damper.Report
	client := bedrockClient(t, fake, true, d)
	msg, err := client.Messages.New(context.Background(), params("claude-sonnet-4-6"), damper.ReportInto(&rep))
	if err != nil || msg.Content[0].Text != "ok" {
		t.Fatalf("err = %v", err)
	}
	if len(fake.paths) != 2 || rep.Attempts != 2 {
		t.Fatalf("server saw %d attempts, report %d; want 2", len(fake.paths), rep.Attempts)
	}
	for i, p := range fake.paths {
		if !strings.HasSuffix(p, "/invoke") {
			t.Errorf("attempt %d went to %s, want Bedrock's invoke path", i+1, p)
		}
		if !strings.HasPrefix(fake.auths[i], "AWS4-HMAC-SHA256") {
			t.Errorf("attempt %d is not SigV4-signed: %q", i+1, fake.auths[i])
		}
	}
	if rep.Provider != "aws.bedrock" {
		t.Errorf("provider = %q, want aws.bedrock", rep.Provider)
	}
}

func TestBedrockWrongOrderIsRefused(t *testing.T) {
	fake := &bedrockFake{}
	d, err := damper.New(damper.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	client := bedrockClient(t, fake, false, d)
	_, err = client.Messages.New(context.Background(), params("claude-sonnet-4-6"), option.WithMaxRetries(0))
	if !errors.Is(err, damper.ErrOptionOrder) || !strings.Contains(err.Error(), "before bedrock.WithConfig") {
		t.Fatalf("err = %v, want the option-order error", err)
	}
	var apiErr *anthropic.Error
	if errors.As(err, &apiErr) || len(fake.paths) != 0 {
		t.Errorf("the request reached the server %d times", len(fake.paths))
	}
}

// platform is a way the SDK reaches Claude, as a test builds it.
type platform struct {
	name string
	// messages returns the Messages service of a client for the platform.
	// first are options in the place the platform keeps for the caller's
	// middleware, before its own signing; h serves the client in memory.
	messages func(t *testing.T, h http.Handler, first ...option.RequestOption) anthropic.MessageService
	// provider is the SDK's gen_ai.provider.name for the platform, which
	// the report must name.
	provider string
	// auth starts the Authorization header of every attempt that reaches
	// the server ("" to leave it unchecked).
	auth string
	// fix names the option Damper must go before (or among) when the
	// platform signs or rewrites requests in its middleware; "" when it does
	// not, so that Damper works given to one call too.
	fix string
}

// jwt stands for an Entra ID access token: its shape, not its content,
// matters.
const jwt = "eyJhbGciOiJSUzI1NiJ9.eyJhdWQiOiJodHRwczovL2FpLmF6dXJlLmNvbSJ9.c2ln"

func platforms() []platform {
	awsCreds := func(t *testing.T, region string) aws.Config {
		t.Setenv("AWS_BEARER_TOKEN_BEDROCK", "")
		return aws.Config{Region: region, Credentials: credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", "")}
	}
	// firstParty is a client of the first-party API, or of a platform
	// reached by its base URL alone; after are options that follow the
	// caller's own, as a platform's are.
	firstParty := func(base string, after ...option.RequestOption) func(*testing.T, http.Handler, ...option.RequestOption) anthropic.MessageService {
		return func(t *testing.T, h http.Handler, first ...option.RequestOption) anthropic.MessageService {
			t.Setenv("ANTHROPIC_BASE_URL", "")
			opts := append(first, option.WithAPIKey("sk-ant-test"), memHTTP(h))
			if base != "" {
				opts = append(opts, option.WithBaseURL(base))
			}
			return anthropic.NewClient(append(opts, after...)...).Messages
		}
	}
	// The vertex and googlecloud packages need Google's auth modules, which
	// this module does not require. Their rows point a client at the
	// platform's host, the one Damper names the provider from, and stand in
	// for the platform's middleware with one that does to the request what
	// it does (vertex.go's path rewrite; googlecloud's Google bearer token).
	vertex := func(base, region string) func(*testing.T, http.Handler, ...option.RequestOption) anthropic.MessageService {
		rewrite := option.WithMiddleware(func(r *http.Request, next option.MiddlewareNext) (*http.Response, error) {
			if r.Method == http.MethodPost && r.URL.Path == "/v1/messages" {
				r.URL.Path = "/v1/projects/test-project/locations/" + region + "/publishers/anthropic/models/claude-sonnet-4-6:rawPredict"
			}
			return next(r)
		})
		return firstParty(base, rewrite)
	}
	googleBearer := option.WithMiddleware(func(r *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		if r.Header.Get("Authorization") == "" {
			r.Header.Set("Authorization", "Bearer ya29.test-token")
		}
		return next(r)
	})
	googleCloud := func(t *testing.T, h http.Handler, first ...option.RequestOption) anthropic.MessageService {
		opts := append([]option.RequestOption{
			option.WithoutEnvironmentDefaults(),
			option.WithBaseURL("https://claude.googleapis.com/v1/projects/test-project/locations/global/workspaces/wrkspc_test/invoke/"),
		}, first...)
		return anthropic.NewClient(append(opts, memHTTP(h), googleBearer)...).Messages
	}
	mantle := func(apiKey string) func(*testing.T, http.Handler, ...option.RequestOption) anthropic.MessageService {
		return func(t *testing.T, h http.Handler, first ...option.RequestOption) anthropic.MessageService {
			t.Setenv("AWS_BEARER_TOKEN_BEDROCK", "")
			t.Setenv("ANTHROPIC_AWS_API_KEY", "")
			t.Setenv("ANTHROPIC_BEDROCK_MANTLE_BASE_URL", "")
			cfg := bedrock.MantleClientConfig{APIKey: apiKey, AWSRegion: "us-west-2"}
			if apiKey == "" {
				cfg.AWSAccessKey, cfg.AWSSecretAccessKey = "AKIDEXAMPLE", "secret"
			}
			c, err := bedrock.NewMantleClient(context.Background(), cfg, append(first, memHTTP(h))...)
			if err != nil {
				t.Fatal(err)
			}
			return c.Messages
		}
	}
	gateway := func(apiKey string) func(*testing.T, http.Handler, ...option.RequestOption) anthropic.MessageService {
		return func(t *testing.T, h http.Handler, first ...option.RequestOption) anthropic.MessageService {
			t.Setenv("ANTHROPIC_AWS_API_KEY", "")
			t.Setenv("ANTHROPIC_AWS_BASE_URL", "")
			cfg := anthropicaws.ClientConfig{APIKey: apiKey, AWSRegion: "eu-central-1", WorkspaceID: "wrkspc_test"}
			if apiKey == "" {
				cfg.AWSAccessKey, cfg.AWSSecretAccessKey = "AKIDEXAMPLE", "secret"
			}
			c, err := anthropicaws.NewClient(context.Background(), cfg, append(first, memHTTP(h))...)
			if err != nil {
				t.Fatal(err)
			}
			return c.Messages
		}
	}
	azure := func(entra bool) func(*testing.T, http.Handler, ...option.RequestOption) anthropic.MessageService {
		return func(t *testing.T, h http.Handler, first ...option.RequestOption) anthropic.MessageService {
			for _, k := range []string{"ANTHROPIC_FOUNDRY_API_KEY", "ANTHROPIC_FOUNDRY_RESOURCE", "ANTHROPIC_FOUNDRY_BASE_URL"} {
				t.Setenv(k, "")
			}
			cfg := foundry.ClientConfig{Resource: "test-resource", APIKey: "0123456789abcdef0123456789abcdef"}
			if entra {
				cfg.APIKey = ""
				cfg.AzureADTokenProvider = func(context.Context) (string, error) { return jwt, nil }
			}
			c, err := foundry.NewClient(cfg, append(first, memHTTP(h))...)
			if err != nil {
				t.Fatal(err)
			}
			return c.Messages
		}
	}
	return []platform{
		{name: "first-party", messages: firstParty(""), provider: "anthropic", auth: "Bearer sk-ant-test"},
		{name: "first-party, explicit URL", messages: firstParty("https://api.anthropic.com"), provider: "anthropic"},
		{name: "bedrock, SigV4", provider: "aws.bedrock", auth: "AWS4-HMAC-SHA256 ", fix: "bedrock.WithConfig",
			messages: func(t *testing.T, h http.Handler, first ...option.RequestOption) anthropic.MessageService {
				return anthropic.NewClient(append(first, bedrock.WithConfig(awsCreds(t, "eu-west-3")), memHTTP(h))...).Messages
			}},
		{name: "bedrock, bearer token", provider: "aws.bedrock", auth: "Bearer bedrock-key", fix: "bedrock.WithConfig",
			messages: func(t *testing.T, h http.Handler, first ...option.RequestOption) anthropic.MessageService {
				cfg := awsCreds(t, "us-east-1")
				t.Setenv("AWS_BEARER_TOKEN_BEDROCK", "bedrock-key")
				return anthropic.NewClient(append(first, bedrock.WithConfig(cfg), memHTTP(h))...).Messages
			}},
		{name: "bedrock mantle, SigV4", messages: mantle(""), provider: "aws.bedrock", auth: "AWS4-HMAC-SHA256 ", fix: "bedrock.NewMantleClient"},
		{name: "bedrock mantle, API key", messages: mantle("mantle-key"), provider: "aws.bedrock", auth: "Bearer mantle-key"},
		{name: "aws gateway, SigV4", messages: gateway(""), provider: "anthropic", auth: "AWS4-HMAC-SHA256 ", fix: "aws.NewClient"},
		{name: "aws gateway, API key", messages: gateway("sk-ant-test"), provider: "anthropic", auth: "Bearer sk-ant-test"},
		{name: "foundry, Entra ID", messages: azure(true), provider: "anthropic", auth: "Bearer " + jwt, fix: "foundry.NewClient"},
		{name: "foundry, API key", messages: azure(false), provider: "anthropic"},
		// A first-party client pointed at Foundry sends its API key as a
		// bearer token, which is not one Foundry's middleware added.
		{name: "foundry, first-party options", messages: firstParty("https://test-resource.services.ai.azure.com/anthropic/"), provider: "anthropic", auth: "Bearer sk-ant-test"},
		{name: "vertex, regional", messages: vertex("https://us-east5-aiplatform.googleapis.com/", "us-east5"), provider: "gcp.vertex_ai", fix: "vertex.WithGoogleAuth"},
		{name: "vertex, global", messages: vertex("https://aiplatform.googleapis.com/", "global"), provider: "gcp.vertex_ai", fix: "vertex.WithGoogleAuth"},
		{name: "vertex, us multi-region", messages: vertex("https://aiplatform.us.rep.googleapis.com/", "us"), provider: "gcp.vertex_ai", fix: "vertex.WithGoogleAuth"},
		{name: "vertex, eu multi-region", messages: vertex("https://aiplatform.eu.rep.googleapis.com/", "eu"), provider: "gcp.vertex_ai", fix: "vertex.WithGoogleAuth"},
		{name: "google cloud gateway", messages: googleCloud, provider: "anthropic", auth: "Bearer ya29.", fix: "googlecloud.NewClient"},
	}
}

// TestPlatforms: on every platform the SDK serves, Damper given before the
// platform's own middleware retries with each attempt signed afresh and
// reports the SDK's provider name; given to one call, after the platform's
// middleware, it refuses the call before any request is sent, with an error
// that names the option to move, unless the platform signs nothing in
// middleware.
func TestPlatforms(t *testing.T) {
	for _, p := range platforms() {
		t.Run(p.name+"/damper first", func(t *testing.T) {
			fake := &bedrockFake{}
			d, err := damper.New(damper.Policy{BackoffBase: 1, BackoffMax: 1})
			if err != nil {
				t.Fatal(err)
			}
			var rep damper.Report
			svc := p.messages(t, fake, d.Option())
			msg, err := svc.New(context.Background(), params("claude-sonnet-4-6"), damper.ReportInto(&rep))
			if err != nil || msg.Content[0].Text != "ok" {
				t.Fatalf("err = %v", err)
			}
			if rep.Provider != p.provider {
				t.Errorf("provider = %q, want %q", rep.Provider, p.provider)
			}
			if len(fake.paths) != 2 || rep.Attempts != 2 {
				t.Fatalf("server saw %d attempts, report %d; want 2", len(fake.paths), rep.Attempts)
			}
			for i, auth := range fake.auths {
				if !strings.HasPrefix(auth, p.auth) {
					t.Errorf("attempt %d has Authorization %q, want it to start with %q", i+1, auth, p.auth)
				}
			}
		})
		t.Run(p.name+"/damper at the call site", func(t *testing.T) {
			fake := &bedrockFake{}
			d, err := damper.New(damper.Policy{BackoffBase: 1, BackoffMax: 1})
			if err != nil {
				t.Fatal(err)
			}
			// seen is where Damper would send the caller, for the request
			// Damper sees.
			var seen string
			probe := option.WithMiddleware(func(r *http.Request, next option.MiddlewareNext) (*http.Response, error) {
				seen = damper.SignedByForTest(r)
				return next(r)
			})
			var rep damper.Report
			svc := p.messages(t, fake)
			_, err = svc.New(context.Background(), params("claude-sonnet-4-6"),
				probe, d.Option(), option.WithMaxRetries(0), damper.ReportInto(&rep))
			if p.fix == "" {
				if err != nil || seen != "" {
					t.Fatalf("err = %v, Damper would say %q; want the call run", err, seen)
				}
				if rep.Provider != p.provider || rep.Attempts != 2 {
					t.Errorf("provider = %q after %d attempts, want %q after 2", rep.Provider, rep.Attempts, p.provider)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), p.fix) || !strings.Contains(seen, p.fix) {
				t.Fatalf("err = %v, Damper would say %q; want the option-order error naming %s", err, seen, p.fix)
			}
			var apiErr *anthropic.Error
			if errors.As(err, &apiErr) || len(fake.paths) != 0 {
				t.Errorf("the request reached the server %d times", len(fake.paths))
			}
		})
	}
}

// A caller may set any X-Stainless-Retry-Count it likes: Damper tells the
// SDK's own retry by the logical request, not by that header, so every
// value leaves its calls and retries as they are.
func TestCallerRetryCountHeaderChangesNothing(t *testing.T) {
	for _, v := range []string{"0", "1", "5", "not a number"} {
		r := newRig(t, damper.Policy{})
		r.srv.Script("", dampertest.Status(529), dampertest.OK())
		var rep damper.Report
		_, err := r.client.Messages.New(context.Background(), params("claude-sonnet-4-6"),
			option.WithHeader("X-Stainless-Retry-Count", v), damper.ReportInto(&rep))
		if err != nil || rep.Attempts != 2 || rep.Outcome != damper.OutcomeSuccess || r.srv.Count("") != 2 {
			t.Errorf("X-Stainless-Retry-Count %q: err %v, report %d attempts %q, server %d; want a success on the second attempt",
				v, err, rep.Attempts, rep.Outcome, r.srv.Count(""))
		}
	}
}

// With the header set by the caller, the SDK numbers nothing; its own run
// again after its request timeout is still refused without an attempt.
func TestSDKRetryRefusedWhateverTheHeader(t *testing.T) {
	for _, v := range []string{"", "0", "7"} {
		srv := &rawServer{handlers: []http.HandlerFunc{func(w http.ResponseWriter, r *http.Request) {
			<-r.Context().Done() // until the SDK's request timeout
		}}}
		synctest.Test(t, func(t *testing.T) {
			client := memClient(newDamper(t, damper.Policy{}), srv)
			opts := []option.RequestOption{option.WithRequestTimeout(2 * time.Second)}
			if v != "" {
				opts = append(opts, option.WithHeader("X-Stainless-Retry-Count", v))
			}
			_, err := client.Messages.New(context.Background(), params("claude-sonnet-4-5"), opts...)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("header %q: err = %v, want context.DeadlineExceeded", v, err)
			}
			if n := srv.requests.Load(); n != 1 {
				t.Fatalf("header %q: the server got %d requests, want 1: the SDK's runs again reached it", v, n)
			}
		})
	}
}

// TestSDKRetriesNeverStack: with one attempt allowed, the SDK's own loop
// (two retries by default) must not run either.
func TestSDKRetriesNeverStack(t *testing.T) {
	for _, step := range []dampertest.Step{
		dampertest.Status(529),
		dampertest.Status(429).RetryAfter("1"),
		dampertest.OK().WithDrop(dampertest.DropBeforeHeaders),
	} {
		r := newRig(t, damper.Policy{MaxAttempts: 1})
		r.srv.Script("", step)
		if _, err := r.client.Messages.New(context.Background(), params("claude-sonnet-4-6")); err == nil {
			t.Fatal("want an error")
		}
		if got := r.srv.Count(""); got != 1 {
			t.Errorf("%+v: provider attempts = %d, want 1", step, got)
		}
	}
}

// TestOtherEndpointsPassThrough: calls other than Messages are the SDK's,
// retries included. An endpoint that answers 529 is tried again after the
// SDK's own backoff, up to its default two retries, and Damper neither
// counts nor reports those attempts. The bubble's clock makes the backoff
// take no real time and shows its length.
func TestOtherEndpointsPassThrough(t *testing.T) {
	countTokens := func(client anthropic.Client, rep *damper.Report) error {
		res, err := client.Messages.CountTokens(context.Background(), anthropic.MessageCountTokensParams{
			Model:    "claude-sonnet-4-6",
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))},
		}, damper.ReportInto(rep))
		if err == nil && res.InputTokens != 12 {
			return fmt.Errorf("input_tokens = %d, want the last attempt's 12", res.InputTokens)
		}
		return err
	}
	listModels := func(client anthropic.Client, rep *damper.Report) error {
		page, err := client.Models.List(context.Background(), anthropic.ModelListParams{}, damper.ReportInto(rep))
		if err == nil && (len(page.Data) != 1 || page.Data[0].ID != "claude-sonnet-4-6") {
			return fmt.Errorf("models = %+v, want the last attempt's one model", page.Data)
		}
		return err
	}
	for _, tt := range []struct {
		name, method, path, body string
		do                       func(anthropic.Client, *damper.Report) error
	}{
		{"count_tokens", http.MethodPost, "/v1/messages/count_tokens", `{"input_tokens":12}`, countTokens},
		{"models list", http.MethodGet, "/v1/models", `{"data":[{"type":"model","id":"claude-sonnet-4-6","display_name":"Claude Sonnet 4.6","created_at":"2026-01-01T00:00:00Z"}],"has_more":false,"first_id":"claude-sonnet-4-6","last_id":"claude-sonnet-4-6"}`, listModels},
	} {
		for _, run := range []struct {
			name     string
			failures int // 529s the endpoint sends before its answer
		}{{"fails once", 1}, {"keeps failing", math.MaxInt}} {
			failures := run.failures
			t.Run(tt.name+", "+run.name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					var mu sync.Mutex
					var tries []string // X-Stainless-Retry-Count of each attempt
					h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
						mu.Lock()
						tries = append(tries, r.Header.Get("X-Stainless-Retry-Count"))
						n := len(tries)
						mu.Unlock()
						w.Header().Set("Content-Type", "application/json")
						if r.Method != tt.method || r.URL.Path != tt.path {
							w.WriteHeader(http.StatusNotFound)
							w.Write([]byte(`{"type":"error","error":{"type":"not_found_error","message":"` + r.Method + " " + r.URL.Path + `"}}`))
							return
						}
						if n <= failures {
							w.WriteHeader(529)
							w.Write([]byte(`{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`))
							return
						}
						w.Write([]byte(tt.body))
					})
					client := memClient(newDamper(t, damper.Policy{}), h)
					var rep damper.Report
					start := time.Now()
					err := tt.do(client, &rep)
					elapsed := time.Since(start)

					// The SDK waits 0.5 s before its first retry and 1 s
					// before its second, less up to a quarter of jitter.
					wantTries, lo, hi := []string{"0", "1"}, 375*time.Millisecond, 500*time.Millisecond
					var apiErr *anthropic.Error
					if failures > 2 {
						wantTries, lo, hi = []string{"0", "1", "2"}, 1125*time.Millisecond, 1500*time.Millisecond
						if !errors.As(err, &apiErr) || apiErr.StatusCode != 529 {
							t.Fatalf("err = %v, want the SDK's 529 after its retries", err)
						}
					} else if err != nil {
						t.Fatal(err)
					}
					mu.Lock()
					defer mu.Unlock()
					if !slices.Equal(tries, wantTries) {
						t.Errorf("attempts with retry counts %q, want %q", tries, wantTries)
					}
					if elapsed < lo || elapsed > hi {
						t.Errorf("took %v, want the SDK's backoff of %v to %v", elapsed, lo, hi)
					}
					if rep.Attempts != 0 || rep.Outcome != "" {
						t.Errorf("Damper reported %+v on a call it does not own", rep)
					}
				})
			})
		}
	}
}

func TestBetaMessagesNew(t *testing.T) {
	r := newRig(t, damper.Policy{})
	r.srv.Script("", dampertest.Status(529), dampertest.OK())
	var rep damper.Report
	_, err := r.client.Beta.Messages.New(context.Background(), anthropic.BetaMessageNewParams{
		Model:     "claude-sonnet-4-6",
		MaxTokens: 16,
		Messages:  []anthropic.BetaMessageParam{anthropic.NewBetaUserMessage(anthropic.NewBetaTextBlock("hi"))},
	}, damper.ReportInto(&rep))
	if err != nil || rep.Attempts != 2 || rep.Outcome != damper.OutcomeSuccess {
		t.Fatalf("err = %v, report = %+v; want success on attempt 2", err, rep)
	}
}
