// Command events benchmarks the events pipeline (issue 5, "Benchmark"): signed upstream webhook
// batches posted to wabarelay_inbound at a fixed offered rate (open loop), stored as events with
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
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"github.com/wabarelay/wabarelay/bench/internal/benchkit"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wabarelay/wabarelay/inbound"
	"github.com/wabarelay/wabarelay/secretbox"
	"github.com/wabarelay/wabarelay/store"
)

const (
	wabaID      = "102290129340398"
	appSecret   = "bench-app-secret-0123456789"
	verifyToken = "bench-verify-token"
	inboundPath = "/webhooks/upstream"
)

type config struct {
	pgDSN         string
	caddyBin      string
	rates         []int
	channels      int
	perPost       int
	duration      time.Duration
	drain         time.Duration
	maxInflight   int
	poolMaxConns  int
	workers       int
	perWebhook    int
	webhooks      int
	receiverH2    bool
	showLogs      bool
	historyDays   int
	overload      int           // R of the overload step (2R offered); 0: no overload step
	overloadDur   time.Duration // the overload step's offered-load time
	fairness      int           // R of the fairness step; 0: no fairness step
	held          int           // held deliveries of the fairness step's paused webhook
	ordering      string        // "conversation": the ordering step (none, then conversation, at -rate's first rate); "": off
	conversations int           // customers (wa_ids) the messages are spread over, one conversation each per channel
}

// deliveryTimeout is the delivery timeout the bench configures (the product's default); the
// fairness step's slow receiver answers a second after it.
const deliveryTimeout = 10 * time.Second

func main() {
	var c config
	var rates string
	flag.StringVar(&c.pgDSN, "pg", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
		"Postgres admin DSN (URL form); the run creates and drops its own database there")
	flag.StringVar(&c.caddyBin, "caddy", "bin/caddy", "the Caddy binary with wabarelay (go build -o bin/caddy ./cmd/caddy)")
	flag.StringVar(&rates, "rate", "1000", "offered events/s; a comma-separated list runs one step per rate, in order (0: no such step, e.g. only -overload or -fairness)")
	flag.IntVar(&c.channels, "channels", 100, "active channels (phone number ids) the posts are spread over")
	flag.IntVar(&c.perPost, "per-post", 10, "messages (events) per upstream post")
	flag.DurationVar(&c.duration, "duration", 20*time.Second, "offered-load time per step (at most 30s)")
	flag.DurationVar(&c.drain, "drain", 60*time.Second, "longest wait for the backlog to drain after each step")
	flag.IntVar(&c.maxInflight, "max-inflight", 2000, "most posts outstanding at once; a post finding none free is skipped (counted)")
	flag.IntVar(&c.poolMaxConns, "pool-max-conns", 0, "pool_max_conns added to Caddy's database DSN (0: the pgxpool default, max(4, CPUs))")
	flag.IntVar(&c.workers, "workers", 0, "delivery workers (0: not set, the product's default)")
	flag.IntVar(&c.perWebhook, "per-webhook", 0, "delivery per_webhook cap (0: not set, the product's default)")
	flag.IntVar(&c.webhooks, "webhooks", 1, "org-scoped webhooks (each on its own receiver path); every event fans out into this many deliveries (at most 64)")
	flag.BoolVar(&c.receiverH2, "receiver-h2", false, "the receiver offers HTTP/2 (default HTTP/1.1)")
	flag.BoolVar(&c.showLogs, "v", false, "print Caddy's log at the end")
	flag.IntVar(&c.historyDays, "history-days", 30, "daily history partitions created back from today before the run (0: only the migration's), as a database in use for that long has them (the default retention is 30 days)")
	flag.IntVar(&c.overload, "overload", 0, "overload step after the others: offer 2 × this many events/s, then drain (0: off)")
	flag.DurationVar(&c.overloadDur, "overload-duration", 30*time.Second, "offered-load time of the overload step (at most 60s)")
	flag.IntVar(&c.fairness, "fairness", 0, "fairness step, last: this many events/s without, then with a slow webhook and a paused one holding -held deliveries (0: off)")
	flag.IntVar(&c.held, "held", 50000, "held deliveries the fairness step's paused webhook holds")
	flag.StringVar(&c.ordering, "ordering", "", `"conversation": after the -rate steps, the ordering step: -rate's first rate with the webhooks' ordering none, then conversation (ratio reported); "" or "none": off`)
	flag.IntVar(&c.conversations, "conversations", 1000, "customers (wa_ids) the messages are spread over, in turn")
	flag.Parse()
	if flag.NArg() > 0 {
		benchkit.Fatalf("unexpected arguments: %v", flag.Args())
	}
	if strings.TrimSpace(rates) != "0" {
		for _, s := range strings.Split(rates, ",") {
			r, err := strconv.Atoi(strings.TrimSpace(strings.ReplaceAll(s, "_", "")))
			if err != nil || r <= 0 {
				benchkit.Fatalf("-rate: invalid rate %q", s)
			}
			c.rates = append(c.rates, r)
		}
	}
	if len(c.rates) == 0 && c.overload == 0 && c.fairness == 0 {
		benchkit.Fatalf("-rate 0 runs no step: add -overload or -fairness")
	}
	if c.channels < 1 || c.perPost < 1 || c.maxInflight < 1 || c.poolMaxConns < 0 {
		benchkit.Fatalf("-channels, -per-post and -max-inflight must be positive")
	}
	if c.workers < 0 || c.perWebhook < 0 {
		benchkit.Fatalf("-workers and -per-webhook must be positive, or 0 for the product's default")
	}
	if c.overload < 0 || c.fairness < 0 || c.held < 1 {
		benchkit.Fatalf("-overload and -fairness must be 0 (off) or positive, -held positive")
	}
	if c.overloadDur <= 0 || c.overloadDur > 60*time.Second {
		benchkit.Fatalf("-overload-duration must be in (0, 60s]")
	}
	if c.ordering == store.OrderingNone {
		c.ordering = ""
	}
	if (c.ordering != "" && c.ordering != store.OrderingConversation) || c.conversations < 1 {
		benchkit.Fatalf("-ordering must be conversation, none or empty, -conversations positive")
	}
	if c.ordering != "" && len(c.rates) == 0 {
		benchkit.Fatalf("-ordering needs a -rate")
	}
	if c.webhooks < 1 || c.webhooks > 64 {
		benchkit.Fatalf("-webhooks must be in [1, 64]")
	}
	if c.duration <= 0 || c.duration > 30*time.Second || c.drain <= 0 || c.drain > 5*time.Minute {
		benchkit.Fatalf("-duration must be in (0, 30s] and -drain in (0, 5m]")
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second Ctrl-C kills at once (the child still dies with us: Pdeathsig)
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
	tmp, err := os.MkdirTemp("", "wabarelay-bench-events-")
	if err != nil {
		return err
	}
	cl.Add(func() { os.RemoveAll(tmp) })

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
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	cl.Add(pool.Close)
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
	// durability, as the bench database's sessions see it
	fsync, syncCommit := "?", "?"
	_ = pool.QueryRow(ctx, "SHOW fsync").Scan(&fsync)
	_ = pool.QueryRow(ctx, "SHOW synchronous_commit").Scan(&syncCommit)

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
	key := make([]byte, 32)
	rand.Read(key)
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
	caddyDSN := dsn
	if c.poolMaxConns > 0 {
		sep := "?"
		if strings.Contains(caddyDSN, "?") {
			sep = "&"
		}
		if strings.HasPrefix(caddyDSN, "postgres") {
			caddyDSN += sep + "pool_max_conns=" + strconv.Itoa(c.poolMaxConns)
		} else {
			caddyDSN += " pool_max_conns=" + strconv.Itoa(c.poolMaxConns)
		}
	}
	// workers and per_webhook: written only when set (-workers, -per-webhook); otherwise the
	// product's defaults apply.
	var tuning string
	if c.workers > 0 {
		tuning += fmt.Sprintf("\n\t\t\tworkers      %d", c.workers)
	}
	if c.perWebhook > 0 {
		tuning += fmt.Sprintf("\n\t\t\tper_webhook  %d", c.perWebhook)
	}
	cfg := fmt.Sprintf(`{
	admin off
	persist_config off
	default_bind 127.0.0.1
	wabarelay {
		database       {env.WBR_BENCH_DATABASE}
		encryption_key {env.WBR_BENCH_KEY}
		meta {
			app_secret   %s
			verify_token %s
		}
		delivery {
			retry_delays 1s 2s 5s
			timeout      %s
			lease        60s%s
			root_ca      %s
			allow_private_targets
		}
	}
}
http://127.0.0.1:%d {
	handle %s {
		wabarelay_inbound
	}
}
`, appSecret, verifyToken, deliveryTimeout, tuning, caPath, port, inboundPath)
	env := []string{"WBR_BENCH_DATABASE=" + caddyDSN, "WBR_BENCH_KEY=" + base64.StdEncoding.EncodeToString(key)}
	cd, err := benchkit.StartCaddy(ctx, caddyBin, filepath.Join(tmp, "caddy"), cfg, env, port)
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
	ld.procs = cpuProcs{pidBench: os.Getpid(), "caddy": cd.PID()}

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

	machine := fmt.Sprintf("%s/%s, %d CPUs, load average %s at start, %s, Postgres %s (fsync %s, synchronous_commit %s)",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), loadAvg, runtime.Version(), pgVersion, fsync, syncCommit)
	ok := report(c, results, over, fair, ord, rcv, q, machine)
	if !ok {
		return errors.New("ledger check failed (see above)")
	}
	return nil
}

