package engine

import (
	"context"
	"errors"
	"net/url"
	"strconv"
	"time"

	"github.com/tidwall/gjson"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// The GenAI client metrics of the OpenTelemetry semantic conventions, as
// the conventions define them in their release v1.41.0: the last release
// of the semantic-conventions repository that holds them (from v1.42.0 they
// live in open-telemetry/semantic-conventions-genai, where they are being
// renamed), and the version of go.opentelemetry.io/otel/semconv/v1.41.0/
// genaiconv. The names and keys are defined here rather than imported, as
// the SDK does for its own gen_ai spans: the GenAI conventions are in
// development and still moving, and Damper keeps what it emits fixed until
// it chooses to follow them.
const (
	metricGenAIDuration   = "gen_ai.client.operation.duration"
	metricGenAITokens     = "gen_ai.client.token.usage"
	metricGenAIFirstChunk = "gen_ai.client.operation.time_to_first_chunk"
	// metricCachedTokens is Damper's own: the conventions of v1.41.0 have no
	// gen_ai.token.type for the input tokens read from or written to the
	// prompt cache, which they count among the input tokens.
	metricCachedTokens = "damper.token.cache_usage"

	keyGenAIOperation     = attribute.Key("gen_ai.operation.name")
	keyGenAIProvider      = attribute.Key("gen_ai.provider.name")
	keyGenAIRequestModel  = attribute.Key("gen_ai.request.model")
	keyGenAIResponseModel = attribute.Key("gen_ai.response.model")
	keyGenAITokenType     = attribute.Key("gen_ai.token.type")
	keyServerAddress      = attribute.Key("server.address")
	keyServerPort         = attribute.Key("server.port")
	keyTokenCache         = attribute.Key("damper.token.cache")
)

// Values of gen_ai.provider.name, as the SDK names them on its own gen_ai
// spans (internal/telemetry in anthropic-sdk-go): Bedrock (bedrock.WithConfig
// and bedrock.NewMantleClient) and Vertex (vertex.WithGoogleAuth) by name,
// every other platform (Foundry, the AWS and Google Cloud gateways) as
// Anthropic's API.
const (
	genAIProviderAnthropic = "anthropic"
	genAIProviderBedrock   = "aws.bedrock"
	genAIProviderVertex    = "gcp.vertex_ai"
)

// Attributes that never change.
var (
	genAIChat     = keyGenAIOperation.String("chat")
	genAIInput    = keyGenAITokenType.String("input")
	genAIOutput   = keyGenAITokenType.String("output")
	cacheRead     = keyTokenCache.String("read")
	cacheCreation = keyTokenCache.String("creation")
)

// The conventions' explicit bucket boundaries: of the durations (the
// operation's and the time to its first chunk), and of the token counts.
var (
	genAIDurationBuckets = []float64{0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92}
	genAITokenBuckets    = []float64{1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864}
)

// genAIProvider returns the gen_ai.provider.name of a call whose
// Report.Provider is provider. Damper names the platform from the request's
// host (providerOf) with the SDK's own values; anything else is Anthropic's
// API, as the SDK has it.
func genAIProvider(provider string) string {
	switch provider {
	case genAIProviderBedrock, genAIProviderVertex:
		return provider
	}
	return genAIProviderAnthropic
}

// Bounds of the GenAI series that name a model of their own, per pool of
// models (those the price table prices, and the others; see labelSet):
// the first maxModelSeries combinations of the request's and the answer's
// models, server and provider, and the first maxErrorSeries of those with
// an error.type. A series of the GenAI histograms is some 6 KB of a
// Prometheus scrape; these keep the ones that name a model near 400 KB
// whatever models the callers and the upstream name. A service calls a
// handful of models: the bounds leave each room for a few servers and
// failures.
const (
	maxModelSeries = 8
	maxErrorSeries = 4
)

// genAISeries is a combination of the GenAI metrics' attributes that may
// name a model: for a base, errType is "".
type genAISeries struct {
	provider, request, response, server string
	port                                int
	errType                             string
}

// genAIErrorType returns error.type as the GenAI metrics record it: a
// status the Messages API and its platforms do not answer with, which only
// a misbehaving upstream would send, is "_OTHER", the conventions' value
// for a type without a name, so that an upstream cannot make a series of
// every status.
func genAIErrorType(typ string) string {
	if typ == "" || typ[0] < '0' || typ[0] > '9' {
		return typ // a kind or an outcome: Damper's own names
	}
	switch typ {
	case "400", "401", "402", "403", "404", "408", "409", "413", "424", "429", "500", "502", "503", "504", "529":
		return typ
	}
	return "_OTHER"
}

// genAIMetrics are the GenAI instruments of one Damper.
type genAIMetrics struct {
	duration   metric.Float64Histogram
	tokens     metric.Int64Histogram
	firstChunk metric.Float64Histogram
	cached     metric.Int64Histogram
	// bases and errs admit the series that name a model (see
	// maxModelSeries).
	bases, errs *seriesSet[genAISeries]
	// opts keeps the options of each combination recorded.
	opts *optionCache[genAISeries, *genAIOptions]
}

func newGenAIMetrics(meter metric.Meter) genAIMetrics {
	var none noop.Meter
	return genAIMetrics{
		bases: newSeriesSet[genAISeries](maxModelSeries),
		errs:  newSeriesSet[genAISeries](maxErrorSeries),
		opts:  &optionCache[genAISeries, *genAIOptions]{},
		duration: instrument(meter.Float64Histogram(metricGenAIDuration, metric.WithUnit("s"),
			metric.WithDescription("GenAI operation duration."),
			metric.WithExplicitBucketBoundaries(genAIDurationBuckets...)))(none.Float64Histogram(metricGenAIDuration)),
		tokens: instrument(meter.Int64Histogram(metricGenAITokens, metric.WithUnit("{token}"),
			metric.WithDescription("Number of input and output tokens used."),
			metric.WithExplicitBucketBoundaries(genAITokenBuckets...)))(none.Int64Histogram(metricGenAITokens)),
		firstChunk: instrument(meter.Float64Histogram(metricGenAIFirstChunk, metric.WithUnit("s"),
			metric.WithDescription("Time to receive the first chunk, measured from when the client issues the generation request to when the first chunk is received in the response stream."),
			metric.WithExplicitBucketBoundaries(genAIDurationBuckets...)))(none.Float64Histogram(metricGenAIFirstChunk)),
		cached: instrument(meter.Int64Histogram(metricCachedTokens, metric.WithUnit("{token}"),
			metric.WithDescription("Input tokens read from (damper.token.cache=read) or written to (creation) the prompt cache, per Messages call: a part of gen_ai.client.token.usage's input tokens, not more of them."),
			metric.WithExplicitBucketBoundaries(genAITokenBuckets...)))(none.Int64Histogram(metricCachedTokens)),
	}
}

// genAICall is what the GenAI metrics keep of one call: made only when one
// of them records, so that a call without them pays nothing for them. The
// retry loop's goroutine writes it, and the goroutine that ends the call
// reads it, as callTrace.
type genAICall struct {
	tokens bool   // the token metrics record: the answer's usage is read
	server string // server.address; "" when the URL has no host
	port   int    // server.port

	responseModel string        // the model of the answer the caller got
	usage         usage         // the answer's usage, once known
	final         bool          // usage is the answer's last word: its output is known
	firstChunk    time.Duration // a stream's time to its first chunk
	released      bool          // a stream reached its caller: firstChunk is set
}

// start returns the GenAI view of a call in ctx to the URL u, or nil
// when none of the GenAI metrics records.
func (g *genAIMetrics) start(ctx context.Context, u *url.URL) *genAICall {
	tokens := g.tokens.Enabled(ctx) || g.cached.Enabled(ctx)
	if !tokens && !g.duration.Enabled(ctx) && !g.firstChunk.Enabled(ctx) {
		return nil
	}
	gc := &genAICall{tokens: tokens}
	if u != nil {
		gc.server, gc.port = serverOf(u)
	}
	return gc
}

var errNoPort = errors.New("no port")

// serverOf returns the server.address and server.port of a request to u:
// its host, and its port or else the scheme's, as the SDK sets them on its
// spans.
func serverOf(u *url.URL) (string, int) {
	port, err := 0, errNoPort
	if p := u.Port(); p != "" { // Atoi's error for "" would allocate, on every call to a URL without a port
		port, err = strconv.Atoi(p)
	}
	if err != nil {
		port = 443
		if u.Scheme == "http" {
			port = 80
		}
	}
	return u.Hostname(), port
}

// tokensOn reports whether the call's answer's usage is wanted by the
// token metrics.
func (ct *callTrace) tokensOn() bool { return ct.gen != nil && ct.gen.tokens }

// plainAnswer notes a plain answer, body, whose usage was read as u: the
// model that answered, and the usage, final.
func (ct *callTrace) plainAnswer(body []byte, u usage) {
	gc := ct.gen
	if gc == nil {
		return
	}
	// "model" comes early in a Message, so the scan stops soon.
	gc.responseModel = gjson.GetBytes(body, "model").Str
	gc.usage, gc.final = u, true
}

// heldModel returns the model that an event a stream held back before its
// first content names, whose data is data (whole, if all of it was kept):
// message_start names the model that answers; "" for any other event. The
// model is the answer's only once the stream reaches its caller
// (firstChunkAt): an attempt that fails before gave no answer.
func (ct *callTrace) heldModel(data []byte, whole bool) string {
	if ct.gen == nil || !whole {
		return ""
	}
	if m := gjson.GetBytes(data, "message.model"); m.Type == gjson.String {
		return m.Str
	}
	return ""
}

// firstChunkAt notes that a stream, whose message_start named model,
// reached its caller d after the call began.
func (ct *callTrace) firstChunkAt(d time.Duration, model string) {
	if gc := ct.gen; gc != nil {
		gc.firstChunk, gc.released = d, true
		gc.responseModel = model
	}
}

// streamUsage notes a stream's usage at its end; final is whether its
// message came whole (message_stop, so the final message_delta, was read).
func (ct *callTrace) streamUsage(u usage, final bool) {
	if gc := ct.gen; gc != nil {
		gc.usage, gc.final = u, final
	}
}

// record records the GenAI metrics of a call that ended with report rep,
// whose last attempt is last, and whose GenAI view is gc.
func (g *genAIMetrics) record(ctx context.Context, m *metrics, gc *genAICall, rep *Report, last AttemptReport) {
	provider := genAIProvider(rep.Provider)
	typ := genAIErrorType(requestErrorType(rep.Outcome, last))
	var request, response string
	if rep.Model != "" {
		request = m.models.label(rep.Model)
	}
	if gc.responseModel != "" {
		response = m.models.label(gc.responseModel)
	}
	if request != "" && request != otherLabel || response != "" && response != otherLabel {
		k := genAISeries{provider: provider, request: request, response: response, server: gc.server, port: gc.port}
		pool := m.models.pool(rep.Model)
		own := g.bases.admit(k, pool)
		if own && typ != "" {
			k.errType = typ
			own = g.errs.admit(k, pool)
		}
		if !own && request != "" {
			request = otherLabel
		}
		if !own && response != "" {
			response = otherLabel
		}
	}
	o := g.options(m, genAISeries{provider: provider, request: request, response: response, server: gc.server, port: gc.port, errType: typ})
	if g.duration.Enabled(ctx) {
		g.duration.Record(ctx, rep.Duration.Seconds(), o.duration...)
	}
	if gc.released && g.firstChunk.Enabled(ctx) {
		g.firstChunk.Record(ctx, gc.firstChunk.Seconds(), o.base...)
	}
	u := gc.usage
	if !u.known {
		return
	}
	if g.tokens.Enabled(ctx) {
		// The conventions count every input token, those of the prompt
		// cache included, as the SDK's gen_ai.usage.input_tokens does.
		g.tokens.Record(ctx, u.input+u.cacheRead+u.cacheCreation, o.input...)
		if gc.final {
			g.tokens.Record(ctx, u.output, o.output...)
		}
	}
	if g.cached.Enabled(ctx) {
		g.cached.Record(ctx, u.cacheRead, o.cacheRead...)
		g.cached.Record(ctx, u.cacheCreation, o.cacheCreation...)
	}
}

// genAIOptions are the options a call's GenAI values are recorded with,
// for one combination of their attributes.
// Each is a slice of one option, passed to Record as it is: a slice made
// for the call would escape to the heap, as Record is an interface's.
type genAIOptions struct {
	duration                 []metric.RecordOption // base, and error.type if any
	base                     []metric.RecordOption
	input, output            []metric.RecordOption // base and gen_ai.token.type
	cacheRead, cacheCreation []metric.RecordOption // the common attributes and damper.token.cache
}

// options returns the options of the combination k, labels as recorded
// (each model a label, or otherLabel once k's series is not admitted; an
// empty one left out), built once per combination (optionCache).
func (g *genAIMetrics) options(m *metrics, k genAISeries) *genAIOptions {
	if o, ok := g.opts.load(k); ok {
		return o
	}
	var buf [10]attribute.KeyValue
	common := append(buf[:0], genAIChat, keyGenAIProvider.String(k.provider))
	if k.server != "" {
		common = append(common, keyServerAddress.String(k.server), keyServerPort.Int(k.port))
	}
	if m.named {
		common = append(common, m.name)
	}
	// The cache's breakdown is Damper's own metric, and as every damper.*
	// metric it leaves the model out.
	nc := len(common)
	base := common
	if k.request != "" {
		base = append(base, keyGenAIRequestModel.String(k.request))
	}
	if k.response != "" {
		base = append(base, keyGenAIResponseModel.String(k.response))
	}
	o := &genAIOptions{
		base:          []metric.RecordOption{withBase(base)},
		input:         []metric.RecordOption{withOne(base, genAIInput)},
		output:        []metric.RecordOption{withOne(base, genAIOutput)},
		cacheRead:     []metric.RecordOption{withOne(common[:nc], cacheRead)},
		cacheCreation: []metric.RecordOption{withOne(common[:nc], cacheCreation)},
	}
	o.duration = o.base
	if k.errType != "" {
		o.duration = []metric.RecordOption{withOne(base, keyErrorType.String(k.errType))}
	}
	g.opts.store(k, o)
	return o
}

// withOne returns the option recording base and kv. The set is built in a
// copy on the stack, which NewSet sorts in place, so that base stays as it
// is for the next value and no copy of it reaches the heap.
func withOne(base []attribute.KeyValue, kv attribute.KeyValue) metric.MeasurementOption {
	var buf [10]attribute.KeyValue
	n := copy(buf[:], base)
	buf[n] = kv
	return metric.WithAttributeSet(attribute.NewSet(buf[:n+1]...))
}

// withBase returns the option recording base alone.
func withBase(base []attribute.KeyValue) metric.MeasurementOption {
	var buf [10]attribute.KeyValue
	n := copy(buf[:], base)
	return metric.WithAttributeSet(attribute.NewSet(buf[:n]...))
}
