// Command smoke is the benchmarks' regression guard: short runs of bench/relay (wrk, without
// and with an idempotency key per send), bench/events (one short rate, its deliveries and its
// CPU per event) and bench/media (downloads), each printing its ratios
// as "RATIO <name> <value>" lines, compared with the baseline recorded in
// bench/smoke-baseline.json. It fails when a ratio of the baseline is missing or more than
// -tolerance (10%) below its recorded value.
//
//	go build -o bin/caddy ./cmd/caddy
//	go run ./bench/smoke            # or: make bench-smoke (builds bin/caddy first)
//	go run ./bench/smoke -record    # write this run's ratios into the baseline file
//
// A bench whose ratio fails is run once more (-retries) and its better run counts: on a shared
// machine one run's noise can move a ratio by more than 10%. Run it from the repository's root,
// before every hand-in that touches a hot path. The whole takes under 2 minutes when nothing has
// to be re-run.
//
// The files: config.go (flags, the runs, the baseline file), load.go (running the programs),
// report.go (the comparison, recording a baseline).
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/wabarelay/wabarelay/bench/internal/benchkit"
)

func main() {
	c := parseFlags()
	var base baseline
	if b, err := os.ReadFile(c.file); err == nil {
		if err := json.Unmarshal(b, &base); err != nil {
			benchkit.Fatalf("%s: %v", c.file, err)
		}
	} else if !c.record {
		benchkit.Fatalf("%s: %v (record one with -record)", c.file, err)
	}
	if _, err := benchkit.CaddyBinary(c.caddy); err != nil {
		benchkit.Fatalf("%v", err)
	}
	tmp, err := os.MkdirTemp("", "wabarelay-smoke-")
	if err != nil {
		benchkit.Fatalf("%v", err)
	}
	defer func() {
		if err := os.RemoveAll(tmp); err != nil {
			benchkit.Logf("remove %s: %v", tmp, err)
		}
	}()

	start := time.Now()
	load := benchkit.LoadAvg()
	got := runAll(c, base, tmp)
	ok := report(c, base, got, time.Since(start), load)
	if c.record {
		record(c, base, got, load)
		return
	}
	if !ok {
		fmt.Println("\nFAIL: a ratio dropped more than the tolerance below its baseline (or is missing)")
		os.Exit(1)
	}
	fmt.Println("\nok")
}