// ---- fairness ----

// fairness is the fairness step: the healthy webhooks' deliveries without (base) and with
// (loaded) a slow webhook and a paused one holding held deliveries.
type fairness struct {
	rate         int
	base, loaded *stepResult
	held         int           // events posted for the paused webhook alone (accepted)
	heldQueued   int64         // its queued deliveries before (c) (held; pending rows before the queue table)
	heldTook     time.Duration // time to post them
	heldAtEnd    int64         // its queued deliveries at the end of (c)
	heldAtEndQ   int64         // … of which in status held (queue table only)
	paused, slow uuid.UUID
	slowOwed     int   // deliveries owed to the slow webhook: events accepted in (c)
	slowAttempts int64 // requests received at the slow path during (c) and its drain
	slowAnswered int64 // … answered (after the timeout: too late for the dispatcher)
	slowQueued   int64 // its queued deliveries at the end of (c)
	pausedRcpts  int64 // receipts at the paused path, whole run (must be 0)
	queueTable   bool  // held deliveries are delivery_queue rows in status held
}

func (f *fairness) ratio() float64 {
	if f.base == nil || f.loaded == nil || f.base.runRate() == 0 {
		return 0
	}
	return f.loaded.runRate() / f.base.runRate()
}

// runFairness runs the fairness step's three parts (see the package comment). The webhooks
// are created with the store's own methods (CreateWebhook, SetWebhookStatus, DeleteWebhook),
// as the management API would.
func runFairness(ctx context.Context, c config, ld *loader, st *store.Store, orgID uuid.UUID, healthy []uuid.UUID, receiverBase string) (*fairness, error) {
	f := &fairness{rate: c.fairness, queueTable: ld.q.table}
	hooks := plural(c.webhooks, "webhook", "webhooks")

	// (a) baseline: the healthy webhooks alone
	benchkit.Logf("fairness (a) baseline: %d events/s × %d healthy %s for %s", c.fairness, c.webhooks, hooks, c.duration)
	f.base = ld.step(ctx, stepSpec{name: "fairness-a", kind: kindFairBase, rate: c.fairness, d: c.duration, drain: c.drain})
	if err := ctx.Err(); err != nil {
		return f, err
	}
	benchkit.Logf("  healthy deliveries/s %.0f, e2e p99 %.1f ms, lost %d", f.base.runRate(), f.base.e2e.p99, f.base.lost())
	if err := ld.q.truncate(ctx); err != nil {
		return f, err
	}

	// (b) the paused webhook alone, and its held deliveries. The healthy webhooks have no
	// deliveries left (truncated): deleting them only keeps (b)'s events from reaching them.
	for _, id := range healthy {
		if err := st.DeleteWebhook(ctx, orgID, id); err != nil {
			return f, fmt.Errorf("fairness: delete healthy webhook: %w", err)
		}
	}
	pw, _, err := st.CreateWebhook(ctx, orgID, store.NewWebhook{Name: "bench paused", URL: receiverBase + pausedPath,
		Events: []string{store.EventMessages, store.EventMessageStatus}})
	if err != nil {
		return f, fmt.Errorf("fairness: create paused webhook: %w", err)
	}
	if _, err := st.SetWebhookStatus(ctx, orgID, pw.ID, store.WebhookPaused); err != nil {
		return f, fmt.Errorf("fairness: pause webhook: %w", err)
	}
	f.paused = pw.ID
	benchkit.Logf("fairness (b): %d events for the paused webhook alone, as fast as the inbound handler takes them", c.held)
	start := time.Now()
	n, err := ld.fill(ctx, c.held)
	f.held, f.heldTook = n, time.Since(start)
	if err != nil {
		return f, fmt.Errorf("fairness: held deliveries: %w", err)
	}
	byHook, err := ld.q.byHook(ctx)
	if err != nil {
		return f, err
	}
	f.heldQueued = byHook[pw.ID].total
	benchkit.Logf("  %d events accepted in %s (%.0f/s); the paused webhook holds %d deliveries",
		n, f.heldTook.Round(time.Millisecond), float64(n)/f.heldTook.Seconds(), f.heldQueued)

	// (c) the healthy webhooks again, the slow one, the paused one holding
	healthy, err = createWebhooks(ctx, st, orgID, receiverBase+hookPrefix, c.webhooks)
	if err != nil {
		return f, err
	}
	sw, _, err := st.CreateWebhook(ctx, orgID, store.NewWebhook{Name: "bench slow", URL: receiverBase + slowPath,
		Events: []string{store.EventMessages, store.EventMessageStatus}})
	if err != nil {
		return f, fmt.Errorf("fairness: create slow webhook: %w", err)
	}
	f.slow = sw.ID
	benchkit.Logf("fairness (c): %d events/s × %d healthy %s, with the slow webhook (answers after %s) and the paused one holding %d",
		c.fairness, c.webhooks, hooks, ld.rc.slowDelay, f.heldQueued)
	slow0 := ld.rc.slowReceipts.Load()
	slowAns0 := ld.rc.slowAnswered.Load()
	f.loaded = ld.step(ctx, stepSpec{name: "fairness-c", kind: kindFairLoaded, rate: c.fairness, d: c.duration, drain: c.drain,
		exclude: []uuid.UUID{sw.ID, pw.ID}})
	if err := ctx.Err(); err != nil {
		return f, err
	}
	f.slowOwed = f.loaded.accepted
	f.slowAttempts = ld.rc.slowReceipts.Load() - slow0
	f.slowAnswered = ld.rc.slowAnswered.Load() - slowAns0
	f.pausedRcpts = ld.rc.pausedReceipts.Load()
	if byHook, err = ld.q.byHook(ctx); err != nil {
		return f, err
	}
	f.slowQueued = byHook[sw.ID].total
	f.heldAtEnd, f.heldAtEndQ = byHook[pw.ID].total, byHook[pw.ID].held
	benchkit.Logf("  healthy deliveries/s %.0f (%.2f × baseline), e2e p99 %.1f ms, lost %d; slow: %d owed, %d attempts, %d queued; paused holds %d",
		f.loaded.runRate(), f.ratio(), f.loaded.e2e.p99, f.loaded.lost(), f.slowOwed, f.slowAttempts, f.slowQueued, f.heldAtEnd)
	return f, nil
}

