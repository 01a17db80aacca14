package main

import (
	"flag"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/wabarelay/wabarelay/bench/internal/benchkit"
)

const (
	upstreamToken = "EAAGbenchUpstreamToken0123456789abcdef"
	wabaID        = "102290129340398"
	proxyPrefix   = "/upstream-proxy"
	// maxPerChannel is the most requests one channel gets in the whole run: well under the
	// relay's 100 per rolling minute, whatever the run's length.
	maxPerChannel = 60
)

type config struct {
	pgDSN       string
	redisURL    string
	caddyBin    string
	channels    int
	concurrency int
	warmup      time.Duration
	slices      int
	slice       time.Duration
	maxRequests int
	cpuProfile  string
	showLogs    bool
	noIdemKey   bool
	cluster     int
	compareLog  bool
	noRedis     bool
	// compareWindow: (a) is the relay with window_guard off, (b) with window_guard enforce, every
	// recipient's window open (the header and the guard's look-up on every send).
	compareWindow bool
	// baselineIdle: (a)'s reverse_proxy keeps this many idle connections per upstream host (0:
	// Caddy's default, 32).
	baselineIdle int
	generator    string // "wrk" or "go"
	wrkThreads   int
	latency      bool
}

// parseFlags reads the flags, fills in the defaults that depend on others (-latency,
// -max-requests, -generator) and exits on a bad combination.
func parseFlags() config {
	var c config
	flag.StringVar(&c.pgDSN, "pg", benchkit.DefaultPG,
		"Postgres admin DSN (URL form); the run creates and drops its own database there")
	flag.StringVar(&c.redisURL, "redis", "", "Redis URL for (b); default: a throwaway redis-server on a free port")
	flag.StringVar(&c.caddyBin, "caddy", "bin/caddy", "the Caddy binary with wabarelay (go build -o bin/caddy ./cmd/caddy)")
	flag.IntVar(&c.channels, "channels", 10000, "active channels (distinct phone number ids) to spread (b) over")
	flag.IntVar(&c.concurrency, "concurrency", 64, "closed-loop workers / wrk connections (requests in flight)")
	flag.DurationVar(&c.warmup, "warmup", 2*time.Second, "warm-up per target (not measured)")
	flag.IntVar(&c.slices, "slices", 4, "measured slices per target, alternating a/b")
	flag.DurationVar(&c.slice, "slice", 5*time.Second, "length of one measured slice")
	flag.IntVar(&c.maxRequests, "max-requests", 0, "most requests per target, warm-up included (≤ 60 × channels; default: the smaller of 300,000 and 60 × channels)")
	flag.StringVar(&c.cpuProfile, "cpuprofile", "", "write a CPU profile of Caddy (b) over the measured phases to this file (enables its admin API on a loopback port)")
	flag.BoolVar(&c.showLogs, "v", false, "print Caddy's logs at the end")
	flag.BoolVar(&c.noIdemKey, "no-idempotency-key", false, "(b) bodies carry no idempotency_key: the relay without keys (one Redis round trip: the rate limit)")
	flag.BoolVar(&c.noRedis, "no-redis", false, "(b) runs without Redis: its limits and idempotency keys in memory, one instance's configuration (b/a then leaves out the Redis round trips)")
	flag.IntVar(&c.cluster, "redis-cluster", 0, "run (b) on a throwaway Redis Cluster of this many masters (e.g. 3) instead of one redis-server")
	flag.IntVar(&c.baselineIdle, "baseline-idle-conns", 0, "(a)'s reverse_proxy keeps this many idle upstream connections per host, as wabarelay_proxy does (1024); 0: Caddy's default (32), the goal's plain reverse_proxy")
	flag.BoolVar(&c.compareLog, "compare-log", false, "(a) is wabarelay_proxy with relay_log off, (b) with the relay log on: b/a is the log's cost")
	flag.BoolVar(&c.compareWindow, "compare-window", false, "(a) is wabarelay_proxy with window_guard off, (b) with window_guard enforce (every recipient's window open): b/a is the window header's and guard's cost")
	flag.StringVar(&c.generator, "generator", "", "load generator: wrk or go (default: wrk when it is on PATH, else go)")
	flag.IntVar(&c.wrkThreads, "wrk-threads", 1, "wrk threads (-generator wrk)")
	flag.BoolVar(&c.latency, "latency", false, "the latency mode: concurrency 1, 1,000 channels, 1 wrk thread, 3 × 3 s slices, unless given; reports the added p50")
	flag.Parse()
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if c.latency {
		if !set["concurrency"] {
			c.concurrency = 1
		}
		if !set["channels"] {
			c.channels = 1000
		}
		if !set["wrk-threads"] {
			c.wrkThreads = 1
		}
		// 60 requests per channel in all: 3 × 3 s slices leave each up to 15,000 (5,000 req/s).
		if !set["slices"] {
			c.slices = 3
		}
		if !set["slice"] {
			c.slice = 3 * time.Second
		}
	} else if !set["concurrency"] {
		c.concurrency = 64 // the goal's row
	}
	if c.maxRequests == 0 {
		c.maxRequests = min(300000, maxPerChannel*c.channels)
	}
	switch c.generator {
	case "":
		c.generator = "go"
		if _, err := exec.LookPath("wrk"); err == nil {
			c.generator = "wrk"
		}
	case "go", "wrk":
	default:
		benchkit.Fatalf("-generator: wrk or go, not %q", c.generator)
	}
	if c.generator == "wrk" && (c.wrkThreads < 1 || c.wrkThreads > c.concurrency) {
		benchkit.Fatalf("-wrk-threads must be between 1 and -concurrency")
	}
	if flag.NArg() > 0 {
		benchkit.Fatalf("unexpected arguments: %v", flag.Args())
	}
	if c.channels < 1 || c.concurrency < 1 || c.slices < 1 || c.slice <= 0 || c.warmup < 0 || c.maxRequests < 1 {
		benchkit.Fatalf("-channels, -concurrency, -slices, -slice and -max-requests must be positive")
	}
	if c.relayBaseline() && c.cluster > 0 {
		benchkit.Fatalf("-compare-log and -compare-window put (a) in Redis database 1: not with -redis-cluster")
	}
	if c.noRedis && (c.redisURL != "" || c.cluster > 0 || c.relayBaseline()) {
		benchkit.Fatalf("-no-redis: not with -redis, -redis-cluster, -compare-log or -compare-window")
	}
	if c.compareLog && c.compareWindow {
		benchkit.Fatalf("-compare-log or -compare-window, not both")
	}
	if c.maxRequests > maxPerChannel*c.channels {
		benchkit.Fatalf("-max-requests %d exceeds %d per channel × %d channels: (b) could approach the 100/min limit",
			c.maxRequests, maxPerChannel, c.channels)
	}
	return c
}

