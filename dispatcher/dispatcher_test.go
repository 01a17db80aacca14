package dispatcher

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/wabarelay/wabarelay/internal/clock"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// ---- fixtures ------------------------------------------------------------------------------

type env struct {
	t     *testing.T
	fix   *testenv.Fixture
	dsn   string
	pool  *pgxpool.Pool
	st    *store.Store
	org   uuid.UUID
	phone string
	seq   atomic.Int64
	// listenDSN, if set, is given to Run instead of dsn
	listenDSN string
	// clk, if set, is the time the store and the configured dispatchers decide by (useClock)
	clk *clock.Stub
}

func newEnv(t *testing.T) *env {
	t.Helper()
	f := testenv.NewStore(t)
	org := f.Org(t, &testenv.OrgOpts{Name: "o"})
	conn := f.Connection()
	f.Channel(t, org.ID, &testenv.ChannelOpts{Connection: conn})
	return &env{t: t, fix: f, dsn: f.DSN, pool: f.Pool, st: f.Store, org: org.ID, phone: conn.PhoneNumberID}
}

// webhook creates an org-scoped webhook for "messages" events.
func (e *env) webhook(url string) (uuid.UUID, string) {
	e.t.Helper()
	w, secret := e.fix.Webhook(e.t, e.org, url)
	return w.ID, secret
}

// events stores n message events (one delivery per webhook each) and returns their ids in order.
func (e *env) events(n int) []uuid.UUID {
	e.t.Helper()
	items := make([]store.IncomingItem, n)
	for i := range items {
		k := e.seq.Add(1)
		items[i] = store.IncomingItem{Type: "messages", PhoneNumberID: e.phone, DedupeKey: fmt.Sprintf("m%d", k),
			Data: json.RawMessage(fmt.Sprintf(`{"message": {"id": "wamid.%d", "text": {"body": "héllo \u00e9 %d"}}}`, k, k))}
	}
	res, err := e.st.StoreEvents(context.Background(), items, store.Claim{})
	if err != nil || res.Events != n {
		e.t.Fatalf("store events: %+v %v", res, err)
	}
	rows, err := e.pool.Query(context.Background(), `SELECT id FROM events WHERE dedupe_key = ANY($1) ORDER BY created_at, id`, dedupeKeys(items))
	if err != nil {
		e.t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		e.t.Fatal(err)
	}
	return ids
}

func dedupeKeys(items []store.IncomingItem) []string {
	var k []string
	for _, it := range items {
		k = append(k, it.DedupeKey)
	}
	return k
}

// patience is how long a test waits for something that takes milliseconds on an idle machine:
// a deadline for a failing test, never a timing the test asserts.
const patience = 30 * time.Second

// config is a test dispatcher's configuration: retries due at once (tests of the schedule set
// their own and move the clock: retrySchedule) and quick polls; an attempt timeout (and a lease)
// that a slow, loaded machine cannot run into, so that no test sees a retry it did not ask for
// (tests of the timeout set their own); the env's clock, if it has one.
func (e *env) config(rc *testenv.Receiver) Config {
	cfg := Config{
		RetryDelays:         []time.Duration{0, 0, 0},
		Timeout:             10 * time.Second,
		Lease:               30 * time.Second,
		PollInterval:        50 * time.Millisecond,
		AllowPrivateTargets: true,
		RootCAs:             rc.Roots(),
		InstanceID:          "test-" + uuid.NewString()[:6],
	}
	if e.clk != nil {
		cfg.Clock = e.clk
	}
	return cfg
}

// useClock makes the store and the dispatchers configured after it (config) decide by a
// stubbed clock, set to the time now, and returns it: the test moves it instead of waiting for
// retries, leases and probes to fall due. Call it before storing events.
func (e *env) useClock() *clock.Stub {
	e.t.Helper()
	e.clk = clock.NewStub(time.Now())
	e.st.SetClock(e.clk)
	return e.clk
}

// run starts a dispatcher; the returned func stops it and waits for Run to return.
func (e *env) run(cfg Config) func() {
	e.t.Helper()
	_, stop := e.start(cfg)
	return stop
}

// start is run that also returns the Dispatcher.
func (e *env) start(cfg Config) (*Dispatcher, func()) {
	e.t.Helper()
	return e.launch(e.st.WebhookSecret, cfg, zaptest.NewLogger(e.t))
}

