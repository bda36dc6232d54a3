package brownout

import (
	"bytes"
	"encoding/xml"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// rootAttr returns the value of the root <svg> element's attribute name.
func rootAttr(t *testing.T, svg []byte, name string) string {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(svg))
	for {
		tok, err := dec.Token()
		if err != nil {
			t.Fatalf("no <svg> element: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			for _, a := range se.Attr {
				if a.Name.Local == name {
					return a.Value
				}
			}
			return ""
		}
	}
}

// The chart has a title (the <title> element, and the scenario's title in
// bold, on two lines when it has two clauses), a caption on its time axis,
// and the outage demo chart's font; it is well-formed XML.
func TestWriteSVGLabels(t *testing.T) {
	for _, sc := range []Scenario{Scenarios(2)[0], Scenarios(2)[3]} {
		t.Run(sc.Name, func(t *testing.T) { testWriteSVGLabels(t, sc) })
	}
}

func testWriteSVGLabels(t *testing.T, sc Scenario) {
	sc.Duration = 120 * time.Second
	results := []*Result{
		{Scenario: sc, Contender: "no-retry", GoodputPerSecond: make([]int, 120), AttemptsPerSecond: make([]int, 120)},
		{Scenario: sc, Contender: "damper+throttle", GoodputPerSecond: make([]int, 120), AttemptsPerSecond: make([]int, 120)},
	}
	for i := range 120 {
		results[0].GoodputPerSecond[i], results[0].AttemptsPerSecond[i] = 9, 10
		results[1].GoodputPerSecond[i], results[1].AttemptsPerSecond[i] = 10, 12
	}
	var b bytes.Buffer
	if err := WriteSVG(&b, results); err != nil {
		t.Fatal(err)
	}
	svg := b.Bytes()

	// Well-formed, and the text a reader sees.
	var text []string
	var title string
	inTitle := false
	dec := xml.NewDecoder(bytes.NewReader(svg))
	for {
		tok, err := dec.Token()
		if err != nil {
			if err != io.EOF {
				t.Fatalf("not well-formed XML: %v", err)
			}
			break
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			inTitle = tok.Name.Local == "title"
		case xml.CharData:
			if s := strings.TrimSpace(string(tok)); s != "" {
				if inTitle {
					title = s
				} else {
					text = append(text, s)
				}
			}
		case xml.EndElement:
			inTitle = false
		}
	}
	if !strings.Contains(title, sc.Title) {
		t.Errorf("<title> %q does not hold the scenario's title %q", title, sc.Title)
	}
	want := []string{xCaption, "2 replicas, 10 logical requests/s offered", "no-retry", "damper+throttle", "shaded: the incident"}
	for _, clause := range strings.SplitAfter(sc.Title, "; ") {
		want = append(want, strings.TrimSpace(clause))
	}
	for _, w := range want {
		if !slices.Contains(text, w) && !slices.ContainsFunc(text, func(s string) bool { return strings.HasPrefix(s, w) }) {
			t.Errorf("chart lacks the text %q; it has %q", w, text)
		}
	}

	// The outage demo's chart as the docs show it: damper demo --svg
	// draws it, in the command's module.
	demo, err := os.ReadFile("../../docs/outage-demo.svg")
	if err != nil {
		t.Fatal(err)
	}
	for _, attr := range []string{"font-family", "font-size"} {
		got, want := rootAttr(t, svg, attr), rootAttr(t, demo, attr)
		if got == "" || got != want {
			t.Errorf("%s = %q, want the outage chart's %q", attr, got, want)
		}
	}
}
