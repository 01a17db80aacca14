// Command events benchmarks the events pipeline: signed upstream webhook batches posted to wabarelay_inbound at a fixed offered rate (open loop), stored as events with
// their deliveries in Postgres, and delivered by the dispatcher to a local HTTPS receiver.
//
//	go build -o bin/caddy ./cmd/caddy
//	go run ./bench/events                                  # 1,000 events/s for 20 s
//	go run ./bench/events -rate 1000,2000,3000,5000        # one step per rate, in order
//	go run ./bench/events -rate 500 -webhooks 4            # 500 events/s = 2,000 deliveries/s
//	go run ./bench/events -rate 0 -overload 2000           # only the overload step (2 × 2,000 for 30 s)
//	go run ./bench/events -rate 0 -fairness 2000           # only the fairness step
//	go run ./bench/events -rate 1000 -duration 10s -ordering conversation   # + ordering none vs conversation
//
// It starts everything itself and removes everything at the end (also on Ctrl-C): a fresh
// database wabarelay_bench_<rand> on the Postgres named by -pg (dropped at the end), the HTTPS
// receiver (httptest, in this process, answering 204 at once) and one bin/caddy process with
// `admin off` on a free loopback port. Delivery runs with the product's defaults for workers and
// per_webhook (not written into the config; -workers and -per-webhook set them for experiments);
// the bench sets retry_delays 1s 2s 5s, timeout 10s and lease 60s (the last two the defaults).
// The report's header says which settings were used, and the Postgres durability settings
// (fsync, synchronous_commit) of the bench database.
//
// Data: one org, -channels active channels (one phone number id each) and -webhooks org-scoped
// webhooks (default 1), all subscribed to messages and message_status; webhook i points at the
// receiver's path /hook/<i>. Every accepted event thus fans out into -webhooks deliveries
// (deliveries = events × webhooks), which measures the dispatcher's sustained deliveries/s apart
// from the per-event inbound cost (the inbound handler stores each event once, whatever the fan-out).
//
// Load, per step: posts of -per-post text messages each (one entry, one change, one phone number
// id; post k on channel k mod channels), signed with X-Hub-Signature-256, scheduled at
// rate/per-post posts per second for -duration regardless of how earlier posts fare (open loop;
// at most -max-inflight posts outstanding, a post that finds no slot is counted as skipped).
// Every message id is unique in the run. After the offered load the step waits (at most -drain)
// until every accepted event has reached every webhook's path and the backlog is empty; the
// tables are then emptied (TRUNCATE events, deliveries, delivery_attempts and, when it exists,
// delivery_queue) before the next step.
//
// The backlog is the live deliveries that are not held for a paused webhook: with the queue
// table (delivery_queue: pending, in_flight and held rows) `SELECT count(*) FROM delivery_queue
// WHERE status <> 'held'`, without it (the schema before the queue table) the deliveries rows
// pending or in flight. Which one is used is decided once at start (to_regclass) and printed.
//
// Measured: inbound ack latency (send → 200) of every post; deliveries (distinct (webhook, event)
// pairs) received per second while load is offered and while draining; the backlog sampled
// every 500 ms; end-to-end latency per delivery (receive time at a webhook's path − send time of
// the post that carried the message, matched by the path and data.message.id); the ledger,
// exact per (webhook, event): events accepted (sum of "events" in the 200 answers) × webhooks =
// distinct (webhook, event) pairs delivered, duplicates (receipts beyond the first per pair;
// also counted per (path, webhook-id)), lost (accepted pairs never received at their webhook's
// path, nothing in the backlog); CPU time per offered event (and per delivery: per event /
// webhooks) of Caddy, of the bench database's Postgres backends, of the other Postgres
// processes (WAL writer, checkpointer, …) and of the bench itself (load + receiver), from
// /proc/<pid>/stat, over the offered-load window.
//
// A step counts as sustained when every offered post was accepted and the backlog did not grow:
// the backlog at the end of the offered load is at most that at a quarter of it plus a quarter
// second's worth of offered deliveries (events × webhooks).
//
// After the steps of -rate (-rate 0: none), two optional steps:
//
//   - Overload (-overload R): 2R events/s offered for -overload-duration (30 s), then drained
//     (at most max(-drain, 3 × -overload-duration)). Targets: deliveries/s during the offered
//     window ≥ 0.8 × R × webhooks; every post acknowledged, inbound ack p99 < 1 s; drain rate
//     (deliveries from the end of the load until the backlog is empty, per second) ≥ R ×
//     webhooks, when the load left at least a second's worth of it behind; the ledger.
//   - Ordering (-ordering conversation), after the -rate steps: -rate's first rate R for
//     -duration to the webhooks with ordering none, then with ordering conversation, the
//     messages spread over -conversations customers (wa_ids) in turn. Target: deliveries/s during
//     the load with conversation ≥ 0.9 × with none.
//   - Fairness (-fairness R), last: (a) baseline: R events/s for -duration to the -webhooks
//     webhooks (the "healthy" ones) alone; (b) the healthy webhooks are deleted (after the
//     baseline's tables were emptied: they have no deliveries) and a "paused" org-scoped webhook
//     (receiver path /paused, paused before any event) gets -held held deliveries, posted as
//     fast as the inbound handler takes them; it is never resumed; (c) the healthy webhooks are created
//     again (same paths) with a "slow" one (path /slow: answers after the delivery timeout + 1 s,
//     i.e. never in time), and R events/s are offered again. Only the healthy webhooks'
//     deliveries count for (a) and (c) (backlog and drain included); target: their deliveries/s
//     in (c) ≥ 0.9 × those in (a). The slow webhook's attempts and backlog and the paused
//     webhook's held deliveries are reported apart (any receipt at /paused fails the run).
//
// The files: config.go (flags, the Caddyfile), load.go (the load of a step, the data),
// steps.go (the fairness and ordering steps), receiver.go (the webhook receiver), queue.go (the
// backlog), report.go (the results).
package main

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/wabarelay/wabarelay/bench/internal/benchkit"
	"github.com/wabarelay/wabarelay/secretbox"
	"github.com/wabarelay/wabarelay/store"
)

