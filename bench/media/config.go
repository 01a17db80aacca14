package main

import (
	"flag"
	"fmt"
	"strings"

	"github.com/wabarelay/wabarelay/bench/internal/benchkit"
)

const (
	upstreamToken = "EAAGbenchMediaUpstreamToken0123456789"
	pnid          = "106500000000001"
	wabaID        = "102290129340398"
	mediaID       = "1040000000000077"
	proxyPrefix   = "/upstream-proxy"
)

type config struct {
	pgDSN, caddyBin string
	size            int
	concurrency     int
	rounds          int
	ops             string // comma-separated: download, upload
	cpuProfile      string // Caddy (b)
	proxyProfile    string // Caddy (p)
	profileSecs     int
	profileMode     string
	beforeBin       string // another build's relay, (o), side by side
}

// parseFlags reads the flags; -short sets the ones not given.
func parseFlags() config {
	var c config
	var short bool
	flag.StringVar(&c.pgDSN, "pg", benchkit.DefaultPG, "admin DSN of the Postgres to create the bench database on")
	flag.StringVar(&c.caddyBin, "caddy", "bin/caddy", "the Caddy binary with wabarelay (go build -o bin/caddy ./cmd/caddy)")
	flag.IntVar(&c.size, "size", 16<<20, "medium size in bytes")
	flag.IntVar(&c.concurrency, "concurrency", 20, "streams at once in the concurrent rounds")
	flag.IntVar(&c.rounds, "rounds", 3, "rounds per target and mode, alternating a/p/b")
	flag.StringVar(&c.ops, "ops", "download,upload", "what to measure, comma-separated: download, upload (bench/smoke: download)")
	flag.BoolVar(&short, "short", false, "a quick run: -size 16 MB -concurrency 4 -rounds 7 -ops download, unless given")
	flag.StringVar(&c.cpuProfile, "cpuprofile", "", "write a CPU profile of Caddy (b) over a phase of concurrent downloads through it to this file")
	flag.StringVar(&c.proxyProfile, "proxy-cpuprofile", "", "write a CPU profile of Caddy (p) over a phase of concurrent downloads through it to this file")
	flag.IntVar(&c.profileSecs, "profile-seconds", 10, "length of each profiled phase")
	flag.StringVar(&c.profileMode, "profile-mode", "download", "what the profiled phases do: download or upload")
	flag.StringVar(&c.beforeBin, "before", "", "another Caddy build (e.g. of main) whose relay runs as a fourth target, (o), in the same rounds")
	flag.Parse()
	if short {
		set := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["size"] {
			c.size = 16 << 20
		}
		if !set["concurrency"] {
			c.concurrency = 4
		}
		if !set["rounds"] {
			c.rounds = 7
		}
		if !set["ops"] {
			c.ops = "download"
		}
	}
	return c
}

// modes returns the transfers -ops names, in order.
func (c config) modes() ([]string, error) {
	var modes []string
	for _, m := range strings.Split(c.ops, ",") {
		switch m = strings.TrimSpace(m); m {
		case "download", "upload":
			modes = append(modes, m)
		case "":
		default:
			return nil, fmt.Errorf("-ops: download or upload, not %q", m)
		}
	}
	return modes, nil
}

// adminLine is a Caddy's admin option: off, or on a free loopback port when a profile of it is
// asked for (the port is returned).
func adminLine(profile string) (string, int) {
	if profile == "" {
		return "admin off", 0
	}
	port := benchkit.FreePort()
	return fmt.Sprintf("admin 127.0.0.1:%d", port), port
}

// caddyfileProxy is (p)'s Caddyfile: plain reverse_proxy to the fake at fakeURL.
func caddyfileProxy(admin string, port int, fakeURL string) string {
	return benchkit.Caddyfile(admin, "", fmt.Sprintf("http://127.0.0.1:%d {\n\treverse_proxy %s\n}\n", port, strings.TrimPrefix(fakeURL, "http://")))
}

// caddyfileRelay is the relay's Caddyfile ((b), and (o) with -before): its defaults but the
// per-channel rate limit, raised so that the benchmark's hundreds of calls on one channel are
// not refused.
func caddyfileRelay(admin string, port int, fakeURL string) string {
	return benchkit.Caddyfile(admin, "upstream       "+fakeURL+"/v26.0", fmt.Sprintf(`http://127.0.0.1:%d {
	handle_path %s/* {
		wabarelay_proxy {
			rate_limit 1000000 1m
		}
	}
}
`, port, proxyPrefix))
}