// ---- queue (backlog) ----

// queue reads the backlog and empties the tables between steps, on the schema it found at
// start: with the queue table delivery_queue (live deliveries: pending, in_flight, held) or,
// before it, with deliveries (every delivery; live ones pending or in_flight).
type queue struct {
	pool  *pgxpool.Pool
	table bool // delivery_queue exists
}

func newQueue(ctx context.Context, pool *pgxpool.Pool) (*queue, error) {
	q := &queue{pool: pool}
	if err := pool.QueryRow(ctx, `SELECT to_regclass('delivery_queue') IS NOT NULL`).Scan(&q.table); err != nil {
		return nil, fmt.Errorf("look for delivery_queue: %w", err)
	}
	return q, nil
}

func (q *queue) desc() string {
	if q.table {
		return "delivery_queue rows not held (status <> 'held')"
	}
	return "deliveries pending or in flight (no delivery_queue table: the schema before the queue)"
}

// pending returns the backlog, leaving out the deliveries of the webhooks exclude (-1 on error).
// Before the queue table, held deliveries are pending rows of a paused webhook: a step with a
// paused webhook excludes it.
func (q *queue) pending(ctx context.Context, exclude []uuid.UUID) int64 {
	var sql string
	var args []any
	switch {
	case q.table && len(exclude) == 0:
		sql = `SELECT count(*) FROM delivery_queue WHERE status <> 'held'`
	case q.table:
		sql, args = `SELECT count(*) FROM delivery_queue WHERE status <> 'held' AND webhook_id <> ALL ($1)`, []any{exclude}
	case len(exclude) == 0:
		sql = `
			SELECT (SELECT count(*) FROM deliveries WHERE status = 'pending' AND attempts = 0)
			     + (SELECT count(*) FROM deliveries WHERE status = 'pending' AND attempts > 0)
			     + (SELECT count(*) FROM deliveries WHERE status = 'in_flight')`
	default:
		sql, args = `SELECT count(*) FROM deliveries WHERE status IN ('pending', 'in_flight') AND webhook_id <> ALL ($1)`, []any{exclude}
	}
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var n int64
	if err := q.pool.QueryRow(qctx, sql, args...).Scan(&n); err != nil {
		return -1
	}
	return n
}

type hookQueue struct{ total, held int64 }

// byHook returns the live deliveries per webhook (held: those in status held, queue table only).
func (q *queue) byHook(ctx context.Context) (map[uuid.UUID]hookQueue, error) {
	sql := `SELECT webhook_id, count(*), count(*) FILTER (WHERE status = 'held') FROM delivery_queue GROUP BY 1`
	if !q.table {
		sql = `SELECT webhook_id, count(*), 0 FROM deliveries WHERE status IN ('pending', 'in_flight') GROUP BY 1`
	}
	rows, err := q.pool.Query(ctx, sql)
	if err != nil {
		return nil, fmt.Errorf("backlog per webhook: %w", err)
	}
	out := map[uuid.UUID]hookQueue{}
	for rows.Next() {
		var id uuid.UUID
		var h hookQueue
		if err := rows.Scan(&id, &h.total, &h.held); err != nil {
			rows.Close()
			return nil, fmt.Errorf("backlog per webhook: %w", err)
		}
		out[id] = h
	}
	return out, rows.Err()
}

// truncate empties the events and their deliveries (the queue table too, when it exists).
func (q *queue) truncate(ctx context.Context) error {
	sql := `TRUNCATE delivery_attempts, deliveries, events`
	if q.table {
		sql = `TRUNCATE delivery_queue, delivery_attempts, deliveries, events`
	}
	if _, err := q.pool.Exec(ctx, sql); err != nil {
		return fmt.Errorf("truncate: %w", err)
	}
	return nil
}

// ---- receiver ----

// hookPrefix is the receiver path prefix: webhook i delivers to hookPrefix + i. The fairness
// step's slow and paused webhooks deliver to slowPath and pausedPath.
const (
	hookPrefix = "/hook/"
	slowPath   = "/slow"
	pausedPath = "/paused"
)

// receiver answers 204 to every delivery and records, for the current step, the first receipt
// of each (webhook, event) pair (webhook by the request path, event by its message id) and the
// receipts per (path, webhook-id). At slowPath it answers only after slowDelay (longer than the
// delivery timeout), or not at all if the request is cancelled or the bench ends first.
type receiver struct {
	webhooks  int
	slowDelay time.Duration
	done      chan struct{} // closed when the bench ends: slow handlers return
	stopOnce  sync.Once
	cur       atomic.Pointer[stepState]
	total     atomic.Int64 // every receipt at a healthy webhook's path, all steps
	mismatch  atomic.Int64 // webhook-id header ≠ body id, or unparsable body
	badPath   atomic.Int64 // receipts on a path that is no webhook's
	stray     atomic.Int64 // receipts for another step's events

	slowReceipts   atomic.Int64 // requests at slowPath
	slowAnswered   atomic.Int64 // … answered after slowDelay
	pausedReceipts atomic.Int64 // requests at pausedPath (a paused webhook's: none expected)
}

func newReceiver(webhooks int) *receiver {
	return &receiver{webhooks: webhooks, slowDelay: deliveryTimeout + time.Second, done: make(chan struct{})}
}

// stop makes the slow path's handlers return (httptest.Server.Close waits for them).
func (rc *receiver) stop() { rc.stopOnce.Do(func() { close(rc.done) }) }

func (rc *receiver) serveSlow(w http.ResponseWriter, r *http.Request) {
	rc.slowReceipts.Add(1)
	io.Copy(io.Discard, io.LimitReader(r.Body, 1<<20))
	t := time.NewTimer(rc.slowDelay)
	defer t.Stop()
	select {
	case <-t.C:
		rc.slowAnswered.Add(1)
		w.WriteHeader(http.StatusNoContent)
	case <-r.Context().Done(): // the dispatcher gave up (timeout)
	case <-rc.done:
		panic(http.ErrAbortHandler) // the bench ends: close the connection, no answer
	}
}

// hookIndex returns the webhook index of a receiver path (hookPrefix + i).
func (rc *receiver) hookIndex(path string) (int, bool) {
	rest, ok := strings.CutPrefix(path, hookPrefix)
	if !ok {
		return 0, false
	}
	h, err := strconv.Atoi(rest)
	if err != nil || h < 0 || h >= rc.webhooks || strconv.Itoa(h) != rest {
		return 0, false
	}
	return h, true
}

type deliveredEvent struct {
	ID        string `json:"id"`
	CreatedAt string `json:"created_at"`
	Data      struct {
		Message struct {
			ID string `json:"id"`
		} `json:"message"`
	} `json:"data"`
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case slowPath:
		rc.serveSlow(w, r)
		return
	case pausedPath:
		rc.pausedReceipts.Add(1)
		w.WriteHeader(http.StatusNoContent)
		return
	}
	now := time.Now()
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	w.WriteHeader(http.StatusNoContent)
	rc.total.Add(1)
	var ev deliveredEvent
	hid := r.Header.Get("webhook-id")
	if err := json.Unmarshal(body, &ev); err != nil || ev.ID == "" || ev.ID != hid {
		rc.mismatch.Add(1)
	}
	hook, ok := rc.hookIndex(r.URL.Path)
	if !ok {
		rc.badPath.Add(1)
		return
	}
	st := rc.cur.Load()
	if st == nil {
		rc.stray.Add(1)
		return
	}
	idx, ok := st.messageIndex(ev.Data.Message.ID)
	if !ok {
		rc.stray.Add(1)
		return
	}
	st.receipts.Add(1)
	if st.recv[st.pair(hook, idx)].CompareAndSwap(0, now.UnixNano()) {
		st.distinct.Add(1)
		st.perHook[hook].Add(1)
	} else {
		st.dupes.Add(1)
	}
	st.mu.Lock()
	st.byHookID[hookReceipt{hook, hid}]++
	st.mu.Unlock()
}

