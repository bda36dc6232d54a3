// Example 06_tenant_budgets gives each tenant of a service its own retry
// budget: one Damper per tenant, named with damper.WithName so that its
// metrics carry the tenant, and one SDK client whose calls each pick their
// tenant's Damper with a per-call option.
//
//	go run ./examples/06_tenant_budgets
//
// Tenant acme's traffic meets a scripted outage (every attempt 529), while
// globex's sees a blip (each call's first attempt 529, the retry
// answered). acme spends its budget and its calls then fail at once;
// globex keeps retrying on its own budget, and every one of its calls is
// answered. The per-tenant series are printed from an OpenTelemetry
// MeterProvider with a ManualReader. The same traffic then runs through a
// single Damper shared by both tenants, with as many retries as the two
// budgets together: acme's outage spends the retries globex needed.
//
// It runs offline and at once: dampertest's fake API is served in memory
// and Damper waits on a virtual clock. The program exits with status 1 if
// globex lost an answer to acme's outage with budgets of its own, or if the
// metrics do not show each tenant apart.
package main

import (
	"cmp"
	"context"
	"fmt"
	"log"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/damper-ai/damper-go/fleet"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// retriesPerMinute is each tenant's budget: the retries its window starts
// with (first attempts that succeed add 0.1 each, as in the default policy).
var retriesPerMinute = map[string]int{"acme": 6, "globex": 10}

// rounds is the number of calls each tenant makes, interleaved.
const rounds = 8

// tenantDampers holds one Damper, and so one retry budget, per tenant.
type tenantDampers map[string]*damper.Damper

// For is the per-call option that hands a call's retries to its tenant's
// Damper. The client itself carries no Damper: one there would wrap the
// tenant's. Every Messages call must carry one of these, or the SDK's own
// retries run for it. (On Bedrock or Vertex AI, Damper refuses an option
// given to one call, which comes after the platform's signing: build one
// client per tenant there instead.)
func (t tenantDampers) For(tenant string) option.RequestOption {
	d, ok := t[tenant]
	if !ok {
		d = t["default"] // tenants without a budget of their own share one
	}
	return d.Option()
}

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	ctx := context.Background()
	api := dampertest.NewServer(dampertest.InMemory())
	defer api.Close()
	// In a real service: anthropic.NewClient(), with the API key from
	// ANTHROPIC_API_KEY.
	client := anthropic.NewClient(api.Options()...)

	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(ctx)

	clock := newClock()
	tenants := tenantDampers{}
	for _, name := range []string{"acme", "globex", "default"} {
		// Policy.RetryBudgetMinTokens sizes a budget the Damper builds; a
		// Budget of one's own, given with WithBudget, has its own values
		// (New refuses a Policy that sets the budget's fields as well).
		budget, err := fleet.NewWindowBudget(0.1, time.Minute, cmp.Or(retriesPerMinute[name], 10))
		if err != nil {
			return err
		}
		d, err := damper.New(damper.Policy{},
			damper.WithBudget(budget),
			damper.WithName(name), // damper.name on every series of this Damper
			damper.WithMeterProvider(mp),
			damper.WithClock(clock),
		)
		if err != nil {
			return err
		}
		tenants[name] = d
	}

	fmt.Printf("One Damper per tenant (acme: %d retries a minute, globex: %d):\n",
		retriesPerMinute["acme"], retriesPerMinute["globex"])
	perTenant := traffic(ctx, api, client, tenants.For)

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		return err
	}
	fmt.Println("\nIts metrics, by damper.name, from the ManualReader:")
	series := tenantSeries(rm)
	width := 0
	for k := range series {
		width = max(width, len(k))
	}
	for _, k := range slices.Sorted(maps.Keys(series)) {
		fmt.Printf("  %-*s %v\n", width, k, series[k])
	}
	// A Damper's budget can be asked too, for an admin page or a header.
	left, err := tenants["globex"].Budget().Available(ctx, clock.Now())
	if err != nil {
		return err
	}
	fmt.Printf("  globex's budget, asked directly: %v retries left this minute\n", left)

	// The same traffic through one Damper for both, with the two budgets
	// pooled: whoever fails most spends the retries of all.
	pooled := retriesPerMinute["acme"] + retriesPerMinute["globex"]
	budget, err := fleet.NewWindowBudget(0.1, time.Minute, pooled)
	if err != nil {
		return err
	}
	shared, err := damper.New(damper.Policy{}, damper.WithBudget(budget), damper.WithClock(newClock()))
	if err != nil {
		return err
	}
	fmt.Printf("\nOne Damper shared by both tenants (%d retries a minute):\n", pooled)
	together := traffic(ctx, api, client, func(string) option.RequestOption { return shared.Option() })

	switch {
	case perTenant["acme"][damper.OutcomeBudgetExhausted] == 0:
		return fmt.Errorf("acme never exhausted its budget")
	case perTenant["globex"][damper.OutcomeSuccess] != rounds:
		return fmt.Errorf("globex lost answers to acme's outage with budgets of its own")
	case together["globex"][damper.OutcomeSuccess] == rounds:
		return fmt.Errorf("with a shared budget, acme's outage cost globex nothing: the contrast is lost")
	}
	for _, tenant := range []string{"acme", "globex"} {
		if got := series[fmt.Sprintf("damper.retries{damper.name=%s}", tenant)]; got == 0 {
			return fmt.Errorf("no damper.retries series for %s", tenant)
		}
	}
	return nil
}

