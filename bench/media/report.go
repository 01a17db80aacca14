package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/wabarelay/wabarelay/bench/internal/benchkit"
)

// result is one mode's measurements (an operation at a number of streams), per target.
type result struct {
	name   string
	bytes  map[target]int64
	time   map[target]time.Duration
	cpu    map[target][]time.Duration // per process of ps
	sys    map[target][]int64         // read and write system calls, per process of ps
	growth int64                      // peak RSS growth of Caddy (b) during (b), concurrent rounds only
	ratios []float64                  // (b)/(p) throughput of each round
}

// report prints the results as Markdown, then the RATIO lines bench/smoke reads.
func report(c config, results []*result, targets []target, ps procs, loadAvg string) {
	var sb strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&sb, format, args...) }
	mbs := func(r *result, t target) float64 { return float64(r.bytes[t]) / r.time[t].Seconds() / 1e6 }
	p("\n## Media benchmark\n\n```sh\n%s\n```\n\n", benchkit.CommandLine("media"))
	p("A %.1f MB medium; %d rounds per target and mode, alternating (a) direct at the fake upstream with the upstream token, "+
		"(p) through plain `reverse_proxy` with the upstream token and (b) through `wabarelay_proxy` with a channel token; "+
		"load average %s at start, %s at the end; everything on this machine.\n\n",
		float64(c.size)/(1<<20), c.rounds, loadAvg, benchkit.LoadAvg())
	colO, sepO := "", ""
	if c.beforeBin != "" {
		colO, sepO = " (o) relay (-before) MB/s | o/p |", "--:|--:|"
	}
	p("| mode | (a) direct MB/s | (p) reverse_proxy MB/s |%s (b) relay MB/s | b/p | b/p, median of rounds | b/a | Caddy (b) peak RSS growth |\n|---|--:|--:|%s--:|--:|--:|--:|--:|\n", colO, sepO)
	ratio := 0.0
	for _, r := range results {
		growth := "—"
		if strings.HasSuffix(r.name, fmt.Sprintf(" %d stream(s)", c.concurrency)) && c.concurrency > 1 {
			growth = fmt.Sprintf("%.1f MB", float64(r.growth)/(1<<20))
		}
		bp := mbs(r, relay) / mbs(r, proxy)
		slices.Sort(r.ratios)
		med := r.ratios[len(r.ratios)/2]
		if len(r.ratios)%2 == 0 {
			med = (r.ratios[len(r.ratios)/2-1] + med) / 2
		}
		if strings.HasPrefix(r.name, "download") && (ratio == 0 || med < ratio) {
			ratio = med
		}
		cellO := ""
		if c.beforeBin != "" {
			cellO = fmt.Sprintf(" %.0f | %.2f× |", mbs(r, before), mbs(r, before)/mbs(r, proxy))
		}
		p("| %s | %.0f | %.0f |%s %.0f | %.2f× | %.2f× | %.2f× | %s |\n", r.name, mbs(r, direct), mbs(r, proxy), cellO, mbs(r, relay),
			bp, med, mbs(r, relay)/mbs(r, direct), growth)
	}
	p("\nCPU µs per MB, per process, over each target's own rounds (and the read and write system calls per MB of the "+
		"target's Caddy):\n\n| mode | target | %s | total | Caddy syscalls/MB |\n|---|---|%s--:|--:|\n",
		strings.Join(ps.names, " | "), strings.Repeat("--:|", len(ps.names)))
	for _, r := range results {
		for _, t := range targets {
			mb := float64(r.bytes[t]) / (1 << 20)
			var cells []string
			var total time.Duration
			for _, d := range r.cpu[t] {
				cells = append(cells, fmt.Sprintf("%.0f", float64(d.Microseconds())/mb))
				total += d
			}
			sys := "—"
			if i := map[target]int{proxy: 1, relay: 2, before: 3}[t]; i > 0 {
				sys = fmt.Sprintf("%.0f", float64(r.sys[t][i])/mb)
			}
			p("| %s | (%c) %s | %s | %.0f | %s |\n", r.name, t, t, strings.Join(cells, " | "), float64(total.Microseconds())/mb, sys)
		}
	}
	p("\nTargets: (b) ≥ 0.9× (p); Caddy (b)'s peak RSS growth < 30 MB during %d concurrent %.1f MB transfers.\n",
		c.concurrency, float64(c.size)/(1<<20))
	fmt.Print(sb.String())
	// Machine-readable lines (bench/smoke reads them): per mode, media-<op>-<streams> b/a (as
	// before the (p) target); then media, the lower download mode's b/p median of rounds.
	for _, r := range results {
		op, streams, _ := strings.Cut(strings.TrimSuffix(r.name, " stream(s)"), ", ")
		fmt.Printf("RATIO media-%s-%s %.3f\n", op, streams, mbs(r, relay)/mbs(r, direct))
	}
	if ratio > 0 {
		fmt.Printf("RATIO media %.3f\n", ratio)
	}
}
