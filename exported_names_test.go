package damper_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"slices"
	"strings"
	"testing"
)

// exportedNames are the package's exported names, sorted, one a line:
// what a user of the library sees. A new one is a deliberate act: add it
// here.
var exportedNames = []string{
	"Ambiguous",
	"AttemptReport",
	"Backend",
	"Batch",
	"BreakerPolicy",
	"BudgetExhaustedAction",
	"CallerTraffic",
	"CircuitChange",
	"CircuitState",
	"Class",
	"Classification",
	"Classifier",
	"ClientKeyHash",
	"Clock",
	"ConcurrencyPolicy",
	"ConfigError",
	"ContextWithHedging",
	"ContextWithPriority",
	"ContextWithReport",
	"Damper",
	"DefaultPriceTable",
	"ErrAmbiguous",
	"ErrAttemptTimeout",
	"ErrCircuitOpen",
	"ErrConcurrencyLimited",
	"ErrDeadline",
	"ErrEventTooLarge",
	"ErrHoldBackExceeded",
	"ErrOptionOrder",
	"ErrRateLimited",
	"ErrRetryAfterTooLong",
	"ErrRetryBudgetExhausted",
	"ErrRetryCostCeiling",
	"ErrRetryThrottled",
	"Error",
	"Failure",
	"Fallback",
	"FallbackPolicy",
	"HedgePolicy",
	"Interactive",
	"LoadPolicyFile",
	"New",
	"NewPriceTable",
	"NewProxy",
	"NoSignal",
	"None",
	"NotRetryable",
	"Outcome",
	"OutcomeAmbiguous",
	"OutcomeAttemptsExhausted",
	"OutcomeBudgetExhausted",
	"OutcomeCanceled",
	"OutcomeCircuitOpen",
	"OutcomeConcurrencyLimited",
	"OutcomeCostCeiling",
	"OutcomeDeadline",
	"OutcomeError",
	"OutcomeRateLimited",
	"OutcomeRetryAfterTooLong",
	"OutcomeRetryThrottled",
	"OutcomeSuccess",
	"ParsePolicyJSON",
	"ParsePolicyYAML",
	"PassthroughBudgetExhausted",
	"Policy",
	"Price",
	"PriceTable",
	"PrimaryBackend",
	"Priority",
	"ProviderAnthropic",
	"ProviderBedrock",
	"ProviderHealth",
	"ProviderVertex",
	"Proxy",
	"ProxyConfig",
	"RateLimitPolicy",
	"RateLimits",
	"RecommendedPolicy",
	"Report",
	"ReportInto",
	"Retryable",
	"Setting",
	"Signal",
	"Skip",
	"Tenant",
	"TenantBatch",
	"TenantInteractive",
	"TenantPriority",
	"TenantRetryBudget",
	"ThrottlePolicy",
	"Usage",
	"WithBackends",
	"WithBudget",
	"WithClock",
	"WithLogger",
	"WithMeterProvider",
	"WithName",
	"WithRand",
	"WithStore",
	"WithTracerProvider",
}

// maxExportedNames bounds the package's exported names.
const maxExportedNames = 100

// TestExportedNames fails on any change to the package's exported names,
// so that the front door grows only on purpose.
func TestExportedNames(t *testing.T) {
	fset := token.NewFileSet()
	notTest := func(fi fs.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }
	pkgs, err := parser.ParseDir(fset, ".", notTest, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range pkgs {
		for _, f := range p.Files {
			got = append(got, exported(f)...)
		}
	}
	slices.Sort(got)
	t.Logf("%d exported names", len(got))
	// A user reads the whole front door in one sitting of go doc: past a
	// hundred names it stops being one, so a new name takes an old one's
	// place (aliases of fleet's names, defaults, helpers stay out).
	if len(got) > maxExportedNames {
		t.Errorf("%d exported names: at most %d", len(got), maxExportedNames)
	}
	if !slices.Equal(got, exportedNames) {
		for _, n := range got {
			if !slices.Contains(exportedNames, n) {
				t.Errorf("new exported name %s: add it to exportedNames if it is meant", n)
			}
		}
		for _, n := range exportedNames {
			if !slices.Contains(got, n) {
				t.Errorf("exported name %s is gone: take it out of exportedNames", n)
			}
		}
		t.Errorf("%d exported names, %d listed", len(got), len(exportedNames))
	}
}

// exported returns the exported names f declares at the package level:
// constants, variables, types and functions (not methods).
func exported(f *ast.File) []string {
	var names []string
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil && d.Name.IsExported() {
				names = append(names, d.Name.Name)
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					if s.Name.IsExported() {
						names = append(names, s.Name.Name)
					}
				case *ast.ValueSpec:
					for _, n := range s.Names {
						if n.IsExported() {
							names = append(names, n.Name)
						}
					}
				}
			}
		}
	}
	return names
}