// launch is start with the webhook secrets read by secrets and the log written to logger.
func (e *env) launch(secrets Secrets, cfg Config, logger *zap.Logger) (*Dispatcher, func()) {
	e.t.Helper()
	d, err := New(e.pool, secrets, cfg, logger)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	dsn := e.dsn
	if e.listenDSN != "" {
		dsn = e.listenDSN
	}
	go func() { defer close(done); d.Run(ctx, dsn) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	e.t.Cleanup(stop)
	return d, stop
}

type deliveryRow struct {
	status   string // as the API shows it: in_flight, pending (held too), delivered, failed
	attempts int
	code     *int
	lastErr  *string
}

func (e *env) delivery(eventID uuid.UUID) deliveryRow {
	e.t.Helper()
	var r deliveryRow
	err := e.pool.QueryRow(context.Background(), `
		SELECT CASE WHEN q.status = 'in_flight' THEN 'in_flight' WHEN q.status IS NOT NULL THEN 'pending' ELSE d.status END,
		       d.attempts, d.last_status_code, d.last_error
		FROM deliveries d LEFT JOIN delivery_queue q ON q.delivery_id = d.id WHERE d.event_id = $1`, eventID).
		Scan(&r.status, &r.attempts, &r.code, &r.lastErr)
	if err != nil {
		e.t.Fatal(err)
	}
	return r
}

func (e *env) statusIs(eventID uuid.UUID, status string) func() bool {
	return func() bool { return e.delivery(eventID).status == status }
}

type attemptRow struct {
	attempt  int
	code     *int
	err      *string
	body     *string
	duration int
}

func (e *env) attemptRows(eventID uuid.UUID) []attemptRow {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), `
		SELECT a.attempt, a.status_code, a.error, a.response_body, a.duration_ms
		FROM delivery_attempts a JOIN deliveries d ON d.id = a.delivery_id WHERE d.event_id = $1 ORDER BY a.attempt`, eventID)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	var out []attemptRow
	for rows.Next() {
		var a attemptRow
		if err := rows.Scan(&a.attempt, &a.code, &a.err, &a.body, &a.duration); err != nil {
			e.t.Fatal(err)
		}
		out = append(out, a)
	}
	return out
}

// ---- tests ---------------------------------------------------------------------------------

func TestDeliveredAndSigned(t *testing.T) {
	e := newEnv(t)
	rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true})
	_, secret := e.webhook(rc.URL + "/hook")
	ids := e.events(1)
	e.run(e.config(rc))
	testenv.Eventually(t, patience, e.statusIs(ids[0], "delivered"), "delivered")

	hits := rc.Deliveries()
	if len(hits) != 1 {
		t.Fatalf("%d hits", len(hits))
	}
	h := hits[0]
	var stored string
	if err := e.pool.QueryRow(context.Background(), `SELECT convert_from(payload, 'UTF8') FROM events WHERE id = $1`, ids[0]).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if string(h.Body) != stored {
		t.Fatalf("body %s\nstored %s", h.Body, stored)
	}
	if h.Header.Get("Content-Type") != "application/json" || h.Header.Get("User-Agent") != DefaultUserAgent {
		t.Fatalf("headers %v", h.Header)
	}
	if h.Header.Get("webhook-id") != ids[0].String() {
		t.Fatalf("webhook-id %q, event %s", h.Header.Get("webhook-id"), ids[0])
	}
	// both signatures verify, made at one time (webhook-timestamp is X-Svc-Signature's t)
	signed, err := testenv.VerifySignature(secret, h.Header, h.Body)
	if err != nil {
		t.Fatal(err)
	}
	// signed when sent: at most the transit (seconds on a loaded machine) before it arrived
	if d := h.At.Sub(signed); d < 0 || d > patience {
		t.Fatalf("signed at %v is not the time of sending (received %v)", signed, h.At)
	}

	row := e.delivery(ids[0])
	if row.attempts != 1 || row.code == nil || *row.code != 200 || row.lastErr != nil {
		t.Fatalf("delivery %+v", row)
	}
	at := e.attemptRows(ids[0])
	if len(at) != 1 || at[0].attempt != 1 || *at[0].code != 200 || at[0].err != nil || *at[0].body != "ok" {
		t.Fatalf("attempts %+v", at)
	}
}

