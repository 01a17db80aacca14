// Command relay benchmarks the relay (issue 3, "Benchmark"): the same closed-loop load against
// (a) Caddy's plain reverse_proxy to the fake upstream and (b) wabarelay_proxy (channel auth →
// Redis rate limit → Redis idempotency → token swap → reverse_proxy), in the same run.
//
//	go build -o bin/caddy ./cmd/caddy
//	go run ./bench/relay                      # defaults: 10,000 channels, 64 connections, wrk, ~60 s
//	go run ./bench/relay -latency             # concurrency 1, 1,000 channels: the added p50
//	go run ./bench/relay -generator go        # the Go load generator (the default without wrk on PATH)
//	go run ./bench/relay -cpuprofile b.pprof  # also a CPU profile of Caddy (b) over the measured phases
//	go run ./bench/relay -no-idempotency-key  # (b) sends without keys
//	go run ./bench/relay -redis-cluster 3      # (b) on a throwaway 3-master Redis Cluster
//	go run ./bench/relay -compare-log          # (a) wabarelay_proxy with relay_log off, (b) with it on
//
// It starts everything itself and removes everything at the end (also on Ctrl-C): a fresh
// database wabarelay_bench_<rand> on the Postgres named by -pg (dropped at the end), a throwaway
// redis-server (unless -redis is given; the idempotency keys of the run are then deleted from it
// at the end), the fake upstream (internal/fakegraph) in a process of its own (this binary run
// again, see fake.go), and two bin/caddy processes with `admin off` on free loopback ports.
//
// Load generator (-generator): wrk when it is on PATH (issue 21), driven by a Lua script and a
// data file written into the run's temp dir (wrk.go), -wrk-threads threads (1 by default: it
// disturbed the machine less than 2, see bench/README.md), one wrk run per slice; otherwise the
// Go closed loop in this process. Both make the same requests.
//
// Data: one org and -channels active channels, each on its own phone number id, all allowed for
// one upstream token in the fake. Both targets get the same request mix: text sends
// POST <pnid>/messages, round-robin over the channels (request n uses channel n mod channels on
// both). (b) authenticates with the channel's token and every body carries a unique
// idempotency_key; (a) sends the upstream token itself and the same body without
// idempotency_key (the fake, like the real API, rejects unknown top-level keys), which is the
// body (b) forwards after removing the key.
//
// Load: -concurrency workers in a closed loop (wrk: connections), a warm-up on each target, then measured slices
// alternating a, b, a, b, ... so that machine noise hits both alike. Every latency of the
// measured slices is kept. Each target gets at most -max-requests in all (warm-up included),
// which must stay at or below 60 per channel so that no channel comes near the relay's 100 per
// minute limit.
//
// Checks: every response is 2xx (non-2xx are counted and printed), no 429, no replay, and the
// fake received exactly one upstream send for each (b) request (each body carries a sequence
// number the fake's wrapper counts), with the real upstream token and without idempotency_key.
// wrk gives no status per request: there every answer must be 2xx, no sequence number may reach
// the fake twice or unsent, and every sent one must reach it except at most those in flight when
// a wrk run stopped (sent, never answered).
//
// Diagnosis, printed with the results: CPU time per request of each process (bench, wrk, both
// Caddy, redis-server, the bench database's Postgres backends, the fake upstream) over each
// target's own slices, Redis'
// command statistics, Postgres channel lookups (relay cache misses), upstream connections opened.
// -cpuprofile profiles Caddy (b); -no-idempotency-key leaves the key out of (b)'s bodies to
// separate the idempotency cost from the rest of the chain (not the benchmark).
//
// -compare-log (issue 20) makes (a) a wabarelay_proxy too, with `relay_log off`, and (b) the
// same with the relay log on (its defaults): both on the bench database and the same Redis
// server ((a)'s limits and keys in database 1), both authenticating with the channel tokens and,
// unless -no-idempotency-key, carrying keys. b/a is then the relay log's cost (goal: ≥ 0.95);
// the checks add that relay_log holds one row per (b) request once (b) has stopped (nothing
// dropped).
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"github.com/wabarelay/wabarelay/bench/internal/benchkit"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/wabarelay/wabarelay/secretbox"
	"github.com/wabarelay/wabarelay/store"
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
	// baselineIdle: (a)'s reverse_proxy keeps this many idle connections per upstream host (0:
	// Caddy's default, 32).
	baselineIdle int
	generator    string // "wrk" or "go"
	wrkThreads   int
	latency      bool
}

