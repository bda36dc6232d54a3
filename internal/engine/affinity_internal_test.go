package engine

import (
	"bytes"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// gjsonBreakpoint is promptSections.breakpoint as gjson reads the body:
// the section, element and content block of the first breakpoint.
func gjsonBreakpoint(body []byte) (section, index, block int) {
	root := gjson.ParseBytes(body)
	set := func(v gjson.Result) bool { return v.Exists() && v.Type != gjson.Null }
	marked := func(v gjson.Result) bool { return v.IsObject() && set(v.Get("cache_control")) }
	for s, name := range []string{"tools", "system"} {
		if list := root.Get(name); list.IsArray() {
			for i, e := range list.Array() {
				if marked(e) {
					return s + 1, i, -1
				}
			}
		}
	}
	automatic := set(root.Get("cache_control"))
	if list := root.Get("messages"); list.IsArray() {
		for i, m := range list.Array() {
			if content := m.Get("content"); m.IsObject() && content.IsArray() {
				for j, b := range content.Array() {
					if marked(b) {
						return sectionMessages, i, j
					}
				}
			}
			if i == 0 && automatic {
				return sectionMessages, 0, -1
			}
		}
	}
	return sectionNone, 0, 0
}

// breakpointOf reads body as a call with cache affinity does, and returns
// its breakpoint and key.
func breakpointOf(body []byte) (breakpoint, uint64) {
	var s promptSections
	readFactsNoting(body, &s)
	return s.breakpoint(body), readFacts(body, true, true).prefix
}

// readFactsNoting runs the top-level pass of readFacts, noting the
// sections in s.
func readFactsNoting(body []byte, s *promptSections) {
	sc := BodyScan{Body: body}
	obj := jsonElems{s: sc, i: SkipSpace(body, 0), end: len(body)}
	if !obj.open('{') {
		return
	}
	for {
		k, kEnd, ok := obj.next()
		if !ok || body[k] != '"' {
			return
		}
		i := SkipSpace(body, kEnd)
		if i >= len(body) || body[i] != ':' {
			return
		}
		obj.i = i + 1
		v, vEnd, ok := obj.next()
		if !ok {
			return
		}
		s.note(body[k+1:kEnd-1], body[v:vEnd], v, vEnd)
	}
}

var breakpointSeeds = []string{
	`{"model":"m","system":[{"type":"text","text":"s","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"hi"}]}`,
	`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b","cache_control":{"type":"ephemeral"}}]}],"model":"m"}`,
	`{"tools":[{"name":"a"},{"name":"b","cache_control":{"type":"ephemeral"}}],"system":[{"text":"s","cache_control":{}}]}`,
	`{"cache_control":{"type":"ephemeral"},"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"yo"}]}`,
	`{"cache_control":null,"system":[{"cache_control":null}],"messages":[{"content":[{"cache_control":null}]}]}`,
	`{"messages":[{"content":[{"type":"tool_result","content":[{"type":"text","cache_control":{}}]}]}]}`,
	`{"system":"cache_control","tools":[["cache_control"]],"messages":[{"content":{"cache_control":{}}}]}`,
	`{"system":[{"cache_control":{},"cache_control":null}],"tools":[],"tools":[{"cache_control":{}}]}`,
	`{"messages":[` + strings.Repeat(`[`, 64) + `"cache_control"` + strings.Repeat(`]`, 64) + `]}`,
	`{"messages":[{"content":[{"cache_control":{}` + "\n]", `{"tools":[{"cache_control":`, `[]`, ``, `{"cache_control":1}`,
}

// FuzzPromptBreakpoint: the key's read of a body finds the breakpoint gjson
// finds, never panics, and gives a key exactly when it finds one.
func FuzzPromptBreakpoint(f *testing.F) {
	for _, s := range breakpointSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		bp, key := breakpointOf(body)
		if again := readFacts(body, true, true).prefix; again != key {
			t.Fatalf("%q: key %x, then %x", body, key, again)
		}
		if readFacts(body, true, false).prefix != 0 {
			t.Fatalf("%q: a key read without affinity", body)
		}
		// A body left to gjson (an escape in a top-level key, or no
		// object) has no key; nor does one gjson finds invalid.
		if bytes.IndexByte(body, '\\') >= 0 || !gjson.ValidBytes(body) || !gjson.ParseBytes(body).IsObject() {
			return
		}
		if (key != 0) != (bp.section != sectionNone) {
			t.Fatalf("%q: breakpoint %+v, key %x", body, bp, key)
		}
		section, index, block := gjsonBreakpoint(body)
		if bp.section != section || section != sectionNone && (bp.index != index || bp.block != block) {
			t.Fatalf("%q: breakpoint %+v; gjson finds section %d, element %d, block %d", body, bp, section, index, block)
		}
	})
}

