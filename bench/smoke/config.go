package main

import (
	"flag"
)

// benches are the short runs, in order: the package under bench/, its arguments, and the
// ratios of its output that the baseline guards.
var benches = []struct {
	name   string
	args   []string
	ratios []string
}{
	{"relay", []string{"-no-idempotency-key", "-channels", "2000", "-warmup", "2s", "-slices", "2", "-slice", "4s"}, []string{"relay-nokey"}},
	{"relay", []string{"-channels", "2000", "-warmup", "2s", "-slices", "2", "-slice", "4s"}, []string{"relay-key"}},
	{"events", []string{"-rate", "2000", "-duration", "5s", "-drain", "20s", "-history-days", "0"}, []string{"events-2000", "events-2000-cpu"}},
	{"media", []string{"-ops", "download", "-rounds", "3"}, []string{"media"}},
}

// baseline is the file's content.
type baseline struct {
	Comment  string             `json:"comment"`
	Recorded string             `json:"recorded"` // when and where, load average
	Ratios   map[string]float64 `json:"ratios"`
}

// config is the run's flags.
type config struct {
	file, caddy     string
	tolerance       float64
	record, verbose bool
	retries         int
}

func parseFlags() config {
	var c config
	flag.StringVar(&c.file, "baseline", "bench/smoke-baseline.json", "the baseline file")
	flag.StringVar(&c.caddy, "caddy", "bin/caddy", "the Caddy build the benches run")
	flag.Float64Var(&c.tolerance, "tolerance", 0.10, "largest drop below a baseline ratio, as a fraction of it")
	flag.BoolVar(&c.record, "record", false, "write this run's ratios into the baseline file (the names it lists; all when it does not exist)")
	flag.IntVar(&c.retries, "retries", 1, "re-runs of a bench whose ratio fails; its best run counts")
	flag.BoolVar(&c.verbose, "v", false, "print every bench's whole output")
	flag.Parse()
	return c
}