// hookReceipt is a webhook-id as received at one webhook's path.
type hookReceipt struct {
	hook int
	id   string
}

// stepState is one step's per-delivery bookkeeping. Message i is in post i / perPost; its
// delivery to webhook h is pair h*events + i.
type stepState struct {
	prefix   string // "wamid.<run>.<step>."
	perPost  int
	events   int            // messages offered in the step (posts × perPost)
	sent     []int64        // per post: send time (unix ns), 0 if not sent
	recv     []atomic.Int64 // per (webhook, message) pair: first receive time (unix ns), 0 if none
	perHook  []atomic.Int64 // per webhook: distinct messages received
	receipts atomic.Int64
	distinct atomic.Int64 // distinct (webhook, message) pairs received
	dupes    atomic.Int64 // receipts of an already received (webhook, message) pair
	mu       sync.Mutex
	byHookID map[hookReceipt]int
}

func (s *stepState) pair(hook, msg int) int { return hook*s.events + msg }

func (s *stepState) messageIndex(wamid string) (int, bool) {
	rest, ok := strings.CutPrefix(wamid, s.prefix)
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(rest)
	if err != nil || i < 0 || i >= s.events {
		return 0, false
	}
	return i, true
}

// ---- load ----

type loader struct {
	url    string
	pnids  []string
	runID  string
	c      config
	client *http.Client

	rc     *receiver
	q      *queue
	procs  cpuProcs
	dbName string
}

// stepKind tells the steps apart in the report.
type stepKind int

const (
	kindRate       stepKind = iota // a step of -rate (and the warm-up)
	kindOverload                   // 2 × -overload
	kindFairBase                   // fairness (a): the healthy webhooks alone
	kindFairLoaded                 // fairness (c): with the slow webhook and the paused one's held deliveries
)

// stepSpec is one step: rate events/s offered for d, then at most drain to drain (0: 30 s, the
// warm-up). exclude: webhooks whose deliveries the backlog leaves out (the fairness step's slow
// and paused ones: the step waits for the healthy webhooks only).
type stepSpec struct {
	name    string
	kind    stepKind
	rate    int
	d       time.Duration
	drain   time.Duration
	exclude []uuid.UUID
}

func newLoader(u string, pnids []string, runID string, c config) *loader {
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        c.maxInflight,
		MaxIdleConnsPerHost: c.maxInflight,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	return &loader{url: u, pnids: pnids, runID: runID, c: c, client: &http.Client{Transport: tr, Timeout: 30 * time.Second}}
}

// body returns post p's upstream batch: perPost messages to channel pnid, message ids
// prefix+index.
func (l *loader) body(buf []byte, prefix, pnid string, first, n int) []byte {
	buf = append(buf[:0], `{"object":"whatsapp_business_account","entry":[{"id":"`+wabaID+`","changes":[{"field":"messages","value":{"messaging_product":"whatsapp","metadata":{"display_phone_number":"1","phone_number_id":"`...)
	buf = append(buf, pnid...)
	buf = append(buf, `"},"contacts":[{"profile":{"name":"A"},"wa_id":"1555"}],"messages":[`...)
	// The upstream's timestamp is when the message was sent: now, as for live traffic.
	sent := strconv.FormatInt(time.Now().Unix(), 10)
	for i := 0; i < n; i++ {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = append(buf, `{"from":"1555`...)
		buf = strconv.AppendInt(buf, int64((first+i)%l.c.conversations), 10)
		buf = append(buf, `","id":"`...)
		buf = append(buf, prefix...)
		buf = strconv.AppendInt(buf, int64(first+i), 10)
		buf = append(buf, `","timestamp":"`...)
		buf = append(buf, sent...)
		buf = append(buf, `","type":"text","text":{"body":"hi"}}`...)
	}
	buf = append(buf, `]}}]}]}`...)
	return buf
}

// fill posts n events (message ids "wamid.<run>.held.<i>") closed-loop, fillBatch messages a
// post and fillConc posts at a time, as fast as the inbound handler takes them, and returns how many
// were accepted. Every post must get a 200 for all its events.
func (l *loader) fill(ctx context.Context, n int) (int, error) {
	const fillBatch, fillConc = 100, 4
	prefix := "wamid." + l.runID + ".held."
	var next, accepted atomic.Int64
	var emu sync.Mutex
	var firstErr error
	fail := func(err error) {
		emu.Lock()
		defer emu.Unlock()
		if firstErr == nil {
			firstErr = err
		}
	}
	var wg sync.WaitGroup
	for range fillConc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var buf []byte
			for ctx.Err() == nil {
				first := int(next.Add(fillBatch)) - fillBatch
				if first >= n {
					return
				}
				k := min(fillBatch, n-first)
				buf = l.body(buf, prefix, l.pnids[(first/fillBatch)%len(l.pnids)], first, k)
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, l.url, bytes.NewReader(buf))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set(inbound.SignatureHeader, inbound.Sign(appSecret, buf))
				resp, err := l.client.Do(req)
				if err != nil {
					fail(err)
					return
				}
				rb, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
				resp.Body.Close()
				var ans struct{ Events int }
				if resp.StatusCode != http.StatusOK || json.Unmarshal(rb, &ans) != nil || ans.Events != k {
					fail(fmt.Errorf("post of %d events: %d %s", k, resp.StatusCode, strings.TrimSpace(string(rb))))
					return
				}
				accepted.Add(int64(ans.Events))
			}
		}()
	}
	wg.Wait()
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	return int(accepted.Load()), firstErr
}

type sample struct {
	at        time.Duration // since the start of the offered load
	pending   int64
	delivered int64 // distinct (webhook, event) pairs received so far
}

type stepResult struct {
	name                 string
	kind                 stepKind
	nominal              int // overload: R (the step offers 2R)
	rate, posts, offered int // offered: events
	webhooks             int // deliveries per accepted event
	duration             time.Duration

	skipped, postErrors  int
	accepted             int
	ack                  quantiles
	e2e                  quantiles
	runDelivered         int64 // distinct (webhook, event) pairs received during the offered load
	drainDelivered       int64 // … and while draining
	drainTime            time.Duration
	drained              bool
	pendingStart         int64 // the backlog (see queue.pending) at the start of the offered load
	pendingQuarter       int64 // … at a quarter of it
	pendingEnd           int64 // … at its end
	pendingMax           int64
	pendingAfter         int64 // … when the drain ended (0 when drained)
	distinct, duplicates int64 // (webhook, event) pairs
	receipts             int64
	hookIDs, hookIDDupes int     // distinct (path, webhook-id) pairs, receipts beyond the first of one
	perHook              []int64 // per webhook: distinct events received
	perHookUnacked       []int64 // per webhook: … of which from posts that did not get a 200
	unacked              int64   // (webhook, event) pairs received from posts that did not get a 200
	samples              []sample
	cpu                  map[string]time.Duration
	errMu                sync.Mutex
	errs                 map[string]int
}

// expected is the deliveries owed: accepted events × webhooks.
func (r *stepResult) expected() int64 { return int64(r.accepted) * int64(r.webhooks) }

// undelivered is accepted (webhook, event) pairs not received when the step ended, summed per
// webhook (so that one webhook's surplus cannot hide another's gap).
func (r *stepResult) undelivered() int64 {
	var n int64
	for h := range r.webhooks {
		n += max(int64(r.accepted)-(r.perHook[h]-r.perHookUnacked[h]), 0)
	}
	return n
}

