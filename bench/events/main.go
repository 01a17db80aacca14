// Command events benchmarks the events pipeline (issue 5, "Benchmark"): signed upstream webhook
// batches posted to wabarelay_inbound at a fixed offered rate (open loop), stored as events with
// their deliveries in Postgres, and delivered by the dispatcher to a local HTTPS receiver.
//
//	go build -o bin/caddy ./cmd/caddy
//	go run ./bench/events                                  # 1,000 events/s for 20 s
//	go run ./bench/events -rate 1000,2000,3000,5000        # one step per rate, in order
//	go run ./bench/events -rate 500 -webhooks 4            # 500 events/s = 2,000 deliveries/s
//
// It starts everything itself and removes everything at the end (also on Ctrl-C): a fresh
// database wabarelay_bench_<rand> on the Postgres named by -pg (dropped at the end), the HTTPS
// receiver (httptest, in this process, answering 204 at once) and one bin/caddy process with
// `admin off` on a free loopback port.
//
// Data: one org, -channels active channels (one phone number id each) and -webhooks org-scoped
// webhooks (default 1), all subscribed to messages and message_status; webhook i points at the
// receiver's path /hook/<i>. Every accepted event thus fans out into -webhooks deliveries
// (deliveries = events × webhooks), which measures the dispatcher's sustained deliveries/s apart
// from the per-event intake cost (intake stores each event once, whatever the fan-out).
//
// Load, per step: posts of -per-post text messages each (one entry, one change, one phone number
// id; post k on channel k mod channels), signed with X-Hub-Signature-256, scheduled at
// rate/per-post posts per second for -duration regardless of how earlier posts fare (open loop;
// at most -max-inflight posts outstanding, a post that finds no slot is counted as skipped).
// Every message id is unique in the run. After the offered load the step waits (at most -drain)
// until every accepted event has reached every webhook's path and no delivery is pending; the tables
// are then emptied (TRUNCATE events, deliveries, attempts) before the next step.
//
// Measured: intake ack latency (send → 200) of every post; deliveries (distinct (webhook, event)
// pairs) received per second while load is offered and while draining; deliveries pending
// (pending + in_flight rows) sampled every 500 ms; end-to-end latency per delivery (receive time
// at a webhook's path − send time of the post that carried the message, matched by the path and
// data.message.id); the ledger, exact per (webhook, event): events accepted (sum of "events" in
// the 200 answers) × webhooks = distinct (webhook, event) pairs delivered, duplicates (receipts
// beyond the first per pair; also counted per (path, webhook-id)), lost (accepted pairs never
// received at their webhook's path, nothing pending); CPU time per offered event (and per
// delivery: per event / webhooks) of Caddy, of the bench database's Postgres backends, of the
// other Postgres processes (WAL writer, checkpointer, …) and of the bench itself (load +
// receiver), from /proc/<pid>/stat, over the offered-load window.
//
// A step counts as sustained when every offered post was accepted and the backlog did not grow:
// pending deliveries at the end of the offered load are at most those at a quarter of it plus a
// quarter second's worth of offered deliveries (events × webhooks).
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
	intakePath  = "/webhooks/upstream"
)

type config struct {
	pgDSN        string
	caddyBin     string
	rates        []int
	channels     int
	perPost      int
	duration     time.Duration
	drain        time.Duration
	maxInflight  int
	poolMaxConns int
	workers      int
	perWebhook   int
	webhooks     int
	receiverH2   bool
	showLogs     bool
}

