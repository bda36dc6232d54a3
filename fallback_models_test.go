package damper_test

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// With RecommendedPolicy and a second first-party backend, a full outage
// of the primary moves every call to the second, for a model the default
// table does not list as for one it does: a first-party backend takes the
// model as the caller names it.
func TestFallbackOutageCurrentModel(t *testing.T) {
	for _, model := range []string{"claude-sonnet-4-6", "claude-sonnet-4-5"} {
		t.Run(model, func(t *testing.T) {
			r := newFallbackRig(t, damper.RecommendedPolicy(), nil)
			r.primary.Script("", dampertest.Status(529))
			start := r.clk.Now()
			var probes []int // the calls the open breaker let try the primary
			for i := range 100 {
				// 100 calls over the 20 s of the outage, each at its slot or,
				// when the call before it waited past that, right after.
				if d := start.Add(time.Duration(i) * 200 * time.Millisecond).Sub(r.clk.Now()); d > 0 {
					r.clk.Advance(d)
				}
				rep, err := r.call(t, model)
				if err != nil {
					t.Fatalf("call %d: %v (attempts on %s, skipped %+v)", i+1, err, backends(rep), rep.Skipped)
				}
				if rep.Backend != "second" || rep.Outcome != damper.OutcomeSuccess || len(rep.Skipped) != 0 {
					t.Fatalf("call %d: answered by %q (%s), skipped %+v; want second", i+1, rep.Backend, rep.Outcome, rep.Skipped)
				}
				if last := rep.AttemptLog[len(rep.AttemptLog)-1]; last.Model != model {
					t.Fatalf("call %d: second got model %q, want %q", i+1, last.Model, model)
				}
				if rep.AttemptLog[0].Probe {
					probes = append(probes, i+1)
				}
			}
			if n := r.second.Count(""); n != 100 {
				t.Fatalf("second got %d attempts, want 100", n)
			}
			// 20 failures open the primary's breaker (by call 17, with the
			// retries the throttle allowed), then one probe per open
			// period: 2, 4 and 8 s.
			if n := r.primary.Count(""); n != 23 || !slices.Equal(probes, []int{27, 47, 87}) {
				t.Fatalf("primary got %d attempts, probes in calls %v; want 23, probes in calls 27, 47, 87", n, probes)
			}
		})
	}
}

// sdkModels returns the value of every model constant the SDK declares
// (the constants of type Model in its package's source), read from the
// SDK's module, in order.
func sdkModels(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/anthropics/anthropic-sdk-go/v2").Output()
	if err != nil {
		t.Fatalf("finding the SDK's module: %v", err)
	}
	dir := strings.TrimSpace(string(out))
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("the SDK's sources in %q: %v", dir, err)
	}
	var models []string
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(src, []byte(" Model = \"")) {
			continue // no model constant: spare parsing it
		}
		file, err := parser.ParseFile(fset, f, src, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range file.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				if typ, ok := vs.Type.(*ast.Ident); !ok || typ.Name != "Model" {
					continue
				}
				for _, v := range vs.Values {
					lit, ok := v.(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						t.Fatalf("%s: a Model constant that is not a string literal", fset.Position(v.Pos()))
					}
					s, err := strconv.Unquote(lit.Value)
					if err != nil {
						t.Fatal(err)
					}
					models = append(models, s)
				}
			}
		}
	}
	// The SDK of go.mod declares 20; fewer means the parse missed them.
	if len(models) < 20 || !slices.Contains(models, anthropic.ModelClaudeSonnet4_6) || !slices.Contains(models, anthropic.ModelClaudeOpus5_5) {
		t.Fatalf("read %d model constants from %s: %q; want every one", len(models), dir, models)
	}
	return models
}

// The SDK's models that the default table gives no Bedrock or Vertex ID,
// as no ID of theirs on those platforms is published beside the SDK: a
// call moves to Bedrock or Vertex with one of them only through
// Backend.Models. A model the SDK adds must be entered here or in the
// table (models.go), with its published IDs.
var noPlatformID = []string{
	"claude-fable-5-2", "claude-mythos-5-2", "claude-haiku-5-5", "claude-sonnet-5-5",
	"claude-fable-5-1", "claude-opus-5-5", "claude-mythos-5-1", "claude-sonnet-5",
	"claude-fable-5", "claude-mythos-5", "claude-opus-5", "claude-opus-4-8",
	"claude-opus-4-7", "claude-mythos-preview", "claude-opus-4-6", "claude-sonnet-4-6",
}

