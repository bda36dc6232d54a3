package damper_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/bedrock"
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
	if err == nil || !strings.Contains(err.Error(), "before bedrock.WithConfig") {
		t.Fatalf("err = %v, want the option-order error", err)
	}
	var apiErr *anthropic.Error
	if errors.As(err, &apiErr) || len(fake.paths) != 0 {
		t.Errorf("the request reached the server %d times", len(fake.paths))
	}
}

// TestProviderLabel: the report names the platform the client is pointed
// at, from the host of the request Damper sees.
func TestProviderLabel(t *testing.T) {
	t.Setenv("ANTHROPIC_BASE_URL", "") // the first-party row keeps the SDK's own URL
	t.Setenv("AWS_BEARER_TOKEN_BEDROCK", "")
	cfg := aws.Config{Region: "eu-west-3", Credentials: credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", "")}
	anyRequest := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { writeMessage(w) })
	for _, tt := range []struct {
		name     string
		platform []option.RequestOption
		want     string
	}{
		{"first-party", []option.RequestOption{option.WithAPIKey("test-key")}, "anthropic"},
		{"first-party, explicit URL", []option.RequestOption{option.WithBaseURL("https://api.anthropic.com"), option.WithAPIKey("test-key")}, "anthropic"},
		{"bedrock", []option.RequestOption{bedrock.WithConfig(cfg)}, "aws.bedrock"},
		// The vertex package needs Google's auth modules, which this module
		// does not require. Damper, given first, sees the request before
		// Vertex's middleware rewrites it: the same request as a client on
		// Vertex's base URL sends.
		{"vertex, regional", []option.RequestOption{option.WithBaseURL("https://us-east5-aiplatform.googleapis.com/"), option.WithAPIKey("test-key")}, "gcp.vertex_ai"},
		{"vertex, global", []option.RequestOption{option.WithBaseURL("https://aiplatform.googleapis.com/"), option.WithAPIKey("test-key")}, "gcp.vertex_ai"},
		{"vertex, multi-region", []option.RequestOption{option.WithBaseURL("https://aiplatform.eu.rep.googleapis.com/"), option.WithAPIKey("test-key")}, "gcp.vertex_ai"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d, err := damper.New(damper.Policy{})
			if err != nil {
				t.Fatal(err)
			}
			opts := append([]option.RequestOption{d.Option()}, tt.platform...)
			client := anthropic.NewClient(append(opts, memHTTP(anyRequest))...)
			var rep damper.Report
			if _, err := client.Messages.New(context.Background(), params("claude-sonnet-4-6"), damper.ReportInto(&rep)); err != nil {
				t.Fatal(err)
			}
			if rep.Provider != tt.want {
				t.Errorf("provider = %q, want %q", rep.Provider, tt.want)
			}
		})
	}
}