// lost is undelivered (webhook, event) pairs with no delivery pending in the database either.
func (r *stepResult) lost() int64 {
	return max(r.undelivered()-max(r.pendingAfter, 0), 0)
}

func (r *stepResult) runRate() float64 { return float64(r.runDelivered) / r.duration.Seconds() }

func (r *stepResult) drainRate() float64 {
	if r.drainTime <= 0 {
		return 0
	}
	return float64(r.drainDelivered) / r.drainTime.Seconds()
}

// sustained: every offered event accepted and no growing backlog (pending deliveries grew by at
// most a quarter second's worth of offered deliveries).
func (r *stepResult) sustained() bool {
	return r.skipped == 0 && r.postErrors == 0 && r.accepted == r.offered && r.lost() == 0 &&
		float64(r.pendingEnd) <= float64(r.pendingQuarter)+float64(r.rate*r.webhooks)/4
}

func (r *stepResult) fail(msg string) {
	r.errMu.Lock()
	defer r.errMu.Unlock()
	if len(msg) > 200 {
		msg = msg[:200] + "…"
	}
	if _, seen := r.errs[msg]; seen || len(r.errs) < 10 {
		r.errs[msg]++
	} else {
		r.errs["(other errors)"]++
	}
}

func (r *stepResult) errorSummary() string {
	r.errMu.Lock()
	defer r.errMu.Unlock()
	var parts []string
	for k, n := range r.errs {
		parts = append(parts, fmt.Sprintf("%d × %s", n, k))
	}
	slices.Sort(parts)
	return strings.Join(parts, "; ")
}

// step offers sp.rate events/s for sp.d (open loop), then waits at most sp.drain for the
// backlog to clear (drain 0: wait up to 30 s, used by the warm-up).
func (l *loader) step(ctx context.Context, sp stepSpec) *stepResult {
	rc, procs, dbName, name, rate, d, drain := l.rc, l.procs, l.dbName, sp.name, sp.rate, sp.d, sp.drain
	per, hooks := l.c.perPost, l.c.webhooks
	interval := time.Duration(float64(time.Second) * float64(per) / float64(rate))
	posts := max(int(d/interval), 1)
	st := &stepState{prefix: "wamid." + l.runID + "." + name + ".", perPost: per, events: posts * per,
		sent: make([]int64, posts), recv: make([]atomic.Int64, posts*per*hooks), perHook: make([]atomic.Int64, hooks),
		byHookID: make(map[hookReceipt]int, posts*per*hooks)}
	res := &stepResult{name: name, kind: sp.kind, rate: rate, posts: posts, offered: posts * per, webhooks: hooks, duration: d, errs: map[string]int{}}
	rc.cur.Store(st)
	acks := make([]time.Duration, posts)
	accepted := make([]int32, posts) // events stored per post (from the 200 answer); -1: no 200

	// backlog sampler
	stopSampler := make(chan struct{})
	samplerDone := make(chan struct{})
	start := time.Now()
	var smu sync.Mutex
	pendingNow := func() int64 { return l.q.pending(ctx, sp.exclude) }
	res.pendingStart = pendingNow()
	go func() {
		defer close(samplerDone)
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stopSampler:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				s := sample{at: time.Since(start), pending: pendingNow(), delivered: st.distinct.Load()}
				smu.Lock()
				res.samples = append(res.samples, s)
				smu.Unlock()
			}
		}
	}()

	// offered load
	cpuBefore := benchkit.SampleCPU(procs, dbName)
	sem := make(chan struct{}, l.c.maxInflight)
	var wg sync.WaitGroup
	var skipped, postErrors atomic.Int64
	bufs := sync.Pool{New: func() any { b := make([]byte, 0, 512+160*per); return &b }}
	for p := 0; p < posts && ctx.Err() == nil; p++ {
		due := start.Add(time.Duration(p) * interval)
		if wait := time.Until(due); wait > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
		}
		select {
		case sem <- struct{}{}:
		default:
			skipped.Add(1)
			accepted[p] = -1
			continue
		}
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			defer func() { <-sem }()
			bp := bufs.Get().(*[]byte)
			defer bufs.Put(bp)
			*bp = l.body(*bp, st.prefix, l.pnids[p%len(l.pnids)], p*per, per)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, l.url, bytes.NewReader(*bp))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set(inbound.SignatureHeader, inbound.Sign(appSecret, *bp))
			s := time.Now()
			st.sent[p] = s.UnixNano()
			resp, err := l.client.Do(req)
			if err != nil {
				accepted[p] = -1
				postErrors.Add(1)
				if ctx.Err() == nil {
					res.fail("transport: " + err.Error())
				}
				return
			}
			rb, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			acks[p] = time.Since(s)
			var ans struct{ Events, Duplicates int }
			if resp.StatusCode != http.StatusOK || json.Unmarshal(rb, &ans) != nil {
				accepted[p] = -1
				postErrors.Add(1)
				res.fail(strconv.Itoa(resp.StatusCode) + " " + strings.TrimSpace(string(rb)))
				return
			}
			accepted[p] = int32(ans.Events)
		}(p)
	}
	// The offered-load window ends when the last post was due; posts still in flight finish
	// in the drain phase.
	loadEnd := time.Now()
	res.runDelivered = st.distinct.Load()
	res.pendingEnd = pendingNow()
	res.cpu = benchkit.DiffCPU(cpuBefore, benchkit.SampleCPU(procs, dbName))
	wg.Wait()

	// drain
	limit := drain
	if limit == 0 {
		limit = 30 * time.Second
	}
	for p := range posts {
		if accepted[p] > 0 {
			res.accepted += int(accepted[p])
		}
	}
	drainStart := time.Now()
	deadline := drainStart.Add(limit)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		if st.distinct.Load() >= res.expected() && pendingNow() == 0 {
			res.drained = true
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	res.drainTime = time.Since(drainStart)
	res.drainDelivered = st.distinct.Load() - res.runDelivered
	res.pendingAfter = pendingNow()
	if res.drained {
		// the drain ended with the last receipt; count from the end of the offered load
		res.drainTime = time.Since(loadEnd)
	}
	time.Sleep(300 * time.Millisecond) // late duplicates, if any
	close(stopSampler)
	<-samplerDone
	rc.cur.Store(nil)

	res.skipped, res.postErrors = int(skipped.Load()), int(postErrors.Load())
	res.distinct, res.duplicates, res.receipts = st.distinct.Load(), st.dupes.Load(), st.receipts.Load()
	st.mu.Lock()
	res.hookIDs = len(st.byHookID)
	for _, n := range st.byHookID {
		res.hookIDDupes += n - 1
	}
	st.mu.Unlock()

	// pending at a quarter of the offered load (nearest sample), max pending
	smu.Lock()
	for _, s := range res.samples {
		if s.at <= d/4 {
			res.pendingQuarter = s.pending
		}
		if s.at <= d {
			res.pendingMax = max(res.pendingMax, s.pending)
		}
	}
	smu.Unlock()

	// latencies (end to end: per delivery), per-webhook ledger
	res.perHook, res.perHookUnacked = make([]int64, hooks), make([]int64, hooks)
	for h := range hooks {
		res.perHook[h] = st.perHook[h].Load()
	}
	var ackL, e2eL []time.Duration
	for p := range posts {
		if accepted[p] >= 0 {
			ackL = append(ackL, acks[p])
		}
		for h := range hooks {
			for i := p * per; i < (p+1)*per; i++ {
				rt := st.recv[st.pair(h, i)].Load()
				if rt == 0 {
					continue
				}
				if accepted[p] < 0 {
					res.unacked++
					res.perHookUnacked[h]++
				}
				if st.sent[p] != 0 {
					e2eL = append(e2eL, time.Duration(rt-st.sent[p]))
				}
			}
		}
	}
	res.ack, res.e2e = quantilesOf(ackL), quantilesOf(e2eL)
	return res
}