func main() {
	if spec := os.Getenv(fakeEnv); spec != "" {
		if err := runFake(spec); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	var c config
	flag.StringVar(&c.pgDSN, "pg", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
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
	flag.IntVar(&c.cluster, "redis-cluster", 0, "run (b) on a throwaway Redis Cluster of this many masters (e.g. 3) instead of one redis-server")
	flag.IntVar(&c.baselineIdle, "baseline-idle-conns", 0, "(a)'s reverse_proxy keeps this many idle upstream connections per host, as wabarelay_proxy does (1024); 0: Caddy's default (32), the issue's plain reverse_proxy")
	flag.BoolVar(&c.compareLog, "compare-log", false, "(a) is wabarelay_proxy with relay_log off, (b) with the relay log on: b/a is the log's cost")
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
		c.concurrency = 64 // the row
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
	if c.compareLog && c.cluster > 0 {
		benchkit.Fatalf("-compare-log puts (a) in Redis database 1: not with -redis-cluster")
	}
	if c.maxRequests > maxPerChannel*c.channels {
		benchkit.Fatalf("-max-requests %d exceeds %d per channel × %d channels: (b) could approach the 100/min limit",
			c.maxRequests, maxPerChannel, c.channels)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second Ctrl-C kills at once (children still die with us: Pdeathsig)
	}()
	err := run(ctx, c)
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		err = errors.New("interrupted")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, c config) (err error) {
	var cl benchkit.Cleanups
	defer func() {
		if ctx.Err() != nil {
			benchkit.Logf("interrupted: cleaning up")
		}
		cl.Run()
	}()

	caddyBin, err := benchkit.CaddyBinary(c.caddyBin)
	if err != nil {
		return err
	}
	loadAvg := benchkit.LoadAvg()
	runID := benchkit.RandHex(4)
	tmp, err := os.MkdirTemp("", "wabarelay-bench-")
	if err != nil {
		return err
	}
	cl.Add(func() { os.RemoveAll(tmp) })

	// ---- Redis ----
	redisURL := c.redisURL
	var redisChildren []*benchkit.Child
	var redisNodes []*redis.Client // one client per server, for statistics
	redisLine := "redis          {env.WBR_BENCH_REDIS}"
	switch {
	case c.cluster > 0:
		addrs, children, err := startRedisCluster(ctx, tmp, c.cluster)
		for _, ch := range children {
			cl.Add(ch.Stop)
		}
		if err != nil {
			return err
		}
		redisChildren = children
		for _, a := range addrs {
			redisNodes = append(redisNodes, redis.NewClient(&redis.Options{Addr: a}))
		}
		redisLine = "redis {\n\t\t\taddresses " + strings.Join(addrs, " ") + "\n\t\t}"
	case redisURL == "":
		u, ch, err := startRedis(ctx, tmp)
		if err != nil {
			return err
		}
		cl.Add(ch.Stop)
		redisURL, redisChildren = u, []*benchkit.Child{ch}
		fallthrough
	default:
		ropt, err := redis.ParseURL(redisURL)
		if err != nil {
			return fmt.Errorf("-redis: %w", err)
		}
		redisNodes = []*redis.Client{redis.NewClient(ropt)}
	}
	rdb := redisNodes[0]
	for _, n := range redisNodes {
		cl.Add(func() { n.Close() })
	}
	redisVersion, err := redisInfo(ctx, rdb)
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	if c.redisURL != "" {
		// An external Redis: remove this run's idempotency records (rate-limit keys expire in 1 min).
		cl.Add(func() { deleteKeys(rdb, "*"+runID+"-*") })
	}

	// ---- Postgres ----
	dbName := "wabarelay_bench_" + runID
	dsn, err := benchkit.WithDatabase(c.pgDSN, dbName)
	if err != nil {
		return err
	}
	admin, err := pgx.Connect(ctx, c.pgDSN)
	if err != nil {
		return fmt.Errorf("postgres admin connection (-pg): %w", err)
	}
	var pgVersion string
	_ = admin.QueryRow(ctx, "SHOW server_version").Scan(&pgVersion)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+dbName); err != nil {
		admin.Close(context.Background())
		return fmt.Errorf("create database: %w", err)
	}
	benchkit.Logf("database %s created", dbName)
	cl.Add(func() {
		dctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if _, err := admin.Exec(dctx, "DROP DATABASE IF EXISTS "+dbName+" WITH (FORCE)"); err != nil {
			benchkit.Logf("drop database %s: %v", dbName, err)
		} else {
			benchkit.Logf("database %s dropped", dbName)
		}
		admin.Close(dctx)
	})
	if err := store.MigrateDSN(ctx, dsn); err != nil {
		return err
	}

	// ---- fake upstream (a process of its own) ----
	fp, err := startFake(ctx, filepath.Join(tmp, "fake.log"), fakeConfig{Channels: c.channels, MaxRequests: c.maxRequests})
	if err != nil {
		return err
	}
	cl.Add(fp.child.Stop)
	fakeURLA, fakeURLB := fp.urlA, fp.urlB
	pnids := make([]string, c.channels)
	for i := range pnids {
		pnids[i] = pnid(i)
	}

	// ---- data ----
	key := make([]byte, 32)
	rand.Read(key)
	tokens, err := createChannels(ctx, dsn, key, pnids)
	if err != nil {
		return err
	}

	// ---- Caddy ----
	portA, portB, portAdmin := benchkit.FreePort(), benchkit.FreePort(), 0
	adminLine := "admin off"
	if c.cpuProfile != "" {
		portAdmin = benchkit.FreePort()
		adminLine = fmt.Sprintf("admin 127.0.0.1:%d", portAdmin)
	}
	fakeHost := strings.TrimPrefix(fakeURLA, "http://")
	proxyA := fakeHost
	if c.baselineIdle > 0 {
		proxyA = fmt.Sprintf("%s {\n\t\t\ttransport http {\n\t\t\t\tkeepalive_idle_conns_per_host %d\n\t\t\t}\n\t\t}", fakeHost, c.baselineIdle)
	}
	cfgA := fmt.Sprintf(`{
	admin off
	persist_config off
	default_bind 127.0.0.1
}
http://127.0.0.1:%d {
	handle_path %s/* {
		rewrite * /v26.0{uri}
		reverse_proxy %s
	}
}
`, portA, proxyPrefix, proxyA)
	cfgB := fmt.Sprintf(`{
	%s
	persist_config off
	default_bind 127.0.0.1
	wabarelay {
		database       {env.WBR_BENCH_DATABASE}
		encryption_key {env.WBR_BENCH_KEY}
		%s
		upstream       %s/v26.0
	}
}
http://127.0.0.1:%d {
	handle_path %s/* {
		wabarelay_proxy
	}
}
`, adminLine, redisLine, fakeURLB, portB, proxyPrefix)
	env := []string{"WBR_BENCH_DATABASE=" + dsn, "WBR_BENCH_KEY=" + base64.StdEncoding.EncodeToString(key),
		"WBR_BENCH_REDIS=" + redisURL}
	var envA []string
	if c.compareLog {
		// (a): the same relay with the log off, its limits and keys in Redis database 1 (each
		// target gives a channel up to maxPerChannel requests; together they would near its limit).
		redisA, err := redisDB(redisURL, 1)
		if err != nil {
			return err
		}
		cfgA = fmt.Sprintf(`{
	admin off
	persist_config off
	default_bind 127.0.0.1
	wabarelay {
		database       {env.WBR_BENCH_DATABASE}
		encryption_key {env.WBR_BENCH_KEY}
		%s
		upstream       %s/v26.0
		relay_log off
	}
}
http://127.0.0.1:%d {
	handle_path %s/* {
		wabarelay_proxy
	}
}
`, redisLine, fakeURLA, portA, proxyPrefix)
		envA = append(env[:2:2], "WBR_BENCH_REDIS="+redisA)
	}
	ca, err := benchkit.StartCaddy(ctx, caddyBin, filepath.Join(tmp, "a"), cfgA, envA, portA)
	if err != nil {
		return fmt.Errorf("caddy (a): %w", err)
	}
	cl.Add(ca.Stop)
	cb, err := benchkit.StartCaddy(ctx, caddyBin, filepath.Join(tmp, "b"), cfgB, env, portB)
	if err != nil {
		return fmt.Errorf("caddy (b): %w", err)
	}
	cl.Add(cb.Stop)
	if c.showLogs {
		cl.Add(func() {
			fmt.Fprintf(os.Stderr, "---- caddy (a) log ----\n%s---- caddy (b) log ----\n%s", ca.Logs(), cb.Logs())
		})
	}
	if err := ctx.Err(); err != nil {
		return err
	}

	// ---- load ----
	tokensA := []string(nil) // (a) sends the upstream token itself
	if c.compareLog {
		tokensA = tokens
	}
	ta := newTarget('a', fmt.Sprintf("http://127.0.0.1:%d%s", portA, proxyPrefix), pnids, tokensA, runID, c)
	tb := newTarget('b', fmt.Sprintf("http://127.0.0.1:%d%s", portB, proxyPrefix), pnids, tokens, runID, c)
	if c.generator == "wrk" {
		wrkBin, _ := exec.LookPath("wrk")
		for _, t := range []*target{ta, tb} {
			if err := t.writeWrkFiles(tmp, wrkBin, c.wrkThreads); err != nil {
				return err
			}
		}
	}
	perPhase := c.maxRequests / (c.slices + 1)
	benchkit.Logf("warm-up: %s per target and at least one request per channel, concurrency %d, load generator %s", c.warmup, c.concurrency, generatorName(c))
	for _, t := range []*target{ta, tb} {
		n, d, err := t.run(ctx, c.warmup, c.channels, perPhase, false)
		if err != nil {
			return err
		}
		benchkit.Logf("  warm-up (%c): %d requests in %s", t.name, n, d.Round(time.Millisecond))
		if n := t.failed.Load(); n > 0 {
			return fmt.Errorf("(%c) failed during warm-up: %s", t.name, t.errorSummary())
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}

	var profErr chan error
	if c.cpuProfile != "" {
		secs := int(math.Ceil((2 * time.Duration(c.slices) * c.slice).Seconds()))
		profErr = make(chan error, 1)
		go func() {
			profErr <- benchkit.FetchProfile(ctx, fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/profile?seconds=%d", portAdmin, secs), c.cpuProfile)
		}()
	}
	benchkit.Logf("measuring: %d × %s per target, alternating a/b", c.slices, c.slice)
	procs := cpuProcs{benchName(c): {os.Getpid()}, "caddy (a)": {ca.PID()}, "caddy (b)": {cb.PID()}, fakeName: {fp.child.PID()}}
	for _, ch := range redisChildren {
		procs["redis-server"] = append(procs["redis-server"], ch.PID())
	}
	if redisChildren != nil {
		for _, n := range redisNodes {
			n.ConfigResetStat(ctx) // command statistics of the measured phases only
		}
	}
	for i := 0; i < c.slices; i++ {
		for _, t := range []*target{ta, tb} {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			before := procs.sample(dbName)
			n, d, err := t.run(ctx, c.slice, 0, perPhase, true)
			if err != nil {
				return err
			}
			t.addCPU(before, procs.sample(dbName))
			benchkit.Logf("  slice %d (%c): %d requests, %.0f req/s", i+1, t.name, n, float64(n)/d.Seconds())
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if profErr != nil {
		if err := <-profErr; err != nil {
			benchkit.Logf("cpu profile: %v", err)
		} else {
			benchkit.Logf("cpu profile of caddy (b) written to %s (go tool pprof -top %s %s)", c.cpuProfile, caddyBin, c.cpuProfile)
		}
	}

	var redisStats string
	if redisChildren != nil {
		redisStats = commandStats(ctx, redisNodes)
	}

	// ---- checks ----
	fr, err := fp.report(ctx)
	if err != nil {
		return err
	}
	checks := verify(ta, tb, fr)
	// Channel lookups that reached Postgres (relay cache misses): Caddy (b) is stopped first so
	// that its backends flush their statistics.
	cb.Stop()
	time.Sleep(500 * time.Millisecond) // its backends exit and flush
	lookups := channelLookups(dsn)
	if c.compareLog {
		// (b) wrote its relay log before it stopped (Stop flushes the buffer): one row per request.
		rows := relayLogRows(dsn)
		checks.add(rows == tb.sent(), "(b) relay_log rows after (b) stopped: %d for %d requests (none dropped)", rows, tb.sent())
	}

	// ---- report ----
	machine := fmt.Sprintf("%s/%s, %d CPUs, load average %s at start, %s, Postgres %s, Redis %s",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), loadAvg, runtime.Version(), pgVersion, redisVersion)
	report(c, ta, tb, checks, lookups, fr.Conns, redisStats, machine)
	if !checks.ok {
		return errors.New("checks failed (see above)")
	}
	return nil
}

// ---- services ----

func startRedis(ctx context.Context, dir string) (string, *benchkit.Child, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return "", nil, errors.New("redis-server not found (apt-get install redis-server) and no -redis given")
	}
	port := benchkit.FreePort()
	ch, err := benchkit.StartChild("redis-server", filepath.Join(dir, "redis.log"), nil, bin,
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	if err != nil {
		return "", nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	if err := benchkit.WaitPort(ctx, addr, 10*time.Second, ch); err != nil {
		ch.Stop()
		return "", nil, fmt.Errorf("redis-server: %w\n%s", err, ch.Logs())
	}
	benchkit.Logf("redis-server on %s", addr)
	return "redis://" + addr, ch, nil
}

// startRedisCluster starts n redis-server cluster nodes (masters only) and joins them with
// redis-cli --cluster create; it returns their addresses once every node reports
// cluster_state:ok. The children are returned even on error, to be stopped.
func startRedisCluster(ctx context.Context, dir string, n int) ([]string, []*benchkit.Child, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, nil, errors.New("redis-server not found (apt-get install redis-server)")
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		return nil, nil, errors.New("redis-cli not found (apt-get install redis-tools)")
	}
	var addrs []string
	var children []*benchkit.Child
	for i := range n {
		port := benchkit.FreePort()
		nodeDir := filepath.Join(dir, "redis-"+strconv.Itoa(i))
		if err := os.MkdirAll(nodeDir, 0o700); err != nil {
			return addrs, children, err
		}
		ch, err := benchkit.StartChild("redis-server", filepath.Join(nodeDir, "redis.log"), nil, bin,
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", nodeDir,
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000")
		if err != nil {
			return addrs, children, err
		}
		children = append(children, ch)
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		if err := benchkit.WaitPort(ctx, addr, 10*time.Second, ch); err != nil {
			return addrs, children, fmt.Errorf("redis-server: %w\n%s", err, ch.Logs())
		}
		addrs = append(addrs, addr)
	}
	args := append(append([]string{"--cluster", "create"}, addrs...), "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		return addrs, children, fmt.Errorf("redis-cli --cluster create: %w\n%s", err, out)
	}
	for _, a := range addrs {
		node := redis.NewClient(&redis.Options{Addr: a})
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			info, err := node.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				node.Close()
				return addrs, children, fmt.Errorf("redis cluster node %s not ready: %v", a, err)
			}
		}
		node.Close()
	}
	benchkit.Logf("redis cluster of %d masters on %s", n, strings.Join(addrs, " "))
	return addrs, children, nil
}

func redisInfo(ctx context.Context, rdb *redis.Client) (string, error) {
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			return v, nil
		}
	}
	return "?", nil
}

// commandStats renders Redis' INFO commandstats, summed over the servers, as a markdown table,
// busiest command first, followed by how many reads and writes of client connections the
// servers made (INFO stats total_reads_processed, total_writes_processed): scripts per read
// tell how many calls each of Redis' reads carried (the pipelining of concurrent calls).
func commandStats(ctx context.Context, nodes []*redis.Client) string {
	var reads, writes int64
	for _, rdb := range nodes {
		info, err := rdb.Info(ctx, "stats").Result()
		if err != nil {
			return ""
		}
		for _, line := range strings.Split(info, "\n") {
			k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "total_reads_processed":
				reads += n
			case "total_writes_processed":
				writes += n
			}
		}
	}
	byName := map[string]*commandRow{}
	for _, rdb := range nodes {
		info, err := rdb.Info(ctx, "commandstats").Result()
		if err != nil {
			return ""
		}
		for _, line := range strings.Split(info, "\n") {
			name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
			name, isCmd := strings.CutPrefix(name, "cmdstat_")
			if !ok || !isCmd {
				continue
			}
			r := byName[name]
			if r == nil {
				r = &commandRow{name: name}
				byName[name] = r
			}
			for _, kv := range strings.Split(rest, ",") {
				k, v, _ := strings.Cut(kv, "=")
				n, _ := strconv.ParseInt(v, 10, 64)
				switch k {
				case "calls":
					r.calls += n
				case "usec":
					r.usec += n
				}
			}
		}
	}
	var rows []commandRow
	for _, r := range byName {
		r.usecPerCall = float64(r.usec) / float64(max(r.calls, 1))
		rows = append(rows, *r)
	}
	slices.SortFunc(rows, func(a, b commandRow) int { return int(b.usec - a.usec) })
	var sb strings.Builder
	sb.WriteString("| command | calls | µs total | µs/call |\n|---|--:|--:|--:|\n")
	for _, r := range rows {
		fmt.Fprintf(&sb, "| %s | %d | %d | %.2f |\n", r.name, r.calls, r.usec, r.usecPerCall)
	}
	scripts := byName["evalsha"].callsOrZero() + byName["eval"].callsOrZero()
	fmt.Fprintf(&sb, "\nReads of client connections %d, writes %d (INFO stats): %.2f scripts per read.\n",
		reads, writes, float64(scripts)/float64(max(reads, 1)))
	return sb.String()
}