// traffic scripts the fake API, makes rounds calls for each tenant,
// interleaved, each with the option pick gives for its tenant, prints how
// they ended and returns the counts, by tenant and outcome.
func traffic(ctx context.Context, api *dampertest.Server, client anthropic.Client, pick func(tenant string) option.RequestOption) map[string]map[damper.Outcome]int {
	// dampertest's scenarios stand for what each tenant's traffic meets;
	// in production no header picks them. acme's calls share one outage;
	// each of globex's has a blip of its own, whatever became of the others.
	api.Script("acme", dampertest.Status(529))
	scenario := func(tenant string, call int) string {
		if tenant == "acme" {
			return "acme"
		}
		return fmt.Sprintf("%s-%d", tenant, call)
	}
	for call := range rounds {
		api.Script(scenario("globex", call), dampertest.Status(529), dampertest.OK())
	}

	outcomes := map[string]map[damper.Outcome]int{"acme": {}, "globex": {}}
	attempts := map[string]int{}
	for call := range rounds {
		for _, tenant := range []string{"acme", "globex"} {
			var rep damper.Report
			_, _ = client.Messages.New(ctx, anthropic.MessageNewParams{
				Model:     anthropic.ModelClaudeSonnet5_5,
				MaxTokens: 256,
				Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Summarize this ticket."))},
			}, pick(tenant), damper.ReportInto(&rep), dampertest.Scenario(scenario(tenant, call)))
			outcomes[tenant][rep.Outcome]++
			attempts[tenant] += rep.Attempts
		}
	}
	for _, tenant := range []string{"acme", "globex"} {
		o := outcomes[tenant]
		line := fmt.Sprintf("  %-7s %d calls, %2d attempts: %d answered", tenant, rounds, attempts[tenant], o[damper.OutcomeSuccess])
		for _, k := range slices.Sorted(maps.Keys(o)) {
			if k != damper.OutcomeSuccess {
				line += fmt.Sprintf(", %d %s", o[k], k)
			}
		}
		fmt.Println(line)
	}
	return outcomes
}

// tenantSeries sums the data points of a few of Damper's instruments by
// damper.name (and damper.denial.reason, for denials), over their other
// attributes (provider, error class), into name{attributes} = value.
func tenantSeries(rm metricdata.ResourceMetrics) map[string]float64 {
	out := map[string]float64{}
	add := func(metric string, attrs attribute.Set, v float64) {
		tenant, _ := attrs.Value("damper.name")
		key := metric + "{damper.name=" + tenant.Emit()
		if reason, ok := attrs.Value("damper.denial.reason"); ok {
			key += ",damper.denial.reason=" + reason.Emit()
		}
		out[key+"}"] += v
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if !strings.HasPrefix(m.Name, "damper.") {
				continue
			}
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				if m.Name == "damper.attempts" || m.Name == "damper.retries" || m.Name == "damper.retry.denials" {
					for _, dp := range data.DataPoints {
						add(m.Name, dp.Attributes, float64(dp.Value))
					}
				}
			case metricdata.Gauge[float64]:
				if m.Name == "damper.retry_budget.balance" {
					for _, dp := range data.DataPoints {
						add(m.Name, dp.Attributes, dp.Value)
					}
				}
			}
		}
	}
	return out
}

// newClock returns a virtual clock that starts on a minute boundary, so
// that a run, whose backoffs add up to less than a minute, falls within one
// budget window: a new window would bring a fresh budget.
func newClock() *dampertest.Clock {
	return dampertest.NewClock(time.Now().Truncate(time.Minute))
}