type quantiles struct {
	n             int
	p50, p99, max float64 // ms
}

func quantilesOf(l []time.Duration) quantiles {
	slices.Sort(l)
	q := quantiles{n: len(l)}
	if len(l) == 0 {
		return q
	}
	at := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(l)))) - 1
		return benchkit.MS(l[max(i, 0)])
	}
	q.p50, q.p99, q.max = at(0.50), at(0.99), benchkit.MS(l[len(l)-1])
	return q
}

// ---- data ----

// createData creates one org, its active channels (channel i on pnids[i]) and webhooks
// org-scoped webhooks for messages and message_status, webhook i to receiverURL + i. It returns
// the org's id and the webhooks' ids.
func createData(ctx context.Context, dsn string, key []byte, pnids []string, receiverURL string, webhooks int) (uuid.UUID, []uuid.UUID, error) {
	start := time.Now()
	org, hooks, err := createDataIn(ctx, dsn, key, pnids, receiverURL, webhooks)
	if err != nil {
		return uuid.Nil, nil, err
	}
	benchkit.Logf("%d active channels and %d org-scoped %s created in %s", len(pnids), webhooks, plural(webhooks, "webhook", "webhooks"),
		time.Since(start).Round(time.Millisecond))
	return org, hooks, nil
}

func createDataIn(ctx context.Context, dsn string, key []byte, pnids []string, receiverURL string, webhooks int) (uuid.UUID, []uuid.UUID, error) {
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return uuid.Nil, nil, err
	}
	pcfg.MaxConns = 4
	// Setup data need not survive a crash: skip the WAL flush per commit (this session only).
	pcfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return uuid.Nil, nil, err
	}
	defer pool.Close()
	box, err := secretbox.New(key)
	if err != nil {
		return uuid.Nil, nil, err
	}
	st := store.New(pool, box)
	org, err := st.CreateOrg(ctx, "bench")
	if err != nil {
		return uuid.Nil, nil, err
	}
	for i, pn := range pnids {
		ch, err := st.CreateChannel(ctx, org.ID, "bench "+strconv.Itoa(i), time.Hour)
		if err != nil {
			return uuid.Nil, nil, fmt.Errorf("create channel: %w", err)
		}
		if err := st.ConnectChannel(ctx, ch.ID, store.Connection{PhoneNumberID: pn, WabaID: wabaID,
			DisplayPhoneNumber: fmt.Sprintf("+1 555-%07d", i), VerifiedName: "Bench", UpstreamToken: "EAAGbench" + benchkit.RandHex(8)}); err != nil {
			return uuid.Nil, nil, fmt.Errorf("connect channel: %w", err)
		}
	}
	hooks, err := createWebhooks(ctx, st, org.ID, receiverURL, webhooks)
	return org.ID, hooks, err
}

// createWebhooks creates n org-scoped webhooks for messages and message_status, webhook i to
// receiverURL + i, and returns their ids.
func createWebhooks(ctx context.Context, st *store.Store, orgID uuid.UUID, receiverURL string, n int) ([]uuid.UUID, error) {
	ids := make([]uuid.UUID, n)
	for i := range n {
		w, _, err := st.CreateWebhook(ctx, orgID, store.NewWebhook{Name: "bench receiver " + strconv.Itoa(i),
			URL: receiverURL + strconv.Itoa(i), Events: []string{store.EventMessages, store.EventMessageStatus}})
		if err != nil {
			return nil, fmt.Errorf("create webhook: %w", err)
		}
		ids[i] = w.ID
	}
	return ids, nil
}

// ---- services ----

// ---- CPU accounting ----

// cpuProcs names the processes whose CPU time is accounted, by pid. The Postgres processes are
// found by their process title: the bench database's backends, and the rest (WAL writer,
// checkpointer, …; other databases' backends too, if any are busy).
type cpuProcs map[string]int

const (
	pidBench = "bench (load + receiver)"
)

// ---- report ----

// label names a step in the report.
func (r *stepResult) label() string {
	switch r.kind {
	case kindOverload:
		return fmt.Sprintf("overload 2 × %d", r.nominal)
	case kindFairBase:
		return "fairness (a) baseline"
	case kindFairLoaded:
		return "fairness (c) slow + held"
	}
	return r.name
}

func passFail(b bool) string {
	if b {
		return "PASS"
	}
	return "FAIL"
}

