// Command broadcast benchmarks a broadcast (docs/broadcasts.md): one big broadcast sent at its
// rate through the relay while the relay's own callers use the channel's other half of its
// limit at the same time.
//
//	make build
//	go run ./bench/broadcast                                   # 20,000 recipients at 6,000/min: ~200 s
//	go run ./bench/broadcast -recipients 2000 -rate 6000       # a short run (~20 s)
//
// It starts everything itself and removes everything at the end (also on Ctrl-C): a fresh
// database wabarelay_bench_<rand> on the Postgres of -pg (durable: the server's fsync and
// synchronous_commit as they are, on by default; dropped at the end), a throwaway redis-server,
// the fake upstream (internal/fakegraph) in this process behind a wrapper that records every
// send, and one bin/caddy with `admin off` on a free loopback port serving the management API
// (wabarelay_api) and the relay (wabarelay_proxy with `rate_limit <-limit> 1m`: 12,000 a
// minute, so that the broadcast's 6,000 is half; the relay log's per_channel rows raised to
// match, so that every call gets its row), the broadcasts' sender with its defaults.
//
// Data: one org, its API key, one connected channel; the fake knows the channel's number and an
// approved template without parameters.
//
// Load: callers send text messages through the relay with the channel's token, paced at
// -caller-rate (default: -limit − -rate, the callers' half), send i at start + i × 60 s / rate,
// at most -caller-concurrency in flight; first alone for -caller-lead (their CPU per send),
// then the broadcast of -recipients recipients at -rate is created through the API (one POST)
// and read through the API every -poll until it is completed; then the callers stop. Bounded:
// the wait ends at the broadcast's expected time + 20% + 1 min; the callers send at most their
// rate over that time.
//
// Results: the broadcast's pace as the fake saw it (sends from the first to the last, per
// minute, against -rate: the deviation in %; the highest and lowest 10-second window; the gaps
// between sends); the callers' sends during the broadcast's sending (accepted, refused 429,
// other), with their latency; the relay's refusals of the broadcast's own sends (relay_log and
// relay_counts rows of status 429, less the callers'); Caddy's resident set (at start, when the
// broadcast is created, the peak sampled every 250 ms while it sends, at the end, and VmHWM);
// the database's growth (pg_database_size before the broadcast's creation and after its end,
// per recipient, and per table); CPU µs per broadcast send of Caddy and the bench database's
// Postgres backends (the process's CPU over the broadcast less the callers' sends at their cost
// per send measured alone); the load average at start, the highest seen, at the end.
//
// Checks: the broadcast completed; the fake received exactly one send for every recipient and
// none for any other number; the API's counts match (total = accepted = recipients; queued,
// failed, unknown 0).
//
// The files: config.go (flags, the Caddyfile), load.go (the fake, the callers, the API, the
// sampling), report.go (results and checks).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wabarelay/wabarelay/bench/internal/benchkit"
	"github.com/wabarelay/wabarelay/secretbox"
	"github.com/wabarelay/wabarelay/store"
)

func main() {
	c := parseFlags()
	ctx := benchkit.SignalContext()
	benchkit.Exit(ctx, run(ctx, c))
}

// result is everything the report prints.
type result struct {
	c         config
	machine   string
	loadStart string
	loadEnd   string
	maxLoad   float64

	created, done time.Time // the broadcast's creation (the POST's answer) and completion seen
	final         broadcastView
	sends         []time.Time // broadcast sends at the fake
	none, once    int         // recipients with no send, exactly one
	more          int         // … more than one
	stray         int64       // template sends to other numbers
	fakeOther     int64       // requests to the fake that were neither
	callerAtFake  int64       // the callers' sends the fake received

	leadCalls, calls []call // the callers' sends alone, and from the broadcast's creation on
	callerErrs       string
	refused429       int64 // the relay's 429s in all (relay_log + relay_counts)
	relayLogRows     int64
	relayCounted     int64 // calls counted in relay_counts instead of rows (refusals, above per_channel)

	rssStart, rssCreate, rssPeak, rssEnd, hwm int64 // kB

	dbBefore, dbAfter      int64 // pg_database_size
	xactBefore, xactAfter  int64 // the database's committed transactions (pg_stat_database)
	tablesBefore, tablesAt map[string]int64
	cpuLead, cpuBroadcast  map[string]time.Duration
}

