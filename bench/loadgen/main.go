// Command loadgen is a second, independent load generator for the events pipeline (issue 21):
// it offers signed upstream posts to wabarelay_inbound at a fixed rate and counts what a
// webhook receiver running in a separate process gets, so that neither the receiver's TLS and
// HTTP work nor the generator's is accounted to (or competes inside) one process with the
// other, and neither shares code with bench/events beyond benchkit's process helpers.
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
package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"flag"
	"fmt"
	"io"
	"math"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wabarelay/wabarelay/bench/internal/benchkit"
	"github.com/wabarelay/wabarelay/secretbox"
	"github.com/wabarelay/wabarelay/store"
)

const (
	wabaID      = "102290129340399"
	appSecret   = "loadgen-app-secret-0123456789"
	verifyToken = "loadgen-verify"
	inboundPath = "/webhooks/upstream"
)

type config struct {
	caddyBin, pgDSN      string
	rate, perPost        int
	channels             int
	statuses             float64
	duration, drain      time.Duration
	maxInflight          int
	receiver, receiverTo string
}

func main() {
	var c config
	flag.StringVar(&c.caddyBin, "caddy", "bin/caddy", "the Caddy binary with wabarelay")
	flag.StringVar(&c.pgDSN, "pg", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "Postgres admin DSN; the run creates and drops its own database")
	flag.IntVar(&c.rate, "rate", 5000, "offered events/s")
	flag.IntVar(&c.perPost, "per-post", 10, "items (events) per upstream post")
	flag.IntVar(&c.channels, "channels", 100, "active channels the posts are spread over")
	flag.Float64Var(&c.statuses, "statuses", 0, "share of posts carrying statuses instead of messages (0..1)")
	flag.DurationVar(&c.duration, "duration", 20*time.Second, "offered-load time (at most 60s)")
	flag.DurationVar(&c.drain, "drain", 60*time.Second, "longest wait for the receiver to get every accepted event")
	flag.IntVar(&c.maxInflight, "max-inflight", 2000, "most posts outstanding at once")
	flag.StringVar(&c.receiver, "receiver", "", "(internal) run as the receiver, writing its URLs and CA to this file")
	flag.Parse()
	if c.receiver != "" {
		if err := runReceiver(c.receiver); err != nil {
			benchkit.Fatalf("receiver: %v", err)
		}
		return
	}
	c.duration = min(c.duration, 60*time.Second)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, c); err != nil {
		benchkit.Fatalf("loadgen: %v", err)
	}
}

// ---- receiver (separate process) ----

// runReceiver serves the webhook over HTTPS and its counts over plain HTTP (GET /stats), and
// writes "<webhook URL>\n<stats URL>\n<CA PEM>" to out.
func runReceiver(out string) error {
	var mu sync.Mutex
	seen := map[string]struct{}{}
	var receipts atomic.Int64
	hook := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var ev struct {
			ID string `json:"id"`
		}
		_ = json.Unmarshal(body, &ev)
		receipts.Add(1)
		mu.Lock()
		seen[ev.ID] = struct{}{}
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	hook.StartTLS()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n := len(seen)
		mu.Unlock()
		fmt.Fprintf(w, "%d %d", n, receipts.Load())
	}))
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: hook.Certificate().Raw})
	tmp := out + ".tmp"
	if err := os.WriteFile(tmp, []byte(hook.URL+"/hook\nhttp://"+ln.Addr().String()+"/stats\n"+string(ca)), 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, out); err != nil {
		return err
	}
	select {} // until killed
}

// receiverStats returns the distinct event ids and receipts the receiver has counted.
func receiverStats(client *http.Client, u string) (distinct, receipts int64, err error) {
	resp, err := client.Get(u)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	_, err = fmt.Sscanf(string(b), "%d %d", &distinct, &receipts)
	return distinct, receipts, err
}

// ---- run ----