func report(c config, rs []*stepResult, over *stepResult, fair *fairness, ord []*stepResult, rc *receiver, q *queue, machine string) bool {
	var sb strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&sb, format, args...) }
	p("\n## Events benchmark\n\n")
	p("```sh\ngo build -o bin/caddy ./cmd/caddy\n%s\n```\n\n", commandLine())
	hooks := c.webhooks
	overloadWindow := ""
	if over != nil {
		overloadWindow = " (overload: " + c.overloadDur.String() + ")"
	}
	p("One Caddy (`wabarelay_inbound` + dispatcher; delivery settings: %s; database pool %s), %d channels, %d org-scoped %s "+
		"(messages, message_status) to a local HTTPS receiver answering 204 (HTTP/%s), one receiver path per webhook: every accepted event "+
		"fans out into %d %s, so deliveries = events × webhooks (%d). Upstream posts of %d messages each, signed, offered open-loop at a fixed rate "+
		"for %s per step%s, then drained. Deliveries, their rates, the backlog and end-to-end latency are per (webhook, event) pair; "+
		"backlog: %s. %s. Everything (load generator, receiver, Caddy, Postgres) shares this machine.\n\n",
		deliveryDesc(c), poolDesc(c.poolMaxConns), c.channels, hooks, plural(hooks, "webhook", "webhooks"),
		map[bool]string{true: "2", false: "1.1"}[c.receiverH2], hooks, plural(hooks, "delivery", "deliveries"), hooks,
		c.perPost, c.duration, overloadWindow, q.desc(), machine)
	p("| step | offered events/s | deliveries offered/s (× %d %s) | events accepted / offered | inbound ack p50 / p99 ms | deliveries/s during load | deliveries/s draining | "+
		"backlog at ¼ → end of load (max) | drain time | end-to-end p50 / p99 ms | deliveries delivered / duplicates / lost (backlog left) | sustained |\n",
		hooks, plural(hooks, "webhook", "webhooks"))
	p("|:--|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|:-:|\n")
	ok := true
	for _, r := range rs {
		sus := "yes"
		if !r.sustained() {
			sus = "**no**"
		}
		if r.kind == kindOverload {
			sus = "—" // offered beyond capacity on purpose
		}
		drain := r.drainTime.Round(100 * time.Millisecond).String()
		if !r.drained {
			drain = "> " + drain + " (not drained)"
		}
		drainRate := "—" // too short a drain to give a rate
		if r.drainTime >= time.Second {
			drainRate = fmt.Sprintf("%.0f", r.drainRate())
		}
		p("| %s | %d | %d | %d / %d | %.1f / %.1f | %.0f | %s | %d → %d (%d) | %s | %.1f / %.1f | %d / %d / %d (%d) | %s |\n",
			r.label(), r.rate, r.rate*r.webhooks, r.accepted, r.offered, r.ack.p50, r.ack.p99, r.runRate(), drainRate,
			r.pendingQuarter, r.pendingEnd, r.pendingMax, drain, r.e2e.p50, r.e2e.p99,
			r.distinct, r.duplicates, r.lost(), max(r.pendingAfter, 0), sus)
		if r.lost() != 0 {
			ok = false
		}
	}
	if fair != nil {
		p("\nThe fairness rows count the %d healthy %s only (deliveries, backlog, drain, latency, ledger).\n", hooks, plural(hooks, "webhook", "webhooks"))
	}
	p("\n")
	best, anyRate := 0, false
	for _, r := range rs {
		if r.kind != kindRate {
			continue
		}
		anyRate = true
		if r.sustained() && r.rate > best {
			best = r.rate
		}
	}
	switch {
	case best > 0:
		p("Highest sustained offered rate in this run: **%d events/s = %d deliveries/s** (%d %s; every offered event accepted, no growing backlog).\n\n",
			best, best*hooks, hooks, plural(hooks, "webhook", "webhooks"))
	case anyRate:
		p("No step of -rate was sustained.\n\n")
	}

	if len(ord) == 2 {
		reportOrdering(p, c, ord[0], ord[1])
	}
	if over != nil {
		reportOverload(p, over)
	}
	if fair != nil {
		if !reportFairness(p, c, fair) {
			ok = false
		}
	}

	p("CPU time per offered event during the offered load (µs, from /proc/<pid>/stat; machine busy = all of it over %d CPUs × the load time; "+
		"per delivery = per event / %d %s):\n\n", runtime.NumCPU(), hooks, plural(hooks, "webhook", "webhooks"))
	p("| step | offered events/s | caddy | postgres (bench db backends) | postgres (other) | bench (load + receiver) | total | total per delivery | machine busy |\n|:--|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, r := range rs {
		n := float64(r.offered)
		var tot time.Duration
		for _, d := range r.cpu {
			tot += d
		}
		us := func(d time.Duration) float64 { return float64(d.Microseconds()) / max(n, 1) }
		busy := 100 * tot.Seconds() / (r.duration.Seconds() * float64(runtime.NumCPU()))
		p("| %s | %d | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f%% |\n", r.label(), r.rate, us(r.cpu["caddy"]), us(r.cpu[benchkit.PGBackends]), us(r.cpu[benchkit.PGOther]),
			us(r.cpu[pidBench]), us(tot), us(tot)/float64(r.webhooks), busy)
	}
	if fair != nil {
		p("\n(Fairness (c): per offered event, whose deliveries also go to the slow webhook and, held, to the paused one.)\n")
	}
	p("\nChecks:\n")
	for _, r := range rs {
		mark := func(b bool) string {
			if b {
				return "ok  "
			}
			return "FAIL"
		}
		lb := r.label()
		if r.kind == kindRate {
			lb = strconv.Itoa(r.rate) + " events/s"
		}
		p("- %s %s: %d posts, %d skipped (no free slot), %d failed%s\n", mark(r.skipped == 0 && r.postErrors == 0), lb, r.posts,
			r.skipped, r.postErrors, errSuffix(r))
		p("- %s %s: accepted %d events × %d %s = %d deliveries = distinct (webhook, event) pairs delivered %d (from non-200 posts %d), "+
			"receipts %d, duplicates %d, distinct (path, webhook-id) pairs %d (%d repeated), lost %d (accepted pairs undelivered, nothing in the backlog)\n",
			mark(r.lost() == 0), lb, r.accepted, r.webhooks, plural(r.webhooks, "webhook", "webhooks"), r.expected(), r.distinct, r.unacked, r.receipts, r.duplicates,
			r.hookIDs, r.hookIDDupes, r.lost())
		if r.webhooks > 1 {
			// Undrained, the webhooks may stand at different points (see the note below).
			lo, hi := slices.Min(r.perHook), slices.Max(r.perHook)
			m := mark(lo == hi)
			if !r.drained && lo != hi {
				m = "note"
			} else if lo != hi {
				ok = false
			}
			p("- %s %s: distinct events delivered per webhook path: min %d, max %d (accepted %d)\n", m, lb, lo, hi, r.accepted)
		}
		if !r.drained {
			p("- note %s: not drained within the drain limit: %d accepted (webhook, event) pairs undelivered, backlog %d (discarded before the next step)\n",
				lb, r.undelivered(), r.pendingAfter)
		}
	}
	// Strays are attempts still in flight when an undrained step's tables were truncated.
	rcvOK := rc.mismatch.Load() == 0 && rc.badPath.Load() == 0
	p("- %s receiver: %d receipts in all at the webhooks' paths (warm-up included), %d with webhook-id ≠ body id, %d on a path that is no webhook's, %d after their step ended (in flight at an undrained step's end)\n",
		map[bool]string{true: "ok  ", false: "FAIL"}[rcvOK], rc.total.Load(), rc.mismatch.Load(), rc.badPath.Load(), rc.stray.Load())
	if !rcvOK {
		ok = false
	}
	fmt.Print(sb.String())
	// One machine-readable line per -rate step (bench/smoke reads them): deliveries/s during the
	// load ÷ offered deliveries/s.
	for _, r := range rs {
		if _, err := strconv.Atoi(r.name); err == nil && r.kind == kindRate { // not the ordering steps
			fmt.Printf("RATIO events-%d %.3f\n", r.rate, r.runRate()/float64(max(r.rate*r.webhooks, 1)))
		}
	}
	return ok
}