func run(ctx context.Context, c config) (err error) {
	var cl benchkit.Cleanups
	defer cl.RunAfter(ctx)
	r, err := benchkit.NewRun(&cl, c.caddyBin, "wabarelay-bench-broadcast-")
	if err != nil {
		return err
	}
	res := &result{c: c, loadStart: r.LoadAvg}

	redisURL, redisChild, err := benchkit.StartRedis(ctx, r.Dir)
	if err != nil {
		return err
	}
	cl.Add(redisChild.Stop)

	// The measured database, durable: the server's settings as they are (as
	// benchkit.DurableStore, with a key of our own: Caddy's, which decrypts the channel's token).
	dbName := "wabarelay_bench_" + r.ID
	dsn, err := benchkit.NewDatabase(ctx, c.pgDSN, dbName, &cl)
	if err != nil {
		return err
	}
	pool, err := benchkit.Pool(ctx, dsn, &cl)
	if err != nil {
		return err
	}
	set := benchkit.Settings(ctx, dsn, "fsync", "synchronous_commit", "server_version")
	benchkit.Logf("Postgres %s, fsync %s, synchronous_commit %s; load %s", set[2], set[0], set[1], benchkit.LoadAvg())
	key := benchkit.NewKey()
	box, err := secretbox.New(key)
	if err != nil {
		return err
	}
	st := store.New(pool, box)

	f, err := startFake(c.recipients, &cl)
	if err != nil {
		return err
	}

	// ---- data: org, key, connected channel ----
	org, err := st.CreateOrg(ctx, "bench")
	if err != nil {
		return err
	}
	_, apiKey, err := st.CreateAPIKey(ctx, org.ID, "bench", nil)
	if err != nil {
		return err
	}
	tokens, err := benchkit.CreateChannels(ctx, st, org.ID, 1, 1, func(int) (string, store.Connection) {
		return "bench", store.Connection{PhoneNumberID: pnid, WabaID: wabaID, DisplayPhoneNumber: "+1 555-0100001",
			VerifiedName: "Bench", UpstreamToken: upstreamToken}
	})
	if err != nil {
		return err
	}
	var channelID uuid.UUID
	if err := pool.QueryRow(ctx, `SELECT id FROM channels WHERE org_id = $1`, org.ID).Scan(&channelID); err != nil {
		return err
	}

	// ---- Caddy ----
	port := benchkit.FreePort()
	caddy, err := benchkit.StartCaddy(ctx, r.CaddyBin, filepath.Join(r.Dir, "caddy"), caddyfile(c, port, f.url),
		benchkit.CaddyEnv(dsn, key, "WBR_BENCH_REDIS="+redisURL), port)
	if err != nil {
		return fmt.Errorf("caddy: %w", err)
	}
	cl.Add(caddy.Stop)
	if c.showLogs {
		cl.Add(func() { fmt.Fprintf(os.Stderr, "---- caddy log ----\n%s", caddy.Logs()) })
	}
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	a := &api{client: benchkit.HTTPClient(4, 4, 60*time.Second), base: base, key: apiKey}
	procs := benchkit.Procs{"caddy": {caddy.PID()}, "bench (callers, fake, API reads)": {os.Getpid()}}
	res.rssStart = procKB(caddy.PID(), "VmRSS")

	// ---- callers alone ----
	cs := newCallers(base, tokens[0], c)
	cpu0 := benchkit.SampleCPU(procs, dbName)
	cs.run(ctx)
	stopCallers := sync1(func() []call { return cs.end() })
	defer stopCallers()
	benchkit.Logf("callers: %d/min through the relay (limit %d/min), alone for %s", c.callerRate, c.limit, c.callerLead)
	if err := sleepCtx(ctx, c.callerLead); err != nil {
		return err
	}
	cpu1 := benchkit.SampleCPU(procs, dbName)
	res.cpuLead = benchkit.DiffCPU(cpu0, cpu1)
	leadEnd := time.Now()

	// ---- the broadcast ----
	res.dbBefore = dbSize(ctx, pool)
	res.xactBefore = queryInt(ctx, pool, xactSQL)
	res.tablesBefore = tableSizes(ctx, pool)
	res.rssCreate = procKB(caddy.PID(), "VmRSS")
	sampler := sampleRSS(caddy.PID())
	b, err := a.createBroadcast(ctx, channelID.String(), c)
	if err != nil {
		sampler.end()
		return err
	}
	res.created = time.Now()
	benchkit.Logf("broadcast %s created: %d recipients at %d/min (expected %s); load %s",
		b.ID, b.Counts.Total, b.RatePerMinute, c.expected().Round(time.Second), benchkit.LoadAvg())
	deadline := res.created.Add(c.deadline())
	lastLog := time.Now()
	for {
		if err := sleepCtx(ctx, c.poll); err != nil {
			sampler.end()
			return err
		}
		if err := a.do(ctx, "GET", "/broadcasts/"+b.ID, nil, &b); err != nil {
			sampler.end()
			return err
		}
		if b.Status != store.BroadcastSending && b.Status != store.BroadcastScheduled {
			break
		}
		if time.Since(lastLog) >= 20*time.Second {
			benchkit.Logf("  %s: %d accepted, %d queued; the fake saw %d; load %s",
				time.Since(res.created).Round(time.Second), b.Counts.Accepted, b.Counts.Queued, len(f.sends()), benchkit.LoadAvg())
			lastLog = time.Now()
		}
		if time.Now().After(deadline) {
			break
		}
	}
	res.done = time.Now()
	cpu2 := benchkit.SampleCPU(procs, dbName)
	res.xactAfter = queryInt(ctx, pool, xactSQL)
	res.cpuBroadcast = benchkit.DiffCPU(cpu1, cpu2)
	res.rssPeak, res.maxLoad = sampler.end()
	all := stopCallers()
	for _, k := range all {
		if k.at.Before(leadEnd) {
			res.leadCalls = append(res.leadCalls, k)
		} else {
			res.calls = append(res.calls, k)
		}
	}
	res.callerErrs = cs.errs.Summary()
	benchkit.Logf("broadcast %s after %s: %d accepted; callers stopped after %d sends", b.Status,
		res.done.Sub(res.created).Round(time.Second), b.Counts.Accepted, len(all))

	// ---- after: the relay log written, sizes, the final counts ----
	time.Sleep(2 * time.Second) // the relay log's buffer is written within its interval (1 s)
	res.dbAfter = dbSize(ctx, pool)
	res.tablesAt = tableSizes(ctx, pool)
	res.rssEnd = procKB(caddy.PID(), "VmRSS")
	res.hwm = procKB(caddy.PID(), "VmHWM")
	res.refused429 = queryInt(ctx, pool, `SELECT (SELECT count(*) FROM relay_log WHERE status = 429)
		+ (SELECT coalesce(sum(calls), 0) FROM relay_counts WHERE status = 429)`)
	res.relayLogRows = queryInt(ctx, pool, `SELECT count(*) FROM relay_log`)
	res.relayCounted = queryInt(ctx, pool, `SELECT coalesce(sum(calls), 0) FROM relay_counts`)
	if err := a.do(ctx, "GET", "/broadcasts/"+b.ID, nil, &res.final); err != nil {
		return err
	}
	res.sends = f.sends()
	res.none, res.once, res.more = f.tally()
	res.stray, res.fakeOther, res.callerAtFake = f.stray.Load(), f.other.Load(), f.calls.Load()
	res.loadEnd = benchkit.LoadAvg()
	res.machine = fmt.Sprintf("%s, Postgres %s (fsync %s, synchronous_commit %s)", benchkit.Machine(r.LoadAvg), set[2], set[0], set[1])

	ok := report(res)
	if !ok {
		return errors.New("checks failed (see above)")
	}
	return nil
}