func TestSignMatchesIndependentImplementation(t *testing.T) {
	secret := store.NewWebhookSecret()
	id := uuid.New()
	body := []byte(`{"a": 1}`)
	at := time.Unix(1700000000, 0)
	svc, wid, wts, wsig := Sign(secret, id, at, body)
	if wid != id.String() || wts != "1700000000" {
		t.Fatal(wid, wts)
	}
	h := http.Header{"X-Svc-Signature": {svc}, "Webhook-Id": {wid}, "Webhook-Timestamp": {wts}, "Webhook-Signature": {wsig}}
	if at, err := testenv.VerifySignature(secret, h, body); err != nil || at.Unix() != 1700000000 {
		t.Fatalf("%s signed at %v: %v", svc, at, err)
	}
}

// retrySchedule makes a delivery's retries fall due by moving the clock: for each delay, it
// waits until the outcome of attempt n (from 1) is recorded, checks that the retry is due the
// delay after it, and moves the clock on by the delay.
func (e *env) retrySchedule(eventID uuid.UUID, delays []time.Duration) {
	e.t.Helper()
	for i, delay := range delays {
		testenv.Eventually(e.t, patience, func() bool { return len(e.attemptRows(eventID)) > i }, "the outcome of attempt %d", i+1)
		due := testenv.QueryValue[time.Time](e.t, e.fix, `SELECT next_attempt_at FROM delivery_queue WHERE event_id = $1`, eventID)
		if want := e.clk.Now().Add(delay); !due.Equal(want) {
			e.t.Fatalf("attempt %d due at %v, want %v after the outcome (%v)", i+2, due, delay, e.clk.Now())
		}
		e.clk.Advance(delay)
	}
}

// TestRetriesThenSucceeds: failed attempts are retried on the default schedule, each retry due
// its delay after the failed attempt's outcome (by the clock) and made no sooner, signed afresh
// with the same webhook-id, until a 2xx.
func TestRetriesThenSucceeds(t *testing.T) {
	e := newEnv(t)
	clk := e.useClock()
	var mu sync.Mutex
	var at []time.Time // the clock's time at each hit
	rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true, Respond: func(n int, w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		at = append(at, clk.Now())
		mu.Unlock()
		if n <= 2 {
			http.Error(w, "boom "+strconv.Itoa(n), http.StatusInternalServerError)
			return
		}
		io.WriteString(w, "fine")
	}})
	_, secret := e.webhook(rc.URL)
	ids := e.events(1)
	cfg := e.config(rc)
	cfg.RetryDelays = nil // the defaults: 30s, 2m, 10m
	e.run(cfg)
	delays := []time.Duration{30 * time.Second, 2 * time.Minute}
	e.retrySchedule(ids[0], delays)
	// delivered is final and written after the receiver answered: every hit is in by now, and
	// no further claim can pick the delivery up
	testenv.Eventually(t, patience, e.statusIs(ids[0], "delivered"), "delivered")
	hits := rc.Deliveries()
	if len(hits) != 3 {
		t.Fatalf("%d hits, want 3", len(hits))
	}
	mu.Lock()
	defer mu.Unlock()
	for i, h := range hits {
		if _, err := testenv.VerifySignature(secret, h.Header, h.Body); err != nil {
			t.Fatalf("hit %d: %v", i, err)
		}
		if h.Header.Get("webhook-id") != ids[0].String() {
			t.Fatalf("hit %d webhook-id %q", i, h.Header.Get("webhook-id"))
		}
		if i > 0 {
			if gap := at[i].Sub(at[i-1]); gap < delays[i-1] {
				t.Fatalf("gap before attempt %d is %v by the clock, want >= %v", i+1, gap, delays[i-1])
			}
		}
	}
	rows := e.attemptRows(ids[0])
	if len(rows) != 3 || *rows[0].code != 500 || *rows[1].code != 500 || *rows[2].code != 200 || *rows[0].err != "http_500" ||
		!strings.HasPrefix(*rows[0].body, "boom 1") || rows[2].err != nil {
		t.Fatalf("attempts %+v", rows)
	}
	if row := e.delivery(ids[0]); row.attempts != 3 || *row.code != 200 || row.lastErr != nil {
		t.Fatalf("delivery %+v", row)
	}
}

