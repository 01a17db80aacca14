package main

import (
	"flag"
	"fmt"
	"time"

	"github.com/wabarelay/wabarelay/bench/internal/benchkit"
)

const (
	upstreamToken = "EAAGbenchUpstreamToken0123456789abcdef"
	wabaID        = "102290129340398"
	pnid          = "106500000000001"
	templateName  = "bench_notice"
	templateLang  = "en_US"
	proxyPrefix   = "/upstream-proxy"
	// recipientPrefix starts every recipient's number: recipient i is recipientPrefix and i in
	// nine digits (11 digits in all), so the fake reads i back from a send's "to".
	recipientPrefix = "31"
	// callerTo is the one recipient of the callers' text sends (not a broadcast recipient).
	callerTo = "15550000001"
	// maxRecipients is the API's largest broadcast.
	maxRecipients = 100000
)

type config struct {
	pgDSN      string
	caddyBin   string
	showLogs   bool
	recipients int
	rate       int           // the broadcast's rate_per_minute
	limit      int           // the relay's rate_limit per minute (the channel's limit)
	callerRate int           // the callers' sends per minute
	callerLead time.Duration // callers alone before the broadcast (their CPU per send)
	callerConc int           // callers' requests in flight at most
	workers    int           // broadcasts { workers }; 0: the product's default
	poll       time.Duration
}

// parseFlags reads the flags and exits on a bad combination.
func parseFlags() config {
	var c config
	flag.StringVar(&c.pgDSN, "pg", benchkit.DefaultPG,
		"Postgres admin DSN (URL form); the run creates and drops its own database there")
	flag.StringVar(&c.caddyBin, "caddy", "bin/caddy", "the Caddy binary with wabarelay (make build)")
	flag.BoolVar(&c.showLogs, "v", false, "print Caddy's log at the end")
	flag.IntVar(&c.recipients, "recipients", 20000, "the broadcast's recipients (at most 100,000)")
	flag.IntVar(&c.rate, "rate", 6000, "the broadcast's rate_per_minute")
	flag.IntVar(&c.limit, "limit", 12000, "the relay's per-channel limit per minute (rate_limit <n> 1m), shared by the broadcast and the callers")
	flag.IntVar(&c.callerRate, "caller-rate", 0, "the callers' sends per minute through the relay, paced (default: -limit minus -rate, the callers' half)")
	flag.DurationVar(&c.callerLead, "caller-lead", 10*time.Second, "the callers send alone for this long before the broadcast is created (their own CPU per send)")
	flag.IntVar(&c.callerConc, "caller-concurrency", 16, "the callers' requests in flight at most")
	flag.IntVar(&c.workers, "workers", 0, "broadcasts { workers } of Caddy (0: the product's default, 4)")
	flag.DurationVar(&c.poll, "poll", 2*time.Second, "how often the broadcast is read through the API while it sends")
	flag.Parse()
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if flag.NArg() > 0 {
		benchkit.Fatalf("unexpected arguments: %v", flag.Args())
	}
	if !set["caller-rate"] {
		c.callerRate = c.limit - c.rate
	}
	switch {
	case c.recipients < 1 || c.recipients > maxRecipients:
		benchkit.Fatalf("-recipients must be between 1 and %d", maxRecipients)
	case c.limit < 1:
		benchkit.Fatalf("-limit must be positive")
	case c.rate < 1 || c.rate > c.limit:
		benchkit.Fatalf("-rate must be between 1 and -limit (%d): the API refuses more", c.limit)
	case c.callerRate < 0:
		benchkit.Fatalf("-caller-rate must be 0 (no callers) or more")
	case c.callerConc < 1 || c.callerLead < 0 || c.workers < 0 || c.poll <= 0:
		benchkit.Fatalf("-caller-concurrency, -poll must be positive; -caller-lead, -workers not negative")
	}
	return c
}

// expected is how long the broadcast takes at its rate.
func (c config) expected() time.Duration {
	return time.Duration(float64(c.recipients) / float64(c.rate) * float64(time.Minute))
}

// deadline bounds the wait for the broadcast's completion: its expected time and a fifth, and
// a minute.
func (c config) deadline() time.Duration { return c.expected()*6/5 + time.Minute }

// maxCalls bounds the callers' requests: their rate over the lead and the deadline.
func (c config) maxCalls() int {
	return int(float64(c.callerRate)*(c.callerLead+c.deadline()).Minutes()) + 1
}

// logPerChannel is the relay log's per_channel rows a second raised to match the limit (the
// default, 100, matches the default limit of 100 a minute with room): every call gets its row.
func (c config) logPerChannel() int { return max(100, (c.limit+59)/60) }

// caddyfile is the one Caddy: the API and the relay with its limit raised, the broadcasts'
// sender with its defaults (or -workers), the relay log's rows per channel raised to match.
func caddyfile(c config, port int, fakeURL string) string {
	app := fmt.Sprintf("redis          {env.WBR_BENCH_REDIS}\nupstream       %s/v26.0\nrelay_log {\n\tper_channel %d\n}",
		fakeURL, c.logPerChannel())
	if c.workers > 0 {
		app += fmt.Sprintf("\nbroadcasts {\n\tworkers %d\n}", c.workers)
	}
	site := fmt.Sprintf(`http://127.0.0.1:%d {
	handle_path /v1/* {
		wabarelay_api
	}
	handle_path %s/* {
		wabarelay_proxy {
			rate_limit %d 1m
		}
	}
}
`, port, proxyPrefix, c.limit)
	return benchkit.Caddyfile("", app, site)
}
