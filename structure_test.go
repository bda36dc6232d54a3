package damper

import (
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// parseRoot parses the root package's files but its tests.
func parseRoot(t *testing.T) map[string]*ast.File {
	t.Helper()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	files := make(map[string]*ast.File)
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		files[name] = f
	}
	return files
}

// receiver is the name of the type a method's receiver expression names.
func receiver(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}

// No type of the root package has more than 20 methods: a type that does
// everything (as the call once did) is split into parts with one
// responsibility each.
func TestMethodsPerType(t *testing.T) {
	count := make(map[string]int)
	for _, f := range parseRoot(t) {
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv != nil {
				count[receiver(fd.Recv.List[0].Type)]++
			}
		}
	}
	if count["call"] == 0 {
		t.Fatal("found no method of call: the test no longer reads the package")
	}
	for name, n := range count {
		if n > 20 {
			t.Errorf("type %s has %d methods, more than 20", name, n)
		}
	}
}

// Every write to a call's report is callReport's (report.go): the rest of
// the engine hands it facts, and no statement elsewhere assigns to a field
// of c.report.
func TestReportWrittenInOnePlace(t *testing.T) {
	throughReport := func(e ast.Expr) bool {
		for {
			switch x := e.(type) {
			case *ast.SelectorExpr:
				if x.Sel.Name == "report" {
					return true
				}
				e = x.X
			case *ast.IndexExpr:
				e = x.X
			case *ast.StarExpr:
				e = x.X
			case *ast.ParenExpr:
				e = x.X
			default:
				return false
			}
		}
	}
	for name, f := range parseRoot(t) {
		if name == "report.go" {
			continue
		}
		ast.Inspect(f, func(n ast.Node) bool {
			var lhs []ast.Expr
			switch s := n.(type) {
			case *ast.AssignStmt:
				lhs = s.Lhs
			case *ast.IncDecStmt:
				lhs = []ast.Expr{s.X}
			}
			for _, e := range lhs {
				// c.report itself (a whole Report) is not the call's.
				if sel, ok := e.(*ast.SelectorExpr); ok && sel.Sel.Name == "report" {
					continue
				}
				if throughReport(e) {
					t.Errorf("%s writes the report in place: %s; hand callReport the fact instead", name, chain(e))
				}
			}
			return true
		})
	}
}

// chain renders e, a selector chain, for a message.
func chain(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.SelectorExpr:
		return chain(x.X) + "." + x.Sel.Name
	case *ast.IndexExpr:
		return chain(x.X) + "[...]"
	case *ast.StarExpr:
		return "*" + chain(x.X)
	case *ast.ParenExpr:
		return "(" + chain(x.X) + ")"
	case *ast.Ident:
		return x.Name
	}
	return "?"
}

// The engine never calls back into an adapter: no file of the root package
// but the SDK adapter (sdk.go) and the proxy (proxy*.go: proxy.go, the
// files of its concerns, and its client authentication, proxy_auth.go)
// names what they declare. What is particular to a client comes in the
// call's front. Every other file is checked, so that a new engine file
// needs no list to be.
func TestEngineNamesNoAdapter(t *testing.T) {
	files := parseRoot(t)
	adapterFiles := []string{"sdk.go"}
	for name := range files {
		if m, _ := filepath.Match("proxy*.go", name); m {
			adapterFiles = append(adapterFiles, name)
		}
	}
	slices.Sort(adapterFiles)
	for _, name := range []string{"sdk.go", "proxy.go", "proxy_auth.go", "proxy_client.go", "proxy_door.go", "proxy_errors.go", "proxy_stream.go"} {
		if !slices.Contains(adapterFiles, name) {
			t.Fatalf("the adapter files, %q, miss %s", adapterFiles, name)
		}
	}
	adapters := make(map[string]string) // name → its adapter's file
	for _, name := range adapterFiles {
		f := files[name]
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil && d.Name.Name != "init" { // no one names an init
					adapters[d.Name.Name] = name
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						adapters[s.Name.Name] = name
					case *ast.ValueSpec:
						for _, n := range s.Names {
							adapters[n.Name] = name
						}
					}
				}
			}
		}
	}
	var engine []string
	for name := range files {
		if !slices.Contains(adapterFiles, name) {
			engine = append(engine, name)
		}
	}
	slices.Sort(engine)
	if !slices.Contains(engine, "call.go") {
		t.Fatalf("the files checked, %q, miss call.go", engine)
	}
	for _, name := range engine {
		f := files[name]
		for _, id := range topLevelUses(f) {
			if from, ok := adapters[id]; ok {
				t.Errorf("%s names %s, declared by the adapter in %s", name, id, from)
			}
		}
	}
}