func TestPromptKeys(t *testing.T) {
	body := func(model, tools, system, messages string, automatic bool) []byte {
		var b strings.Builder
		fmt.Fprintf(&b, `{"max_tokens":64,"messages":%s,"model":%q`, messages, model)
		if system != "" {
			fmt.Fprintf(&b, `,"system":%s`, system)
		}
		if tools != "" {
			fmt.Fprintf(&b, `,"tools":%s`, tools)
		}
		if automatic {
			b.WriteString(`,"cache_control":{"type":"ephemeral"}`)
		}
		b.WriteString("}")
		return []byte(b.String())
	}
	const cc = `"cache_control":{"type":"ephemeral"}`
	sys := `[{"type":"text","text":"You are terse.",` + cc + `}]`
	turn1 := `[{"role":"user","content":"first"}]`
	turn2 := `[{"role":"user","content":"first"},{"role":"assistant","content":"ok"},{"role":"user","content":[{"type":"text","text":"more",` + cc + `}]}]`
	key := func(b []byte) uint64 { return readFacts(b, true, true).prefix }
	base := key(body("m", "", sys, turn1, false))
	switch {
	case base == 0:
		t.Fatal("a system breakpoint: no key")
	case key(body("m", "", sys, turn2, false)) != base:
		t.Error("the first breakpoint's prefix is the system prompt: a later turn, with a breakpoint of its own, has another key")
	case key(body("m2", "", sys, turn1, false)) == base:
		t.Error("another model: the same key")
	case key(body("m", "", strings.Replace(sys, "terse", "brief", 1), turn1, false)) == base:
		t.Error("another system prompt: the same key")
	case key(body("m", `[{"name":"t","input_schema":{}}]`, sys, turn1, false)) == base:
		t.Error("tools come before the system prompt in the prefix: adding one kept the key")
	case key(body("m", "", `[{"type":"text","text":"You are terse."}]`, turn1, false)) != 0:
		t.Error("no breakpoint: a key")
	}
	// A breakpoint on a tool: the prefix ends there, whatever follows.
	tools := `[{"name":"a","input_schema":{},` + cc + `},{"name":"b","input_schema":{}}]`
	if k := key(body("m", tools, sys, turn1, false)); k == 0 || k != key(body("m", tools, "", turn2, false)) {
		t.Error("a tool's breakpoint: the system prompt and messages after it changed the key")
	}
	// Automatic caching: the first message ends the prefix, so every turn
	// of a conversation shares it.
	auto1, auto2 := key(body("m", "", "", turn1, true)), key(body("m", "", "", strings.Replace(turn2, ","+cc, "", 1), true))
	if auto1 == 0 || auto1 != auto2 {
		t.Errorf("automatic caching: keys %x and %x; want one key for a conversation's turns", auto1, auto2)
	}
	if key(body("m", "", "", `[{"role":"user","content":"another"}]`, true)) == auto1 {
		t.Error("automatic caching: another first message, the same key")
	}
}

