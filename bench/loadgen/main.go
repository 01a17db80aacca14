// Command loadgen is a second, independent load generator for the events pipeline: it offers signed upstream posts to wabarelay_inbound at a fixed rate and counts what a
// webhook receiver running in a separate process gets, so that neither the receiver's TLS and
// HTTP work nor the generator's is accounted to (or competes inside) one process with the
// other, and neither shares code with bench/events beyond benchkit's setup helpers.
//
//	go build -o bin/caddy ./cmd/caddy
//	go run ./bench/loadgen -rate 5000 -duration 20s              # 5,000 events/s, 10 a post
//	go run ./bench/loadgen -rate 3000 -statuses 0.7              # 70% of the posts carry statuses
//	go run ./bench/loadgen -caddy /tmp/caddy-before -rate 5000   # another build
//
// It starts a fresh database (migrated, 100 channels, one org-scoped webhook for messages and
// message_status; dropped at the end), the receiver (this program re-executed with -receiver:
// HTTPS on loopback with a throwaway certificate, answering 204 at once, counting receipts and
// distinct event ids) and one Caddy with wabarelay_inbound and the product's delivery defaults
// (only retry_delays 1s 2s 5s set, as bench/events does). Posts are signed the way the upstream
// signs them: X-Hub-Signature-256 = "sha256=" + hex HMAC-SHA256 of the raw body, keyed with the
// app secret (computed here with crypto/hmac, not with the inbound package's helper).
//
// Each post holds -per-post items of one channel (channels in turn): text messages, or with
// probability -statuses "delivered" statuses of as many outgoing messages (each status also
// writes the message's row in messages). Load is open loop: posts are started on schedule
// whatever earlier ones do (at most -max-inflight at once; a post finding none free is skipped
// and counted). After -duration it waits (at most -drain) until the receiver has every accepted
// event. Reported: events accepted / offered, ack p50/p99, deliveries/s during the load and
// while draining, the backlog (delivery_queue rows not held) at a quarter and at the end of the
// load, the ledger (distinct events received = events accepted, duplicates), and the CPU time
// per offered event of Caddy, the bench database's Postgres backends, the other Postgres
// processes, the receiver and the generator, over the load window. Sustained: every post
// accepted, the backlog at the end at most that at a quarter plus a quarter second's worth, and
// deliveries/s during the load at least 95% of the offered rate.
//
// The files: config.go (flags, the Caddyfile), load.go (the posts, the data), receiver.go (the
// receiver process), report.go (the results).
package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"time"

	"github.com/wabarelay/wabarelay/bench/internal/benchkit"
)

func main() {
	c := parseFlags()
	if c.receiver != "" {
		if err := runReceiver(c.receiver); err != nil {
			benchkit.Fatalf("receiver: %v", err)
		}
		return
	}
	ctx := benchkit.SignalContext()
	if err := run(ctx, c); err != nil {
		benchkit.Fatalf("loadgen: %v", err)
	}
}

func run(ctx context.Context, c config) error {
	var cl benchkit.Cleanups
	defer cl.Run()
	run, err := benchkit.NewRun(&cl, c.caddyBin, "wabarelay-loadgen-")
	if err != nil {
		return err
	}
	runID, tmp := run.ID, run.Dir

	// receiver, in its own process
	rcv, hookURL, statsURL, caPath, err := startReceiver(ctx, tmp)
	if err != nil {
		return err
	}
	cl.Add(rcv.Stop)
	benchkit.Logf("receiver (pid %d) on %s", rcv.PID(), hookURL)

	// database and data
	dbName := "wabarelay_loadgen_" + runID
	dsn, err := benchkit.NewDatabase(ctx, c.pgDSN, dbName, &cl)
	if err != nil {
		return err
	}
	key := benchkit.NewKey()
	pnids := make([]string, c.channels)
	for i := range pnids {
		pnids[i] = fmt.Sprintf("1077%011d", i)
	}
	if err := createData(ctx, dsn, key, pnids, hookURL); err != nil {
		return err
	}
	pool, err := benchkit.Pool(ctx, dsn, &cl)
	if err != nil {
		return err
	}
	backlog := func() int64 {
		var n int64
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM delivery_queue WHERE status <> 'held'`).Scan(&n)
		return n
	}

	// Caddy
	port := benchkit.FreePort()
	cd, err := benchkit.StartCaddy(ctx, run.CaddyBin, filepath.Join(tmp, "caddy"), caddyfile(port, caPath), benchkit.CaddyEnv(dsn, key), port)
	if err != nil {
		return fmt.Errorf("caddy: %w", err)
	}
	cl.Add(cd.Stop)

	g := &generator{c: c, url: fmt.Sprintf("http://127.0.0.1:%d%s", port, inboundPath), pnids: pnids, runID: runID,
		client: benchkit.HTTPClient(c.maxInflight, c.maxInflight, 30*time.Second)}
	stats := newStatsReader(statsURL)

	// warm-up (not measured): 100 events
	if acc, _ := g.load(ctx, 200, 500*time.Millisecond, "w"); acc.accepted.Load() == 0 {
		return fmt.Errorf("warm-up: nothing accepted (see Caddy's log in %s)", tmp)
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if d, _, _ := stats.read(); d >= 100 && backlog() == 0 {
			break
		}
	}
	baseDistinct, baseReceipts, err := stats.read()
	if err != nil {
		return err
	}

	// the measured step
	procs := benchkit.Procs{"caddy": {cd.PID()}, "receiver": {rcv.PID()}, "loadgen": {os.Getpid()}}
	cpu0 := benchkit.SampleCPU(procs, dbName)
	start := time.Now()
	var quarterBacklog int64
	quarter := time.AfterFunc(c.duration/4, func() { quarterBacklog = backlog() })
	defer quarter.Stop()
	res, acks := g.load(ctx, c.rate, c.duration, "m")
	r := result{caddyBin: run.CaddyBin, receiverPID: rcv.PID(), loadAvg: run.LoadAvg, counts: res, acks: acks}
	r.loadTime = time.Since(start)
	r.cpu = benchkit.DiffCPU(cpu0, benchkit.SampleCPU(procs, dbName))
	r.endBacklog = backlog()
	runDistinct, _, _ := stats.read()
	r.accepted = res.accepted.Load()
	var drainTime time.Duration
	distinct, receipts := runDistinct, int64(0)
	for drainStart := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		distinct, receipts, _ = stats.read()
		if distinct-baseDistinct >= r.accepted && backlog() == 0 || time.Since(drainStart) > c.drain || ctx.Err() != nil {
			drainTime = time.Since(drainStart)
			break
		}
	}
	r.cpuAll = benchkit.DiffCPU(cpu0, benchkit.SampleCPU(procs, dbName)) // load and drain: all the work of the step
	r.quarterBacklog = quarterBacklog
	r.delivered = distinct - baseDistinct
	r.dups = (receipts - baseReceipts) - r.delivered
	r.duringLoad = float64(runDistinct-baseDistinct) / r.loadTime.Seconds()
	r.drainRate = float64(distinct-runDistinct) / math.Max(drainTime.Seconds(), 0.001)
	r.offered = int64(c.rate) * int64(c.duration/time.Second)

	report(c, &r)
	if r.delivered < r.accepted {
		return fmt.Errorf("%d accepted events not delivered within %s", r.accepted-r.delivered, c.drain)
	}
	return nil
}
