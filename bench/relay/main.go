// Command relay benchmarks the relay: the same closed-loop load against (a) Caddy's plain
// reverse_proxy to the fake upstream and (b) wabarelay_proxy (channel auth → Redis rate limit →
// Redis idempotency → token swap → reverse_proxy), in the same run.
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
// Load generator (-generator): wrk when it is on PATH, driven by a Lua script and a data file
// written into the run's temp dir (wrk.go), -wrk-threads threads (1 by default: it disturbed the
// machine less than 2), one wrk run per slice; otherwise the Go closed loop in this process.
// Both make the same requests.
//
// Data: one org and -channels active channels, each on its own phone number id, all allowed for
// one upstream token in the fake. Both targets get the same request mix: text sends
// POST <pnid>/messages, round-robin over the channels (request n uses channel n mod channels on
// both). (b) authenticates with the channel's token and every body carries a unique
// idempotency_key; (a) sends the upstream token itself and the same body without
// idempotency_key (the fake, like the real API, rejects unknown top-level keys), which is the
// body (b) forwards after removing the key.
//
// Load: -concurrency workers in a closed loop (wrk: connections), a warm-up on each target, then
// measured slices alternating a, b, a, b, ... so that machine noise hits both alike. Every latency
// of the measured slices is kept. Each target gets at most -max-requests in all (warm-up
// included), which must stay at or below 60 per channel so that no channel comes near the
// relay's 100 per minute limit.
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
// target's own slices, Redis' command statistics, Postgres channel lookups (relay cache misses),
// upstream connections opened. -cpuprofile profiles Caddy (b); -no-idempotency-key leaves the key
// out of (b)'s bodies to separate the idempotency cost from the rest of the chain.
//
// -compare-log makes (a) a wabarelay_proxy too, with `relay_log off`, and (b) the same with the
// relay log on (its defaults): both on the bench database and the same Redis server ((a)'s
// limits and keys in database 1), both authenticating with the channel tokens and, unless
// -no-idempotency-key, carrying keys. b/a is then the relay log's cost (goal: ≥ 0.95); the
// checks add that relay_log holds one row per (b) request once (b) has stopped (nothing dropped).
//
// The files: config.go (flags, the Caddyfiles), load.go (the targets and the Go generator),
// wrk.go (the wrk generator), fake.go (the fake upstream process), report.go (checks, results).
package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/wabarelay/wabarelay/bench/internal/benchkit"
)