// reportOverload prints the overload step's targets.
func reportOverload(p func(string, ...any), r *stepResult) {
	nominal := float64(r.nominal * r.webhooks) // R, in deliveries/s
	p("### Overload: 2 × R = %d events/s for %s (R = %d events/s = %.0f deliveries/s)\n\n", r.rate, r.duration, r.nominal, nominal)
	p("| deliveries/s during the load | ÷ R | inbound ack p99 ms | posts skipped / failed | backlog at end of load | drain rate (deliveries/s, end of load → backlog empty) | drain time | lost |\n")
	p("|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	drain := r.drainTime.Round(100 * time.Millisecond).String()
	if !r.drained {
		drain = "> " + drain + " (not drained)"
	}
	p("| %.0f | %.2f | %.1f | %d / %d | %d | %.0f | %s | %d |\n\n", r.runRate(), r.runRate()/nominal, r.ack.p99, r.skipped, r.postErrors,
		r.pendingEnd, r.drainRate(), drain, r.lost())
	p("- %s deliveries/s during the offered window: %.0f = %.2f × R (target ≥ 0.8)\n", passFail(r.runRate() >= 0.8*nominal), r.runRate(), r.runRate()/nominal)
	ackOK := r.skipped == 0 && r.postErrors == 0 && r.ack.p99 < 1000
	p("- %s inbound: every post acknowledged (%d skipped, %d failed of %d) and ack p99 %.1f ms (target < 1 s)\n", passFail(ackOK),
		r.skipped, r.postErrors, r.posts, r.ack.p99)
	switch {
	case r.drained && float64(r.pendingEnd) < nominal:
		// less than a second's worth of R left: the drain time is the tail latency, not a rate
		p("- PASS drain: backlog at the end of the load %d, under a second's worth of R; drained %s after it\n", r.pendingEnd, drain)
	default:
		p("- %s drain rate: %.0f deliveries/s from the end of the load %s (%d delivered; target ≥ R = %.0f)\n", passFail(r.drainRate() >= nominal),
			r.drainRate(), map[bool]string{true: "until the backlog was empty", false: "over the drain limit, not drained"}[r.drained], r.drainDelivered, nominal)
	}
	p("- %s ledger: %d events accepted, %d deliveries owed, %d delivered, %d duplicates, %d lost, %d left in the backlog\n\n", passFail(r.lost() == 0),
		r.accepted, r.expected(), r.distinct, r.duplicates, r.lost(), max(r.pendingAfter, 0))
}

// reportFairness prints the fairness step's comparison and targets; false if a paused webhook
// got a delivery or its held deliveries did not add up.
func reportFairness(p func(string, ...any), c config, f *fairness) bool {
	ok := true
	hooks := plural(c.webhooks, "webhook", "webhooks")
	p("### Fairness: R = %d events/s × %d healthy %s, without and with a slow webhook and a paused one holding %d deliveries\n\n",
		f.rate, c.webhooks, hooks, f.heldQueued)
	p("(a) the healthy %s alone; (b) %d events posted for the paused webhook alone in %s (%.0f events/s), which then held %d deliveries; "+
		"(c) the healthy %s again with the slow webhook (its receiver answers after %s, the delivery timeout being %s) and the paused one. "+
		"Only the healthy %s deliveries count below.\n\n",
		hooks, f.held, f.heldTook.Round(time.Millisecond), float64(f.held)/max(f.heldTook.Seconds(), 1e-9), f.heldQueued,
		hooks, (deliveryTimeout + time.Second), deliveryTimeout, map[bool]string{true: "webhook's", false: "webhooks'"}[c.webhooks == 1])
	p("| part | healthy deliveries/s during load | end-to-end p50 / p99 ms | inbound ack p99 ms | healthy delivered / lost |\n|:--|--:|--:|--:|--:|\n")
	for _, r := range []*stepResult{f.base, f.loaded} {
		if r == nil {
			continue
		}
		p("| %s | %.0f | %.1f / %.1f | %.1f | %d / %d |\n", r.label(), r.runRate(), r.e2e.p50, r.e2e.p99, r.ack.p99, r.distinct, r.lost())
	}
	p("\n")
	if f.base == nil || f.loaded == nil {
		return ok
	}
	p("- %s healthy deliveries/s with the slow and paused webhooks: %.0f vs %.0f alone = %.2f× (target: drops by less than 10%%, ≥ 0.90×)\n",
		passFail(f.ratio() >= 0.9), f.loaded.runRate(), f.base.runRate(), f.ratio())
	p("- info end-to-end p99 of the healthy %s: %.1f ms alone, %.1f ms with the slow and paused webhooks\n", hooks, f.base.e2e.p99, f.loaded.e2e.p99)
	p("- %s healthy ledger: lost %d (a), %d (c)\n", passFail(f.base.lost() == 0 && f.loaded.lost() == 0), f.base.lost(), f.loaded.lost())
	p("- info slow webhook (not expected to complete; not a failure): %d deliveries owed in (c), %d attempts received, %d answered (after the timeout), "+
		"%d still in the backlog at the end\n", f.slowOwed, f.slowAttempts, f.slowAnswered, f.slowQueued)
	wantHeld := f.heldQueued + int64(f.loaded.accepted)
	heldOK := f.heldQueued == int64(f.held) && f.heldAtEnd == wantHeld && f.pausedRcpts == 0
	heldState := " (pending rows: no queue table)"
	if f.queueTable {
		heldOK = heldOK && f.heldAtEndQ == f.heldAtEnd
		heldState = fmt.Sprintf(" (%d in status held)", f.heldAtEndQ)
	}
	p("- %s paused webhook: %d held after (b) (%d events), %d at the end%s (expected %d + %d accepted in (c) = %d), %d receipts at its path (expected 0)\n\n",
		passFail(heldOK), f.heldQueued, f.held, f.heldAtEnd, heldState, f.heldQueued, f.loaded.accepted, wantHeld, f.pausedRcpts)
	if !heldOK {
		ok = false
	}
	return ok
}

// deliveryDesc says which delivery settings Caddy ran with.
func deliveryDesc(c config) string {
	set := func(name string, n int) string {
		if n == 0 {
			return name + " product default"
		}
		return fmt.Sprintf("%s %d (set by -%s)", name, n, strings.ReplaceAll(name, "_", "-"))
	}
	var s string
	if c.workers == 0 && c.perWebhook == 0 {
		s = "product defaults (workers, per_webhook not set)"
	} else {
		s = set("workers", c.workers) + ", " + set("per_webhook", c.perWebhook)
	}
	return s + "; retry_delays 1s 2s 5s, timeout " + deliveryTimeout.String() + ", lease 60s"
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func poolDesc(n int) string {
	if n == 0 {
		return fmt.Sprintf("pgxpool default (%d conns)", max(4, runtime.NumCPU()))
	}
	return strconv.Itoa(n) + " conns"
}

func errSuffix(r *stepResult) string {
	if s := r.errorSummary(); s != "" {
		return ": " + s
	}
	return ""
}

func commandLine() string {
	args := []string{"go", "run", "./bench/events"}
	for _, a := range os.Args[1:] {
		if strings.ContainsAny(a, " \t'\"$&;|<>()*?") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		args = append(args, a)
	}
	return strings.Join(args, " ")
}

// ensureHistory creates the daily history partitions of the days back from today, if the
// schema has them (store.EnsurePartitions; an older schema has none and nothing is done).
func ensureHistory(ctx context.Context, pool *pgxpool.Pool, days int) error {
	var partitioned bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_partitioned_table WHERE partrelid = 'events'::regclass)`).Scan(&partitioned); err != nil || !partitioned {
		return err
	}
	now := time.Now()
	return store.New(pool, nil).EnsurePartitions(ctx, now.AddDate(0, 0, -days), now)
}

// ---- ordering ----

// runOrdering runs the ordering step: -rate's first rate for -duration to the healthy webhooks
// with ordering none, then again with ordering conversation (messages spread over
// -conversations customers), each drained; the webhooks are set back to none after it.
func runOrdering(ctx context.Context, c config, ld *loader, st *store.Store, orgID uuid.UUID, healthy []uuid.UUID, q *queue) ([]*stepResult, error) {
	set := func(ordering string) error {
		for _, id := range healthy {
			if _, err := st.SetWebhookOrdering(ctx, orgID, id, ordering); err != nil {
				return err
			}
		}
		return nil
	}
	rate := c.rates[0]
	var out []*stepResult
	for _, ordering := range []string{store.OrderingNone, store.OrderingConversation} {
		if err := set(ordering); err != nil {
			return out, err
		}
		benchkit.Logf("ordering %s: %d events/s × %d %s over %d conversations per channel for %s", ordering, rate, c.webhooks,
			plural(c.webhooks, "webhook", "webhooks"), c.conversations, c.duration)
		r := ld.step(ctx, stepSpec{name: "ordering " + ordering, rate: rate, d: c.duration, drain: c.drain})
		if err := ctx.Err(); err != nil {
			return out, err
		}
		out = append(out, r)
		if err := q.truncate(ctx); err != nil {
			return out, err
		}
	}
	return out, set(store.OrderingNone)
}

// reportOrdering prints the ordering step's comparison: deliveries/s with ordering
// conversation ÷ with none (target ≥ 0.9), both at the same offered rate.
func reportOrdering(p func(string, ...any), c config, none, conv *stepResult) {
	p("### Ordering: R = %d events/s × %d %s, ordering none, then conversation (messages spread over %d customers per channel)\n\n",
		none.rate, c.webhooks, plural(c.webhooks, "webhook", "webhooks"), c.conversations)
	p("| ordering | deliveries/s during load | drain time | end-to-end p50 / p99 ms | backlog at end of load | sustained | lost |\n|:--|--:|--:|--:|--:|:-:|--:|\n")
	for _, r := range []*stepResult{none, conv} {
		p("| %s | %.0f | %s | %.1f / %.1f | %d | %v | %d |\n", strings.TrimPrefix(r.name, "ordering "), r.runRate(),
			r.drainTime.Round(100*time.Millisecond), r.e2e.p50, r.e2e.p99, r.pendingEnd, r.sustained(), r.lost())
	}
	ratio := conv.runRate() / max(none.runRate(), 1e-9)
	p("\n- %s deliveries/s with ordering conversation ÷ none: %.0f / %.0f = %.2f (target ≥ 0.9)\n\n", passFail(ratio >= 0.9),
		conv.runRate(), none.runRate(), ratio)
}