func main() {
	var c config
	var rates string
	flag.StringVar(&c.pgDSN, "pg", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
		"Postgres admin DSN (URL form); the run creates and drops its own database there")
	flag.StringVar(&c.caddyBin, "caddy", "bin/caddy", "the Caddy binary with wabarelay (go build -o bin/caddy ./cmd/caddy)")
	flag.StringVar(&rates, "rate", "1000", "offered events/s; a comma-separated list runs one step per rate, in order")
	flag.IntVar(&c.channels, "channels", 100, "active channels (phone number ids) the posts are spread over")
	flag.IntVar(&c.perPost, "per-post", 10, "messages (events) per upstream post")
	flag.DurationVar(&c.duration, "duration", 20*time.Second, "offered-load time per step (at most 30s)")
	flag.DurationVar(&c.drain, "drain", 60*time.Second, "longest wait for the backlog to drain after each step")
	flag.IntVar(&c.maxInflight, "max-inflight", 2000, "most posts outstanding at once; a post finding none free is skipped (counted)")
	flag.IntVar(&c.poolMaxConns, "pool-max-conns", 0, "pool_max_conns added to Caddy's database DSN (0: the pgxpool default, max(4, CPUs))")
	flag.IntVar(&c.workers, "workers", 256, "delivery workers")
	flag.IntVar(&c.perWebhook, "per-webhook", 256, "delivery per_webhook cap")
	flag.IntVar(&c.webhooks, "webhooks", 1, "org-scoped webhooks (each on its own receiver path); every event fans out into this many deliveries (at most 64)")
	flag.BoolVar(&c.receiverH2, "receiver-h2", false, "the receiver offers HTTP/2 (default HTTP/1.1)")
	flag.BoolVar(&c.showLogs, "v", false, "print Caddy's log at the end")
	flag.Parse()
	if flag.NArg() > 0 {
		benchkit.Fatalf("unexpected arguments: %v", flag.Args())
	}
	for _, s := range strings.Split(rates, ",") {
		r, err := strconv.Atoi(strings.TrimSpace(strings.ReplaceAll(s, "_", "")))
		if err != nil || r <= 0 {
			benchkit.Fatalf("-rate: invalid rate %q", s)
		}
		c.rates = append(c.rates, r)
	}
	if c.channels < 1 || c.perPost < 1 || c.maxInflight < 1 || c.workers < 1 || c.perWebhook < 1 || c.poolMaxConns < 0 {
		benchkit.Fatalf("-channels, -per-post, -max-inflight, -workers and -per-webhook must be positive")
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
	var pgVersion, syncCommit string
	_ = admin.QueryRow(ctx, "SHOW server_version").Scan(&pgVersion)
	_ = admin.QueryRow(ctx, "SHOW synchronous_commit").Scan(&syncCommit)
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

	// ---- receiver ----
	rcv := newReceiver(c.webhooks)
	srv := httptest.NewUnstartedServer(rcv)
	srv.EnableHTTP2 = c.receiverH2
	srv.Config.ReadHeaderTimeout = 10 * time.Second
	srv.StartTLS()
	cl.Add(srv.Close)
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
	if err := createData(ctx, dsn, key, pnids, receiverURL, c.webhooks); err != nil {
		return err
	}

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
			timeout      10s
			workers      %d
			per_webhook  %d
			lease        60s
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
`, appSecret, verifyToken, c.workers, c.perWebhook, caPath, port, intakePath)
	env := []string{"WBR_BENCH_DATABASE=" + caddyDSN, "WBR_BENCH_KEY=" + base64.StdEncoding.EncodeToString(key)}
	cd, err := benchkit.StartCaddy(ctx, caddyBin, filepath.Join(tmp, "caddy"), cfg, env, port)
	if err != nil {
		return fmt.Errorf("caddy: %w", err)
	}
	cl.Add(cd.Stop)
	if c.showLogs {
		cl.Add(func() { fmt.Fprintf(os.Stderr, "---- caddy log ----\n%s", cd.Logs()) })
	}

	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	cl.Add(pool.Close)

	ld := newLoader(fmt.Sprintf("http://127.0.0.1:%d%s", port, intakePath), pnids, runID, c)
	procs := cpuProcs{pidBench: os.Getpid(), "caddy": cd.PID()}

	// ---- warm-up: connections and caches, not measured ----
	benchkit.Logf("warm-up: 100 events at 200 events/s (× %d %s)", c.webhooks, plural(c.webhooks, "webhook", "webhooks"))
	w := ld.step(ctx, rcv, pool, procs, dbName, "w", 200, 500*time.Millisecond, 0)
	if err := ctx.Err(); err != nil {
		return err
	}
	if w.lost() != 0 || w.accepted == 0 {
		return fmt.Errorf("warm-up: %d events accepted, %d deliveries lost, %d post errors (%s); see -v for Caddy's log",
			w.accepted, w.lost(), w.postErrors, w.errorSummary())
	}
	if err := truncate(ctx, pool); err != nil {
		return err
	}

	var results []*stepResult
	for i, rate := range c.rates {
		benchkit.Logf("step %d: %d events/s × %d %s = %d deliveries/s for %s (%d per post, %.0f posts/s)",
			i+1, rate, c.webhooks, plural(c.webhooks, "webhook", "webhooks"), rate*c.webhooks, c.duration, c.perPost, float64(rate)/float64(c.perPost))
		r := ld.step(ctx, rcv, pool, procs, dbName, strconv.Itoa(i+1), rate, c.duration, c.drain)
		if err := ctx.Err(); err != nil {
			return err
		}
		results = append(results, r)
		benchkit.Logf("  accepted %d/%d events, deliveries/s run %.0f drain %.0f, pending %d → %d → %d, e2e p50 %.1f ms p99 %.1f ms, deliveries lost %d, dup %d, sustained %v",
			r.accepted, r.offered, r.runRate(), r.drainRate(), r.pendingStart, r.pendingQuarter, r.pendingEnd,
			r.e2e.p50, r.e2e.p99, r.lost(), r.duplicates, r.sustained())
		if err := truncate(ctx, pool); err != nil {
			return err
		}
	}

	machine := fmt.Sprintf("%s/%s, %d CPUs, load average %s at start, %s, Postgres %s (synchronous_commit %s)",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), loadAvg, runtime.Version(), pgVersion, syncCommit)
	ok := report(c, results, rcv, machine)
	if !ok {
		return errors.New("ledger check failed (see above)")
	}
	return nil
}

// ---- receiver ----

// hookPrefix is the receiver path prefix: webhook i delivers to hookPrefix + i.
const hookPrefix = "/hook/"

// receiver answers 204 to every delivery and records, for the current step, the first receipt
// of each (webhook, event) pair (webhook by the request path, event by its message id) and the
// receipts per (path, webhook-id).
type receiver struct {
	webhooks int
	cur      atomic.Pointer[stepState]
	total    atomic.Int64 // every receipt, all steps
	mismatch atomic.Int64 // webhook-id header ≠ body id, or unparsable body
	badPath  atomic.Int64 // receipts on a path that is no webhook's
	stray    atomic.Int64 // receipts for another step's events
}

func newReceiver(webhooks int) *receiver { return &receiver{webhooks: webhooks} }

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
	for i := 0; i < n; i++ {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = append(buf, `{"from":"1555","id":"`...)
		buf = append(buf, prefix...)
		buf = strconv.AppendInt(buf, int64(first+i), 10)
		buf = append(buf, `","timestamp":"1700000000","type":"text","text":{"body":"hi"}}`...)
	}
	buf = append(buf, `]}}]}]}`...)
	return buf
}

type sample struct {
	at        time.Duration // since the start of the offered load
	pending   int64
	delivered int64 // distinct (webhook, event) pairs received so far
}

type stepResult struct {
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
	pendingStart         int64
	pendingQuarter       int64
	pendingEnd           int64
	pendingMax           int64
	pendingAfter         int64 // deliveries still pending when the drain ended (0 when drained)
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

// step offers rate events/s for d (open loop), then waits at most drain for the backlog to
// clear (drain 0: wait up to 30 s, used by the warm-up).
func (l *loader) step(ctx context.Context, rc *receiver, pool *pgxpool.Pool, procs cpuProcs, dbName, name string,
	rate int, d, drain time.Duration) *stepResult {
	per, hooks := l.c.perPost, l.c.webhooks
	interval := time.Duration(float64(time.Second) * float64(per) / float64(rate))
	posts := max(int(d/interval), 1)
	st := &stepState{prefix: "wamid." + l.runID + "." + name + ".", perPost: per, events: posts * per,
		sent: make([]int64, posts), recv: make([]atomic.Int64, posts*per*hooks), perHook: make([]atomic.Int64, hooks),
		byHookID: make(map[hookReceipt]int, posts*per*hooks)}
	res := &stepResult{rate: rate, posts: posts, offered: posts * per, webhooks: hooks, duration: d, errs: map[string]int{}}
	rc.cur.Store(st)
	acks := make([]time.Duration, posts)
	accepted := make([]int32, posts) // events stored per post (from the 200 answer); -1: no 200

	// backlog sampler
	stopSampler := make(chan struct{})
	samplerDone := make(chan struct{})
	start := time.Now()
	var smu sync.Mutex
	pendingNow := func() int64 {
		var n int64
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := pool.QueryRow(qctx, `
			SELECT (SELECT count(*) FROM deliveries WHERE status = 'pending' AND attempts = 0)
			     + (SELECT count(*) FROM deliveries WHERE status = 'pending' AND attempts > 0)
			     + (SELECT count(*) FROM deliveries WHERE status = 'in_flight')`).Scan(&n); err != nil {
			return -1
		}
		return n
	}
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
	cpuBefore := procs.sample(dbName)
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
	res.cpu = diffCPU(cpuBefore, procs.sample(dbName))
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

func truncate(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `TRUNCATE delivery_attempts, deliveries, events`)
	if err != nil {
		return fmt.Errorf("truncate: %w", err)
	}
	return nil
}

// ---- data ----

// createData creates one org, its active channels (channel i on pnids[i]) and webhooks
// org-scoped webhooks for messages and message_status, webhook i to receiverURL + i.
func createData(ctx context.Context, dsn string, key []byte, pnids []string, receiverURL string, webhooks int) error {
	start := time.Now()
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return err
	}
	pcfg.MaxConns = 4
	// Setup data need not survive a crash: skip the WAL flush per commit (this session only).
	pcfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	box, err := secretbox.New(key)
	if err != nil {
		return err
	}
	st := store.New(pool, box)
	org, err := st.CreateOrg(ctx, "bench")
	if err != nil {
		return err
	}
	for i, pn := range pnids {
		ch, err := st.CreateChannel(ctx, org.ID, "bench "+strconv.Itoa(i), time.Hour)
		if err != nil {
			return fmt.Errorf("create channel: %w", err)
		}
		if err := st.ConnectChannel(ctx, ch.ID, store.Connection{PhoneNumberID: pn, WabaID: wabaID,
			DisplayPhoneNumber: fmt.Sprintf("+1 555-%07d", i), VerifiedName: "Bench", UpstreamToken: "EAAGbench" + benchkit.RandHex(8)}); err != nil {
			return fmt.Errorf("connect channel: %w", err)
		}
	}
	for i := range webhooks {
		if _, _, err := st.CreateWebhook(ctx, org.ID, store.NewWebhook{Name: "bench receiver " + strconv.Itoa(i),
			URL: receiverURL + strconv.Itoa(i), Events: []string{"messages", "message_status"}}); err != nil {
			return fmt.Errorf("create webhook: %w", err)
		}
	}
	benchkit.Logf("%d active channels and %d org-scoped %s created in %s", len(pnids), webhooks, plural(webhooks, "webhook", "webhooks"),
		time.Since(start).Round(time.Millisecond))
	return nil
}

// ---- services ----

// ---- CPU accounting ----

// cpuProcs names the processes whose CPU time is accounted, by pid. The Postgres processes are
// found by their process title: the bench database's backends, and the rest (WAL writer,
// checkpointer, …; other databases' backends too, if any are busy).
type cpuProcs map[string]int

const (
	pidBench   = "bench (load + receiver)"
	pgBackends = "postgres (bench db backends)"
	pgOther    = "postgres (other processes)"
)

func (p cpuProcs) sample(dbName string) map[string]time.Duration {
	out := map[string]time.Duration{}
	for name, pid := range p {
		if d, ok := benchkit.ProcCPU(pid); ok {
			out[name] = d
		}
	}
	if dirs, err := os.ReadDir("/proc"); err == nil {
		for _, d := range dirs {
			pid, err := strconv.Atoi(d.Name())
			if err != nil {
				continue
			}
			cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			if err != nil || !bytes.HasPrefix(cmd, []byte("postgres")) && !bytes.Contains(cmd, []byte("/postgres\x00")) {
				continue
			}
			c, ok := benchkit.ProcCPU(pid)
			if !ok {
				continue
			}
			if bytes.Contains(cmd, []byte(" "+dbName+" ")) {
				out[pgBackends] += c
			} else {
				out[pgOther] += c
			}
		}
	}
	return out
}

func diffCPU(before, after map[string]time.Duration) map[string]time.Duration {
	out := map[string]time.Duration{}
	for name, a := range after {
		out[name] = max(a-before[name], 0) // a backend that exited meanwhile is lost, not negative
	}
	return out
}

// ---- report ----

func report(c config, rs []*stepResult, rc *receiver, machine string) bool {
	var sb strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&sb, format, args...) }
	p("\n## Events benchmark\n\n")
	p("```sh\ngo build -o bin/caddy ./cmd/caddy\n%s\n```\n\n", commandLine())
	hooks := c.webhooks
	p("One Caddy (`wabarelay_inbound` + dispatcher: workers %d, per_webhook %d, database pool %s), %d channels, %d org-scoped %s "+
		"(messages, message_status) to a local HTTPS receiver answering 204 (HTTP/%s), one receiver path per webhook: every accepted event "+
		"fans out into %d %s, so deliveries = events × webhooks (%d). Upstream posts of %d messages each, signed, offered open-loop at a fixed rate "+
		"for %s per step, then drained. Deliveries, their rates, pending counts and end-to-end latency are per (webhook, event) pair. "+
		"%s. Everything (load generator, receiver, Caddy, Postgres) shares this machine.\n\n",
		c.workers, c.perWebhook, poolDesc(c.poolMaxConns), c.channels, hooks, plural(hooks, "webhook", "webhooks"),
		map[bool]string{true: "2", false: "1.1"}[c.receiverH2], hooks, plural(hooks, "delivery", "deliveries"), hooks,
		c.perPost, c.duration, machine)
	p("| offered events/s | deliveries offered/s (× %d %s) | events accepted / offered | intake ack p50 / p99 ms | deliveries/s during load | deliveries/s draining | "+
		"pending deliveries at ¼ → end of load (max) | drain time | end-to-end p50 / p99 ms | deliveries delivered / duplicates / lost (still pending) | sustained |\n",
		hooks, plural(hooks, "webhook", "webhooks"))
	p("|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|:-:|\n")
	ok := true
	for _, r := range rs {
		sus := "yes"
		if !r.sustained() {
			sus = "**no**"
		}
		drain := r.drainTime.Round(100 * time.Millisecond).String()
		if !r.drained {
			drain = "> " + drain + " (not drained)"
		}
		drainRate := "—" // too short a drain to give a rate
		if r.drainTime >= time.Second {
			drainRate = fmt.Sprintf("%.0f", r.drainRate())
		}
		p("| %d | %d | %d / %d | %.1f / %.1f | %.0f | %s | %d → %d (%d) | %s | %.1f / %.1f | %d / %d / %d (%d) | %s |\n",
			r.rate, r.rate*r.webhooks, r.accepted, r.offered, r.ack.p50, r.ack.p99, r.runRate(), drainRate,
			r.pendingQuarter, r.pendingEnd, r.pendingMax, drain, r.e2e.p50, r.e2e.p99,
			r.distinct, r.duplicates, r.lost(), max(r.pendingAfter, 0), sus)
		if r.lost() != 0 {
			ok = false
		}
	}
	p("\n")
	best := 0
	for _, r := range rs {
		if r.sustained() && r.rate > best {
			best = r.rate
		}
	}
	if best > 0 {
		p("Highest sustained offered rate in this run: **%d events/s = %d deliveries/s** (%d %s; every offered event accepted, no growing backlog).\n\n",
			best, best*hooks, hooks, plural(hooks, "webhook", "webhooks"))
	} else {
		p("No step was sustained.\n\n")
	}
	p("CPU time per offered event during the offered load (µs, from /proc/<pid>/stat; machine busy = all of it over %d CPUs × the load time; "+
		"per delivery = per event / %d %s):\n\n", runtime.NumCPU(), hooks, plural(hooks, "webhook", "webhooks"))
	p("| offered events/s | caddy | postgres (bench db backends) | postgres (other) | bench (load + receiver) | total | total per delivery | machine busy |\n|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, r := range rs {
		n := float64(r.offered)
		var tot time.Duration
		for _, d := range r.cpu {
			tot += d
		}
		us := func(d time.Duration) float64 { return float64(d.Microseconds()) / max(n, 1) }
		busy := 100 * tot.Seconds() / (r.duration.Seconds() * float64(runtime.NumCPU()))
		p("| %d | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f%% |\n", r.rate, us(r.cpu["caddy"]), us(r.cpu[pgBackends]), us(r.cpu[pgOther]),
			us(r.cpu[pidBench]), us(tot), us(tot)/float64(r.webhooks), busy)
	}
	p("\nChecks:\n")
	for _, r := range rs {
		mark := func(b bool) string {
			if b {
				return "ok  "
			}
			return "FAIL"
		}
		p("- %s %d events/s: %d posts, %d skipped (no free slot), %d failed%s\n", mark(r.skipped == 0 && r.postErrors == 0), r.rate, r.posts,
			r.skipped, r.postErrors, errSuffix(r))
		p("- %s %d events/s: accepted %d events × %d %s = %d deliveries = distinct (webhook, event) pairs delivered %d (from non-200 posts %d), "+
			"receipts %d, duplicates %d, distinct (path, webhook-id) pairs %d (%d repeated), lost %d (accepted pairs undelivered, nothing pending)\n",
			mark(r.lost() == 0), r.rate, r.accepted, r.webhooks, plural(r.webhooks, "webhook", "webhooks"), r.expected(), r.distinct, r.unacked, r.receipts, r.duplicates,
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
			p("- %s %d events/s: distinct events delivered per webhook path: min %d, max %d (accepted %d)\n", m, r.rate, lo, hi, r.accepted)
		}
		if !r.drained {
			p("- note %d events/s: not drained within -drain: %d accepted (webhook, event) pairs undelivered, %d deliveries still pending (discarded before the next step)\n",
				r.rate, r.undelivered(), r.pendingAfter)
		}
	}
	// Strays are attempts still in flight when an undrained step's tables were truncated.
	rcvOK := rc.mismatch.Load() == 0 && rc.badPath.Load() == 0
	p("- %s receiver: %d receipts in all (warm-up included), %d with webhook-id ≠ body id, %d on a path that is no webhook's, %d after their step ended (in flight at an undrained step's end)\n",
		map[bool]string{true: "ok  ", false: "FAIL"}[rcvOK], rc.total.Load(), rc.mismatch.Load(), rc.badPath.Load(), rc.stray.Load())
	if !rcvOK {
		ok = false
	}
	fmt.Print(sb.String())
	return ok
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
