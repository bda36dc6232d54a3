package damper_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// goNames is what the workspace's Go code declares and names: every
// declared name (bare, and as Type.Member for a method, a field or an
// interface's method), every package's name and the names it declares, every selector of an imported package the
// code uses (http.Handler), and every string literal outside the tests
// (metric names, outcomes, label values).
type goNames struct {
	declared map[string]bool            // name, and Type.Member
	packages map[string]map[string]bool // package name → its top-level names
	imported map[string]bool            // pkg.Name used through an import
	strs     map[string]bool            // string literals' values
	types    map[string]bool            // declared type names
	selected map[string]bool            // names used after a dot (a field of another package's type)
	members  map[string]map[string]bool // type → its methods and fields
}

// workspaceNames parses every tracked .go file of the workspace.
func workspaceNames(t *testing.T, tracked []string) *goNames {
	t.Helper()
	n := &goNames{declared: map[string]bool{}, packages: map[string]map[string]bool{},
		imported: map[string]bool{}, strs: map[string]bool{}, types: map[string]bool{}, selected: map[string]bool{}, members: map[string]map[string]bool{}}
	declare := func(name string) { n.declared[name] = true }
	member := func(typ, name string) {
		if n.members[typ] == nil {
			n.members[typ] = map[string]bool{}
		}
		n.members[typ][name] = true
		declare(typ + "." + name)
		declare(name)
	}
	fields := func(typ string, e ast.Expr) {
		switch x := e.(type) {
		case *ast.StructType:
			for _, f := range x.Fields.List {
				for _, id := range f.Names {
					member(typ, id.Name)
				}
				if len(f.Names) == 0 { // embedded: its type's name
					if id := typeName(f.Type); id != "" {
						member(typ, id)
					}
				}
			}
		case *ast.InterfaceType:
			for _, f := range x.Methods.List {
				for _, id := range f.Names {
					member(typ, id.Name)
				}
			}
		}
	}
	fset := token.NewFileSet()
	for _, file := range tracked {
		if !strings.HasSuffix(file, ".go") || strings.Contains("/"+file, "/testdata/") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.FromSlash(file), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		pkg := n.packages[f.Name.Name]
		if pkg == nil {
			pkg = map[string]bool{}
			n.packages[f.Name.Name] = pkg
		}
		imports := map[string]bool{}
		for _, im := range f.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			name := path.Base(p)
			if im.Name != nil {
				name = im.Name.Name
			} else if regexp.MustCompile(`^v[0-9]+$`).MatchString(name) {
				name = path.Base(path.Dir(p))
			}
			imports[name] = true
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil {
					pkg[d.Name.Name] = true
					declare(d.Name.Name)
				} else {
					member(typeName(d.Recv.List[0].Type), d.Name.Name)
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						pkg[s.Name.Name] = true
						n.types[s.Name.Name] = true
						declare(s.Name.Name)
						fields(s.Name.Name, s.Type)
					case *ast.ValueSpec:
						for _, id := range s.Names {
							pkg[id.Name] = true
							declare(id.Name)
						}
					}
				}
			}
		}
		ast.Inspect(f, func(x ast.Node) bool {
			switch x := x.(type) {
			case *ast.SelectorExpr:
				n.selected[x.Sel.Name] = true
				if id, ok := x.X.(*ast.Ident); ok && imports[id.Name] {
					n.imported[id.Name+"."+x.Sel.Name] = true
				}
			case *ast.Field:
				// A field's file key is a name the code has.
				if x.Tag != nil {
					if tag, err := strconv.Unquote(x.Tag.Value); err == nil {
						if key, _, _ := strings.Cut(reflect.StructTag(tag).Get("key"), ","); key != "" && key != "-" {
							n.strs[key] = true
						}
					}
				}
			case *ast.BasicLit:
				if x.Kind == token.STRING && !strings.HasSuffix(file, "_test.go") {
					if s, err := strconv.Unquote(x.Value); err == nil {
						n.strs[s] = true
					}
				}
			}
			return true
		})
	}
	return n
}

// typeName is the name of a receiver's or an embedded field's type.
func typeName(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.StarExpr:
		return typeName(x.X)
	case *ast.IndexExpr:
		return typeName(x.X)
	case *ast.IndexListExpr:
		return typeName(x.X)
	case *ast.SelectorExpr:
		return x.Sel.Name
	case *ast.Ident:
		return x.Name
	}
	return ""
}

var (
	identChain = regexp.MustCompile(`^\*?([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)(?:\(.*\))?$`)
	pathLike   = regexp.MustCompile(`^[A-Za-z0-9_.*\-/]+$`)
)

// docWords are backticked words of the documentation that are not the
// code's: go.mod's directive.
var docWords = map[string]bool{"replace": true}