// TestAlwaysFailingEndsFailed: a delivery whose receiver always fails gets its four attempts on
// the default schedule (by the clock) and is failed after the fourth.
func TestAlwaysFailingEndsFailed(t *testing.T) {
	e := newEnv(t)
	e.useClock()
	rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true, Respond: func(n int, w http.ResponseWriter, r *http.Request) { w.WriteHeader(503) }})
	e.webhook(rc.URL)
	ids := e.events(1)
	cfg := e.config(rc)
	cfg.RetryDelays = nil // the defaults: 30s, 2m, 10m
	e.run(cfg)
	e.retrySchedule(ids[0], []time.Duration{30 * time.Second, 2 * time.Minute, 10 * time.Minute})
	testenv.Eventually(t, patience, e.statusIs(ids[0], "failed"), "failed") // final: every hit is in
	if n := len(rc.Deliveries()); n != 4 {
		t.Fatalf("%d hits, want 4", n)
	}
	row := e.delivery(ids[0])
	if row.attempts != 4 || *row.code != 503 || *row.lastErr != "http_503" {
		t.Fatalf("delivery %+v", row)
	}
	if at := e.attemptRows(ids[0]); len(at) != 4 || at[3].attempt != 4 {
		t.Fatalf("attempts %+v", at)
	}
}

func TestSlowReceiverIsFailure(t *testing.T) {
	e := newEnv(t)
	rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true, Respond: func(n int, w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(patience):
		case <-r.Context().Done():
		}
	}})
	e.webhook(rc.URL)
	ids := e.events(1)
	cfg := e.config(rc)
	cfg.Timeout, cfg.RetryDelays = 200*time.Millisecond, []time.Duration{}
	e.run(cfg)
	testenv.Eventually(t, patience, e.statusIs(ids[0], "failed"), "failed")
	at := e.attemptRows(ids[0])
	if len(at) != 1 || at[0].code != nil || at[0].err == nil || *at[0].err != "timeout" || at[0].duration < 200 {
		t.Fatalf("attempts %+v", at)
	}
}

func TestRedirectIsFailure(t *testing.T) {
	e := newEnv(t)
	var rc *testenv.Receiver
	rc = testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true, Respond: func(n int, w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/elsewhere" {
			return
		}
		http.Redirect(w, r, rc.URL+"/elsewhere", http.StatusTemporaryRedirect)
	}})
	e.webhook(rc.URL)
	ids := e.events(1)
	cfg := e.config(rc)
	cfg.RetryDelays = []time.Duration{}
	e.run(cfg)
	// a followed redirect would have hit the receiver before the attempt ended
	testenv.Eventually(t, patience, e.statusIs(ids[0], "failed"), "failed")
	if hits := rc.Deliveries(); len(hits) != 1 {
		t.Fatalf("%d hits: the redirect was followed", len(hits))
	}
	if row := e.delivery(ids[0]); *row.code != 307 || *row.lastErr != "http_307" {
		t.Fatalf("delivery %+v", row)
	}
}

