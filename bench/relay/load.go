package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/wabarelay/wabarelay/bench/internal/benchkit"
	"github.com/wabarelay/wabarelay/store"
)

// createChannels creates one org and len(pnids) active channels, channel i on pnids[i], and
// returns their channel tokens.
func createChannels(ctx context.Context, dsn string, key []byte, pnids []string) ([]string, error) {
	start := time.Now()
	const workers = 16
	st, pool, err := benchkit.SetupStore(ctx, dsn, key, workers)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	org, err := st.CreateOrg(ctx, "bench")
	if err != nil {
		return nil, err
	}
	tokens, err := benchkit.CreateChannels(ctx, st, org.ID, len(pnids), workers, func(i int) (string, store.Connection) {
		return "bench " + strconv.Itoa(i), store.Connection{PhoneNumberID: pnids[i], WabaID: wabaID,
			DisplayPhoneNumber: fmt.Sprintf("+1 555-%07d", i), VerifiedName: "Bench", UpstreamToken: upstreamToken}
	})
	if err != nil {
		return nil, fmt.Errorf("creating channels: %w", err)
	}
	// The channels' health counts as read already, as a deployment's channels connected a while
	// ago: otherwise (b) reads every new channel's health from the fake upstream in its first
	// seconds (a connect-time read, package health), which slowed the first measured slice,
	// (a)'s, to 4,155–4,700 req/s against 6,500–7,500 after, and flattered the ratio.
	if _, err := pool.Exec(ctx, `UPDATE channel_health SET prompt_due_at = NULL, checked_at = now()`); err != nil {
		return nil, fmt.Errorf("channels' health: %w", err)
	}
	benchkit.Logf("%d active channels created in %s", len(pnids), time.Since(start).Round(time.Millisecond))
	return tokens, nil
}

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

	errs benchkit.Errors // by "status body"
}

func newTarget(name byte, base string, pnids, tokens []string, runID string, c config) *target {
	t := &target{name: name, client: benchkit.HTTPClient(4*c.concurrency, 2*c.concurrency, 30*time.Second),
		urls: make([]string, len(pnids)), auths: make([]string, len(pnids)), runID: runID, c: c,
		status: make([]uint16, c.maxRequests)}
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
// or -compare-window (both relays), unless -no-idempotency-key.
func (t *target) keyed() bool {
	return (t.name == 'b' || t.c.relayBaseline()) && !t.c.noIdemKey
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
					_, _ = io.Copy(io.Discard, resp.Body) // drained for the connection's reuse; the status is the answer
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
	msg = benchkit.Cut(msg, 300)
	k := strconv.Itoa(status) + " " + volatile.ReplaceAllString(strings.TrimSpace(msg), `"$1":"…"`)
	if status == 0 {
		k = "transport error: " + msg
	}
	t.errs.Add(k)
}

func (t *target) errorSummary() string { return t.errs.Summary() }

// volatile matches the per-request ids in error bodies, so that equal errors group together.
var volatile = regexp.MustCompile(`"(fbtrace_id|x-fb-trace-id|wamid|id)":"[^"]*"`)

// addCPU adds a measured slice's CPU time per process to t's.
func (t *target) addCPU(d map[string]time.Duration) {
	if t.cpu == nil {
		t.cpu = map[string]time.Duration{}
	}
	for name, v := range d {
		t.cpu[name] += v
	}
}