// topLevelUses lists the identifiers f uses that may name a package-level
// declaration: every identifier but a selector's field or method name, a
// composite literal's key, and a field's or parameter's name.
func topLevelUses(f *ast.File) []string {
	skip := make(map[*ast.Ident]bool)
	ast.Inspect(f, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.SelectorExpr:
			skip[x.Sel] = true
		case *ast.KeyValueExpr:
			if id, ok := x.Key.(*ast.Ident); ok {
				skip[id] = true
			}
		case *ast.Field:
			for _, id := range x.Names {
				skip[id] = true
			}
		}
		return true
	})
	var uses []string
	ast.Inspect(f, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok && !skip[id] {
			uses = append(uses, id.Name)
		}
		return true
	})
	return uses
}

// TestLibraryModuleLeavesTheCommandsDependencies: the library's go.mod
// requires none of what only the damper command, the Redis store, the
// examples or the benchmarks need, so that a user of the library alone
// downloads none of it. Those modules live beside the library in the
// workspace (go.work), each with its own go.mod.
func TestLibraryModuleLeavesTheCommandsDependencies(t *testing.T) {
	gomod, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	for _, dep := range []string{"github.com/redis/go-redis", "github.com/failsafe-go/failsafe-go"} {
		if strings.Contains(string(gomod), dep) {
			t.Errorf("the library's go.mod requires %s: only a nested module may", dep)
		}
	}
	work, err := os.ReadFile("go.work")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"./cmd/damper", "./redisstore", "./examples", "./bench"} {
		if !strings.Contains(string(work), "\t"+m+"\n") {
			t.Errorf("go.work does not use %s: go run ./cmd/damper and the README's test command need every module in the workspace", m)
		}
		if _, err := os.Stat(filepath.Join(m, "go.mod")); err != nil {
			t.Errorf("%s is not a module of its own: %v", m, err)
		}
	}
}

