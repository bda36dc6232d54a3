package conf

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestCheckFindsBadDeclarations: a field with no key, a default that does
// not parse, one outside its bounds, a type a file cannot hold and a
// number or list with no max are each an error of Check, naming the field.
func TestCheckFindsBadDeclarations(t *testing.T) {
	type noKey struct{ A int }
	type badDefault struct {
		A time.Duration `key:"a" default:"soon"`
	}
	type outside struct {
		A int `key:"a" default:"101" min:"1" max:"100"`
	}
	type outsideInterval struct {
		A float64 `key:"a" default:"1" in:"(0,1)"`
	}
	type code struct {
		F func() `key:"f"`
	}
	type inner struct {
		P *noKey `key:"p"`
	}
	type unbounded struct {
		A time.Duration `key:"a" min:">0"`
	}
	type unboundedList struct {
		L []string `key:"l"`
	}
	for _, tt := range []struct {
		t    reflect.Type
		want string
	}{
		{reflect.TypeFor[noKey](), "noKey.A: no key tag"},
		{reflect.TypeFor[badDefault](), `badDefault.A: default "soon"`},
		{reflect.TypeFor[outside](), "outside.A: default 101: must be at most 100"},
		{reflect.TypeFor[outsideInterval](), "outsideInterval.A: default 1: must be in (0, 1)"},
		{reflect.TypeFor[code](), `code.F: type func(): not a kind a file holds; tag it key:"-"`},
		{reflect.TypeFor[inner](), "noKey.A: no key tag"},
		{reflect.TypeFor[unbounded](), "unbounded.A: no max"},
		{reflect.TypeFor[unboundedList](), "unboundedList.L: no max"},
	} {
		if err := Check(tt.t); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: error %v, want %q", tt.t, err, tt.want)
		}
	}
}

type decl struct {
	N     int           `key:"count" default:"3" min:"1" max:"10"`
	Off   time.Duration `key:"pause" default:"1s" none:"means 0" min:"0" max:"1h"`
	Ratio float64       `key:"ratio" in:"(0,1]" zero:"off"`
	Name  string        `key:"name" default:"x"`
	Mode  uint8         `key:"mode" enum:"a:ModeA,b:ModeB"`
	Sub   *struct {
		M map[string]declEntry `key:"m" max:"2" unit:"entries"`
	} `key:"sub"`
}

type declEntry struct {
	V int64 `key:"v" min:"0"`
}

// TestFillAndFile: defaults, None, bounds, and the file's reading of the
// same declaration.
func TestFillAndFile(t *testing.T) {
	s := decl{Off: None}
	if err := Fill(&s); err != nil || s.N != 3 || s.Off != 0 || s.Name != "x" {
		t.Fatalf("Fill: %+v, %v", s, err)
	}
	for _, tt := range []struct {
		s    decl
		want string
	}{
		{decl{N: 11}, "N = 11: must be at most 10"},
		{decl{N: -1}, "N = -1: must be at least 1 (0 means the default, 3)"},
		{decl{Off: -2}, "Off = -2ns: must be at least 0 (0 means the default, 1s; None means 0)"},
		{decl{Ratio: 2}, "Ratio = 2: must be in (0, 1] (0 means off)"},
		{decl{Mode: 2}, "Mode = 2: must be ModeA or ModeB"},
	} {
		if err := Fill(&tt.s); err == nil || err.Error() != tt.want {
			t.Errorf("Fill(%+v) = %v, want %q", tt.s, err, tt.want)
		}
	}

	var got decl
	if err := DecodeYAML([]byte("count: 4\npause: 0\nmode: b\nsub: {m: {k: {v: 5}}}\n"), &got); err != nil {
		t.Fatal(err)
	}
	if got.N != 4 || got.Off != None || got.Mode != 1 || got.Sub == nil || got.Sub.M["k"].V != 5 || got.Name != "" {
		t.Fatalf("decoded %+v", got)
	}
	js, err := MarshalJSON(got)
	if err != nil || string(js) != `{"count":4,"pause":"0s","mode":"b","sub":{"m":{"k":{"v":5}}}}` {
		t.Fatalf("MarshalJSON = %s, %v", js, err)
	}
	for doc, want := range map[string]string{
		`{"count": 0}`:      `count: 0: must be at least 1 (leave the key out for the default, 3)`,
		`{"pause": -1}`:     `pause: -1: want a duration`,
		`{"pause": "-1ns"}`: `pause: "-1ns": must be at least 0 (leave the key out for the default, 1s)`,
		`{"mode": "c"}`:     `mode: "c": want "a" or "b"`,
		`{"sub": {"m": {"a": {}, "b": {}, "c": {}}}}`: `sub.m: 3 entries: must be at most 2`,
		`{"sub": {"m": {"a": {"v": -1}}}}`:            `sub.m.a.v: -1: must be at least 0`,
		`{"ratio": 0, "count": 20}`:                   `count: 20: must be at most 10`,
	} {
		var s decl
		if err := DecodeJSON([]byte(doc), &s); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want %q", doc, err, want)
		}
	}
}

type listed struct {
	Items []listItem `key:"items" max:"2" unit:"items"`
}

type listItem struct {
	Name string            `key:"name" default:"anon"`
	M    map[string]string `key:"m" max:"1" unit:"entries"`
	N    int               `key:"num" min:"0" max:"100"`
}

func init() {
	Register(func(p *listItem, _ listItem) error {
		if p.N == 7 {
			return &FieldError{Field: "N", Value: p.N, Why: "must not be 7"}
		}
		return nil
	})
}

// TestListOfStructs: each element of a list of structs is filled in and
// checked as a struct of its own, its errors named by its index.
func TestListOfStructs(t *testing.T) {
	var got listed
	if err := DecodeYAML([]byte("items:\n  - {m: {a: b}}\n  - {name: x, num: 3}\n"), &got); err != nil {
		t.Fatal(err)
	}
	if err := Fill(&got); err != nil || len(got.Items) != 2 || got.Items[0].Name != "anon" || got.Items[1].N != 3 {
		t.Fatalf("filled %+v, %v", got, err)
	}
	if err := Check(reflect.TypeFor[listed]()); err != nil {
		t.Error(err)
	}
	var sampled listed
	if err := Sample(&sampled, false); err != nil || len(sampled.Items) != 1 || sampled.Items[0].Name != "sample-name" {
		t.Errorf("Sample: %+v, %v", sampled, err)
	}
	for doc, want := range map[string]string{
		`{"items": [{}, {}, {}]}`:                      `items: 3 items: must be at most 2`,
		`{"items": [{}, {"m": {"a": "1", "b": "2"}}]}`: `items[1].m: 2 entries: must be at most 1`,
		`{"items": [{"num": -1}]}`:                     `items[0].num: -1: must be at least 0`,
		`{"items": [{}, {"num": 7}]}`:                  `items[1].num: 7: must not be 7`,
		`{"items": [{"bad": 1}]}`:                      `items[0].bad: unknown key`,
	} {
		var s listed
		if err := DecodeJSON([]byte(doc), &s); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want %q", doc, err, want)
		}
	}
}
