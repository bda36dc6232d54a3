package outage

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// Chart geometry, in SVG user units.
const (
	chartW, chartH = 860, 460
	padL, padR     = 80, 40
	padT, padB     = 86, 64
	plotW, plotH   = chartW - padL - padR, chartH - padT - padB
)

// Series colours: colour-blind safe, and distinct in grey scale.
const (
	naiveColor   = "#d55e00"
	damperColor  = "#0072b2"
	breakerColor = "#009e73"
	limitColor   = "#6b6b6b"
)

// WriteSVG draws r as an SVG chart of cumulative provider attempts over
// virtual time, one line per strategy, with axes, labels and a legend.
// A maxAmplification above 0 adds the pass/fail line at that many attempts
// per logical request.
//
// Each series is a <g> element with id "naive", "damper" or
// "damper-breaker" and a data-attempts attribute, so that tools and tests
// can find it.
func WriteSVG(w io.Writer, r Result, maxAmplification float64) error {
	var b bytes.Buffer
	end := max(r.Naive.Elapsed, r.Damper.Elapsed, r.Breaker.Elapsed, time.Second)
	unit, unitName := time.Second, "seconds"
	if end >= 2*time.Minute {
		unit, unitName = time.Minute, "minutes"
	}
	xMax := float64(end) / float64(unit)
	yMax := float64(max(r.Naive.Attempts, r.Damper.Attempts, 1))
	limit := maxAmplification * float64(r.Requests)
	yMax = max(yMax, limit) * 1.05
	x := func(d time.Duration) float64 { return padL + float64(d)/float64(unit)/xMax*plotW }
	y := func(n float64) float64 { return padT + plotH - n/yMax*plotH }

	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" font-size="13">`+"\n", chartW, chartH, chartW, chartH)
	fmt.Fprintf(&b, `<title>%s</title>`+"\n", esc("Provider attempts during a simulated outage: naive retries, Damper, and Damper with its breaker"))
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="#ffffff"/>`+"\n", chartW, chartH)
	text(&b, padL, 28, "start", 17, "bold", "#222", "Provider attempts during a simulated outage")
	text(&b, padL, 48, "start", 13, "normal", "#555", fmt.Sprintf(
		"%s logical requests, each failing %d× with 529 before it succeeds · concurrency %d · virtual time",
		thousands(r.Requests), r.Failures, r.Concurrency))

	// Grid and axes.
	step := niceStep(yMax, 6)
	for v := 0.0; v <= yMax; v += step {
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#e6e6e6"/>`+"\n", padL, y(v), padL+plotW, y(v))
		text(&b, padL-8, y(v)+4, "end", 12, "normal", "#444", thousands(int(v)))
	}
	xStep := niceStep(xMax, 8)
	for v := 0.0; v <= xMax+1e-9; v += xStep {
		px := padL + v/xMax*plotW
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#444"/>`+"\n", px, padT+plotH, px, padT+plotH+5)
		text(&b, px, padT+plotH+20, "middle", 12, "normal", "#444", trimFloat(v))
	}
	fmt.Fprintf(&b, `<path d="M%d %d V%d H%d" fill="none" stroke="#444"/>`+"\n", padL, padT, padT+plotH, padL+plotW)
	text(&b, padL+plotW/2, chartH-16, "middle", 13, "normal", "#222", "virtual time since the outage began ("+unitName+")")
	fmt.Fprintf(&b, `<text transform="translate(22 %d) rotate(-90)" text-anchor="middle" fill="#222">%s</text>`+"\n",
		padT+plotH/2, esc("provider attempts (cumulative)"))

	if limit > 0 {
		fmt.Fprintf(&b, `<g id="limit"><line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="%s" stroke-dasharray="6 4"/>`, padL, y(limit), padL+plotW, y(limit), limitColor)
		text(&b, padL+plotW-4, y(limit)-6, "end", 12, "normal", limitColor,
			fmt.Sprintf("pass/fail limit: %.2fx = %s attempts", maxAmplification, thousands(int(math.Round(limit)))))
		b.WriteString("</g>\n")
	}

	series(&b, r.Naive, "naive", naiveColor, x, y, end)
	series(&b, r.Damper, "damper", damperColor, x, y, end)
	series(&b, r.Breaker, "damper-breaker", breakerColor, x, y, end)

	// Legend, top left of the plot, where both lines start low.
	lx, ly := float64(padL+16), float64(padT+14)
	fmt.Fprintf(&b, `<g id="legend"><rect x="%.0f" y="%.0f" width="545" height="76" fill="#ffffff" stroke="#cccccc"/>`+"\n", lx-8, ly-10)
	legend(&b, lx, ly+6, naiveColor, fmt.Sprintf("Naive retries: %s attempts, %.2fx, done at %s",
		thousands(r.Naive.Attempts), r.Naive.Amplification, short(r.Naive.Elapsed)))
	legend(&b, lx, ly+28, damperColor, fmt.Sprintf("Damper: %s attempts, %.2fx, %s budget-exhausted, done at %s",
		thousands(r.Damper.Attempts), r.Damper.Amplification, thousands(r.Damper.BudgetExhausted), short(r.Damper.Elapsed)))
	legend(&b, lx, ly+50, breakerColor, fmt.Sprintf("Damper + breaker: %s attempts, %.2fx, %s circuit-open, done at %s",
		thousands(r.Breaker.Attempts), r.Breaker.Amplification, thousands(r.Breaker.CircuitOpen), short(r.Breaker.Elapsed)))
	b.WriteString("</g>\n</svg>\n")

	_, err := w.Write(b.Bytes())
	return err
}