// commandRow is one command's line of commandStats.
type commandRow struct {
	name        string
	calls       int64
	usec        int64
	usecPerCall float64
}

// callsOrZero returns r's calls, 0 for a command that never ran (nil).
func (r *commandRow) callsOrZero() int64 {
	if r == nil {
		return 0
	}
	return r.calls
}

func deleteKeys(rdb *redis.Client, pattern string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var cursor uint64
	n := 0
	for {
		keys, next, err := rdb.Scan(ctx, cursor, pattern, 1000).Result()
		if err != nil {
			benchkit.Logf("redis cleanup: %v", err)
			return
		}
		if len(keys) > 0 {
			rdb.Unlink(ctx, keys...)
			n += len(keys)
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	benchkit.Logf("redis: %d idempotency records of this run deleted", n)
}

// createChannels creates one org and len(pnids) active channels, channel i on pnids[i], and
// returns their channel tokens.
func createChannels(ctx context.Context, dsn string, key []byte, pnids []string) ([]string, error) {
	start := time.Now()
	const workers = 16
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	pcfg.MaxConns = workers
	// Setup data need not survive a crash: skip the WAL flush per commit (this session only).
	pcfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	box, err := secretbox.New(key)
	if err != nil {
		return nil, err
	}
	st := store.New(pool, box)
	org, err := st.CreateOrg(ctx, "bench")
	if err != nil {
		return nil, err
	}
	tokens := make([]string, len(pnids))
	var next atomic.Int64
	var firstErr error
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(pnids) || ctx.Err() != nil {
					return
				}
				ch, err := st.CreateChannel(ctx, org.ID, "bench "+strconv.Itoa(i), time.Hour)
				if err == nil {
					err = st.ConnectChannel(ctx, ch.ID, store.Connection{PhoneNumberID: pnids[i], WabaID: wabaID,
						DisplayPhoneNumber: fmt.Sprintf("+1 555-%07d", i), VerifiedName: "Bench", UpstreamToken: upstreamToken})
				}
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					next.Store(int64(len(pnids)))
					return
				}
				tokens[i] = ch.ChannelToken
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return nil, fmt.Errorf("creating channels: %w", firstErr)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	benchkit.Logf("%d active channels created in %s", len(pnids), time.Since(start).Round(time.Millisecond))
	return tokens, nil
}

// channelLookups returns how often the channels' token-hash index was scanned (one scan per
// relay cache miss), or -1 if the statistics cannot be read.
// relayLogRows counts the bench database's relay_log rows (-1 on error).
func relayLogRows(dsn string) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return -1
	}
	defer conn.Close(ctx)
	var n int64
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM relay_log`).Scan(&n); err != nil {
		return -1
	}
	return n
}

// redisDB returns the Redis URL u on database db (u must name database 0).
func redisDB(u string, db int) (string, error) {
	opt, err := redis.ParseURL(u)
	if err != nil {
		return "", fmt.Errorf("-redis: %w", err)
	}
	if opt.DB != 0 {
		return "", fmt.Errorf("-compare-log needs -redis on database 0 (it uses database %d for (a))", db)
	}
	return strings.TrimRight(u, "/") + "/" + strconv.Itoa(db), nil
}

func channelLookups(dsn string) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return -1
	}
	defer conn.Close(ctx)
	var n int64
	if err := conn.QueryRow(ctx, `SELECT coalesce(sum(idx_scan), 0)::bigint FROM pg_stat_user_indexes
		WHERE relname = 'channels' AND indexrelname = 'channels_channel_token_hash_key'`).Scan(&n); err != nil {
		return -1
	}
	return n
}

// ---- load ----

type target struct {
	name   byte
	client *http.Client
	urls   []string // per channel
	auths  []string // per channel
	prefix []byte   // body up to the sequence number
	suffix []byte   // body after it, up to the idempotency key value (b) or the end (a)
	runID  string
	c      config

	seq      atomic.Int64 // next sequence number
	status   []uint16     // per sequence number: HTTP status (0: transport error / not sent)
	measured []time.Duration
	elapsed  time.Duration // wall time of the measured slices
	slices   []float64     // req/s of each measured slice

	cpu map[string]time.Duration // CPU time per process (group) during the measured slices

	failed   atomic.Int64
	replayed atomic.Int64

	// -generator wrk: no status per request; which sequence numbers were sent, and the counts.
	wrk                                *wrkTarget
	wrkSent                            []bool
	wrkIssued, wrkCompleted, wrkNon2xx int64

	errMu sync.Mutex
	errs  map[string]int // "status: body" → count
}

func newTarget(name byte, base string, pnids, tokens []string, runID string, c config) *target {
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        4 * c.concurrency,
		MaxIdleConnsPerHost: 2 * c.concurrency,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	t := &target{name: name, client: &http.Client{Transport: tr, Timeout: 30 * time.Second},
		urls: make([]string, len(pnids)), auths: make([]string, len(pnids)), runID: runID, c: c,
		status: make([]uint16, c.maxRequests), errs: map[string]int{}}
	if c.generator == "wrk" {
		t.wrkSent = make([]bool, c.maxRequests)
	}
	for i, p := range pnids {
		t.urls[i] = base + "/" + p + "/messages"
		if tokens != nil {
			t.auths[i] = "Bearer " + tokens[i]
		} else {
			t.auths[i] = "Bearer " + upstreamToken
		}
	}
	t.prefix = []byte(`{"messaging_product":"whatsapp","recipient_type":"individual","to":"15551234567","type":"text","text":{"body":"bench ` + string(name) + " ")
	if t.keyed() {
		t.suffix = []byte(`"},"idempotency_key":"` + runID + "-" + string(name) + "-")
	} else {
		t.suffix = []byte(`"}}`)
	}
	return t
}

// sent returns the requests sent to t so far, warm-up included.
func (t *target) sent() int64 {
	if t.wrk != nil {
		return t.wrkIssued
	}
	return t.seq.Load()
}

// keyed reports whether t's bodies carry an idempotency key: (b)'s, and (a)'s with -compare-log
// (both relays), unless -no-idempotency-key.
func (t *target) keyed() bool {
	return (t.name == 'b' || t.c.compareLog) && !t.c.noIdemKey
}

func (t *target) body(buf []byte, seq int) []byte {
	buf = append(buf[:0], t.prefix...)
	buf = strconv.AppendInt(buf, int64(seq), 10)
	buf = append(buf, t.suffix...)
	if t.keyed() {
		buf = strconv.AppendInt(buf, int64(seq), 10)
		buf = append(buf, `"}`...)
	}
	return buf
}

// run runs one phase with the configured load generator: for wrk, repeated while fewer than
// minReq requests were issued (the warm-up's one request per channel).
func (t *target) run(ctx context.Context, d time.Duration, minReq, budget int, measured bool) (int, time.Duration, error) {
	if t.wrk == nil {
		n, el := t.phase(ctx, d, minReq, budget, measured)
		return n, el, nil
	}
	first := t.wrkIssued
	var n int
	var el time.Duration
	for {
		k, e, err := t.wrkPhase(ctx, d, budget, measured)
		n, el = n+k, el+e
		if err != nil || t.wrkIssued-first >= int64(minReq) || ctx.Err() != nil {
			return n, el, err
		}
	}
}

// phase runs a closed loop for d, and at least until minReq requests were issued, but never
// more than budget requests. When measured it keeps every latency. It returns the requests
// completed and the wall time.
func (t *target) phase(ctx context.Context, d time.Duration, minReq, budget int, measured bool) (int, time.Duration) {
	first := int(t.seq.Load())
	limit := min(first+budget, len(t.status))
	minSeq := int64(first + minReq)
	start := time.Now()
	deadline := start.Add(d)
	lat := make([][]time.Duration, t.c.concurrency)
	var wg sync.WaitGroup
	for w := range lat {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var buf []byte
			local := make([]time.Duration, 0, 4096)
			for ctx.Err() == nil && (time.Now().Before(deadline) || t.seq.Load() < minSeq) {
				seq := int(t.seq.Add(1) - 1)
				if seq >= limit {
					t.seq.Add(-1) // keep the counter at the number issued
					break
				}
				buf = t.body(buf, seq)
				ch := seq % len(t.urls)
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, t.urls[ch], bytes.NewReader(buf))
				req.Header.Set("Authorization", t.auths[ch])
				req.Header.Set("Content-Type", "application/json")
				s := time.Now()
				resp, err := t.client.Do(req)
				if err != nil {
					if ctx.Err() == nil {
						t.fail(0, err.Error())
					}
					continue
				}
				var rb []byte
				if resp.StatusCode/100 != 2 {
					rb, _ = io.ReadAll(io.LimitReader(resp.Body, 2048))
				} else {
					io.Copy(io.Discard, resp.Body)
				}
				resp.Body.Close()
				el := time.Since(s)
				t.status[seq] = uint16(resp.StatusCode)
				if resp.Header.Get("Idempotent-Replayed") != "" {
					t.replayed.Add(1)
				}
				if resp.StatusCode/100 != 2 {
					t.fail(resp.StatusCode, string(rb))
				}
				if measured {
					local = append(local, el)
				}
			}
			lat[w] = local
		}()
	}
	wg.Wait()
	el := time.Since(start)
	n := 0
	for _, l := range lat {
		n += len(l)
	}
	if measured {
		for _, l := range lat {
			t.measured = append(t.measured, l...)
		}
		t.elapsed += el
		t.slices = append(t.slices, float64(n)/el.Seconds())
	} else {
		n = int(t.seq.Load()) - first
	}
	return n, el
}

