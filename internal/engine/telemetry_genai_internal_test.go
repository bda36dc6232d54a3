package engine

import (
	"context"
	"net/url"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// The GenAI metrics cost a call nothing unless one of them records: with
// no meter provider, or one whose views drop them, a call has no GenAI
// view, and its answer's usage is read only for the token metrics.
func TestGenAIPaysOnlyWhenEnabled(t *testing.T) {
	ctx := context.Background()
	u := &url.URL{Scheme: "https", Host: "api.anthropic.com", Path: "/v1/messages"}
	drop := func(name string) sdkmetric.View {
		return sdkmetric.NewView(sdkmetric.Instrument{Name: name}, sdkmetric.Stream{Aggregation: sdkmetric.AggregationDrop{}})
	}
	for _, tc := range []struct {
		name         string
		views        []sdkmetric.View
		none, tokens bool // no GenAI view; a view that reads usage
		global       bool
	}{
		{name: "no provider", global: true, none: true},
		{name: "all dropped", views: []sdkmetric.View{drop("gen_ai.*"), drop("damper.token.*")}, none: true},
		{name: "tokens dropped", views: []sdkmetric.View{drop("gen_ai.client.token.usage"), drop("damper.token.*")}},
		{name: "duration dropped", views: []sdkmetric.View{drop("gen_ai.client.operation.*")}, tokens: true},
		{name: "all on", tokens: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var settings []Setting
			if !tc.global {
				mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()), sdkmetric.WithView(tc.views...))
				t.Cleanup(func() { _ = mp.Shutdown(ctx) })
				settings = append(settings, WithMeterProvider(mp))
			}
			d, err := New(Policy{}, settings...)
			if err != nil {
				t.Fatal(err)
			}
			gc := d.tel.m.gen.start(ctx, u)
			if (gc == nil) != tc.none {
				t.Fatalf("GenAI view %+v, want none: %v", gc, tc.none)
			}
			ct := &callTrace{gen: gc}
			if ct.tokensOn() != tc.tokens {
				t.Errorf("tokensOn %v, want %v", ct.tokensOn(), tc.tokens)
			}
			if gc != nil && (gc.server != "api.anthropic.com" || gc.port != 443) {
				t.Errorf("server %q:%d, want api.anthropic.com:443", gc.server, gc.port)
			}
		})
	}
}

func TestGenAIProvider(t *testing.T) {
	for provider, want := range map[string]string{
		"anthropic": "anthropic", "aws.bedrock": "aws.bedrock", "gcp.vertex_ai": "gcp.vertex_ai", "": "anthropic",
	} {
		if got := genAIProvider(provider); got != want {
			t.Errorf("genAIProvider(%q) = %q, want %q", provider, got, want)
		}
	}
}

func TestServerOf(t *testing.T) {
	for raw, want := range map[string]struct {
		host string
		port int
	}{
		"https://api.anthropic.com/v1/messages":            {"api.anthropic.com", 443},
		"http://localhost/v1/messages":                     {"localhost", 80},
		"http://127.0.0.1:8080/v1/messages":                {"127.0.0.1", 8080},
		"https://[::1]:9443/v1/messages":                   {"::1", 9443},
		"https://Bedrock-Runtime.us-east-1.amazonaws.com/": {"Bedrock-Runtime.us-east-1.amazonaws.com", 443},
	} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		if host, port := serverOf(u); host != want.host || port != want.port {
			t.Errorf("serverOf(%s) = %s, %d; want %s, %d", raw, host, port, want.host, want.port)
		}
	}
}