// Every model the SDK names moves to a first-party backend as it is named;
// to Bedrock and Vertex, under the table's ID, or the call says why it
// cannot: a Skip in its report, the damper.fallback.skipped counter, and
// one Warn line per backend and model.
func TestFallbackEveryModelOfTheSDK(t *testing.T) {
	models := sdkModels(t)

	t.Run("first-party", func(t *testing.T) {
		r := newFallbackRig(t, damper.Policy{MaxAttempts: 1}, nil)
		r.primary.Script("", dampertest.Status(529))
		for _, model := range models {
			rep, err := r.call(t, model)
			if err != nil || backends(rep) != "primary,second" || len(rep.Skipped) != 0 {
				t.Fatalf("%s: %v, attempts on %s, skipped %+v; want an answer from second", model, err, backends(rep), rep.Skipped)
			}
			if got := rep.AttemptLog[1].Model; got != model {
				t.Fatalf("%s: second was sent %q", model, got)
			}
		}
		if n := r.second.Count(""); n != len(models) {
			t.Fatalf("second got %d attempts, want %d", n, len(models))
		}
	})

	t.Run("platforms", func(t *testing.T) {
		t.Setenv("AWS_BEARER_TOKEN_BEDROCK", "") // else the SDK sends it in place of SigV4
		bedrock := dampertest.NewServer(dampertest.InMemory(), dampertest.Bedrock("us-east-1"))
		vertex := dampertest.NewServer(dampertest.InMemory(), dampertest.Vertex("us-east5", "fallback-test"))
		t.Cleanup(bedrock.Close)
		t.Cleanup(vertex.Close)
		r := newTelRig(t, damper.Policy{MaxAttempts: 1}, []damper.Setting{damper.WithBackends(
			damper.Backend{Name: "bedrock", Provider: damper.ProviderBedrock, Options: bedrock.Options()},
			damper.Backend{Name: "vertex", Provider: damper.ProviderVertex, Options: vertex.Options()},
		)})
		bedrock.Script("sdk", dampertest.Status(503)) // so that the call goes on to Vertex
		vertex.Script("sdk", dampertest.OK())

		var unmapped int
		for i, model := range models {
			bedrockID, onBedrock := damper.DefaultModelIDForTest(damper.ProviderBedrock, model)
			vertexID, onVertex := damper.DefaultModelIDForTest(damper.ProviderVertex, model)
			if listed := slices.Contains(noPlatformID, model); listed == onBedrock || listed == onVertex {
				t.Errorf("%s: Bedrock ID %q, Vertex ID %q, listed as having none: %v; give the table its published IDs, or list it", model, bedrockID, vertexID, listed)
			}
			wantBackends := "primary"
			var wantSkips []damper.Skip
			for _, b := range []struct {
				name string
				ok   bool
			}{{"bedrock", onBedrock}, {"vertex", onVertex}} {
				if b.ok {
					wantBackends += "," + b.name
				} else {
					wantSkips = append(wantSkips, damper.Skip{Backend: b.name, Model: model, Reason: damper.SkipNoModelID})
				}
			}
			if !onBedrock {
				unmapped++
			}
			nb, nv := len(bedrock.Requests()), len(vertex.Requests())
			rep, err := r.call(t, "sdk", model, dampertest.Status(529))
			if got := backends(rep); got != wantBackends || !slices.Equal(rep.Skipped, wantSkips) || (err == nil) != onVertex {
				t.Fatalf("%s: %v, attempts on %s, skipped %+v; want attempts on %s, skipped %+v", model, err, got, rep.Skipped, wantBackends, wantSkips)
			}
			for _, sent := range []struct {
				srv  *dampertest.Server
				from int
				ok   bool
				id   string
			}{{bedrock, nb, onBedrock, bedrockID}, {vertex, nv, onVertex, vertexID}} {
				reqs := sent.srv.Requests()[sent.from:]
				if sent.ok != (len(reqs) == 1) || sent.ok && (reqs[0].Model != sent.id || reqs[0].AuthError != "") {
					t.Fatalf("call %d, %s: %s got %+v; want one request for %q, accepted", i+1, model, sent.srv.Requests()[0].Platform, reqs, sent.id)
				}
			}
		}
		if unmapped != len(noPlatformID) {
			t.Errorf("%d of the SDK's models have no Bedrock ID, want the %d listed", unmapped, len(noPlatformID))
		}

		m := r.metricValues(t)
		for _, b := range []string{"bedrock", "vertex"} {
			key := "damper.fallback.skipped{damper.backend=" + b + ",damper.fallback.reason=no_model_id}"
			if m[key] != float64(unmapped) {
				t.Errorf("%s = %v, want %d", key, m[key], unmapped)
			}
		}
		warned := map[string]int{}
		for _, l := range r.logLines(t) {
			if l["msg"] == "damper: cannot fall back to a backend with this model" && l["level"] == "WARN" && l["reason"] == "no_model_id" {
				warned[l["backend"].(string)+" "+l["model"].(string)]++
			}
		}
		for _, model := range noPlatformID {
			for _, b := range []string{"bedrock", "vertex"} {
				if n := warned[b+" "+model]; n != 1 {
					t.Errorf("%s on %s: %d Warn lines, want 1", model, b, n)
				}
			}
		}
		if len(warned) != 2*len(noPlatformID) {
			t.Errorf("Warn lines for %v; want one per backend and unmapped model", warned)
		}
	})
}

