package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// noDispatcherLog is (part of) the info line an instance with delivery { workers 0 } logs.
const noDispatcherLog = "this instance runs no dispatcher"

// TestRolesInboundOnlyAndDispatcherOnly: two Caddy processes on one database. A serves the inbound endpoint
// with delivery { workers 0 } (no dispatcher, though it trusts the receiver's CA); B has only the wabarelay global option (no site,
// no inbound endpoint) and default delivery settings. 20 signed upstream batches of 10 messages posted to
// A are stored pending and announced (the NOTIFY is seen), and every event reaches the HTTPS
// receiver exactly once, each attempt made under B's claim: at the moment of every attempt the
// delivery row is in_flight with locked_by = B's instance id (host-<caddy instance>-<pid of B>),
// A never attempts (no attempt metric on A, its log says it runs no dispatcher), and the
// deliveries table shows each delivery delivered after one recorded attempt.
func TestRolesInboundOnlyAndDispatcherOnly(t *testing.T) {
	t.Parallel()
	const batches, perBatch = 20, 10
	const events = batches * perBatch
	e := newRelayEnv(t)
	ctx := context.Background()

	// The receiver (deliveries per event id, both signatures checked) notes, as it answers each
	// attempt, who holds the delivery's claim while it is being made (locked_by is cleared when
	// the outcome is recorded).
	var claimMu sync.Mutex
	claims := map[string][]string{} // event id → "status locked_by" seen during each attempt
	rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true, Respond: func(_ int, w http.ResponseWriter, r *http.Request) {
		var status string
		var lockedBy *string
		seen := ""
		err := e.pool.QueryRow(r.Context(), `SELECT status, locked_by FROM delivery_queue WHERE event_id::text = $1`,
			r.Header.Get("webhook-id")).Scan(&status, &lockedBy)
		switch {
		case err != nil:
			seen = "error: " + err.Error()
		case lockedBy == nil:
			seen = status + " <none>"
		default:
			seen = status + " " + *lockedBy
		}
		claimMu.Lock()
		claims[r.Header.Get("webhook-id")] = append(claims[r.Header.Get("webhook-id")], seen)
		claimMu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}})
	caPath := testenv.CAFile(t, rc.Certificate())

	e.channelOn(true, pnid)
	_, secret := e.fix.Webhook(t, e.org, rc.URL+"/hook", &testenv.WebhookOpts{Name: "r"})
	rc.Verify(secret)

	// A: inbound (and relay, metrics), no dispatcher; it could reach the receiver if it had one
	a := e.caddyWith("", fmt.Sprintf("meta {\n app_secret %s\n verify_token %s\n}\ndelivery {\n workers 0\n root_ca %s\n allow_private_targets\n}",
		testAppSecret, testVerifyToken, caPath),
		"handle /webhooks/upstream {\n wabarelay_inbound\n}")
	// B: nothing but the app, default delivery settings (plus what reaching a local test
	// receiver needs)
	b := e.caddyFile(fmt.Sprintf(`{
	admin off
	persist_config off
	wabarelay {
		database       {env.WBR_TEST_DATABASE}
		encryption_key {env.WBR_TEST_KEY}
		delivery {
			root_ca %s
			allow_private_targets
		}
	}
}
`, caPath), testenv.FreePort(t), "WBR_TEST_DATABASE="+e.dsn, "WBR_TEST_KEY="+e.keyB64)
	logsOf := func(origin string) string { return e.caddies[origin].Logs() }
	if !strings.Contains(logsOf(a), noDispatcherLog) {
		t.Fatalf("A (workers 0) does not log that it runs no dispatcher:\n%s", logsOf(a))
	}
	if strings.Contains(logsOf(b), noDispatcherLog) {
		t.Fatal("B (default workers) logs that it runs no dispatcher")
	}
	host, _ := os.Hostname()
	pidA, pidB := strconv.Itoa(e.caddies[a].PID()), strconv.Itoa(e.caddies[b].PID())
	isB := func(lockedBy string) bool {
		return strings.HasPrefix(lockedBy, host+"-") && strings.HasSuffix(lockedBy, "-"+pidB)
	}

	// Deliveries stored by A are announced to the other instances' dispatchers.
	listener, err := pgx.Connect(ctx, e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = listener.Close(ctx) }() // closed even if Close returns an error
	if _, err := listener.Exec(ctx, "LISTEN "+pgx.Identifier{store.DeliveriesNotifyChannel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	post := func(i int) {
		t.Helper()
		ids := make([]string, perBatch)
		for j := range ids {
			ids[j] = fmt.Sprintf("r%d-%d", i, j)
		}
		status, body := signedPost(t, a+"/webhooks/upstream", testAppSecret, upstreamBatch(map[string][2][]string{pnid: {ids, nil}}))
		if status != 200 || !strings.Contains(body, fmt.Sprintf(`"events":%d`, perBatch)) {
			t.Fatalf("inbound on A, batch %d: %d %s", i, status, body)
		}
	}
	post(0)
	nctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	n, err := listener.WaitForNotification(nctx)
	cancel()
	if err != nil || n.Channel != store.DeliveriesNotifyChannel {
		t.Errorf("no NOTIFY %s after A stored deliveries: %v", store.DeliveriesNotifyChannel, err)
	}
	for i := 1; i < batches; i++ {
		post(i)
	}

	took := testenv.Eventually(t, 2*time.Minute, func() bool { return len(rc.PerEvent()) == events }, "every event delivered")
	testenv.Eventually(t, time.Minute, func() bool { return e.undelivered() == 0 }, "every delivery delivered")
	t.Logf("%d events posted to A delivered in %v", events, took)

	// exactly once, per event id
	rows, err := e.pool.Query(ctx, `SELECT e.id::text, d.status, d.attempts, NOT EXISTS (SELECT 1 FROM delivery_queue q WHERE q.delivery_id = d.id),
		       (SELECT count(*) FROM delivery_attempts x WHERE x.delivery_id = d.id),
		       (SELECT count(*) FROM delivery_attempts x WHERE x.delivery_id = d.id AND x.attempt = 1 AND x.status_code = 204)
		FROM events e JOIN deliveries d ON d.event_id = e.id`)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		id, status        string
		attempts          int
		unlocked          bool
		logged, logged204 int
	}
	var got []row
	for rows.Next() {
		var r row
		if err := rows.Scan(&r.id, &r.status, &r.attempts, &r.unlocked, &r.logged, &r.logged204); err != nil {
			t.Fatal(err)
		}
		got = append(got, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(got) != events || e.upstreamEvents() != events || e.count("deliveries") != events {
		t.Fatalf("%d event deliveries (%d events, %d deliveries), want %d each", len(got), e.upstreamEvents(), e.count("deliveries"), events)
	}
	hits := rc.PerEvent()
	claimMu.Lock()
	defer claimMu.Unlock()
	if len(hits) != events {
		t.Errorf("receiver saw %d distinct event ids, want %d", len(hits), events)
	}
	bID := ""
	for _, r := range got {
		if hits[r.id] != 1 {
			t.Errorf("event %s received %d times, want 1", r.id, hits[r.id])
		}
		if r.status != "delivered" || r.attempts != 1 || !r.unlocked || r.logged != 1 || r.logged204 != 1 {
			t.Errorf("event %s: delivery %s, attempts %d, unlocked %v, %d attempts logged (%d a first attempt answered 204)",
				r.id, r.status, r.attempts, r.unlocked, r.logged, r.logged204)
		}
		c := claims[r.id]
		if len(c) != 1 {
			t.Errorf("event %s: claims seen during attempts %q, want one", r.id, c)
			continue
		}
		status, lockedBy, _ := strings.Cut(c[0], " ")
		if status != "in_flight" || !isB(lockedBy) {
			t.Errorf("event %s attempted while its delivery was %q, want in_flight under B's claim (%s-…-%s; A is …-%s)",
				r.id, c[0], host, pidB, pidA)
		}
		if bID == "" {
			bID = lockedBy
		} else if lockedBy != bID {
			t.Errorf("attempts under two claimants: %s and %s", bID, lockedBy)
		}
	}
	if !t.Failed() {
		t.Logf("every attempt was made under B's claim %s", bID)
	}

	// A made no attempt (its process-wide attempt counter has no sample), and its metrics,
	// queue collector included, work with no dispatcher.
	m := call(t, "GET", a+"/metrics", "", "")
	if m.status != 200 {
		t.Fatalf("A's metrics: %d", m.status)
	}
	if strings.Contains(string(m.body), "caddy_wabarelay_delivery_attempts_total{") {
		t.Errorf("A (workers 0) counted delivery attempts:\n%s", grepLines(string(m.body), "delivery_attempts_total"))
	}
	for _, want := range []string{fmt.Sprintf(`caddy_wabarelay_inbound_events_total{type="messages"} %d`, events),
		"caddy_wabarelay_delivery_queue_depth 0", "caddy_wabarelay_delivery_oldest_due_seconds 0"} {
		if !strings.Contains(string(m.body), want) {
			t.Errorf("A's metrics lack %s", want)
		}
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