func main() {
	c := parseFlags()
	ctx := benchkit.SignalContext()
	benchkit.Exit(ctx, run(ctx, c))
}

func run(ctx context.Context, c config) (err error) {
	var cl benchkit.Cleanups
	defer cl.RunAfter(ctx)

	r, err := benchkit.NewRun(&cl, c.caddyBin, "wabarelay-bench-events-")
	if err != nil {
		return err
	}
	runID, tmp := r.ID, r.Dir

	// ---- Postgres ----
	dbName := "wabarelay_bench_" + runID
	dsn, err := benchkit.NewDatabase(ctx, c.pgDSN, dbName, &cl)
	if err != nil {
		return err
	}
	// the server's version and durability, as the bench database's sessions see them
	settings := benchkit.Settings(ctx, dsn, "server_version", "fsync", "synchronous_commit")
	pgVersion, fsync, syncCommit := settings[0], settings[1], settings[2]
	pool, err := benchkit.Pool(ctx, dsn, &cl)
	if err != nil {
		return err
	}
	if c.historyDays > 0 {
		// A database in use for a while has a partition per day of its retention, and every
		// statement on a partitioned table could pay for each: the bench runs against that.
		if err := ensureHistory(ctx, pool, c.historyDays); err != nil {
			return err
		}
		benchkit.Logf("history partitions: %d days back (as after %d days in use)", c.historyDays, c.historyDays)
	}
	q, err := newQueue(ctx, pool)
	if err != nil {
		return err
	}
	benchkit.Logf("backlog: %s", q.desc())

	// ---- receiver ----
	rcv := newReceiver(c.webhooks)
	srv := httptest.NewUnstartedServer(rcv)
	srv.EnableHTTP2 = c.receiverH2
	srv.Config.ReadHeaderTimeout = 10 * time.Second
	srv.StartTLS()
	cl.Add(srv.Close)
	cl.Add(rcv.stop) // before srv.Close (cleanups run in reverse), which waits for the slow path's handlers
	caPath := filepath.Join(tmp, "receiver-ca.pem")
	if err := os.WriteFile(caPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		return err
	}
	receiverURL := srv.URL + hookPrefix // webhook i: receiverURL + i
	benchkit.Logf("receiver on %s<0..%d>", receiverURL, c.webhooks-1)

	// ---- data ----
	key := benchkit.NewKey()
	pnids := make([]string, c.channels)
	for i := range pnids {
		pnids[i] = fmt.Sprintf("1065%011d", i)
	}
	orgID, healthy, err := createData(ctx, dsn, key, pnids, receiverURL, c.webhooks)
	if err != nil {
		return err
	}
	box, err := secretbox.New(key)
	if err != nil {
		return err
	}
	st := store.New(pool, box) // webhooks of the fairness step

	// ---- Caddy ----
	port := benchkit.FreePort()
	env := benchkit.CaddyEnv(caddyDSN(c, dsn), key)
	cd, err := benchkit.StartCaddy(ctx, r.CaddyBin, filepath.Join(tmp, "caddy"), caddyfile(c, port, caPath), env, port)
	if err != nil {
		return fmt.Errorf("caddy: %w", err)
	}
	cl.Add(cd.Stop)
	cl.Add(rcv.stop) // before Caddy stops: it need not wait for the slow path's attempts
	if c.showLogs {
		cl.Add(func() { fmt.Fprintf(os.Stderr, "---- caddy log ----\n%s", cd.Logs()) })
	}

	ld := newLoader(fmt.Sprintf("http://127.0.0.1:%d%s", port, inboundPath), pnids, runID, c)
	ld.rc, ld.q, ld.dbName = rcv, q, dbName
	ld.procs = benchkit.Procs{pidBench: {os.Getpid()}, "caddy": {cd.PID()}}
	if c.pgstat > 0 {
		if ld.pgstat, err = newPGStat(ctx, pool, c.pgstat); err != nil {
			return err
		}
	}

	// ---- warm-up: connections and caches, not measured ----
	benchkit.Logf("warm-up: 100 events at 200 events/s (× %d %s)", c.webhooks, plural(c.webhooks, "webhook", "webhooks"))
	w := ld.step(ctx, stepSpec{name: "w", rate: 200, d: 500 * time.Millisecond})
	if err := ctx.Err(); err != nil {
		return err
	}
	if w.lost() != 0 || w.accepted == 0 {
		return fmt.Errorf("warm-up: %d events accepted, %d deliveries lost, %d post errors (%s); see -v for Caddy's log",
			w.accepted, w.lost(), w.postErrors, w.errorSummary())
	}
	if err := q.truncate(ctx); err != nil {
		return err
	}

	logStep := func(r *stepResult) {
		benchkit.Logf("  accepted %d/%d events, deliveries/s run %.0f drain %.0f, backlog %d → %d → %d, e2e p50 %.1f ms p99 %.1f ms, "+
			"ack p99 %.1f ms, deliveries lost %d, dup %d, sustained %v",
			r.accepted, r.offered, r.runRate(), r.drainRate(), r.pendingStart, r.pendingQuarter, r.pendingEnd,
			r.e2e.p50, r.e2e.p99, r.ack.p99, r.lost(), r.duplicates, r.sustained())
	}
	var results []*stepResult
	for i, rate := range c.rates {
		benchkit.Logf("step %d: %d events/s × %d %s = %d deliveries/s for %s (%d per post, %.0f posts/s)",
			i+1, rate, c.webhooks, plural(c.webhooks, "webhook", "webhooks"), rate*c.webhooks, c.duration, c.perPost, float64(rate)/float64(c.perPost))
		r := ld.step(ctx, stepSpec{name: strconv.Itoa(i + 1), rate: rate, d: c.duration, drain: c.drain})
		if err := ctx.Err(); err != nil {
			return err
		}
		results = append(results, r)
		logStep(r)
		if err := q.truncate(ctx); err != nil {
			return err
		}
	}

	// ---- ordering: R with ordering none, then conversation ----
	var ord []*stepResult
	if c.ordering != "" {
		ord, err = runOrdering(ctx, c, ld, st, orgID, healthy, q)
		results = append(results, ord...)
		if err != nil {
			return err
		}
	}

	// ---- overload: 2R for -overload-duration, then the drain ----
	var over *stepResult
	if c.overload > 0 {
		limit := min(max(c.drain, 3*c.overloadDur), 5*time.Minute)
		benchkit.Logf("overload: 2 × %d = %d events/s (× %d %s) for %s, then drain (at most %s)",
			c.overload, 2*c.overload, c.webhooks, plural(c.webhooks, "webhook", "webhooks"), c.overloadDur, limit)
		over = ld.step(ctx, stepSpec{name: "overload", kind: kindOverload, rate: 2 * c.overload, d: c.overloadDur, drain: limit})
		if err := ctx.Err(); err != nil {
			return err
		}
		over.nominal = c.overload
		results = append(results, over)
		logStep(over)
		if err := q.truncate(ctx); err != nil {
			return err
		}
	}

	// ---- fairness, last (the slow webhook's attempts and the held deliveries stay) ----
	var fair *fairness
	if c.fairness > 0 {
		fair, err = runFairness(ctx, c, ld, st, orgID, healthy, srv.URL)
		if fair != nil {
			for _, r := range []*stepResult{fair.base, fair.loaded} {
				if r != nil {
					results = append(results, r)
				}
			}
		}
		if err != nil {
			return err
		}
	}

	machine := benchkit.Machine(r.LoadAvg) + fmt.Sprintf(", Postgres %s (fsync %s, synchronous_commit %s)", pgVersion, fsync, syncCommit)
	ok := report(c, results, over, fair, ord, rcv, q, machine)
	if !ok {
		return errors.New("ledger check failed (see above)")
	}
	return nil
}
