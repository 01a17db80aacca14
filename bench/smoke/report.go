package main

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/wabarelay/wabarelay/bench/internal/benchkit"
)

// report prints every ratio beside its baseline and its floor; false when a guarded ratio is
// missing or below its floor.
func report(c config, base baseline, got map[string]float64, took time.Duration, load string) bool {
	ok := true
	fmt.Printf("\n## bench smoke (%s, load average %s at start)\n\n", took.Round(time.Second), load)
	fmt.Printf("| ratio | baseline | now | floor (−%.0f%%) | |\n|---|--:|--:|--:|:-:|\n", c.tolerance*100)
	names := make([]string, 0, len(got)+len(base.Ratios))
	for k := range got {
		names = append(names, k)
	}
	for k := range base.Ratios {
		if _, ok := got[k]; !ok {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	for _, k := range names {
		v, have := got[k]
		bv, inBase := base.Ratios[k]
		switch {
		case !inBase:
			fmt.Printf("| %s | — | %.3f | — | (not guarded) |\n", k, v)
		case !have:
			fmt.Printf("| %s | %.3f | missing | %.3f | **FAIL** |\n", k, bv, bv*(1-c.tolerance))
			ok = false
		case v < bv*(1-c.tolerance):
			fmt.Printf("| %s | %.3f | %.3f | %.3f | **FAIL** |\n", k, bv, v, bv*(1-c.tolerance))
			ok = false
		default:
			fmt.Printf("| %s | %.3f | %.3f | %.3f | ok |\n", k, bv, v, bv*(1-c.tolerance))
		}
	}
	return ok
}

// record writes this run's ratios into the baseline file: those the benches guard (their
// ratios lists).
func record(c config, base baseline, got map[string]float64, load string) {
	nb := baseline{Comment: base.Comment, Ratios: map[string]float64{},
		Recorded: fmt.Sprintf("%s, load average %s at start", time.Now().Format("2006-01-02"), load)}
	if nb.Comment == "" {
		nb.Comment = "bench/smoke's baseline: go run ./bench/smoke -record (see bench/README.md, Smoke)"
	}
	for _, b := range benches {
		for _, k := range b.ratios {
			if v, ok := got[k]; ok {
				nb.Ratios[k] = v
			}
		}
	}
	b, _ := json.MarshalIndent(nb, "", "  ")
	if err := os.WriteFile(c.file, append(b, '\n'), 0o644); err != nil {
		benchkit.Fatalf("%v", err)
	}
	fmt.Printf("\nrecorded in %s\n", c.file)
}
