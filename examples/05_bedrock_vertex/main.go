// Example 05_bedrock_vertex puts Damper on Amazon Bedrock and Google
// Vertex AI clients built with the SDK's own bedrock and vertex packages,
// then shows what Damper does when its option is given in the wrong place.
//
//	go run ./examples/05_bedrock_vertex
//
// Damper's option goes before the platform's (bedrock.WithConfig,
// vertex.WithCredentials or vertex.WithGoogleAuth). The platform's option
// rewrites each request for its endpoint and signs it, and Damper must sit
// above that so that every retry is rewritten and signed afresh: a SigV4
// signature is dated, and a token may have expired by the time a backoff
// ends. Given after it, Damper would see a request already signed, so it
// refuses the call, before anything is sent, with an error that names the
// option to move.
//
// Nothing reaches the network, and no cloud account is needed:
//   - Bedrock gets an aws.Config with static, made-up credentials, so
//     requests are SigV4-signed locally.
//   - Vertex gets vertex.WithCredentials with a static, made-up token.
//     vertex.WithGoogleAuth, its usual front door, looks up Application
//     Default Credentials and panics when there are none, so it cannot be
//     shown offline; it builds the same option from what it finds.
//   - Both clients keep their platform's real URL, so that Damper names the
//     provider as it would in production, and an HTTP client whose
//     transport is dampertest.Transport serves every request in memory.
//     (To reach a proxy or a private endpoint instead, give
//     option.WithBaseURL after the platform's option, which sets its own.)
//   - dampertest's fake API speaks the first-party path, POST /v1/messages;
//     platformFront, below, takes each platform's path back to it, as the
//     platform's own front end would hand the request to Claude.
//
// The program exits with status 1 if a retry did not go through the
// platform's signing, or if the wrong order was not refused.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/bedrock"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/anthropics/anthropic-sdk-go/v2/vertex"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"golang.org/x/oauth2"
	"golang.org/x/oauth2/google"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	api := dampertest.NewServer(dampertest.InMemory())
	defer api.Close()
	// Each platform is overloaded once, then answers.
	api.Script("bedrock", dampertest.Status(529), dampertest.OK().WithText("Hello from the fake Bedrock."))
	api.Script("vertex", dampertest.Status(529), dampertest.OK().WithText("Hello from the fake Vertex AI."))
	front := &platformFront{api: api}
	inMemory := option.WithHTTPClient(&http.Client{Transport: dampertest.Transport(front)})

	d, err := damper.New(damper.Policy{BackoffBase: 50 * time.Millisecond, BackoffMax: time.Second})
	if err != nil {
		return err
	}

	// A bearer token in the environment would take the place of SigV4.
	os.Unsetenv("AWS_BEARER_TOKEN_BEDROCK")
	awsCfg := aws.Config{
		Region:      "us-east-1",
		Credentials: credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "made-up-secret", ""),
	}
	googleCreds := &google.Credentials{
		ProjectID:   "example-project",
		TokenSource: oauth2.StaticTokenSource(&oauth2.Token{AccessToken: "made-up-vertex-token"}),
	}
	vertexAuth := vertex.WithCredentials(ctx, "us-east5", googleCreds.ProjectID, googleCreds)

	bedrockClient := anthropic.NewClient(
		d.Option(), // first: each attempt then goes through Bedrock's signing
		bedrock.WithConfig(awsCfg),
		inMemory,
	)
	vertexClient := anthropic.NewClient(
		d.Option(),
		// Before vertex's option, which wraps this client's transport with
		// its token; given after, it would replace Vertex's client whole.
		inMemory,
		vertexAuth,
	)

	onBedrock := platform{name: "Bedrock", scenario: "bedrock", model: "anthropic.claude-sonnet-4-5-20250929-v1:0",
		provider: "aws.bedrock", auth: "AWS4-HMAC-SHA256", option: "bedrock.WithConfig"}
	onVertex := platform{name: "Vertex AI", scenario: "vertex", model: "claude-sonnet-4-5@20250929",
		provider: "gcp.vertex_ai", auth: "Bearer", option: "vertex.WithGoogleAuth"}

	fmt.Println("Right order, Damper's option first:")
	if err := onBedrock.call(ctx, front, bedrockClient); err != nil {
		return err
	}
	if err := onVertex.call(ctx, front, vertexClient); err != nil {
		return err
	}

	fmt.Println("\nWrong order, the platform's option first:")
	if err := onBedrock.refused(ctx, front, anthropic.NewClient(bedrock.WithConfig(awsCfg), d.Option(), inMemory)); err != nil {
		return err
	}
	return onVertex.refused(ctx, front, anthropic.NewClient(inMemory, vertexAuth, d.Option()))
}