// series draws one run's cumulative attempts: a solid line while the run
// lasts, then a dashed one at its final count to the right edge, since a
// finished run adds no attempts.
func series(b *bytes.Buffer, run Run, id, color string, x func(time.Duration) float64, y func(float64) float64, end time.Duration) {
	times := slices.Clone(run.AttemptTimes)
	slices.Sort(times)
	fmt.Fprintf(b, `<g id="%s" data-attempts="%d">`+"\n", id, run.Attempts)
	var pts []string
	add := func(px, py float64) {
		pts = append(pts, fmt.Sprintf("%.1f,%.1f", px, py))
	}
	add(x(0), y(0))
	// A step per pixel column is enough: the attempts that land in one
	// column rise as one vertical segment, from the count before it.
	for i := 0; i < len(times); {
		col := math.Round(x(times[i]) * 2)
		j := i + 1
		for j < len(times) && math.Round(x(times[j])*2) == col {
			j++
		}
		add(col/2, y(float64(i)))
		add(col/2, y(float64(j)))
		i = j
	}
	fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="2.5" stroke-linejoin="round" points="%s"/>`+"\n", color, strings.Join(pts, " "))
	doneX, doneY := x(run.Elapsed), y(float64(run.Attempts))
	if end-run.Elapsed > 0 {
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2" stroke-dasharray="2 4"/>`+"\n",
			doneX, doneY, x(end), doneY, color)
	}
	fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="4" fill="%s"/>`+"\n", doneX, doneY, color)
	b.WriteString("</g>\n")
}

func legend(b *bytes.Buffer, x, y float64, color, label string) {
	fmt.Fprintf(b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="%s" stroke-width="3"/>`+"\n", x, y-4, x+26, y-4, color)
	text(b, x+34, y, "start", 13, "normal", "#222", label)
}

func text(b *bytes.Buffer, x, y float64, anchor string, size int, weight, color, s string) {
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="%s" font-size="%d" font-weight="%s" fill="%s">%s</text>`+"\n",
		x, y, anchor, size, weight, color, esc(s))
}

func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}

// niceStep returns a tick step of 1, 2 or 5 times a power of ten that
// divides [0, span] into at most about n parts.
func niceStep(span float64, n int) float64 {
	raw := span / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*mag >= raw {
			return m * mag
		}
	}
	return 10 * mag
}

func trimFloat(v float64) string {
	return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.2f", v), "0"), ".")
}

// short formats a virtual duration for a label: 9.1 s, 24.5 min.
func short(d time.Duration) string {
	if d >= 2*time.Minute {
		return fmt.Sprintf("%.1f min", d.Minutes())
	}
	return fmt.Sprintf("%.1f s", d.Seconds())
}

// thousands formats n with comma separators: 1,010.
func thousands(n int) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return "-" + thousands(-n)
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