func TestPausedHeldThenDeliveredOldestFirst(t *testing.T) {
	e := newEnv(t)
	rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true})
	wh, _ := e.webhook(rc.URL)
	ctx := context.Background()
	if _, err := e.st.SetWebhookStatus(ctx, e.org, wh, store.WebhookPaused); err != nil {
		t.Fatal(err)
	}
	// three held deliveries, due a second apart in the order of ids
	ids := e.events(3)
	for i, id := range ids {
		if _, err := e.pool.Exec(ctx, `UPDATE delivery_queue SET next_attempt_at = now() - $2 * interval '1 second' WHERE event_id = $1`,
			id, 3-i); err != nil {
			t.Fatal(err)
		}
	}
	cfg := e.config(rc)
	cfg.PerWebhook = 1 // one at a time, to observe the order
	// a marker: another org's active webhook gets a delivery stored after the held ones; once
	// it is delivered, the dispatcher has claimed past the held deliveries and left them alone
	marker := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true})
	org2, phone2 := e.tenant("marker")
	e.fix.Webhook(t, org2, marker.URL, &testenv.WebhookOpts{Name: "m"})
	e.run(cfg)
	if _, err := e.st.StoreEvents(ctx, []store.IncomingItem{{Type: "messages", PhoneNumberID: phone2, DedupeKey: "marker",
		Data: json.RawMessage(`{"message":{"id":"marker"}}`)}}, store.Claim{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, patience, func() bool { return len(marker.Deliveries()) == 1 }, "the marker delivered")
	if n := len(rc.Deliveries()); n != 0 {
		t.Fatalf("paused webhook got %d hits", n)
	}
	for _, id := range ids {
		if row := e.delivery(id); row.status != "pending" || row.attempts != 0 {
			t.Fatalf("held delivery %+v", row)
		}
	}
	if _, err := e.st.SetWebhookStatus(ctx, e.org, wh, store.WebhookActive); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, patience, e.statusIs(ids[2], "delivered"), "delivered")
	hits := rc.Deliveries()
	if len(hits) != 3 {
		t.Fatalf("%d hits", len(hits))
	}
	for i, h := range hits {
		if h.Header.Get("webhook-id") != ids[i].String() {
			t.Fatalf("hit %d is %s, want %s (oldest first)", i, h.Header.Get("webhook-id"), ids[i])
		}
	}
}

func TestLoopbackRefusedWithoutAllowPrivate(t *testing.T) {
	e := newEnv(t)
	rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true})
	e.webhook(rc.URL)
	ids := e.events(1)
	cfg := e.config(rc)
	cfg.AllowPrivateTargets, cfg.RetryDelays = false, []time.Duration{}
	e.run(cfg)
	testenv.Eventually(t, patience, e.statusIs(ids[0], "failed"), "failed")
	if n := len(rc.Deliveries()); n != 0 {
		t.Fatalf("receiver got %d hits", n)
	}
	at := e.attemptRows(ids[0])
	if len(at) != 1 || at[0].code != nil || at[0].err == nil || *at[0].err != "address_not_allowed" {
		t.Fatalf("attempts %+v", at)
	}
	t.Logf("recorded error: %s", *at[0].err)
}

