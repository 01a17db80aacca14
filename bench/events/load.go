package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wabarelay/wabarelay/bench/internal/benchkit"
	"github.com/wabarelay/wabarelay/inbound"
	"github.com/wabarelay/wabarelay/store"
)

// pidBench names this process (load generator and receiver) in the CPU table.
const pidBench = "bench (load + receiver)"

type loader struct {
	url    string
	pnids  []string
	runID  string
	c      config
	client *http.Client

	rc     *receiver
	q      *queue
	procs  benchkit.Procs
	dbName string
	pgstat *pgStat // nil: -pgstat off
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
	return &loader{url: u, pnids: pnids, runID: runID, c: c, client: benchkit.HTTPClient(c.maxInflight, c.maxInflight, 30*time.Second)}
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
	res := &stepResult{name: name, kind: sp.kind, rate: rate, posts: posts, offered: posts * per, webhooks: hooks, duration: d}
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
	if err := l.pgstat.reset(ctx); err != nil {
		res.fail("pgstat: " + err.Error())
	}
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
	if stats, err := l.pgstat.read(ctx); err != nil {
		res.fail("pgstat: " + err.Error())
	} else {
		res.statements = stats
	}
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

// createData creates one org, its active channels (channel i on pnids[i]) and webhooks
// org-scoped webhooks for messages and message_status, webhook i to receiverURL + i. It returns
// the org's id and the webhooks' ids.
func createData(ctx context.Context, dsn string, key []byte, pnids []string, receiverURL string, webhooks int) (uuid.UUID, []uuid.UUID, error) {
	start := time.Now()
	st, pool, err := benchkit.SetupStore(ctx, dsn, key, 4)
	if err != nil {
		return uuid.Nil, nil, err
	}
	defer pool.Close()
	org, err := st.CreateOrg(ctx, "bench")
	if err != nil {
		return uuid.Nil, nil, err
	}
	if _, err := benchkit.CreateChannels(ctx, st, org.ID, len(pnids), 1, func(i int) (string, store.Connection) {
		return "bench " + strconv.Itoa(i), store.Connection{PhoneNumberID: pnids[i], WabaID: wabaID,
			DisplayPhoneNumber: fmt.Sprintf("+1 555-%07d", i), VerifiedName: "Bench", UpstreamToken: "EAAGbench" + benchkit.RandHex(8)}
	}); err != nil {
		return uuid.Nil, nil, err
	}
	hooks, err := createWebhooks(ctx, st, org.ID, receiverURL, webhooks)
	if err != nil {
		return uuid.Nil, nil, err
	}
	benchkit.Logf("%d active channels and %d org-scoped %s created in %s", len(pnids), webhooks, plural(webhooks, "webhook", "webhooks"),
		time.Since(start).Round(time.Millisecond))
	return org.ID, hooks, nil
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
