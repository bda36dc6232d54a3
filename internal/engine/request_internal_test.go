package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/tidwall/gjson"

	"github.com/damper-ai/damper-go/internal/estimate"
)

// FuzzReadBodyFacts: the one-pass read of a request body's model,
// max_tokens and stream agrees with gjson's look-up of each path, the
// first of duplicate members included; its estimate of the input tokens
// agrees with estimate.InputTokens on a body with no escapes; and it never
// panics.
func FuzzReadBodyFacts(f *testing.F) {
	for _, s := range []string{
		`{"max_tokens":64,"messages":[{"role":"user","content":"hi"}],"model":"claude-sonnet-4-5","stream":true}`,
		`{"messages":[{"content":"{\"model\":\"inner\"}"}],"model":"claude-opus-4-1-20250805","max_tokens":1e3}`,
		`{"model":"a","model":"b","stream":false,"stream":true}`,
		`{"model":"caf\u00e9 \"x\"","max_tokens":"12"}`,
		`{"messages":[{"content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}}]}],"data":"AAAA","model":"m"}`,
		`{"data" : "spaced", "x":{"data":"y"}}`,
		`[1,2]`, `{"model":`, ``, `{}`, `{"stream":1}`, `{"data":`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got := readBodyFacts(body, false)
		if !gjson.ValidBytes(body) || !gjson.ParseBytes(body).IsObject() {
			return // only that it does not panic
		}
		want := slowFacts(body, false)
		if got.model != want.model || got.maxTokens != want.maxTokens || got.stream != want.stream {
			t.Fatalf("readBodyFacts(%q) = %+v; gjson says %+v", body, got, want)
		}
		if bytes.IndexByte(body, '\\') < 0 && got.inputTokens != want.inputTokens {
			t.Fatalf("readBodyFacts(%q) estimates %d tokens, estimate.InputTokens %d", body, got.inputTokens, want.inputTokens)
		}
	})
}

