package brownout

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// palette gives each contender, in table order, a colour that stays apart
// from the others in print and for common colour blindness; the first,
// grey, is the no-retry control's.
var palette = []string{"#999999", "#e69f00", "#56b4e9", "#009e73", "#cc79a7", "#d55e00", "#0072b2", "#000000"}

// smoothing is the width of the moving average drawn, so that Poisson
// noise does not hide the shape.
const smoothing = 5

// fontFamily and fontSize are those of the outage demo's chart
// (cmd/damper/internal/outage/svg.go, drawn in docs/outage-demo.svg), so
// that the charts of the docs look alike.
const (
	fontFamily = "Helvetica, Arial, sans-serif"
	fontSize   = 13
)

// xCaption is the caption of the time axis, under the bottom panel.
const xCaption = "virtual time since the run began (seconds)"

// WriteSVG draws, for one scenario, goodput and provider attempts per
// second over time, one line per contender, with the incident shaded. The
// chart has a title (the scenario's, also as the SVG's <title>), a
// subtitle with the load and the provider's capacity, and a caption on the
// time axis.
func WriteSVG(w io.Writer, results []*Result) error {
	if len(results) == 0 {
		return fmt.Errorf("brownout: no results to draw")
	}
	sc := results[0].Scenario
	seconds := int(sc.Duration / time.Second)
	const (
		width, left, right = 920, 60, 170
		panelH, gap        = 220, 64
		bottom             = 64 // under the last panel: its tick labels and the caption
	)
	// The title, on two lines when it has two clauses, then the subtitle;
	// the first panel's title sits 32 below it.
	title := strings.SplitAfter(sc.Title, "; ")
	subtitleY := 48 + 20*(len(title)-1)
	top := subtitleY + 42
	height := top + 2*panelH + gap + bottom
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="%s" font-size="%d">`+"\n",
		width, height, width, height, fontFamily, fontSize)
	fmt.Fprintf(&b, `<title>%s</title>`+"\n", escape("Brownout simulation, "+sc.Title+": goodput and provider attempts per second, by retry strategy"))
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	for i, line := range title {
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="17" font-weight="bold" fill="#222">%s</text>`+"\n", left, 28+20*i, escape(strings.TrimSpace(line)))
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#555">%s</text>`+"\n", left, subtitleY, escape(fmt.Sprintf(
		"%d replicas, %.0f logical requests/s offered; the provider serves %.1f attempts/s outside the incident",
		sc.Replicas, sc.Rate, sc.Provider.Capacity)))

	plotW := float64(width - left - right)
	x := func(sec float64) float64 { return float64(left) + sec/float64(seconds)*plotW }
	panels := []struct {
		title  string
		series func(r *Result) []int
	}{
		{"goodput: successful logical requests per second (5 s average)", func(r *Result) []int { return r.GoodputPerSecond }},
		{"provider attempts per second (5 s average)", func(r *Result) []int { return r.AttemptsPerSecond }},
	}
	inc := sc.Provider.Incident
	for i, panel := range panels {
		y0 := float64(top + i*(panelH+gap))
		maxV := 1.0
		smoothed := make([][]float64, len(results))
		for j, r := range results {
			smoothed[j] = movingAverage(panel.series(r)[:seconds], smoothing)
			for _, v := range smoothed[j] {
				maxV = max(maxV, v)
			}
		}
		maxV = niceCeil(maxV)
		y := func(v float64) float64 { return y0 + float64(panelH) - v/maxV*float64(panelH) }
		fmt.Fprintf(&b, `<text x="%d" y="%.0f" fill="#222">%s</text>`+"\n", left, y0-10, escape(panel.title))
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%d" fill="#eeeeee"/>`+"\n",
			x(inc.Start.Seconds()), y0, x((inc.Start+inc.Length).Seconds())-x(inc.Start.Seconds()), panelH)
		for k := 0; k <= 4; k++ {
			v := maxV * float64(k) / 4
			fmt.Fprintf(&b, `<line x1="%d" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#cccccc"/>`, left, float64(left)+plotW, y(v), y(v))
			fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end" font-size="12" fill="#444">%g</text>`+"\n", left-6, y(v)+4, v)
		}
		for t := 0; t <= seconds; t += 60 {
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="12" fill="#444">%d</text>`, x(float64(t)), y0+float64(panelH)+16, t)
		}
		b.WriteString("\n")
		for j, s := range smoothed {
			var pts strings.Builder
			for sec, v := range s {
				fmt.Fprintf(&pts, "%.1f,%.1f ", x(float64(sec)+0.5), y(v))
			}
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n", palette[j%len(palette)], strings.TrimSpace(pts.String()))
		}
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="%d" text-anchor="middle" fill="#222">%s</text>`+"\n", float64(left)+plotW/2, height-16, escape(xCaption))
	for j, r := range results {
		ly := top + 10 + j*18
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="3"/><text x="%d" y="%d" fill="#222">%s</text>`+"\n",
			width-right+15, width-right+35, ly, ly, palette[j%len(palette)], width-right+40, ly+4, escape(r.Contender))
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#666666">shaded: the incident</text>`+"\n", width-right+15, top+10+len(results)*18+10)
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}
func movingAverage(v []int, n int) []float64 {
	out := make([]float64, len(v))
	sum := 0
	for i := range v {
		sum += v[i]
		if i >= n {
			sum -= v[i-n]
		}
		out[i] = float64(sum) / float64(min(i+1, n))
	}
	return out
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	p := 1.0
	for p*10 <= v {
		p *= 10
	}
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

func escape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}