func (t *target) fail(status int, msg string) {
	t.failed.Add(1)
	if len(msg) > 300 {
		msg = msg[:300] + "…"
	}
	k := strconv.Itoa(status) + " " + volatile.ReplaceAllString(strings.TrimSpace(msg), `"$1":"…"`)
	if status == 0 {
		k = "transport error: " + msg
	}
	t.errMu.Lock()
	if _, seen := t.errs[k]; seen || len(t.errs) < 10 {
		t.errs[k]++
	} else {
		t.errs["(other errors)"]++
	}
	t.errMu.Unlock()
}

func (t *target) errorSummary() string {
	t.errMu.Lock()
	defer t.errMu.Unlock()
	var parts []string
	for k, n := range t.errs {
		parts = append(parts, fmt.Sprintf("%d × %s", n, k))
	}
	slices.Sort(parts)
	return strings.Join(parts, "; ")
}

// volatile matches the per-request ids in error bodies, so that equal errors group together.
var volatile = regexp.MustCompile(`"(fbtrace_id|x-fb-trace-id|wamid|id)":"[^"]*"`)

// ---- CPU accounting ----

// cpuProcs are the processes whose CPU time is measured, by name (several for a Redis Cluster).
type cpuProcs map[string][]int

const pgName = benchkit.PGBackends

