package main

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/wabarelay/wabarelay/bench/internal/benchkit"
)

// channelLookupsSQL counts the scans of the channels' token-hash index: one per relay cache miss.
const channelLookupsSQL = `SELECT coalesce(sum(idx_scan), 0)::bigint FROM pg_stat_user_indexes
		WHERE relname = 'channels' AND indexrelname = 'channels_channel_token_hash_key'`

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
		var ok2xx, non2xxSent, n429 int
		var a arrivals
		for i := 0; i < issued; i++ {
			st, n := t.status[i], arr[i]
			if st == 429 {
				n429++
			}
			if st/100 == 2 {
				ok2xx++
				a.count(n)
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
		res.add(a.missing == 0 && a.dup == 0 && stray == 0,
			"(%c) fake upstream received exactly one send for %d of %d 2xx requests (missing %d, duplicated %d, unknown %d)",
			t.name, a.once, ok2xx, a.missing, a.dup, stray)
		if non2xxSent > 0 {
			res.lines = append(res.lines, fmt.Sprintf("note (%c) %d non-2xx requests did reach the fake", t.name, non2xxSent))
		}
	}
	res.add(tb.replayed.Load() == 0 && ta.replayed.Load() == 0, "(b) idempotent replays: %d", tb.replayed.Load())
	res.add(fr.Other == 0, "sends at the fake without a bench sequence number: %d", fr.Other)
	res.add(fr.ForwardedB > 0 && fr.ForwardedBadB == 0, "(b) last %d forwarded sends carry the upstream token, path /v26.0/<pnid>/messages, no idempotency_key (%d wrong)",
		fr.ForwardedB, fr.ForwardedBadB)
	return res
}

// verifyWrk checks a target driven by wrk, which knows no status per request: every answer was
// 2xx (so no 429 either); no sequence number reached the fake twice, none that was not sent
// reached it, and every sent one reached it, except at most those still in flight when a wrk run
// ended (sent, never answered: wrk abandons them).
func verifyWrk(res *checkResult, t *target, arr []byte) {
	var sent, stray int
	var a arrivals
	for i, n := range arr {
		if !t.wrkSent[i] {
			stray += int(n)
			continue
		}
		sent++
		a.count(n)
	}
	ok2xx := t.wrkCompleted - t.wrkNon2xx
	inFlight := t.wrkIssued - t.wrkCompleted
	res.add(t.failed.Load() == 0, "(%c) %d requests sent (warm-up included), %d answered, %d of them 2xx, %d errors%s",
		t.name, t.wrkIssued, t.wrkCompleted, ok2xx, t.failed.Load(), errSuffix(t))
	res.add(a.dup == 0 && stray == 0 && int64(a.once) >= ok2xx && int64(a.missing) <= inFlight,
		"(%c) fake upstream received exactly one send for %d of %d sent (2xx answers %d; missing %d, at most the %d in flight when wrk stopped; duplicated %d, unknown %d)",
		t.name, a.once, sent, ok2xx, a.missing, inFlight, a.dup, stray)
}

// arrivals tallies how often the fake received each request expected there: once, never, or
// more than once.
type arrivals struct{ once, missing, dup int }

func (a *arrivals) count(n byte) {
	switch {
	case n == 1:
		a.once++
	case n == 0:
		a.missing++
	default:
		a.dup++
	}
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
	s.p50, s.p90, s.p99 = benchkit.Quantile(l, 0.50), benchkit.Quantile(l, 0.90), benchkit.Quantile(l, 0.99)
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
	p("```sh\n%s\n```\n\n", benchkit.CommandLine("relay"))
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
	if c.compareWindow {
		nameA = "(a) `wabarelay_proxy`, `window_guard off`"
	}
	row(nameA, a, ta)
	backend := "Redis"
	switch {
	case c.cluster > 0:
		backend = fmt.Sprintf("Redis Cluster (%d masters)", c.cluster)
	case c.noRedis:
		backend = "no Redis (limits and keys in memory)"
	}
	keyNote := "a key per send"
	goal := 0.80
	if c.noIdemKey {
		keyNote, goal = "no key", 0.85
	}
	if c.compareLog {
		keyNote, goal = keyNote+", relay log on", 0.95
	}
	if c.compareWindow {
		keyNote, goal = keyNote+", `window_guard enforce` (windows open)", 0.97
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
		added, limit := "met", 0.15 // issue 35: +0.15 ms with a key, +0.10 without
		if c.noIdemKey {
			limit = 0.10
		}
		if !(b.p50-a.p50 <= limit) {
			added = "NOT met"
		}
		p("Added p50 at concurrency %d (goal: ≤ +%.2f ms): **%s** (%+.3f ms; p99 %+.3f ms).\n\n", c.concurrency, limit, added, b.p50-a.p50, b.p99-a.p99)
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
	if c.compareWindow {
		mixA = "(a): the same, through the relay with `window_guard off` (no header, no look-up; its limits and keys in Redis database 1). " +
			"Every channel's recipient wrote a minute before the run: (b) finds each window open, in memory, and lets the send through."
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
	names := []string{benchName(c), wrkName, "caddy (a)", "caddy (b)", "redis-server", benchkit.PGBackends, fakeName}
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
	case c.compareWindow:
		name = "relay-window"
	case c.noIdemKey:
		name = "relay-nokey"
	}
	if c.noRedis {
		name += "-noredis"
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
