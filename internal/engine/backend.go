package engine

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/core"
	"github.com/damper-ai/damper-go/internal/gates/breaker"
	"github.com/damper-ai/damper-go/internal/gates/concurrency"
	"github.com/damper-ai/damper-go/internal/gates/ratelimit"
)

// Backends: the places a Messages call can be sent. The client a call
// comes through is the first, "primary"; [WithBackends] adds others, tried
// in order when the one before them cannot answer (see fallback.go). Each
// keeps its own retry budget, throttle, breaker and rate limiter.

// The platforms a backend can be, as reports, spans and metrics name them
// (the values of gen_ai.provider.name).
const (
	ProviderAnthropic = "anthropic"     // the first-party API
	ProviderBedrock   = "aws.bedrock"   // Amazon Bedrock
	ProviderVertex    = "gcp.vertex_ai" // Google Vertex AI
)

// PrimaryBackend is the name of the backend a call's own client reaches.
const PrimaryBackend = "primary"

// Backend is a place a Messages call can fall back to: a platform, reached
// with the SDK's own options, such as
//
//	damper.Backend{
//		Name:     "bedrock",
//		Provider: damper.ProviderBedrock,
//		Options:  []option.RequestOption{bedrock.WithConfig(cfg)},
//	}
//
// Damper builds one client from Options (with the SDK's own retries off:
// Damper owns them) and sends the backend's attempts through it, so that
// the platform's middleware signs each attempt afresh and translates its
// answer (Bedrock's event stream becomes SSE). The caller's headers travel
// with the call, but not its credentials (x-api-key, authorization): each
// backend's come from its Options. Options must not hold Damper's own
// [Damper.Option].
type Backend struct {
	// Name labels the backend in reports, spans, metrics and logs; it must
	// be unique, and not "primary".
	Name string
	// Provider is the platform: ProviderAnthropic, ProviderBedrock or
	// ProviderVertex. It picks the model IDs of Damper's table (the
	// fallback guide, docs/guide/fallback.md, lists it).
	Provider string
	// Options configure the client that reaches the backend, as
	// anthropic.NewClient takes them.
	Options []option.RequestOption
	// Models maps a model, as the caller names it, to this backend's ID
	// for it, ahead of Damper's table. A call whose model has no ID
	// here or there does not fall back to this backend, and says so: a
	// [Skip] in its Report.Skipped, the damper.fallback.skipped counter,
	// and a Warn line once per backend and model. A first-party backend
	// needs no entry: it takes the model as the caller names it.
	Models map[string]string
	// Store keeps this backend's budget, throttle, breaker and rate-limit
	// buckets; nil keeps them in memory. Give each backend a store of its
	// own (for Redis, a name of its own).
	Store fleet.Store
	// Weight is the backend's weight under spread routing
	// ([FallbackPolicy].Routing): its headroom counts Weight times, and
	// while no limit is known, it gets Weight calls for every one of a
	// backend of weight 1. 0 means 1; at most 1000. Failover routing
	// ignores it.
	Weight int
}

// maxWeight bounds a backend's weight under spread routing.
const maxWeight = 1000

// WithBackends adds backends that a Messages call falls back to, in order,
// after the client's own (see [FallbackPolicy] for when a call moves on).
// Each gets its own budget, throttle, breaker and rate limiter, from the
// Damper's Policy and the backend's Store.
func WithBackends(backends ...Backend) Setting {
	return func(d *Damper) error {
		seen := map[string]bool{PrimaryBackend: true}
		for i, b := range backends {
			field := fmt.Sprintf("WithBackends: backend %d (%q)", i+1, b.Name)
			switch {
			case b.Name == "":
				return fmt.Errorf("damper: %s: Name is required", field)
			case seen[b.Name]:
				return fmt.Errorf("damper: %s: Name %q is taken (%q is the client's own backend)", field, b.Name, PrimaryBackend)
			case b.Provider != ProviderAnthropic && b.Provider != ProviderBedrock && b.Provider != ProviderVertex:
				return fmt.Errorf("damper: %s: Provider %q: must be %q, %q or %q", field, b.Provider, ProviderAnthropic, ProviderBedrock, ProviderVertex)
			case b.Weight < 0 || b.Weight > maxWeight:
				return fmt.Errorf("damper: %s: Weight %d: must be 1 to %d (0 means 1)", field, b.Weight, maxWeight)
			}
			for from, to := range b.Models {
				if from == "" || to == "" {
					return fmt.Errorf("damper: %s: Models[%q] = %q: neither may be empty", field, from, to)
				}
			}
			seen[b.Name] = true
		}
		d.backendSpecs = append(d.backendSpecs, backends...)
		return nil
	}
}