func run(ctx context.Context, c config) error {
	var cl benchkit.Cleanups
	defer cl.Run()
	caddyBin, err := benchkit.CaddyBinary(c.caddyBin)
	if err != nil {
		return err
	}
	loadAvg := benchkit.LoadAvg()
	runID := benchkit.RandHex(4)
	tmp, err := os.MkdirTemp("", "wabarelay-loadgen-")
	if err != nil {
		return err
	}
	cl.Add(func() { os.RemoveAll(tmp) })

	// receiver, in its own process
	self, err := os.Executable()
	if err != nil {
		return err
	}
	rcvFile := filepath.Join(tmp, "receiver")
	rcv := exec.Command(self, "-receiver", rcvFile)
	rcv.Stderr = os.Stderr
	if err := rcv.Start(); err != nil {
		return err
	}
	cl.Add(func() { rcv.Process.Kill(); rcv.Wait() })
	var rcvInfo []byte
	for deadline := time.Now().Add(10 * time.Second); ; {
		if rcvInfo, err = os.ReadFile(rcvFile); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("receiver did not start")
		}
		time.Sleep(20 * time.Millisecond)
	}
	lines := strings.SplitN(string(rcvInfo), "\n", 3)
	hookURL, statsURL := lines[0], lines[1]
	caPath := filepath.Join(tmp, "receiver-ca.pem")
	if err := os.WriteFile(caPath, []byte(lines[2]), 0o600); err != nil {
		return err
	}
	benchkit.Logf("receiver (pid %d) on %s", rcv.Process.Pid, hookURL)

	// database and data
	dbName := "wabarelay_loadgen_" + runID
	dsn, err := benchkit.NewDatabase(ctx, c.pgDSN, dbName, &cl)
	if err != nil {
		return err
	}
	key := make([]byte, 32)
	rand.Read(key)
	pnids := make([]string, c.channels)
	for i := range pnids {
		pnids[i] = fmt.Sprintf("1077%011d", i)
	}
	if err := createData(ctx, dsn, key, pnids, hookURL); err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	cl.Add(pool.Close)
	backlog := func() int64 {
		var n int64
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM delivery_queue WHERE status <> 'held'`).Scan(&n)
		return n
	}

	// Caddy
	port := benchkit.FreePort()
	cfg := fmt.Sprintf(`{
	admin off
	persist_config off
	default_bind 127.0.0.1
	wabarelay {
		database       {env.WBR_LOADGEN_DATABASE}
		encryption_key {env.WBR_LOADGEN_KEY}
		meta {
			app_secret   %s
			verify_token %s
		}
		delivery {
			retry_delays 1s 2s 5s
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
`, appSecret, verifyToken, caPath, port, inboundPath)
	env := []string{"WBR_LOADGEN_DATABASE=" + dsn, "WBR_LOADGEN_KEY=" + base64.StdEncoding.EncodeToString(key)}
	cd, err := benchkit.StartCaddy(ctx, caddyBin, filepath.Join(tmp, "caddy"), cfg, env, port)
	if err != nil {
		return fmt.Errorf("caddy: %w", err)
	}
	cl.Add(cd.Stop)

	g := &generator{c: c, url: fmt.Sprintf("http://127.0.0.1:%d%s", port, inboundPath), pnids: pnids, runID: runID,
		client: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConns: c.maxInflight,
			MaxIdleConnsPerHost: c.maxInflight, DisableCompression: true}}}
	statsClient := &http.Client{Timeout: 5 * time.Second}

	// warm-up (not measured): 100 events
	if acc, _ := g.load(ctx, 200, 500*time.Millisecond, "w"); acc.accepted.Load() == 0 {
		return fmt.Errorf("warm-up: nothing accepted (see Caddy's log in %s)", tmp)
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if d, _, _ := receiverStats(statsClient, statsURL); d >= 100 && backlog() == 0 {
			break
		}
	}
	baseDistinct, baseReceipts, err := receiverStats(statsClient, statsURL)
	if err != nil {
		return err
	}

	// the measured step
	procs := map[string]int{"caddy": cd.PID(), "receiver": rcv.Process.Pid, "loadgen": os.Getpid()}
	cpu0 := benchkit.SampleCPU(procs, dbName)
	start := time.Now()
	var quarterBacklog, quarterDelivered int64
	quarter := time.AfterFunc(c.duration/4, func() {
		quarterBacklog = backlog()
		quarterDelivered, _, _ = receiverStats(statsClient, statsURL)
	})
	defer quarter.Stop()
	res, acks := g.load(ctx, c.rate, c.duration, "m")
	loadTime := time.Since(start)
	cpu := benchkit.DiffCPU(cpu0, benchkit.SampleCPU(procs, dbName))
	endBacklog := backlog()
	runDistinct, _, _ := receiverStats(statsClient, statsURL)
	accepted := res.accepted.Load()
	var drainTime time.Duration
	distinct, receipts := runDistinct, int64(0)
	for drainStart := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		distinct, receipts, _ = receiverStats(statsClient, statsURL)
		if distinct-baseDistinct >= accepted && backlog() == 0 || time.Since(drainStart) > c.drain || ctx.Err() != nil {
			drainTime = time.Since(drainStart)
			break
		}
	}
	cpuAll := benchkit.DiffCPU(cpu0, benchkit.SampleCPU(procs, dbName)) // load and drain: all the work of the step
	delivered := distinct - baseDistinct
	dups := (receipts - baseReceipts) - delivered
	duringLoad := float64(runDistinct-baseDistinct) / loadTime.Seconds()
	drainRate := float64(distinct-runDistinct) / math.Max(drainTime.Seconds(), 0.001)
	offered := int64(c.rate) * int64(c.duration/time.Second)
	sustained := res.skipped.Load() == 0 && res.failed.Load() == 0 && accepted == offered &&
		endBacklog <= quarterBacklog+int64(c.rate/4) && duringLoad >= 0.95*float64(c.rate)

	// report
	p := func(f string, a ...any) { fmt.Printf(f+"\n", a...) }
	p("\n## loadgen\n\n```sh\n%s\n```\n", "go run ./bench/loadgen "+strings.Join(os.Args[1:], " "))
	p("Caddy %s (wabarelay_inbound, product delivery defaults, retry_delays 1s 2s 5s), %d channels, 1 org-scoped webhook to a receiver in its own process (pid %d, HTTPS, 204). Posts of %d items (%.0f%% statuses), signed, open loop at %d events/s for %s. Load average at start %s.\n",
		caddyBin, c.channels, rcv.Process.Pid, c.perPost, 100*c.statuses, c.rate, c.duration, loadAvg)
	slices.Sort(acks)
	q := func(f float64) float64 {
		if len(acks) == 0 {
			return 0
		}
		return benchkit.MS(acks[min(len(acks)-1, int(f*float64(len(acks))))])
	}
	p("| offered events/s | accepted / offered | skipped / failed posts | ack p50 / p99 ms | deliveries/s during load | draining | backlog ¼ → end | delivered / dup / lost | sustained |")
	p("|--:|--:|--:|--:|--:|--:|--:|--:|:-:|")
	p("| %d | %d / %d | %d / %d | %.1f / %.1f | %.0f | %.0f | %d → %d | %d / %d / %d | %v |",
		c.rate, accepted, offered, res.skipped.Load(), res.failed.Load(), q(0.5), q(0.99), duringLoad, drainRate,
		quarterBacklog, endBacklog, delivered, dups, max(accepted-delivered, 0), sustained)
	_ = quarterDelivered
	names := []string{"caddy", benchkit.PGBackends, benchkit.PGOther, "receiver", "loadgen"}
	var total time.Duration
	row := "|"
	for _, n := range names {
		total += cpu[n]
		row += fmt.Sprintf(" %.0f |", float64(cpu[n].Microseconds())/float64(offered))
	}
	var totalAll time.Duration
	rowAll := "| load and drain, per accepted event |"
	for _, n := range names {
		totalAll += cpuAll[n]
		rowAll += fmt.Sprintf(" %.0f |", float64(cpuAll[n].Microseconds())/float64(max(accepted, 1)))
	}
	p("\nCPU µs per event (machine busy during the load %.0f%%):\n", 100*total.Seconds()/(2*loadTime.Seconds()))
	p("| window | %s | total |", strings.Join(names, " | "))
	p("|:--|%s--:|", strings.Repeat("--:|", len(names)))
	p("| load, per offered event |%s %.0f |", row[1:], float64(total.Microseconds())/float64(offered))
	p("%s %.0f |", rowAll, float64(totalAll.Microseconds())/float64(max(accepted, 1)))
	if delivered < accepted {
		return fmt.Errorf("%d accepted events not delivered within %s", accepted-delivered, c.drain)
	}
	return nil
}

// createData makes the org, the channels (one phone number id each) and the webhook.
func createData(ctx context.Context, dsn string, key []byte, pnids []string, hookURL string) error {
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return err
	}
	pcfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off" // setup only
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
	org, err := st.CreateOrg(ctx, "loadgen")
	if err != nil {
		return err
	}
	for i, pn := range pnids {
		ch, err := st.CreateChannel(ctx, org.ID, "loadgen "+strconv.Itoa(i), time.Hour)
		if err != nil {
			return fmt.Errorf("create channel: %w", err)
		}
		if err := st.ConnectChannel(ctx, ch.ID, store.Connection{PhoneNumberID: pn, WabaID: wabaID,
			DisplayPhoneNumber: fmt.Sprintf("+1 555-%07d", i), VerifiedName: "Loadgen", UpstreamToken: "EAAGload" + benchkit.RandHex(8)}); err != nil {
			return fmt.Errorf("connect channel: %w", err)
		}
	}
	_, _, err = st.CreateWebhook(ctx, org.ID, store.NewWebhook{Name: "loadgen", URL: hookURL,
		Events: []string{store.EventMessages, store.EventMessageStatus}})
	return err
}

// ---- load ----

type generator struct {
	c      config
	url    string
	pnids  []string
	runID  string
	client *http.Client
	seq    atomic.Int64
}

type counts struct{ accepted, skipped, failed atomic.Int64 }

// sign returns the upstream's X-Hub-Signature-256 of body.
func sign(body []byte) string {
	m := hmac.New(sha256.New, []byte(appSecret))
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// body returns a post of n items on channel pnid: messages, or statuses of outgoing messages.
func (g *generator) body(pnid string, n int, statuses bool, tag string) []byte {
	now := strconv.FormatInt(time.Now().Unix(), 10)
	var b bytes.Buffer
	b.WriteString(`{"object":"whatsapp_business_account","entry":[{"id":"` + wabaID + `","changes":[{"field":"messages","value":{"messaging_product":"whatsapp","metadata":{"display_phone_number":"1","phone_number_id":"` + pnid + `"},`)
	if statuses {
		b.WriteString(`"statuses":[`)
	} else {
		b.WriteString(`"contacts":[{"profile":{"name":"L"},"wa_id":"1666"}],"messages":[`)
	}
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		id := "wamid.lg." + g.runID + "." + tag + "." + strconv.FormatInt(g.seq.Add(1), 10)
		if statuses {
			b.WriteString(`{"id":"` + id + `","status":"delivered","timestamp":"` + now + `","recipient_id":"1666` + strconv.Itoa(i) + `"}`)
		} else {
			b.WriteString(`{"from":"1666` + strconv.Itoa(i) + `","id":"` + id + `","timestamp":"` + now + `","type":"text","text":{"body":"hello"}}`)
		}
	}
	b.WriteString(`]}}]}]}`)
	return b.Bytes()
}

// load offers rate events/s for d (open loop) and returns the counts and every post's ack time.
func (g *generator) load(ctx context.Context, rate int, d time.Duration, tag string) (*counts, []time.Duration) {
	var res counts
	posts := int(int64(rate) * int64(d) / int64(time.Second) / int64(g.c.perPost))
	interval := time.Duration(float64(time.Second) * float64(g.c.perPost) / float64(rate))
	slots := make(chan struct{}, g.c.maxInflight)
	var mu sync.Mutex
	acks := make([]time.Duration, 0, posts)
	var wg sync.WaitGroup
	start := time.Now()
	for k := range posts {
		if wait := time.Until(start.Add(time.Duration(k) * interval)); wait > 0 {
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				return &res, acks
			}
		}
		select {
		case slots <- struct{}{}:
		default:
			res.skipped.Add(1)
			continue
		}
		body := g.body(g.pnids[k%len(g.pnids)], g.c.perPost, mrand.Float64() < g.c.statuses, tag)
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, g.url, bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Hub-Signature-256", sign(body))
			t0 := time.Now()
			resp, err := g.client.Do(req)
			if err != nil {
				res.failed.Add(1)
				return
			}
			rb, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var ans struct{ Events int }
			if resp.StatusCode != http.StatusOK || json.Unmarshal(rb, &ans) != nil {
				res.failed.Add(1)
				return
			}
			el := time.Since(t0)
			res.accepted.Add(int64(ans.Events))
			mu.Lock()
			acks = append(acks, el)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return &res, acks
}

// ---- CPU ----