// known reports whether a backticked token of the documentation names
// something the code has; checked is false for a token that is neither a
// path nor a Go name (a request line, a header, a command).
func (n *goNames) known(tok string, isPath func(string) bool) (ok, checked bool) {
	if n.strs[tok] || docWords[tok] || pathLike.MatchString(tok) && isPath(tok) {
		return true, true
	}
	if strings.Contains(tok, "/") && pathLike.MatchString(tok) {
		if isPath(tok) {
			return true, true
		}
		// internal/ratelimit.Group: a package's directory, then a name in it.
		i := strings.LastIndex(tok, "/")
		pkg, chain, ok := strings.Cut(tok[i+1:], ".")
		if !ok || strings.HasSuffix(tok, ".go") || strings.HasSuffix(tok, ".md") || !isPath(tok[:i+1]+pkg+"/") {
			return false, true
		}
		return n.known(pkg+"."+chain, isPath)
	}
	if strings.HasSuffix(tok, ".go") || strings.HasSuffix(tok, ".md") {
		return isPath(tok), true
	}
	m := identChain.FindStringSubmatch(tok)
	if m == nil {
		return false, false
	}
	parts := strings.Split(m[1], ".")
	if len(parts) == 1 {
		return n.declared[parts[0]] || n.selected[parts[0]] || n.packages[parts[0]] != nil || isPath(parts[0]+"/"), true
	}
	if len(parts) == 2 && n.imported[m[1]] {
		return true, true // http.Handler
	}
	if pkg := n.packages[parts[0]]; pkg != nil && !n.types[parts[0]] {
		if !pkg[parts[1]] {
			return false, true
		}
		parts = parts[1:]
	}
	for i := 0; i+1 < len(parts); i++ {
		if n.types[parts[i]] && !n.members[parts[i]][parts[i+1]] {
			return false, true
		}
	}
	last := parts[len(parts)-1]
	return n.declared[last] || n.selected[last], true
}

// TestArchitectureNames: every Go name, file and directory that
// docs/ARCHITECTURE.md puts in backticks exists in the workspace's code, a
// Type.Member is a member of that type, and a pkg.Name is declared by that
// package; and the page speaks of the code as it is, not of work to come.
func TestArchitectureNames(t *testing.T) {
	tracked, ok := trackedFiles(t, ".")
	if !ok {
		t.Skip("not a git checkout: the workspace's other modules are not here")
	}
	doc, err := os.ReadFile(filepath.Join("docs", "ARCHITECTURE.md"))
	if err != nil {
		t.Fatal(err)
	}
	n := workspaceNames(t, tracked)
	// A path is the repository's, or the end of one (a file of a module's
	// directory, guide/ in docs/); a glob matches a file's name.
	isPath := func(p string) bool {
		dir := strings.HasSuffix(p, "/")
		p = strings.TrimSuffix(p, "/")
		for _, f := range tracked {
			if strings.HasPrefix("/"+f, "/"+p+"/") || strings.Contains("/"+f, "/"+p+"/") {
				return true
			}
			if m, _ := path.Match(p, path.Base(f)); !dir && (f == p || strings.HasSuffix(f, "/"+p) || m) {
				return true
			}
		}
		return false
	}
	// The check itself: names that exist, and names that do not.
	for tok, want := range map[string]bool{
		"admitAttempt": true, "Limiter.AdmitAttempt": true, "Damper.wire": true, "sse.Scanner.TrackUsage": true,
		"internal/ratelimit.Group": true, "telemetry*.go": true, "http.Handler": true, "proxy_backends.go": true,
		"redisstore.Options.Lease": true, "damper.circuit.changes": true, "Allow(now)": true, "guide/": true,
		"call.admitAttempt": false, "admitAttempts": false, "fleet.NoSuchPart": false, "nosuch.go": false,
		"internal/nosuch/": false, "internal/ratelimit.NoGroup": false, "Damper.nosuch": false, "redisstore.Options.Nosuch": false,
	} {
		if got, checked := n.known(tok, isPath); got != want || !checked {
			t.Errorf("known(%q) = %v, checked %v; want %v", tok, got, checked, want)
		}
	}
	seen := map[string]bool{}
	for _, m := range regexp.MustCompile("`([^`\n]+)`").FindAllStringSubmatch(string(doc), -1) {
		tok := m[1]
		if seen[tok] {
			continue
		}
		seen[tok] = true
		if ok, checked := n.known(tok, isPath); checked && !ok {
			t.Errorf("docs/ARCHITECTURE.md names `%s`, which the code does not have", tok)
		}
	}
	for _, m := range regexp.MustCompile(`(?i)[^.|]*\b(?:once [^.|]* lands|will land|not yet|todo)\b[^.|]*`).FindAllString(string(doc), -1) {
		t.Errorf("docs/ARCHITECTURE.md speaks of work to come: %q", strings.TrimSpace(m))
	}
}
