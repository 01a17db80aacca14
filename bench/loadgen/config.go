package main

import (
	"flag"
	"fmt"
	"time"

	"github.com/wabarelay/wabarelay/bench/internal/benchkit"
)

const (
	wabaID      = "102290129340399"
	appSecret   = "loadgen-app-secret-0123456789"
	verifyToken = "loadgen-verify"
	inboundPath = "/webhooks/upstream"
)

type config struct {
	caddyBin, pgDSN string
	rate, perPost   int
	channels        int
	statuses        float64
	duration, drain time.Duration
	maxInflight     int
	receiver        string
}

// parseFlags reads the flags.
func parseFlags() config {
	var c config
	flag.StringVar(&c.caddyBin, "caddy", "bin/caddy", "the Caddy binary with wabarelay")
	flag.StringVar(&c.pgDSN, "pg", benchkit.DefaultPG, "Postgres admin DSN; the run creates and drops its own database")
	flag.IntVar(&c.rate, "rate", 5000, "offered events/s")
	flag.IntVar(&c.perPost, "per-post", 10, "items (events) per upstream post")
	flag.IntVar(&c.channels, "channels", 100, "active channels the posts are spread over")
	flag.Float64Var(&c.statuses, "statuses", 0, "share of posts carrying statuses instead of messages (0..1)")
	flag.DurationVar(&c.duration, "duration", 20*time.Second, "offered-load time (at most 60s)")
	flag.DurationVar(&c.drain, "drain", 60*time.Second, "longest wait for the receiver to get every accepted event")
	flag.IntVar(&c.maxInflight, "max-inflight", 2000, "most posts outstanding at once")
	flag.StringVar(&c.receiver, "receiver", "", "(internal) run as the receiver, writing its URLs and CA to this file")
	flag.Parse()
	c.duration = min(c.duration, 60*time.Second)
	return c
}

// caddyfile is the Caddy configuration under test: wabarelay_inbound on port with the product's
// delivery defaults (only retry_delays set, as bench/events does), delivering to the receiver
// whose CA is at caPath.
func caddyfile(port int, caPath string) string {
	return benchkit.Caddyfile("", fmt.Sprintf(`meta {
	app_secret   %s
	verify_token %s
}
delivery {
	retry_delays 1s 2s 5s
	root_ca      %s
	allow_private_targets
}`, appSecret, verifyToken, caPath), fmt.Sprintf("http://127.0.0.1:%d {\n\thandle %s {\n\t\twabarelay_inbound\n\t}\n}\n", port, inboundPath))
}