// backend is one backend as the engine sees it: where its attempts go and
// the parts of the gates that keep its state (gates.go).
type backend struct {
	name     string
	provider string // "" for the primary: the request's own (providerOf)
	client   *anthropic.Client
	models   map[string]string
	store    fleet.Store // where its parts keep their state
	skips    skipLog     // the models logged as having no ID here
	gaps     skipLog     // the features logged as lacking on its platform (parity.go)

	gates
	gb      core.Backend       // the backend as its gates see it
	budget  fleet.Budget       // the budget gate's, read for the report's balance
	limiter *ratelimit.Limiter // the rate limiter gate's, nil without Policy.RateLimit

	// What spread routing reads (routing.go): the weight, the breaker
	// (nil without Policy.Breaker) and the concurrency limit (nil without
	// Policy.Concurrency).
	weight  int
	breaker *breaker.Circuit
	conc    *concurrency.Limit
}

// newBackend makes a backend whose parts keep their state in store s
// (budget, when not nil, is the one to use); Damper.wire makes its parts
// once the telemetry is built.
func (d *Damper) newBackend(name string, s fleet.Store, budget fleet.Budget) *backend {
	return &backend{name: name, store: s, budget: budget}
}

// newBackendClient is the client of a backend: the backend's options,
// after the middleware that hands each attempt's response to Damper, with
// the SDK's retries and request timeout off (Damper's own bound them).
func newBackendClient(opts []option.RequestOption) *anthropic.Client {
	all := make([]option.RequestOption, 0, len(opts)+3)
	all = append(all, option.WithMiddleware(handOver))
	all = append(all, opts...)
	all = append(all, option.WithMaxRetries(0), option.WithRequestTimeout(0))
	c := anthropic.NewClient(all...)
	return &c
}

// handedOver is where handOver leaves an attempt's response.
type handedOver struct {
	res  *http.Response
	err  error
	done bool
}

type HandedOverKey struct{}

// handOver is the first middleware of a backend's client: it takes the
// response as the platform's middleware left it (signed, translated),
// gives it to Damper through the request's context, and answers the SDK
// with an empty 204, which the SDK then discards, so that the SDK neither
// reads nor closes the real one.
func handOver(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
	slot, ok := req.Context().Value(HandedOverKey{}).(*handedOver)
	if !ok {
		return next(req)
	}
	slot.res, slot.err = next(req)
	slot.done = true
	return &http.Response{
		Status: "204 damper: handed over", StatusCode: http.StatusNoContent,
		Header: http.Header{"X-Should-Retry": {"false"}}, Body: http.NoBody, Request: req,
	}, nil
}

// ErrBackendInBackend is a Damper option inside a backend's Options.
var ErrBackendInBackend = errors.New("damper: a backend's Options hold a Damper's Option(): give Damper's option to the caller's client only")

// send sends one attempt of a call to the backend: req is the attempt's
// request as the caller's client made it (its URL, query and headers),
// body its body with the model this backend names.
func (b *backend) send(req *http.Request, body []byte) (*http.Response, error) {
	slot := new(handedOver)
	ctx := context.WithValue(req.Context(), HandedOverKey{}, slot)
	opts := make([]option.RequestOption, 0, len(req.Header)+1)
	opts = append(opts, option.WithRequestBody("application/json", body))
	for k, vs := range req.Header {
		if !forwarded(k) {
			continue
		}
		if k == "Anthropic-Beta" {
			vs = betasFor(b.provider, vs) // the platform's names
		}
		for i, v := range vs {
			if i == 0 {
				opts = append(opts, option.WithHeader(k, v))
			} else {
				opts = append(opts, option.WithHeaderAdd(k, v))
			}
		}
	}
	path := "v1/messages" // on the backend's base URL, whatever the client's path before it
	if req.URL.RawQuery != "" {
		path += "?" + req.URL.RawQuery
	}
	err := b.client.Execute(ctx, http.MethodPost, path, nil, nil, opts...)
	if slot.done {
		return slot.res, slot.err
	}
	if err == nil {
		err = errors.New("the client sent nothing")
	}
	return nil, fmt.Errorf("damper: backend %q: %w", b.name, err)
}

// forwarded reports whether a header of the caller's request goes on to
// another backend: not its credentials, nor what the backend's client
// sets itself (the SDK's X-Stainless headers, the body's length and type).
func forwarded(key string) bool {
	switch key = http.CanonicalHeaderKey(key); key {
	case "Authorization", "X-Api-Key", "Content-Length", "Content-Type", "Host", "Accept-Encoding", "Connection":
		return false
	}
	return !strings.HasPrefix(key, "X-Stainless-")
}