func main() {
	if spec := os.Getenv(fakeEnv); spec != "" {
		if err := runFake(spec); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	c := parseFlags()
	ctx := benchkit.SignalContext()
	benchkit.Exit(ctx, run(ctx, c))
}

func run(ctx context.Context, c config) (err error) {
	var cl benchkit.Cleanups
	defer cl.RunAfter(ctx)

	r, err := benchkit.NewRun(&cl, c.caddyBin, "wabarelay-bench-")
	if err != nil {
		return err
	}
	caddyBin, runID, tmp := r.CaddyBin, r.ID, r.Dir

	// ---- Redis ----
	redisURL := c.redisURL
	var redisChildren []*benchkit.Child
	var redisNodes []*redis.Client // one client per server, for statistics
	redisLine := "redis          {env.WBR_BENCH_REDIS}"
	switch {
	case c.noRedis:
		redisLine = ""
	case c.cluster > 0:
		addrs, children, err := benchkit.StartRedisCluster(ctx, tmp, c.cluster)
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
		redisLine = "redis {\n\taddresses " + strings.Join(addrs, " ") + "\n}"
	case redisURL == "":
		u, ch, err := benchkit.StartRedis(ctx, tmp)
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
	for _, n := range redisNodes {
		cl.Add(func() { _ = n.Close() })
	}
	redisVersion := "none (-no-redis)"
	if !c.noRedis {
		if redisVersion, err = benchkit.RedisVersion(ctx, redisNodes[0]); err != nil {
			return fmt.Errorf("redis: %w", err)
		}
	}
	if c.redisURL != "" {
		rdb := redisNodes[0]
		// An external Redis: remove this run's idempotency records (rate-limit keys expire in 1 min).
		cl.Add(func() { benchkit.DeleteKeys(rdb, "*"+runID+"-*") })
	}

	// ---- Postgres ----
	dbName := "wabarelay_bench_" + runID
	dsn, err := benchkit.NewDatabase(ctx, c.pgDSN, dbName, &cl)
	if err != nil {
		return err
	}
	pgVersion := benchkit.Settings(ctx, dsn, "server_version")[0]

	// ---- fake upstream (a process of its own) ----
	fp, err := startFake(ctx, filepath.Join(tmp, "fake.log"), fakeConfig{Channels: c.channels, MaxRequests: c.maxRequests})
	if err != nil {
		return err
	}
	cl.Add(fp.child.Stop)
	pnids := make([]string, c.channels)
	for i := range pnids {
		pnids[i] = pnid(i)
	}

	// ---- data ----
	key := benchkit.NewKey()
	tokens, err := createChannels(ctx, dsn, key, pnids)
	if err != nil {
		return err
	}

	// ---- Caddy ----
	portA, portB, portAdmin := benchkit.FreePort(), benchkit.FreePort(), 0
	if c.cpuProfile != "" {
		portAdmin = benchkit.FreePort()
	}
	env := benchkit.CaddyEnv(dsn, key, "WBR_BENCH_REDIS="+redisURL)
	if c.compareWindow {
		if err := openWindows(ctx, dsn); err != nil {
			return err
		}
	}
	cfgA, envA := caddyfileA(c, portA, fp.urlA, redisLine), []string(nil)
	if c.relayBaseline() {
		// (a): the same relay with the log off, its limits and keys in Redis database 1 (each
		// target gives a channel up to maxPerChannel requests; together they would near its limit).
		redisA, err := redisDB(redisURL, 1)
		if err != nil {
			return err
		}
		envA = append(env[:2:2], "WBR_BENCH_REDIS="+redisA)
	}
	ca, err := benchkit.StartCaddy(ctx, caddyBin, filepath.Join(tmp, "a"), cfgA, envA, portA)
	if err != nil {
		return fmt.Errorf("caddy (a): %w", err)
	}
	cl.Add(ca.Stop)
	cb, err := benchkit.StartCaddy(ctx, caddyBin, filepath.Join(tmp, "b"), caddyfileB(c, portB, portAdmin, fp.urlB, redisLine), env, portB)
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
	if c.relayBaseline() {
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
	procs := benchkit.Procs{benchName(c): {os.Getpid()}, "caddy (a)": {ca.PID()}, "caddy (b)": {cb.PID()}, fakeName: {fp.child.PID()}}
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
			before := benchkit.SampleCPU(procs, dbName)
			n, d, err := t.run(ctx, c.slice, 0, perPhase, true)
			if err != nil {
				return err
			}
			t.addCPU(benchkit.DiffCPU(before, benchkit.SampleCPU(procs, dbName)))
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
		redisStats = benchkit.RedisCommandStats(ctx, redisNodes)
	}

	// ---- checks ----
	fr, err := fp.report(ctx)
	if err != nil {
		return err
	}
	checks := verify(ta, tb, fr)
	if c.compareWindow {
		// One more send through each: (b) tells the window (open: the guard looked it up and let
		// the sends through), (a) does not.
		ha, hb := windowHeader(ctx, ta, tokens[0]), windowHeader(ctx, tb, tokens[0])
		checks.add(ha == "" && hb == "open", "Wabarelay-Window of one more send: (a) %q (off), (b) %q (enforce; want open)", ha, hb)
	}
	// Channel lookups that reached Postgres (relay cache misses): Caddy (b) is stopped first so
	// that its backends flush their statistics.
	cb.Stop()
	time.Sleep(500 * time.Millisecond) // its backends exit and flush
	lookups := benchkit.QueryInt(dsn, channelLookupsSQL)
	if c.compareLog {
		// (b) wrote its relay log before it stopped (Stop flushes the buffer): one row per request.
		rows := benchkit.QueryInt(dsn, `SELECT count(*) FROM relay_log`)
		checks.add(rows == tb.sent(), "(b) relay_log rows after (b) stopped: %d for %d requests (none dropped)", rows, tb.sent())
	}

	// ---- report ----
	machine := benchkit.Machine(r.LoadAvg) + fmt.Sprintf(", Postgres %s, Redis %s", pgVersion, redisVersion)
	report(c, ta, tb, checks, lookups, fr.Conns, redisStats, machine)
	if !checks.ok {
		return errors.New("checks failed (see above)")
	}
	return nil
}
