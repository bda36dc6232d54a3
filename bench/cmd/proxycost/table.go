package main

import (
	"fmt"
	"io"
	"time"
)

// printTables prints, per call kind, one row per contender: the medians
// over the rounds of its throughput, CPU per call and RSS, of its
// throughput as a share of the direct calls' and of the bare proxy's and
// its CPU as a share of the bare proxy's, each taken in its round
// (pairedRatio), and the p50 and p99 it adds to a direct call, for each
// client count.
func printTables(w io.Writer, cfg config, names []string, results map[key][]result) {
	least := int64(-1) // the fewest ticks of CPU a measurement read
	for k, rs := range results {
		for _, r := range rs {
			if k.contender != "direct" && (least < 0 || r.cpuTicks < least) {
				least = r.cpuTicks
			}
		}
	}
	if least >= 0 {
		fmt.Fprintf(w, "\nCPU is read from /proc in ticks of 10 ms; the smallest measurement read %d ticks (±%.1f %% at most).\n",
			least, 100/float64(max(least, 1)))
	}
	for _, kind := range cfg.Kinds {
		fmt.Fprintf(w, "\n%s calls: %d measured per cell (more, in batches of as many, for a proxy that spent under %d ticks of CPU on them), median of %d rounds\n\n",
			kind, cfg.Requests, minTicks, cfg.Rounds)
		fmt.Fprintf(w, "| contender | clients | calls/s | vs direct | vs bare | CPU µs/call | CPU vs bare | RSS MB | added p50 | added p99 |\n")
		fmt.Fprintf(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, n := range cfg.Clients {
			directRs, bareRs := results[key{"direct", kind, n}], results[key{"bare Go proxy", kind, n}]
			direct := summarize(directRs)
			rps := func(r result) float64 { return r.rps }
			cpuOf := func(r result) float64 { return r.cpuPerCall }
			for _, name := range names {
				rs := results[key{name, kind, n}]
				s := summarize(rs)
				cpu, cpuVsBare, rss := "–", "–", "–"
				if name != "direct" {
					cpu, rss = fmt.Sprintf("%.1f", s.cpu), fmt.Sprintf("%.1f", s.rss)
					cpuVsBare = pairedRatio(rs, bareRs, cpuOf)
				}
				fmt.Fprintf(w, "| %s | %d | %.0f | %s | %s | %s | %s | %s | %s | %s |\n",
					label(name), n, s.rps, pairedRatio(rs, directRs, rps), pairedRatio(rs, bareRs, rps), cpu, cpuVsBare, rss,
					added(s.p50, direct.p50), added(s.p99, direct.p99))
			}
		}
	}
}

// summary is the medians of one cell's rounds.
type summary struct {
	rps, cpu, rss float64
	p50, p99      float64 // µs
}

func summarize(rs []result) summary {
	var rps, cpu, rss, p50, p99 []float64
	for _, r := range rs {
		rps, cpu, rss = append(rps, r.rps), append(cpu, r.cpuPerCall), append(rss, r.rss)
		p50, p99 = append(p50, us(r.p50)), append(p99, us(r.p99))
	}
	return summary{median(rps), median(cpu), median(rss), median(p50), median(p99)}
}

func us(d time.Duration) float64 { return float64(d) / 1e3 }

// pairedRatio is the median over the rounds of f of rs's measurement
// over f of base's in the same round: the contenders of a round run one
// after the other, within seconds, so a ratio of one round is little
// moved by the machine's load, where each one's own median is. "–" when
// base has none.
func pairedRatio(rs, base []result, f func(result) float64) string {
	var ratios []float64
	for i := range min(len(rs), len(base)) {
		if b := f(base[i]); b > 0 {
			ratios = append(ratios, f(rs[i])/b)
		}
	}
	if len(ratios) == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", median(ratios))
}

func added(x, direct float64) string {
	return fmt.Sprintf("%.0f µs", x-direct)
}