// relayBaseline reports whether (a) is the relay too (-compare-log, -compare-window): then it
// takes the channel tokens and keys, and its limits and keys live in Redis database 1.
func (c config) relayBaseline() bool { return c.compareLog || c.compareWindow }

// caddyfileA is (a)'s Caddyfile: plain reverse_proxy to the fake's listener fakeURL, or with
// -compare-log the relay with relay_log off, with -compare-window the relay with window_guard off.
func caddyfileA(c config, port int, fakeURL, redisLine string) string {
	if c.compareLog {
		return benchkit.Caddyfile("", redisLine+"\nupstream       "+fakeURL+"/v26.0\nrelay_log off", relaySite(port, ""))
	}
	if c.compareWindow {
		return benchkit.Caddyfile("", redisLine+"\nupstream       "+fakeURL+"/v26.0", relaySite(port, "window_guard off"))
	}
	fakeHost := strings.TrimPrefix(fakeURL, "http://")
	proxy := fakeHost
	if c.baselineIdle > 0 {
		proxy = fmt.Sprintf("%s {\n\t\t\ttransport http {\n\t\t\t\tkeepalive_idle_conns_per_host %d\n\t\t\t}\n\t\t}", fakeHost, c.baselineIdle)
	}
	return benchkit.Caddyfile("", "", fmt.Sprintf(`http://127.0.0.1:%d {
	handle_path %s/* {
		rewrite * /v26.0{uri}
		reverse_proxy %s
	}
}
`, port, proxyPrefix, proxy))
}

// caddyfileB is (b)'s Caddyfile: the relay with its defaults (with -compare-window, window_guard
// enforce); its admin API on adminPort when not 0 (for -cpuprofile).
func caddyfileB(c config, port, adminPort int, fakeURL, redisLine string) string {
	admin := ""
	if adminPort != 0 {
		admin = fmt.Sprintf("admin 127.0.0.1:%d", adminPort)
	}
	opts := ""
	if c.compareWindow {
		opts = "window_guard enforce"
	}
	return benchkit.Caddyfile(admin, redisLine+"\nupstream       "+fakeURL+"/v26.0", relaySite(port, opts))
}

// relaySite is the relay's site: wabarelay_proxy under proxyPrefix, with the block opts if any.
func relaySite(port int, opts string) string {
	proxy := "wabarelay_proxy"
	if opts != "" {
		proxy += " {\n\t\t\t" + opts + "\n\t\t}"
	}
	return fmt.Sprintf("http://127.0.0.1:%d {\n\thandle_path %s/* {\n\t\t%s\n\t}\n}\n", port, proxyPrefix, proxy)
}

// redisDB returns the Redis URL u on database db (u must name database 0).
func redisDB(u string, db int) (string, error) {
	opt, err := redis.ParseURL(u)
	if err != nil {
		return "", fmt.Errorf("-redis: %w", err)
	}
	if opt.DB != 0 {
		return "", fmt.Errorf("-compare-log and -compare-window need -redis on database 0 (they use database %d for (a))", db)
	}
	return strings.TrimRight(u, "/") + "/" + strconv.Itoa(db), nil
}