// TestHookTableNamesEveryPart: the hooks table of docs/ARCHITECTURE.md
// ("Gates and hooks") names, in its who column, every type of the root
// package, the contract (internal/core) and the gates (internal/gates/*)
// that implements the row's hook, an interface of the contract, so that a
// gate's part that takes a hook cannot go unmentioned (a new pass that is
// a SpanPass, say).
func TestHookTableNamesEveryPart(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("docs", "ARCHITECTURE.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(doc), "\n| hook | when | how | who |\n")
	if !ok {
		t.Fatal("docs/ARCHITECTURE.md has no hooks table")
	}
	table, _, _ = strings.Cut(table, "\n\n")
	ifaces, methods := hookSets(parseGates(t))
	rows := 0
	for _, line := range strings.Split(table, "\n") {
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		if len(cells) != 4 || !strings.HasPrefix(cells[0], "`") {
			continue
		}
		rows++
		hook, _, _ := strings.Cut(strings.Trim(cells[0], "`"), ".")
		want, ok := ifaces[hook]
		if !ok {
			t.Errorf("the hooks table's row %s names no interface of internal/core", cells[0])
			continue
		}
		var missing []string
		for typ, ms := range methods {
			if _, isIface := ifaces[typ]; isIface || typ == "" {
				continue
			}
			implements := true
			for name, sig := range want {
				if ms[name] != sig {
					implements = false
				}
			}
			if implements && !strings.Contains(cells[3], "`"+typ+"`") {
				missing = append(missing, typ)
			}
		}
		slices.Sort(missing)
		if len(missing) > 0 {
			t.Errorf("the hooks table's row %s does not name %q, which implement %s", cells[0], missing, hook)
		}
	}
	if rows < 8 {
		t.Errorf("read %d rows of the hooks table; it has a row per hook", rows)
	}
}

// parseGates parses the files but the tests of the root package, the
// contract (internal/core) and every gate (internal/gates/*), by path.
func parseGates(t *testing.T) map[string]*ast.File {
	t.Helper()
	files := parseRoot(t)
	dirs, err := filepath.Glob(filepath.Join("internal", "gates", "*"))
	if err != nil {
		t.Fatal(err)
	}
	dirs = append(dirs, filepath.Join("internal", "core"))
	if len(dirs) < 7 {
		t.Fatalf("found the packages %q: the gates are missing", dirs)
	}
	fset := token.NewFileSet()
	for _, dir := range dirs {
		names, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range names {
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			files[name] = f
		}
	}
	return files
}

// hookSets returns the root package's interfaces (name → method → its
// signature, the embedded interfaces' methods included) and every type's
// methods (type → method → signature).
func hookSets(files map[string]*ast.File) (ifaces, methods map[string]map[string]string) {
	ifaces = map[string]map[string]string{}
	methods = map[string]map[string]string{}
	embeds := map[string][]string{}
	for _, f := range files {
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv != nil {
					typ := receiver(d.Recv.List[0].Type)
					if methods[typ] == nil {
						methods[typ] = map[string]string{}
					}
					methods[typ][d.Name.Name] = signature(d.Type)
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					ts, ok := s.(*ast.TypeSpec)
					if !ok {
						continue
					}
					it, ok := ts.Type.(*ast.InterfaceType)
					if !ok {
						continue
					}
					ms := map[string]string{}
					for _, m := range it.Methods.List {
						if ft, ok := m.Type.(*ast.FuncType); ok && len(m.Names) > 0 {
							ms[m.Names[0].Name] = signature(ft)
						} else if id, ok := m.Type.(*ast.Ident); ok {
							embeds[ts.Name.Name] = append(embeds[ts.Name.Name], id.Name)
						}
					}
					ifaces[ts.Name.Name] = ms
				}
			}
		}
	}
	var flatten func(name string, into map[string]string)
	flatten = func(name string, into map[string]string) {
		for _, e := range embeds[name] {
			maps.Copy(into, ifaces[e])
			flatten(e, into)
		}
	}
	for name, ms := range ifaces {
		flatten(name, ms)
	}
	return ifaces, methods
}

// signature renders a method's parameter and result types, without names
// and without the contract's package name, so that a gate's method and
// the contract's interface read alike.
func signature(ft *ast.FuncType) string {
	list := func(fl *ast.FieldList) string {
		var out []string
		if fl != nil {
			for _, f := range fl.List {
				for range max(1, len(f.Names)) {
					out = append(out, types.ExprString(f.Type))
				}
			}
		}
		return strings.Join(out, ", ")
	}
	return strings.ReplaceAll("("+list(ft.Params)+") ("+list(ft.Results)+")", "core.", "")
}

// TestGatesImportNoGateNorEngine: a gate's package (internal/gates/*)
// imports the contract and leaves, never another gate nor the root
// package, the engine; and the contract imports no gate nor the root.
func TestGatesImportNoGateNorEngine(t *testing.T) {
	const module = "github.com/damper-ai/damper-go"
	dirs, err := filepath.Glob(filepath.Join("internal", "gates", "*"))
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) < 6 {
		t.Fatalf("found the gates %q, want every gate's package", dirs)
	}
	dirs = append(dirs, filepath.Join("internal", "core"))
	fset := token.NewFileSet()
	for _, dir := range dirs {
		self := module + "/" + filepath.ToSlash(dir)
		names, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range names {
			f, err := parser.ParseFile(fset, name, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range f.Imports {
				path := strings.Trim(imp.Path.Value, `"`)
				switch {
				case path == module:
					t.Errorf("%s imports the root package, the engine", name)
				case strings.HasPrefix(path, module+"/internal/gates/") && path != self:
					t.Errorf("%s imports another gate, %s", name, path)
				}
			}
		}
	}
}