// readBodyFacts keeps no view of the buffer it read: the model survives
// the buffer's reuse.
func TestReadBodyFactsCopiesTheModel(t *testing.T) {
	body := []byte(`{"model":"claude-sonnet-4-5","max_tokens":8}`)
	f := readBodyFacts(body, false)
	copy(body, bytes.Repeat([]byte("x"), len(body)))
	if f.model != "claude-sonnet-4-5" || f.maxTokens != 8 {
		t.Fatalf("facts = %+v after the buffer was overwritten", f)
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

// BenchmarkReadBodyFacts reads the facts of a 100 KB request body, whose
// model and stream come after the messages, as the SDK writes them.
func BenchmarkReadBodyFacts(b *testing.B) {
	body := []byte(`{"max_tokens":64,"messages":[{"role":"user","content":[{"type":"text","text":"` +
		strings.Repeat(`lorem ipsum dolor sit amet, \"quoted\" now and then. `, 2000) + `"}]}],"model":"claude-sonnet-4-5","stream":true}`)
	tokens := estimate.InputTokens(body)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if f := readBodyFacts(body, false); f.model != "claude-sonnet-4-5" || !f.stream || f.inputTokens != tokens {
			b.Fatal(f)
		}
	}
}

// partsWriterTo writes its body in two parts, or fails with err.
type partsWriterTo struct {
	body []byte
	err  error
}

func (p partsWriterTo) Read([]byte) (int, error) { return 0, errors.New("read, not WriteTo") }
func (p partsWriterTo) Close() error             { return nil }
func (p partsWriterTo) WriteTo(w io.Writer) (int64, error) {
	if p.err != nil {
		return 0, p.err
	}
	n1, err := w.Write(p.body[:len(p.body)/2])
	if err != nil {
		return int64(n1), err
	}
	n2, err := w.Write(p.body[len(p.body)/2:])
	return int64(n1 + n2), err
}

// writeToOnly is a body that can only be written, as a bytes.Reader
// writes itself, in one piece.
type writeToOnly struct{ r *bytes.Reader }

func (w writeToOnly) Read([]byte) (int, error)             { return 0, errors.New("read, not WriteTo") }
func (w writeToOnly) Close() error                         { return nil }
func (w writeToOnly) WriteTo(dst io.Writer) (int64, error) { return w.r.WriteTo(dst) }

// readFacts reads the body the SDK hands over in place, through WriteTo,
// and any other body by reading it; either way it leaves a body to send.
func TestReadFacts(t *testing.T) {
	body := []byte(`{"max_tokens":77,"messages":[{"role":"user","content":"` + strings.Repeat("x", 4000) + `"}],"model":"claude-opus-4-1","stream":true}`)
	boom := errors.New("boom")
	for _, tc := range []struct {
		name    string
		body    io.ReadCloser
		getBody func() (io.ReadCloser, error)
		length  int64
		wantErr error
	}{
		{"the SDK's bytes.Reader", io.NopCloser(bytes.NewReader(body)), nil, int64(len(body)), nil},
		// Read fails: only a read in place, through WriteTo, succeeds.
		{"in place", writeToOnly{bytes.NewReader(body)}, nil, int64(len(body)), nil},
		{"length unknown", io.NopCloser(bytes.NewReader(body)), nil, 0, nil},
		{"length wrong", io.NopCloser(bytes.NewReader(body)), nil, int64(len(body)) - 1, nil},
		{"no WriteTo", io.NopCloser(iotest.OneByteReader(bytes.NewReader(body))), nil, int64(len(body)), nil},
		{"written in parts", partsWriterTo{body: body}, func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }, int64(len(body)), nil},
		{"WriteTo fails", partsWriterTo{err: boom}, nil, int64(len(body)), boom},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodPost, "http://x.invalid/v1/messages", bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			req.Body, req.ContentLength = tc.body, tc.length
			if tc.getBody != nil {
				req.GetBody = tc.getBody
			}
			q := &request{req: req}
			err = q.readFacts()
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("readFacts: %v, want %v", err, tc.wantErr)
			}
			if tc.wantErr != nil {
				return
			}
			if f := q.facts; f.model != "claude-opus-4-1" || f.maxTokens != 77 || !f.stream || f.inputTokens != estimate.InputTokens(body) {
				t.Errorf("facts: %q, %d, %v, %d tokens", f.model, f.maxTokens, f.stream, f.inputTokens)
			}
		})
	}
}

// TestChangesRequest: a next that runs another middleware may change the
// request in place, so a retry needs the headers kept before it; the
// client's HTTP client, or the proxy's transport, does not.
func TestChangesRequest(t *testing.T) {
	for _, tc := range []struct {
		name  string
		after []option.RequestOption
		want  bool
	}{
		{"last middleware", nil, false},
		{"a middleware after", []option.RequestOption{option.WithMiddleware(func(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
			return next(req)
		})}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ran := false, false
			probe := option.WithMiddleware(func(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
				got, ran = changesRequest(next), true
				return nil, errors.New("probe: nothing sent")
			})
			opts := append([]option.RequestOption{option.WithAPIKey("k"), option.WithBaseURL("http://localhost/"), option.WithMaxRetries(0), probe}, tc.after...)
			client := anthropic.NewClient(opts...)
			_ = client.Get(context.Background(), "v1/models", nil, nil)
			if !ran || got != tc.want {
				t.Fatalf("changesRequest = %v (the probe ran: %v), want %v", got, ran, tc.want)
			}
		})
	}
	if changesRequest(http.DefaultTransport.RoundTrip) {
		t.Error("changesRequest(a transport's RoundTrip) = true")
	}
}

// BenchmarkReadBodyFactsAtTheDoor times readBodyFacts, the engine's read of a body,
// on the bodies of the proxy's BenchmarkCheckMessagesBody, its check at
// the door.
func BenchmarkReadBodyFactsAtTheDoor(b *testing.B) {
	for _, size := range []int{2 << 10, 1 << 20} {
		body := []byte(`{"messages":[{"role":"user","content":"` + strings.Repeat("x", size) +
			`"}],"model":"claude-sonnet-4-6","max_tokens":1024,"stream":true}`)
		b.Run(fmt.Sprintf("facts/%dKiB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				readBodyFacts(body, false)
			}
		})
	}
}