// TestTwoInstancesDeliverEachOnce: two dispatchers on one database deliver every event exactly
// once while no attempt times out. (An attempt that times out is retried: at least once, by
// design; TestSlowReceiverIsFailure covers it.) The timeout here is one a loaded machine cannot
// run into; should one expire all the same, that delivery is left out of the exactly-once count
// instead of failing the test.
func TestTwoInstancesDeliverEachOnce(t *testing.T) {
	e := newEnv(t)
	rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true})
	e.webhook(rc.URL)
	const n = 200
	ids := e.events(n)
	cfgA, cfgB := e.config(rc), e.config(rc)
	cfgA.BatchSize, cfgB.BatchSize = 10, 10 // many claims, so that the two instances interleave
	cfgA.Timeout, cfgB.Timeout = 20*time.Second, 20*time.Second
	cfgA.Lease, cfgB.Lease = time.Minute, time.Minute // a claim outlives every attempt
	cfgA.InstanceID, cfgB.InstanceID = "A", "B"
	obsA, obsB := &countingObserver{n: map[string]int{}}, &countingObserver{n: map[string]int{}}
	cfgA.Observer, cfgB.Observer = obsA, obsB
	stopA, stopB := e.run(cfgA), e.run(cfgB)
	testenv.Eventually(t, 2*patience, func() bool {
		var left int
		if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM deliveries WHERE status <> 'delivered'`).Scan(&left); err != nil {
			t.Fatal(err)
		}
		return left == 0
	}, "all delivered")
	stopA()
	stopB()

	// The deliveries with an attempt that timed out, by event.
	timedOut := map[string]bool{}
	rows, err := e.pool.Query(context.Background(), `SELECT DISTINCT d.event_id::text FROM delivery_attempts a
		JOIN deliveries d ON d.id = a.delivery_id WHERE a.error LIKE 'timeout%'`)
	if err != nil {
		t.Fatal(err)
	}
	var id string
	if _, err := pgx.ForEachRow(rows, []any{&id}, func() error { timedOut[id] = true; return nil }); err != nil {
		t.Fatal(err)
	}
	if len(timedOut) > 0 {
		t.Logf("%d deliveries had an attempt time out (retried by design): not counted", len(timedOut))
	}
	if len(timedOut) > n/2 {
		t.Fatalf("%d of %d deliveries timed out after 20 s: too few left to count", len(timedOut), n)
	}

	// Every other event reached the receiver once, after one attempt, by one instance.
	counts := rc.PerEvent()
	if len(counts) != n {
		t.Fatalf("%d distinct events delivered, want %d", len(counts), n)
	}
	for _, id := range ids {
		if !timedOut[id.String()] && counts[id.String()] != 1 {
			t.Fatalf("event %s delivered %d times", id, counts[id.String()])
		}
	}
	rows, err = e.pool.Query(context.Background(), `SELECT d.event_id::text, count(*), count(*) FILTER (WHERE a.attempt = 1 AND a.status_code = 200)
		FROM delivery_attempts a JOIN deliveries d ON d.id = a.delivery_id GROUP BY d.event_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	logged := 0
	for rows.Next() {
		var id string
		var total, firstOK int
		if err := rows.Scan(&id, &total, &firstOK); err != nil {
			t.Fatal(err)
		}
		logged++
		if !timedOut[id] && (total != 1 || firstOK != 1) {
			t.Fatalf("event %s: %d attempt rows (%d successful first attempts), want 1", id, total, firstOK)
		}
	}
	if logged != n {
		t.Fatalf("attempts logged for %d deliveries, want %d", logged, n)
	}
	obsA.mu.Lock()
	obsB.mu.Lock()
	t.Logf("delivered by A: %d, by B: %d", obsA.n[OutcomeDelivered], obsB.n[OutcomeDelivered])
	obsA.mu.Unlock()
	obsB.mu.Unlock()
}

func TestExpiredLeaseIsReclaimed(t *testing.T) {
	e := newEnv(t)
	rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true})
	e.webhook(rc.URL)
	ids := e.events(2)
	ctx := context.Background()
	// Both: one attempt recorded, the second claimed (its instance's second claim) by an instance
	// that died. ids[0]'s lease has passed; ids[1]'s has not.
	if _, err := e.pool.Exec(ctx, `
		WITH q AS (UPDATE delivery_queue SET status = 'in_flight', attempts = 1, claim_seq = 2, locked_by = 'dead',
		           locked_until = CASE WHEN event_id = $1 THEN now() - interval '1 second' ELSE now() + interval '1 hour' END)
		UPDATE deliveries SET attempts = 1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	e.run(e.config(rc))
	testenv.Eventually(t, patience, e.statusIs(ids[0], "delivered"), "reclaimed and delivered")
	// the lost claim used up no attempt: the reclaim made attempt 2
	if row := e.delivery(ids[0]); row.attempts != 2 {
		t.Fatalf("reclaimed delivery %+v, want attempts 2", row)
	}
	if got := e.attemptRows(ids[0]); len(got) != 1 || got[0].attempt != 2 {
		t.Fatalf("reclaimed delivery's log %+v, want attempt 2", got)
	}
	// ids[1] is older than nothing and due like ids[0]: the claim that took ids[0] saw it and
	// left it, its lease being live
	if row := e.delivery(ids[1]); row.status != "in_flight" || row.attempts != 1 {
		t.Fatalf("live lease was taken: %+v", row)
	}
	if hits := rc.Deliveries(); len(hits) != 1 || hits[0].Header.Get("webhook-id") != ids[0].String() {
		t.Fatalf("hits %v", hits)
	}
	// Late completions of claims that are not ids[1]'s current one are fenced out and not
	// logged: another instance's, and the same instance's earlier claim; the current claim's is
	// recorded.
	complete := func(instance string, claim int) {
		t.Helper()
		code, msg, body := 500, "late", ""
		var created time.Time
		if err := e.pool.QueryRow(ctx, `SELECT created_at FROM deliveries WHERE event_id = $1`, ids[1]).Scan(&created); err != nil {
			t.Fatal(err)
		}
		j := job{ID: mustDeliveryID(t, e, ids[1]), Attempt: 2, Claim: claim, CreatedAt: created}
		// (a retry an hour away: the running dispatcher leaves it alone)
		late := store.Outcome{Delivery: j, Started: time.Now(), Duration: time.Millisecond, StatusCode: &code,
			Error: &msg, Body: &body, RetryIn: time.Hour}
		if _, err := store.NewQueue(e.pool).Record(ctx, instance, []store.Outcome{late}); err != nil {
			t.Fatal(err)
		}
	}
	complete("someone-else", 2)
	complete("dead", 1)
	if row := e.delivery(ids[1]); row.status != "in_flight" || row.attempts != 1 || len(e.attemptRows(ids[1])) != 0 {
		t.Fatalf("fence failed: %+v, log %+v", row, e.attemptRows(ids[1]))
	}
	complete("dead", 2)
	if row := e.delivery(ids[1]); row.status != "pending" || row.attempts != 2 || len(e.attemptRows(ids[1])) != 1 {
		t.Fatalf("the current claim's outcome: %+v, log %+v", row, e.attemptRows(ids[1]))
	}
}

func mustDeliveryID(t *testing.T, e *env, eventID uuid.UUID) uuid.UUID {
	var id uuid.UUID
	if err := e.pool.QueryRow(context.Background(), `SELECT id FROM deliveries WHERE event_id = $1`, eventID).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// TestPerWebhookCap: with a cap of 3 per webhook, 3 attempts run at once and never more. The
// first requests are held until 3 are in at the same time (the cap is reached), then each is
// held briefly, so that a 4th would overlap them if the cap let it through.
func TestPerWebhookCap(t *testing.T) {
	e := newEnv(t)
	var cur, peak atomic.Int32
	full := make(chan struct{}) // closed once 3 requests are in at the same time
	var fullOnce sync.Once
	rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true, Respond: func(n int, w http.ResponseWriter, r *http.Request) {
		c := cur.Add(1)
		for {
			p := peak.Load()
			if c <= p || peak.CompareAndSwap(p, c) {
				break
			}
		}
		if c >= 3 {
			fullOnce.Do(func() { close(full) })
		}
		select {
		case <-full:
		case <-time.After(patience):
			fullOnce.Do(func() { close(full) })
		}
		time.Sleep(20 * time.Millisecond)
		cur.Add(-1)
	}})
	e.webhook(rc.URL)
	ids := e.events(20)
	cfg := e.config(rc)
	cfg.PerWebhook = 3
	cfg.Timeout, cfg.Lease = 2*patience, 3*patience // longer than any hold
	e.run(cfg)
	testenv.Eventually(t, 2*patience, func() bool {
		for _, id := range ids {
			if e.delivery(id).status != "delivered" {
				return false
			}
		}
		return true
	}, "all delivered")
	if p := peak.Load(); p != 3 {
		t.Fatalf("peak concurrency %d, cap 3", p)
	}
	if n := len(rc.Deliveries()); n != 20 {
		t.Fatalf("%d hits", n)
	}
}

func TestNewRejectsShortLease(t *testing.T) {
	if _, err := New(&pgxpool.Pool{}, func(context.Context, uuid.UUID) (string, error) { return "", nil },
		Config{Timeout: 10 * time.Second, Lease: 5 * time.Second}, nil); err == nil {
		t.Fatal("lease <= timeout accepted")
	}
}

type countingObserver struct {
	mu sync.Mutex
	n  map[string]int
}

func (o *countingObserver) Attempt(outcome string, d time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.n[outcome]++
}

// TestObserverAndGracefulShutdown: the observer sees each attempt's outcome, and shutting down
// waits for the attempt in flight and records it. The receiver holds the second attempt until
// shutdown has begun.
func TestObserverAndGracefulShutdown(t *testing.T) {
	e := newEnv(t)
	started := make(chan struct{}, 10)
	release := make(chan struct{})
	var releaseOnce sync.Once
	rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true, Respond: func(n int, w http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		if n == 1 {
			w.WriteHeader(500)
			return
		}
		<-release
	}})
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) }) // (before rc.srv.Close)
	e.webhook(rc.URL)
	ids := e.events(1)
	obs := &countingObserver{n: map[string]int{}}
	cfg := e.config(rc)
	cfg.Observer = obs
	d, err := New(e.pool, e.st.WebhookSecret, cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx, e.dsn) }()
	t.Cleanup(func() { cancel(); <-done })
	<-started
	<-started // the retry is in flight, held by the receiver
	cancel()  // shutdown begins
	select {
	case <-done:
		t.Fatal("Run returned with an attempt in flight")
	default:
	}
	releaseOnce.Do(func() { close(release) })
	<-done // Run waits for the attempt and records it
	if row := e.delivery(ids[0]); row.status != "delivered" || row.attempts != 2 {
		t.Fatalf("after shutdown: %+v", row)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if obs.n[OutcomeRetrying] != 1 || obs.n[OutcomeDelivered] != 1 || len(obs.n) != 2 {
		t.Fatalf("observer %v", obs.n)
	}
}

func TestWakesOnNotify(t *testing.T) {
	e := newEnv(t)
	rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true})
	e.webhook(rc.URL)
	sep := "?"
	if strings.Contains(e.dsn, "?") {
		sep = "&"
	}
	e.listenDSN = e.dsn + sep + "pool_max_conns=2" // a pool DSN works for the LISTEN connection
	cfg := e.config(rc)
	cfg.PollInterval = time.Hour // only a notification can wake the dispatcher
	e.run(cfg)
	e.fix.WaitListen(t, "wabarelay_deliveries")
	// Twice: the first store may race the claim made on connecting; by the second, that claim
	// is long done, and with a poll interval of an hour only the notification can wake it.
	for round := range 2 {
		t0 := time.Now()
		ids := e.events(1)
		testenv.Eventually(t, patience, e.statusIs(ids[0], "delivered"), "delivered after NOTIFY")
		t.Logf("round %d: store to delivered: %v", round, time.Since(t0))
	}
}

func TestUntrustedCertificateIsFailure(t *testing.T) {
	for _, name := range []string{"system pool only", "other extra CA"} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true})
			e.webhook(rc.URL)
			ids := e.events(1)
			cfg := e.config(rc)
			cfg.RetryDelays = []time.Duration{}
			if name == "system pool only" {
				cfg.RootCAs = nil
			} else {
				cfg.RootCAs = otherCA(t) // (httptest servers all share one certificate)
			}
			e.run(cfg)
			testenv.Eventually(t, patience, e.statusIs(ids[0], "failed"), "failed")
			if row := e.delivery(ids[0]); row.lastErr == nil || *row.lastErr != "tls_error" {
				t.Fatalf("delivery %+v", row)
			}
			t.Logf("error: %s", *e.delivery(ids[0]).lastErr)
		})
	}
}

// otherCA returns a pool holding a fresh self-signed CA that signed nothing.
func otherCA(t *testing.T) *x509.CertPool {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "other"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	p := x509.NewCertPool()
	p.AddCert(c)
	return p
}

// TestConfigValidate: Validate applies the defaults and the lease rule that New applies.
func TestConfigValidate(t *testing.T) {
	for _, c := range []struct {
		cfg Config
		ok  bool
	}{
		{Config{}, true},
		{Config{Timeout: 30 * time.Second, Lease: 31 * time.Second}, true},
		{Config{Timeout: 30 * time.Second, Lease: 30 * time.Second}, false},
		{Config{Timeout: DefaultLease}, false}, // the default lease does not exceed it
		{Config{Lease: DefaultTimeout}, false},
		{Config{RetryDelays: []time.Duration{-time.Second}}, false},
	} {
		if err := c.cfg.Validate(); (err == nil) != c.ok {
			t.Errorf("Validate(%+v) = %v, want ok %v", c.cfg, err, c.ok)
		}
	}
}

// TestClaimTimeout: a claim's time limit is the attempt timeout, never below DefaultTimeout
// unless half the lease is shorter.
func TestClaimTimeout(t *testing.T) {
	for _, c := range []struct{ timeout, lease, want time.Duration }{
		{200 * time.Millisecond, 30 * time.Second, DefaultTimeout},
		{DefaultTimeout, DefaultLease, DefaultTimeout},
		{30 * time.Second, time.Minute, 30 * time.Second},
		{time.Second, 4 * time.Second, 2 * time.Second},
	} {
		d := &Dispatcher{cfg: Config{Timeout: c.timeout, Lease: c.lease}}
		if got := d.claimTimeout(); got != c.want {
			t.Errorf("timeout %v, lease %v: claim timeout %v, want %v", c.timeout, c.lease, got, c.want)
		}
	}
}
