package damper

import (
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// parseRoot parses the root package's files but its tests.
func parseRoot(t *testing.T) map[string]*ast.File { return parseDir(t, ".") }

// engineDir is the call engine's package, which the root's adapters hand
// their calls to.
var engineDir = filepath.Join("internal", "engine")

// parseDir parses the files but the tests of the package in dir, by their
// names in dir.
func parseDir(t *testing.T, dir string) map[string]*ast.File {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
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
		files[filepath.Base(name)] = f
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

// No type of the root package nor of the engine has more than 20
// methods: a type that does everything (as the call once did) is split
// into parts with one responsibility each.
func TestMethodsPerType(t *testing.T) {
	for _, dir := range []string{".", engineDir} {
		count := make(map[string]int)
		for _, f := range parseDir(t, dir) {
			for _, d := range f.Decls {
				if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv != nil {
					count[receiver(fd.Recv.List[0].Type)]++
				}
			}
		}
		if want := map[string]string{".": "Proxy", engineDir: "call"}[dir]; count[want] == 0 {
			t.Fatalf("found no method of %s in %s: the test no longer reads the package", want, dir)
		}
		for name, n := range count {
			if n > 20 {
				t.Errorf("type %s of %s has %d methods, more than 20", name, dir, n)
			}
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
	files := parseDir(t, engineDir)
	if files["report.go"] == nil {
		t.Fatalf("found no report.go in %s: the test no longer reads the engine", engineDir)
	}
	for name, f := range files {
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

// The engine never calls back into an adapter. The engine is a package of
// its own (internal/engine), which imports neither the root package nor
// anything that imports it, so it cannot name what the adapters declare;
// and no file of the root package but the SDK adapter (sdk.go) and the
// proxy (proxy*.go: proxy.go, the files of its concerns, and its client
// authentication, proxy_auth.go) names what they declare: the rest is the
// package's public face, which names the engine's. What is particular to
// a client comes in the call's engine.Front. Every other file is checked,
// so that a new file needs no list to be.
func TestEngineNamesNoAdapter(t *testing.T) {
	const module = "github.com/damper-ai/damper-go"
	engineFiles := parseDir(t, engineDir)
	if engineFiles["call.go"] == nil {
		t.Fatalf("found no call.go in %s: the test no longer reads the engine", engineDir)
	}
	for name, f := range engineFiles {
		for _, imp := range f.Imports {
			if path := strings.Trim(imp.Path.Value, `"`); path == module {
				t.Errorf("%s imports the root package, the adapters", filepath.Join(engineDir, name))
			}
		}
	}

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
	var face []string
	for name := range files {
		if !slices.Contains(adapterFiles, name) {
			face = append(face, name)
		}
	}
	slices.Sort(face)
	if !slices.Contains(face, "damper.go") {
		t.Fatalf("the files checked, %q, miss damper.go", face)
	}
	for _, name := range face {
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
// package, the engine (internal/engine), the contract (internal/core) and the gates (internal/gates/*)
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
// engine, the contract (internal/core) and every gate (internal/gates/*),
// by path.
func parseGates(t *testing.T) map[string]*ast.File {
	t.Helper()
	files := parseRoot(t)
	for name, f := range parseDir(t, engineDir) {
		files[filepath.Join(engineDir, name)] = f
	}
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
// imports the contract and leaves, never another gate, the engine
// (internal/engine) nor the root package; and the contract imports no
// gate, nor the engine, nor the root.
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
					t.Errorf("%s imports the root package", name)
				case path == module+"/internal/engine":
					t.Errorf("%s imports the engine", name)
				case strings.HasPrefix(path, module+"/internal/gates/") && path != self:
					t.Errorf("%s imports another gate, %s", name, path)
				}
			}
		}
	}
}

// TestEngineSDKAdapterCopy: the engine's tests drive it through a copy of
// the SDK adapter (internal/engine/sdkadapter_test.go), which is sdk.go
// with the engine's names unqualified; a change to sdk.go is made to the
// copy too, so that those tests run the adapter users run.
func TestEngineSDKAdapterCopy(t *testing.T) {
	root, err := os.ReadFile("sdk.go")
	if err != nil {
		t.Fatal(err)
	}
	cp, err := os.ReadFile(filepath.Join(engineDir, "sdkadapter_test.go"))
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Replace(string(root), "package damper\n", "package engine\n", 1)
	want = strings.Replace(want, "\t\"github.com/damper-ai/damper-go/internal/engine\"\n", "", 1)
	want = strings.ReplaceAll(want, "d.e.NewCall(", "d.NewCall(")
	want = regexp.MustCompile(`\bengine\.`).ReplaceAllString(want, "")
	got := regexp.MustCompile(`(?s)\n\n// The SDK adapter as the engine's own tests run it.*?\n\n`).ReplaceAllString(string(cp), "\n\n")
	if got != want {
		gl, wl := strings.Split(got, "\n"), strings.Split(want, "\n")
		for i := range min(len(gl), len(wl)) {
			if gl[i] != wl[i] {
				t.Fatalf("%s differs from sdk.go at line %d:\n%s\nwant\n%s", filepath.Join(engineDir, "sdkadapter_test.go"), i+1, gl[i], wl[i])
			}
		}
		t.Fatalf("%s has %d lines, sdk.go makes %d", filepath.Join(engineDir, "sdkadapter_test.go"), len(gl), len(wl))
	}
}
