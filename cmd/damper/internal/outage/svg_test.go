package outage

import (
	"bytes"
	"context"
	"encoding/xml"
	"io"
	"strings"
	"testing"
)

// svgNode is any SVG element, with its attributes and children.
type svgNode struct {
	XMLName  xml.Name
	Attrs    []xml.Attr `xml:",any,attr"`
	Text     string     `xml:",chardata"`
	Children []svgNode  `xml:",any"`
}

func (n svgNode) attr(name string) string {
	for _, a := range n.Attrs {
		if a.Name.Local == name {
			return a.Value
		}
	}
	return ""
}

// find returns every element for which match holds, depth first.
func (n svgNode) find(match func(svgNode) bool) []svgNode {
	var out []svgNode
	if match(n) {
		out = append(out, n)
	}
	for _, c := range n.Children {
		out = append(out, c.find(match)...)
	}
	return out
}

func TestWriteSVG(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Requests = 300
	res, err := Simulate(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteSVG(&buf, res, 1.1); err != nil {
		t.Fatal(err)
	}
	var root svgNode
	if err := xml.Unmarshal(buf.Bytes(), &root); err != nil {
		t.Fatalf("chart is not well-formed XML: %v", err)
	}
	if root.XMLName.Local != "svg" || root.XMLName.Space != "http://www.w3.org/2000/svg" {
		t.Fatalf("root element = %v, want svg in the SVG namespace", root.XMLName)
	}

	for _, s := range []struct {
		id       string
		attempts string
	}{{"naive", "900"}, {"damper", "310"}, {"damper-breaker", "20"}} {
		groups := root.find(func(n svgNode) bool { return n.XMLName.Local == "g" && n.attr("id") == s.id })
		if len(groups) != 1 {
			t.Fatalf("%d <g id=%q> elements, want 1", len(groups), s.id)
		}
		g := groups[0]
		if got := g.attr("data-attempts"); got != s.attempts {
			t.Errorf("%s: data-attempts = %q, want %q", s.id, got, s.attempts)
		}
		lines := g.find(func(n svgNode) bool { return n.XMLName.Local == "polyline" })
		if len(lines) != 1 || len(strings.Fields(lines[0].attr("points"))) < 4 {
			t.Errorf("%s: want one polyline with a rising line, got %d", s.id, len(lines))
		}
	}

	var texts []string
	for _, n := range root.find(func(n svgNode) bool { return n.XMLName.Local == "text" }) {
		texts = append(texts, n.Text)
	}
	all := strings.Join(texts, "\n")
	for _, want := range []string{
		"Naive retries: 900 attempts, 3.00x",
		"Damper: 310 attempts, 1.03x, 295 budget-exhausted",
		"Damper + breaker: 20 attempts, 0.07x, 286 circuit-open",
		"provider attempts (cumulative)",
		"virtual time since the outage began",
		"pass/fail limit: 1.10x = 330 attempts",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("chart has no text %q; texts:\n%s", want, all)
		}
	}
}

func TestWriteSVGError(t *testing.T) {
	res, err := Simulate(context.Background(), Config{Requests: 10, Failures: 1, Concurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteSVG(failWriter{}, res, 0); err != io.ErrShortWrite {
		t.Errorf("err = %v, want the writer's error", err)
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, io.ErrShortWrite }
