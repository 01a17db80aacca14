package main

import (
	"flag"

	"github.com/wabarelay/wabarelay/bench/internal/benchkit"
)

// config is the run's flags.
type config struct {
	pg                                       string
	rows, chunk, channels, eventsEvery, runs int
}

// parseFlags reads the flags.
func parseFlags() config {
	var c config
	flag.StringVar(&c.pg, "pg", benchkit.DefaultPG, "admin DSN of the Postgres to use (a database is created and dropped)")
	flag.IntVar(&c.rows, "rows", 10_000_000, "messages rows, and relay_log rows")
	flag.IntVar(&c.chunk, "chunk", 1_000_000, "rows per INSERT transaction")
	flag.IntVar(&c.channels, "channels", 4, "channels (the first holds 85% of the rows)")
	flag.IntVar(&c.eventsEvery, "events-every", 10, "every n-th message gets its three status events and their deliveries")
	flag.IntVar(&c.runs, "runs", 200, "runs of each query")
	flag.Parse()
	return c
}