func (p cpuProcs) sample(dbName string) map[string]time.Duration {
	out := map[string]time.Duration{}
	for name, pids := range p {
		for _, pid := range pids {
			if d, ok := benchkit.ProcCPU(pid); ok {
				out[name] += d
			}
		}
	}
	out[pgName], _ = benchkit.PostgresCPU(dbName)
	return out
}

func (t *target) addCPU(before, after map[string]time.Duration) {
	if t.cpu == nil {
		t.cpu = map[string]time.Duration{}
	}
	for name, a := range after {
		t.cpu[name] += max(a-before[name], 0) // a backend that exited meanwhile is lost, not negative
	}
}

// ---- checks and report ----

type checkResult struct {
	ok    bool
	lines []string
}

func (c *checkResult) add(ok bool, format string, args ...any) {
	mark := "ok  "
	if !ok {
		mark = "FAIL"
		c.ok = false
	}
	c.lines = append(c.lines, mark+" "+fmt.Sprintf(format, args...))
}

func verify(ta, tb *target, fr *fakeReport) checkResult {
	res := checkResult{ok: true}
	for _, t := range []*target{ta, tb} {
		arr := fr.CountsA
		if t.name == 'b' {
			arr = fr.CountsB
		}
		if t.wrk != nil {
			verifyWrk(&res, t, arr)
			continue
		}
		issued := int(t.seq.Load())
		var ok2xx, once, missing, dup, non2xxSent, n429 int
		for i := 0; i < issued; i++ {
			st, n := t.status[i], arr[i]
			if st == 429 {
				n429++
			}
			if st/100 == 2 {
				ok2xx++
				switch {
				case n == 1:
					once++
				case n == 0:
					missing++
				default:
					dup++
				}
			} else if n > 0 {
				non2xxSent++
			}
		}
		stray := 0
		for i := issued; i < len(arr); i++ {
			stray += int(arr[i])
		}
		res.add(t.failed.Load() == 0, "(%c) %d requests (warm-up included), %d answered 2xx, %d errors%s",
			t.name, issued, ok2xx, t.failed.Load(), errSuffix(t))
		res.add(n429 == 0, "(%c) 429 responses: %d", t.name, n429)
		res.add(missing == 0 && dup == 0 && stray == 0,
			"(%c) fake upstream received exactly one send for %d of %d 2xx requests (missing %d, duplicated %d, unknown %d)",
			t.name, once, ok2xx, missing, dup, stray)
		if non2xxSent > 0 {
			res.lines = append(res.lines, fmt.Sprintf("note (%c) %d non-2xx requests did reach the fake", t.name, non2xxSent))
		}
	}
	res.add(tb.replayed.Load() == 0 && ta.replayed.Load() == 0, "(b) idempotent replays: %d", tb.replayed.Load())
	res.add(fr.Other == 0, "requests at the fake without a bench sequence number: %d", fr.Other)
	res.add(fr.ForwardedB > 0 && fr.ForwardedBadB == 0, "(b) last %d forwarded sends carry the upstream token, path /v26.0/<pnid>/messages, no idempotency_key (%d wrong)",
		fr.ForwardedB, fr.ForwardedBadB)
	return res
}

