package damper

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"testing"
	"testing/iotest"

	"github.com/tidwall/gjson"
)

// FuzzTopLevelFacts: the one-pass read of a request body's model,
// max_tokens and stream agrees with gjson's look-up of each path, the
// first of duplicate members included, and never panics.
func FuzzTopLevelFacts(f *testing.F) {
	for _, s := range []string{
		`{"max_tokens":64,"messages":[{"role":"user","content":"hi"}],"model":"claude-sonnet-4-5","stream":true}`,
		`{"messages":[{"content":"{\"model\":\"inner\"}"}],"model":"claude-opus-4-1-20250805","max_tokens":1e3}`,
		`{"model":"a","model":"b","stream":false,"stream":true}`,
		`{"model":"caf\u00e9 \"x\"","max_tokens":"12"}`,
		`[1,2]`, `{"model":`, ``, `{}`, `{"stream":1}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		model, maxTokens, stream := topLevelFacts(body)
		if !gjson.ValidBytes(body) || !gjson.ParseBytes(body).IsObject() {
			return // only that it does not panic
		}
		want := gjson.GetManyBytes(body, "model", "max_tokens", "stream")
		if model != want[0].Str || maxTokens != int(want[1].Int()) || stream != want[2].Bool() {
			t.Fatalf("topLevelFacts(%q) = %q, %d, %v; gjson says %q, %d, %v", body, model, maxTokens, stream, want[0].Str, want[1].Int(), want[2].Bool())
		}
	})
}

// topLevelFacts keeps no view of the buffer it read: the model survives
// the buffer's reuse.
func TestTopLevelFactsCopiesTheModel(t *testing.T) {
	body := []byte(`{"model":"claude-sonnet-4-5","max_tokens":8}`)
	model, _, _ := topLevelFacts(body)
	copy(body, bytes.Repeat([]byte("x"), len(body)))
	if model != "claude-sonnet-4-5" {
		t.Fatalf("model = %q after the buffer was overwritten", model)
	}
}

func TestReadInto(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789"), 1000)
	for _, tc := range []struct {
		name   string
		r      io.Reader
		length int64
	}{
		{"length known", bytes.NewReader(data), int64(len(data))},
		{"length unknown", bytes.NewReader(data), 0},
		{"length too short", bytes.NewReader(data), 10},
		{"length too long", bytes.NewReader(data), 1 << 20},
		{"one byte at a time", iotest.OneByteReader(bytes.NewReader(data)), int64(len(data))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := readInto(nil, tc.r, tc.length)
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("readInto = %d bytes, %v; want the %d bytes", len(got), err, len(data))
			}
			if tc.length == int64(len(data)) && !raceEnabled {
				r := bytes.NewReader(data)
				allocs := testing.AllocsPerRun(10, func() {
					r.Reset(data)
					_, _ = readInto(nil, r, tc.length)
				})
				if allocs != 1 {
					t.Errorf("%v allocations with the length known, want 1", allocs)
				}
			}
		})
	}
	boom := errors.New("boom")
	got, err := readInto(nil, io.MultiReader(bytes.NewReader(data[:5]), iotest.ErrReader(boom)), 0)
	if !errors.Is(err, boom) || string(got) != "01234" {
		t.Errorf("readInto over a failing reader = %q, %v; want what came and the error", got, err)
	}
}

// A dated or platform model ID is resolved to its family once; the table
// remembers at most maxResolved IDs and stays right beyond them.
func TestPriceLookupRemembers(t *testing.T) {
	table, err := NewPriceTable("test", map[string]Price{"claude-sonnet-4-5": {InputPerMTok: 3, OutputPerMTok: 15}})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if p, ok := table.Lookup("us.anthropic.claude-sonnet-4-5-20250929-v1:0"); !ok || p.InputPerMTok != 3 {
			t.Fatalf("Lookup of a Bedrock ID = %+v, %v", p, ok)
		}
	}
	if n := table.resolvedCount.Load(); n != 1 {
		t.Fatalf("%d IDs remembered after one ID looked up three times, want 1", n)
	}
	for i := range maxResolved + 50 {
		id := fmt.Sprintf("claude-sonnet-4-5-2025%04d", i)
		if _, ok := table.Lookup(id); !ok {
			t.Fatalf("Lookup(%q) found no price", id)
		}
		if _, ok := table.Lookup(fmt.Sprintf("unknown-%d", i)); ok {
			t.Fatalf("an unknown model has a price")
		}
	}
	if n := table.resolvedCount.Load(); n != maxResolved {
		t.Errorf("%d IDs remembered, want the bound %d", n, maxResolved)
	}
}

// BenchmarkPriceLookup: a dated ID costs about what an alias does once it
// has been seen.
func BenchmarkPriceLookup(b *testing.B) {
	for _, model := range []string{"claude-sonnet-4-5", "claude-sonnet-4-5-20250929", "us.anthropic.claude-sonnet-4-5-20250929-v1:0"} {
		b.Run(model, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, ok := defaultPrices.Lookup(model); !ok {
					b.Fatal("no price")
				}
			}
		})
	}
}