// The key of a body is read with no allocation, whatever the body: plain,
// cached, or hostile (deep nesting, a huge array, invalid JSON); a body
// without a breakpoint costs one byte search.
func TestPromptKeyAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("allocations are counted without -race")
	}
	long := strings.Repeat("x", 64<<10)
	bodies := map[string]string{
		"plain":   `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"` + long + `"}]}`,
		"cached":  `{"model":"m","max_tokens":8,"system":[{"type":"text","text":"` + long + `","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"hi"}]}`,
		"deep":    `{"model":"m","messages":[{"role":"user","content":[` + strings.Repeat(`{"a":[`, 100_000) + strings.Repeat(`]}`, 100_000) + `,{"cache_control":{}}]}]}`,
		"unended": `{"model":"m","messages":[{"role":"user","content":[` + strings.Repeat(`[`, 100_000) + `"cache_control"` + `]}`,
		"huge":    `{"model":"m","tools":[` + strings.Repeat(`{"name":"t"},`, 100_000) + `{"name":"u","cache_control":{}}],"messages":[]}`,
		"invalid": `{"model":"m","system":[{"cache_control":}],"messages":[{"content":[{"cache_control"`,
		"many":    `{"model":"m","messages":[` + strings.Repeat(`{"role":"user","content":[{"type":"text","text":"cache_control"}]},`, 20_000) + `{"content":[{"cache_control":{}}]}]}`,
	}
	want := map[string]bool{"cached": true, "deep": true, "huge": true, "many": true}
	for name, b := range bodies {
		body := []byte(b)
		f := readFacts(body, true, true)
		if (f.prefix != 0) != want[name] {
			t.Errorf("%s: key %x; want one: %v", name, f.prefix, want[name])
		}
		with := testing.AllocsPerRun(10, func() { readFacts(body, true, true) })
		without := testing.AllocsPerRun(10, func() { readFacts(body, true, false) })
		if with != without {
			t.Errorf("%s: %v allocations with the key, %v without", name, with, without)
		}
	}
}

// The table holds at most its size, the least recently used evicted, in
// bounded memory: 100,000 distinct prefixes leave 4,096 entries.
func TestAffinityTableBounded(t *testing.T) {
	b1, b2 := &backend{name: "one"}, &backend{name: "two"}
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	a := newAffinity(4096)
	a.record(1, b1)
	for k := uint64(2); k <= 100_000; k++ {
		a.record(k, b2)
		if k%1000 == 0 {
			if b, ok := a.lookup(1); !ok || b != b1 { // used: never the least recent
				t.Fatalf("after %d prefixes, key 1 lost", k)
			}
		}
	}
	full := heap()
	for k := uint64(100_001); k <= 200_000; k++ {
		a.record(k, b2)
		if k%1000 == 0 {
			a.lookup(1)
		}
	}
	after := heap()
	if n := a.len(); n != 4096 || len(a.slots) != 4096 || cap(a.slots) > 8192 {
		t.Fatalf("%d entries in %d slots (capacity %d); want 4096", n, len(a.slots), cap(a.slots))
	}
	if _, ok := a.lookup(1); !ok {
		t.Error("key 1, used throughout, evicted")
	}
	if _, ok := a.lookup(200_000 - 4094); !ok {
		t.Error("a recent key evicted")
	}
	if _, ok := a.lookup(200_000 - 4095); ok {
		t.Error("the least recent key kept")
	}
	grew := int64(full) - int64(before)
	t.Logf("the table of 4,096 entries: %d bytes; after 100,000 more prefixes %+d", grew, int64(after)-int64(full))
	if grew > 512<<10 || int64(after)-int64(full) > 64<<10 {
		t.Fatalf("the table took %d bytes, then %+d more; want at most 512 KiB, and no growth", grew, int64(after)-int64(full))
	}
	runtime.KeepAlive(a)
}

// A backend's entry follows the backend that last served the prefix.
func TestAffinityTableRecords(t *testing.T) {
	b1, b2 := &backend{name: "one"}, &backend{name: "two"}
	a := newAffinity(2)
	if _, ok := a.lookup(7); ok {
		t.Fatal("an empty table found a key")
	}
	a.record(7, b1)
	a.record(8, b1)
	a.record(7, b2) // moved: 7 is the most recent
	a.record(9, b1) // evicts 8
	if b, ok := a.lookup(7); !ok || b != b2 {
		t.Errorf("key 7: %v, %v; want the second backend", b, ok)
	}
	if _, ok := a.lookup(8); ok {
		t.Error("key 8, the least recent, kept")
	}
	if b, ok := a.lookup(9); !ok || b != b1 || a.len() != 2 {
		t.Errorf("key 9: %v, %v; %d entries", b, ok, a.len())
	}
}