// platform is what the example expects of one cloud platform.
type platform struct {
	name, scenario, model string
	provider              string // the provider Damper's report names
	auth                  string // how each attempt's Authorization header starts
	option                string // the option Damper's error tells to go after
}

// call makes one Messages call and checks that Damper retried it, with
// each attempt rewritten and signed by the platform's option.
func (p platform) call(ctx context.Context, front *platformFront, client anthropic.Client) error {
	before := len(front.log())
	var rep damper.Report
	msg, err := client.Messages.New(ctx, params(p.model), damper.ReportInto(&rep), dampertest.Scenario(p.scenario))
	if err != nil {
		return fmt.Errorf("%s: %w", p.name, err)
	}
	fmt.Printf("  %s: %q after %d attempts (provider %s)\n", p.name, msg.Content[0].Text, rep.Attempts, rep.Provider)
	seen := front.log()[before:]
	for i, s := range seen {
		status := 0
		if i < len(rep.AttemptLog) {
			status = rep.AttemptLog[i].StatusCode
		}
		fmt.Printf("    attempt %d: HTTP %d, POST %s\n               %s\n", i+1, status, s.path, s.auth)
		if !strings.HasPrefix(s.auth, p.auth) || strings.HasSuffix(s.path, "/v1/messages") {
			return fmt.Errorf("%s: attempt %d was not rewritten and signed by the platform's option", p.name, i+1)
		}
	}
	if len(seen) != 2 || rep.Attempts != 2 || rep.Provider != p.provider {
		return fmt.Errorf("%s: want 2 attempts to %s, got %d (report: %d to %q)", p.name, p.provider, len(seen), rep.Attempts, rep.Provider)
	}
	return nil
}

// refused makes one Messages call on a client whose Damper option comes
// after the platform's, and checks that Damper refused it unsent.
func (p platform) refused(ctx context.Context, front *platformFront, client anthropic.Client) error {
	before := len(front.log())
	_, err := client.Messages.New(ctx, params(p.model), dampertest.Scenario(p.scenario))
	sent := len(front.log()) - before
	fmt.Printf("  %s: %d requests sent, error:\n    %v\n", p.name, sent, err)
	// damper.ErrOptionOrder marks it; its text names the option to move.
	if !errors.Is(err, damper.ErrOptionOrder) || !strings.Contains(err.Error(), "before "+p.option) || sent != 0 {
		return fmt.Errorf("%s: want the call refused unsent, with an error naming %s", p.name, p.option)
	}
	return nil
}

func params(model string) anthropic.MessageNewParams {
	return anthropic.MessageNewParams{
		Model:     anthropic.Model(model),
		MaxTokens: 512,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Say hello."))},
	}
}

// platformFront stands in for Bedrock's and Vertex AI's endpoints: it logs
// the path and credentials of each request, then hands it to the fake API
// on the first-party path.
type platformFront struct {
	api *dampertest.Server

	mu   sync.Mutex
	seen []arrival
}

type arrival struct{ path, auth string }

func (f *platformFront) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// A SigV4 header goes on with the signed headers and the signature;
	// its credential scope (key, date, region, service) is what tells.
	auth, _, _ := strings.Cut(r.Header.Get("Authorization"), ",")
	f.mu.Lock()
	f.seen = append(f.seen, arrival{path: r.URL.Path, auth: auth})
	f.mu.Unlock()
	r.URL.Path, r.URL.RawPath = "/v1/messages", ""
	f.api.Handler().ServeHTTP(w, r)
}

func (f *platformFront) log() []arrival {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]arrival(nil), f.seen...)
}