// sync1 returns f as a function that runs f once, later calls returning its first result.
func sync1[T any](f func() T) func() T {
	var done bool
	var v T
	return func() T {
		if !done {
			done, v = true, f()
		}
		return v
	}
}

// sleepCtx sleeps d or until ctx ends (its error).
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// xactSQL reads the database's committed transactions so far (as its backends last reported
// them: within a second).
const xactSQL = `SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()`

// dbSize returns pg_database_size of the pool's database (-1 on error).
func dbSize(ctx context.Context, pool *pgxpool.Pool) int64 {
	return queryInt(ctx, pool, `SELECT pg_database_size(current_database())`)
}

// sizedTables are the tables whose growth is reported one by one (with their partitions,
// indexes and TOAST).
var sizedTables = []string{"broadcast_recipients", "broadcasts", "messages", "relay_log", "relay_counts", "relay_minutes"}

// tableSizes returns the total size of each of sizedTables.
func tableSizes(ctx context.Context, pool *pgxpool.Pool) map[string]int64 {
	out := map[string]int64{}
	for _, t := range sizedTables {
		var n int64
		// pg_partition_tree lists a partitioned table and its partitions, nothing for a plain one.
		if err := pool.QueryRow(ctx, `SELECT coalesce((SELECT sum(pg_total_relation_size(relid))::bigint FROM pg_partition_tree($1::regclass)),
			pg_total_relation_size($1::regclass))`, t).Scan(&n); err != nil {
			n = -1
		}
		out[t] = n
	}
	return out
}

func queryInt(ctx context.Context, pool *pgxpool.Pool, sql string) int64 {
	var n int64
	if err := pool.QueryRow(ctx, sql).Scan(&n); err != nil {
		benchkit.Logf("query: %v", err)
		return -1
	}
	return n
}