// A call that cannot move to a backend says so when it starts, whether it
// needs to move or not: a Skip in its report, damper.fallback.skipped once
// per call, and a Warn line once per backend and model, for at most 64
// models a backend, each name cut to 128 bytes.
func TestFallbackSkipSaysWhy(t *testing.T) {
	t.Setenv("AWS_BEARER_TOKEN_BEDROCK", "")
	bedrock := dampertest.NewServer(dampertest.InMemory(), dampertest.Bedrock("us-east-1"))
	second := dampertest.NewServer(dampertest.InMemory())
	t.Cleanup(bedrock.Close)
	t.Cleanup(second.Close)
	r := newTelRig(t, damper.Policy{
		MaxAttempts: 1,
		Fallback:    &damper.FallbackPolicy{Models: map[string][]string{"claude-sonnet-4-5": {"claude-sonnet-4-6"}}},
	}, []damper.Setting{damper.WithBackends(
		damper.Backend{Name: "second", Provider: damper.ProviderAnthropic, Options: []option.RequestOption{
			option.WithBaseURL(dampertest.MemoryURL), option.WithAPIKey("second-key"),
			option.WithHTTPClient(&http.Client{Transport: dampertest.Transport(second.Handler())}),
		}},
		damper.Backend{Name: "bedrock", Provider: damper.ProviderBedrock, Options: bedrock.Options()},
	)})
	skip := func(model string) []damper.Skip {
		return []damper.Skip{{Backend: "bedrock", Model: model, Reason: damper.SkipNoModelID}}
	}

	long := "claude-" + strings.Repeat("é", 200) // 407 bytes
	calls := []struct {
		model string
		skips []damper.Skip
	}{
		{"claude-sonnet-4-6", skip("claude-sonnet-4-6")},
		{"claude-sonnet-4-6", skip("claude-sonnet-4-6")},
		{"claude-opus-4-8", skip("claude-opus-4-8")},
		{"claude-sonnet-4-5", skip("claude-sonnet-4-6")}, // its sibling has no Bedrock ID
		{long, skip(long)},
	}
	for i := range 64 - 3 + 2 { // the set fills, then two more
		m := fmt.Sprintf("claude-test-%d", i)
		calls = append(calls, struct {
			model string
			skips []damper.Skip
		}{m, skip(m)})
	}
	calls = append(calls, calls[0])
	for i, c := range calls {
		rep, err := r.call(t, "ok", c.model, dampertest.OK())
		if err != nil || rep.Backend != "primary" || !slices.Equal(rep.Skipped, c.skips) {
			t.Fatalf("call %d (%.20s): %v, answered by %q, skipped %+v; want the primary's answer, skipped %+v", i+1, c.model, err, rep.Backend, rep.Skipped, c.skips)
		}
	}
	if n := len(bedrock.Requests()) + second.Count(""); n != 0 {
		t.Fatalf("the backends got %d requests, want none", n)
	}

	key := "damper.fallback.skipped{damper.backend=bedrock,damper.fallback.reason=no_model_id}"
	if m := r.metricValues(t); m[key] != float64(len(calls)) || len(keysWith(m, "fallback.skipped")) != 1 {
		t.Errorf("%s = %v, want %d; have %v", key, m[key], len(calls), keysWith(m, "fallback.skipped"))
	}

	var models []string
	var more int
	for _, l := range r.logLines(t) {
		switch l["msg"] {
		case "damper: cannot fall back to a backend with this model":
			if l["level"] != "WARN" || l["backend"] != "bedrock" || l["provider"] != damper.ProviderBedrock || l["reason"] != "no_model_id" {
				t.Errorf("line %v", l)
			}
			models = append(models, l["model"].(string))
		case "damper: more models cannot fall back to a backend; no longer logged one by one":
			if l["level"] != "WARN" || l["backend"] != "bedrock" || l["models_logged"] != float64(64) {
				t.Errorf("line %v", l)
			}
			more++
		}
	}
	want := []string{"claude-sonnet-4-6", "claude-opus-4-8", "claude-" + strings.Repeat("é", 60)} // 127 bytes: no half character
	for i := range 64 - 3 {
		want = append(want, fmt.Sprintf("claude-test-%d", i))
	}
	if !slices.Equal(models, want) || more != 1 {
		t.Errorf("Warn lines for %d models (%q...), %d lines saying no more; want %d, then 1", len(models), models[:min(4, len(models))], more, len(want))
	}
}