// verifyWrk checks a target driven by wrk, which knows no status per request: every answer was
// 2xx (so no 429 either); no sequence number reached the fake twice, none that was not sent
// reached it, and every sent one reached it, except at most those still in flight when a wrk run
// ended (sent, never answered: wrk abandons them).
func verifyWrk(res *checkResult, t *target, arr []byte) {
	var sent, once, missing, dup, stray int
	for i, n := range arr {
		if !t.wrkSent[i] {
			stray += int(n)
			continue
		}
		sent++
		switch {
		case n == 1:
			once++
		case n == 0:
			missing++
		default:
			dup++
		}
	}
	ok2xx := t.wrkCompleted - t.wrkNon2xx
	inFlight := t.wrkIssued - t.wrkCompleted
	res.add(t.failed.Load() == 0, "(%c) %d requests sent (warm-up included), %d answered, %d of them 2xx, %d errors%s",
		t.name, t.wrkIssued, t.wrkCompleted, ok2xx, t.failed.Load(), errSuffix(t))
	res.add(dup == 0 && stray == 0 && int64(once) >= ok2xx && int64(missing) <= inFlight,
		"(%c) fake upstream received exactly one send for %d of %d sent (2xx answers %d; missing %d, at most the %d in flight when wrk stopped; duplicated %d, unknown %d)",
		t.name, once, sent, ok2xx, missing, inFlight, dup, stray)
}

