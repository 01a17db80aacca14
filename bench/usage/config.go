package main

import (
	"flag"

	"github.com/wabarelay/wabarelay/bench/internal/benchkit"
)

// config is the run's flags.
type config struct {
	pg                              string
	messages, channels, countries   int
	months, otherOrgs, deltas, runs int
	rateCard                        bool
	home, zipf                      float64
	cpuprofile                      string
}

// parseFlags reads the flags.
func parseFlags() config {
	var c config
	flag.StringVar(&c.pg, "pg", benchkit.DefaultPG, "admin DSN of the Postgres to use (a database is created and dropped)")
	flag.IntVar(&c.messages, "messages", 10_000_000, "messages a month of the measured org")
	flag.IntVar(&c.channels, "channels", 40, "channels of the measured org")
	flag.IntVar(&c.countries, "countries", 25, "recipient countries the org sends to")
	flag.Float64Var(&c.home, "home", 0.9, "share of a channel's messages to its home country (the rest to the others by a Zipf law)")
	flag.Float64Var(&c.zipf, "zipf", 2, "exponent of the Zipf law of the other countries")
	flag.IntVar(&c.months, "months", 3, "months of history in the rollup (the last 31 days measured)")
	flag.IntVar(&c.otherOrgs, "other-orgs", 2, "other orgs with the same traffic in the same tables")
	flag.IntVar(&c.deltas, "deltas", 10_000, "deltas not folded yet of the measured org (a 10-minute fold interval at 10 million a month writes about 2,500)")
	flag.IntVar(&c.runs, "runs", 300, "runs of each query")
	flag.StringVar(&c.cpuprofile, "cpuprofile", "", "write a CPU profile of this program during the measured runs to this file")
	flag.BoolVar(&c.rateCard, "rate-card", true, "price the answers with a rate card of every country and category")
	flag.Parse()
	return c
}
