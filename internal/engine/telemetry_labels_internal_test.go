package engine

import (
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"
)

// 10,000 distinct models leave at most maxLabels labels per pool, the
// first seen, and every later one is other; known models always pass.
func TestLabelSetBounded(t *testing.T) {
	p := Policy{}
	p, err := p.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	models, _ := policyLabels(&p)
	labels := map[string]bool{}
	for i := range 10_000 {
		labels[models.label(fmt.Sprintf("model-%d", i))] = true
		labels[models.label(fmt.Sprintf("claude-sonnet-4-5-%08d", i))] = true // priced by its family
	}
	if n := len(labels); n != 2*maxLabels+1 {
		t.Errorf("%d labels, want %d", n, 2*maxLabels+1)
	}
	for _, m := range []string{"model-0", "model-31", "claude-sonnet-4-5-00000031"} {
		if got := models.label(m); got != m {
			t.Errorf("label(%q) = %q, want the model: it came among the first", m, got)
		}
	}
	for _, m := range []string{"model-32", "model-9999", "claude-sonnet-4-5-00000032"} {
		if got := models.label(m); got != otherLabel {
			t.Errorf("label(%q) = %q, want %q", m, got, otherLabel)
		}
	}
	for _, m := range []string{"claude-haiku-4-5", "claude-opus-4-1"} {
		if got := models.label(m); got != m {
			t.Errorf("label(%q) = %q, want the model: the price table has it", m, got)
		}
	}
	for _, m := range []string{"bad\xff", strings.Repeat("a", maxLabelBytes+1)} {
		if got := newLabelSet(nil, nil, maxLabels).label(m); got != otherLabel {
			t.Errorf("label(%.20q) = %q, want %q: it cannot be a model ID", m, got, otherLabel)
		}
	}
	if got := models.label(""); got != "" {
		t.Errorf(`label("") = %q, want ""`, got)
	}
}

// A label already given is read without an allocation.
func TestLabelSetReadAllocates(t *testing.T) {
	s := newLabelSet(nil, nil, maxLabels)
	m := strings.Clone("model-a")
	s.label(m)
	if n := testing.AllocsPerRun(100, func() { s.label(m) }); n != 0 {
		t.Errorf("%v allocations per label read, want 0", n)
	}
}

func TestBoundedText(t *testing.T) {
	long := strings.Repeat("é", maxLabelBytes) // 2 bytes each
	for _, tc := range []struct{ in, want string }{
		{"claude-sonnet-4-5", "claude-sonnet-4-5"},
		{"bad\xff\xfe-model", "bad\uFFFD-model"},
		{long, long[:maxLabelBytes]},
		{"x" + long, "x" + long[:maxLabelBytes-2]},
		{strings.Repeat("\xff", 1<<20), "\uFFFD"},
	} {
		got := BoundedText(tc.in)
		if got != tc.want || !utf8.ValidString(got) || len(got) > maxLabelBytes {
			t.Errorf("boundedText(%.20q) = %.20q (%d bytes), want %.20q", tc.in, got, len(got), tc.want)
		}
	}
}

// The price table remembers no model ID longer than any model ID is, so
// that callers naming long models cannot make it hold them.
func TestPriceTableForgetsLongIDs(t *testing.T) {
	table, err := NewPriceTable("test", map[string]Price{"claude-x-1": {InputPerMTok: 1}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		table.Lookup(fmt.Sprintf("%s-%d", strings.Repeat("m", 64<<10), i))
	}
	if n := table.resolvedCount.Load(); n != 0 {
		t.Errorf("%d long IDs remembered, want 0", n)
	}
	table.Lookup("claude-x-1-20250101")
	if n := table.resolvedCount.Load(); n != 1 {
		t.Errorf("%d IDs remembered, want 1", n)
	}
}

// A seriesSet admits the first max keys of each pool, and always them
// after; a key already admitted is read without an allocation.
func TestSeriesSetBounded(t *testing.T) {
	s := newSeriesSet[genAISeries](maxModelSeries)
	admitted := [2]int{}
	for i := range 10_000 {
		for pool := range 2 {
			if s.admit(genAISeries{request: fmt.Sprint(i), port: pool}, pool) {
				admitted[pool]++
			}
		}
	}
	if admitted != [2]int{maxModelSeries, maxModelSeries} {
		t.Errorf("admitted %v, want %d a pool", admitted, maxModelSeries)
	}
	first := genAISeries{request: "0"}
	if !s.admit(first, 0) || s.admit(genAISeries{request: fmt.Sprint(maxModelSeries)}, 0) {
		t.Error("the first key is refused, or one beyond the bound admitted")
	}
	if n := testing.AllocsPerRun(100, func() { s.admit(first, 0) }); n != 0 {
		t.Errorf("%v allocations per admitted key, want 0", n)
	}
}

// error.type in the GenAI metrics: Damper's names and the statuses the
// API answers with as they are, any other status _OTHER.
func TestGenAIErrorTypeBounded(t *testing.T) {
	for typ, want := range map[string]string{
		"": "", "400": "400", "429": "429", "529": "529", "504": "504",
		"418": "_OTHER", "599": "_OTHER", "999": "_OTHER", "4000": "_OTHER",
		"attempts_exhausted": "attempts_exhausted", "transport": "transport",
	} {
		if got := genAIErrorType(typ); got != want {
			t.Errorf("genAIErrorType(%q) = %q, want %q", typ, got, want)
		}
	}
}