func errSuffix(t *target) string {
	if t.failed.Load() == 0 {
		return ""
	}
	return ": " + t.errorSummary()
}

type stats struct {
	n             int
	rps           float64
	p50, p90, p99 float64 // ms
	mean          float64
}

func summarize(t *target) stats {
	l := t.measured
	slices.Sort(l)
	s := stats{n: len(l)}
	if len(l) == 0 {
		return s
	}
	s.rps = float64(len(l)) / t.elapsed.Seconds()
	q := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(l)))) - 1
		return benchkit.MS(l[max(i, 0)])
	}
	s.p50, s.p90, s.p99 = q(0.50), q(0.90), q(0.99)
	var sum time.Duration
	for _, d := range l {
		sum += d
	}
	s.mean = benchkit.MS(sum / time.Duration(len(l)))
	return s
}

func report(c config, ta, tb *target, checks checkResult, lookups int64, upConns [2]int64, redisStats, env string) {
	a, b := summarize(ta), summarize(tb)
	var sb strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&sb, format, args...) }
	p("\n## Relay benchmark\n\n")
	p("```sh\n%s\n```\n\n", commandLine())
	p("%d active channels, concurrency %d, load generator %s, warm-up %s per target (and at least one request per channel), then %d × %s slices "+
		"per target alternating a/b; %s. Everything (load generator, fake upstream process, both Caddy, Postgres, Redis) shares this machine.\n\n",
		c.channels, c.concurrency, generatorName(c), c.warmup, c.slices, c.slice, env)
	if c.generator == "wrk" {
		p("Latencies are wrk's (its percentiles 0.1 … 99.9 of each slice, merged weighted by the slice's requests).\n\n")
	}
	p("| target | requests | errors | req/s | p50 ms | p90 ms | p99 ms |\n")
	p("|---|--:|--:|--:|--:|--:|--:|\n")
	row := func(name string, s stats, t *target) {
		p("| %s | %d | %d | %.0f | %.3f | %.3f | %.3f |\n", name, s.n, t.failed.Load(), s.rps, s.p50, s.p90, s.p99)
	}
	nameA := "(a) `reverse_proxy`"
	if c.compareLog {
		nameA = "(a) `wabarelay_proxy`, `relay_log off`"
	}
	row(nameA, a, ta)
	backend := "Redis"
	if c.cluster > 0 {
		backend = fmt.Sprintf("Redis Cluster (%d masters)", c.cluster)
	}
	keyNote := "a key per send"
	goal := 0.80
	if c.noIdemKey {
		keyNote, goal = "no key", 0.85
	}
	if c.compareLog {
		keyNote, goal = keyNote+", relay log on", 0.95
	}
	row(fmt.Sprintf("(b) `wabarelay_proxy`, %s, %s", keyNote, backend), b, tb)
	ratio := math.NaN()
	if a.rps > 0 {
		ratio = b.rps / a.rps
	}
	p("| **b/a** | | | **%.2f×** | **%+.3f** | %+.3f | %+.3f |\n\n", ratio, b.p50-a.p50, b.p90-a.p90, b.p99-a.p99)
	target := "met"
	if !(ratio >= goal) {
		target = "NOT met"
	}
	if c.latency {
		added := "met"
		if !(b.p50-a.p50 <= 0.15) {
			added = "NOT met"
		}
		p("Added p50 at concurrency %d (issue 21: ≤ +0.15 ms): **%s** (%+.3f ms; p99 %+.3f ms).\n\n", c.concurrency, added, b.p50-a.p50, b.p99-a.p99)
	} else {
		p("Target (b ≥ %.2f × a throughput; the added p50 is judged with -latency, at concurrency 1): **%s** (%.2f×, %+.3f ms p50).\n\n",
			goal, target, ratio, b.p50-a.p50)
	}
	p("Per-slice req/s — a: %s; b: %s. Mean latency a %.3f ms, b %.3f ms.\n\n", fmtSlices(ta.slices), fmtSlices(tb.slices), a.mean, b.mean)
	idem := "body with a unique `idempotency_key`"
	if c.noIdemKey {
		idem = "body WITHOUT `idempotency_key` (-no-idempotency-key)"
	}
	mixA := "(a): the upstream token itself and the same body without `idempotency_key` (the fake, like the real API, " +
		"rejects unknown top-level keys), i.e. exactly the body (b) forwards."
	if c.compareLog {
		mixA = "(a): the same, through the relay with `relay_log off` (its limits and keys in Redis database 1)."
	}
	p("Request mix: `POST <pnid>/messages` text sends, request n on channel n mod %d for both targets. "+
		"(b): `Authorization: Bearer <channel_token>`, "+idem+". "+mixA+"\n\n", c.channels)
	if lookups >= 0 {
		nb := tb.sent()
		p("Channel lookups in Postgres (cache misses of the relay's channel cache): %d for %d (b) requests, warm-up included (%.1f%%).\n\n",
			lookups, nb, 100*float64(lookups)/float64(max(nb, 1)))
	}
	p("Upstream connections opened by Caddy to the fake: (a) %d, (b) %d.\n\n", upConns[0], upConns[1])
	p("CPU time per request during the measured slices (µs; both targets' slices alternate, so each column covers only its own slices):\n\n")
	p("| process | (a) | (b) |\n|---|--:|--:|\n")
	names := []string{benchName(c), wrkName, "caddy (a)", "caddy (b)", "redis-server", pgName, fakeName}
	var sumA, sumB float64
	for _, name := range names {
		_, inA := ta.cpu[name]
		_, inB := tb.cpu[name]
		if !inA && !inB {
			continue
		}
		ua := perReq(ta.cpu[name], a.n)
		ub := perReq(tb.cpu[name], b.n)
		sumA, sumB = sumA+ua, sumB+ub
		p("| %s | %.0f | %.0f |\n", name, ua, ub)
	}
	p("| **total** | **%.0f** | **%.0f** |\n\n", sumA, sumB)
	if redisStats != "" {
		p("Redis commands during the measured slices (INFO commandstats; %d (b) requests):\n\n%s\n", b.n, redisStats)
	}
	p("Checks:\n")
	for _, l := range checks.lines {
		p("- %s\n", l)
	}
	fmt.Print(sb.String())
	// One machine-readable line each (bench/smoke reads them).
	name := "relay-key"
	switch {
	case c.compareLog:
		name = "relay-log"
	case c.noIdemKey:
		name = "relay-nokey"
	}
	if c.latency {
		name += "-c" + strconv.Itoa(c.concurrency)
	}
	fmt.Printf("RATIO %s %.3f\n", name, ratio)
	fmt.Printf("ADDED_P50_MS %s %.3f\n", name, b.p50-a.p50)
}

const fakeName = "fake upstream"

// benchName names this process in the CPU table: with the Go generator, the load.
func benchName(c config) string {
	if c.generator == "go" {
		return "bench (Go load generator)"
	}
	return "bench (driver)"
}

func generatorName(c config) string {
	if c.generator == "wrk" {
		return fmt.Sprintf("wrk (-t%d)", c.wrkThreads)
	}
	return "Go (in the bench process)"
}

func perReq(d time.Duration, n int) float64 {
	if n == 0 {
		return 0
	}
	return float64(d.Microseconds()) / float64(n)
}

func fmtSlices(s []float64) string {
	parts := make([]string, len(s))
	for i, v := range s {
		parts[i] = strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strings.Join(parts, ", ")
}

func commandLine() string {
	args := []string{"go", "run", "./bench/relay"}
	for _, a := range os.Args[1:] {
		if strings.ContainsAny(a, " \t'\"$&;|<>()*?") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		args = append(args, a)
	}
	return strings.Join(args, " ")
}
