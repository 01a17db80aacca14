package dispatcher

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"go.uber.org/zap/zaptest"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// reserve waits until the dispatcher hands out slots (Run has started).
func reserve(t *testing.T, d *Dispatcher, n int) int {
	t.Helper()
	var got int
	testenv.Eventually(t, patience, func() bool { got = d.Reserve(n); return got > 0 }, "slots to reserve")
	return got
}

// inbound stores n message events the way wabarelay_inbound does, with the claim of reserved.
func (e *env) inbound(n int, claim store.Claim) store.InboundResult {
	e.t.Helper()
	items := make([]store.IncomingItem, n)
	for i := range items {
		k := e.seq.Add(1)
		items[i] = store.IncomingItem{Type: "messages", PhoneNumberID: e.phone, DedupeKey: fmt.Sprintf("h%d", k),
			Data: json.RawMessage(fmt.Sprintf(`{"message": {"id": "wamid.h%d"}}`, k))}
	}
	res, err := e.st.StoreEvents(context.Background(), items, claim)
	if err != nil || res.Events != n {
		e.t.Fatalf("store events: %+v %v", res, err)
	}
	return res
}

func jobsOf(res store.InboundResult) []Job {
	return res.Claimed
}

// TestHandOffDeliversWithoutClaim: the deliveries the inbound handler inserts claimed are
// delivered without a claim; those over the reservation wait in the queue and are claimed. The
// webhook (ordering none) has a due retry in the queue: changed for issue 35, decision 2 — the
// retry no longer keeps the new deliveries from the hand-off (before, any due row of the webhook
// sent them to the queue behind it): retries of an unordered webhook are out of order by nature,
// and its receiver de-duplicates and does not rely on order. The retry is still delivered, as
// attempt 2.
func TestHandOffDeliversWithoutClaim(t *testing.T) {
	e := newEnv(t)
	rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true})
	_, secret := e.webhook(rc.URL)
	// A delivery whose first attempt failed, its retry due in an hour (not yet due at start-up).
	retry := e.events(1)[0]
	e.fix.Exec(t, `UPDATE delivery_queue SET attempts = 1, next_attempt_at = now() + interval '1 hour' WHERE event_id = $1`, retry)
	e.fix.Exec(t, `UPDATE deliveries SET attempts = 1 WHERE event_id = $1`, retry)
	cfg := e.config(rc)
	cfg.PollInterval = time.Hour // only the start-up claim: anything delivered later was handed off or announced
	d, _ := e.start(cfg)
	caughtUp(t, d)
	// The retry falls due, unannounced: it waits in the queue while the new events come.
	e.fix.Exec(t, `UPDATE delivery_queue SET next_attempt_at = now() - interval '1 second' WHERE event_id = $1`, retry)

	n := reserve(t, d, 10)
	if n != 10 {
		t.Fatalf("reserved %d of 10 free slots", n)
	}
	// Two slots fewer than deliveries: two go out directly, the third waits in the queue.
	res := e.inbound(3, store.Claim{Instance: d.InstanceID(), Lease: d.Lease(), Max: 2})
	if len(res.Claimed) != 2 || res.Queued != 1 || res.Deliveries != 3 {
		t.Fatalf("inbound %+v, want 2 claimed beside the due retry, 1 queued", res)
	}
	for _, c := range res.Claimed {
		var status, lockedBy string
		var attempts, claim int
		if err := e.pool.QueryRow(context.Background(), `SELECT status, attempts, claim_seq, locked_by FROM delivery_queue WHERE delivery_id = $1`, c.ID).
			Scan(&status, &attempts, &claim, &lockedBy); err != nil {
			t.Fatal(err)
		}
		// claimed, no attempt recorded yet
		if status != "in_flight" || attempts != 0 || claim != 0 || lockedBy != d.InstanceID() {
			t.Fatalf("claimed delivery stored as %s/%d/%d/%s", status, attempts, claim, lockedBy)
		}
	}
	d.Deliver(n, jobsOf(res), res.Queued > 0)

	// The queued one and the retry are announced (NOTIFY) and claimed; the two handed off need
	// nothing more.
	testenv.Eventually(t, patience, func() bool { return len(rc.Deliveries()) == 4 }, "four receipts")
	for _, h := range rc.Deliveries() {
		var stored string
		if err := e.pool.QueryRow(context.Background(), `SELECT convert_from(payload, 'UTF8') FROM events WHERE id = $1`,
			h.Header.Get("webhook-id")).Scan(&stored); err != nil {
			t.Fatal(err)
		}
		if string(h.Body) != stored {
			t.Fatalf("body %s\nstored %s", h.Body, stored)
		}
		if _, err := testenv.VerifySignature(secret, h.Header, h.Body); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range res.Claimed {
		testenv.Eventually(t, patience, e.statusIs(c.EventID, "delivered"), "delivered")
		if row := e.delivery(c.EventID); row.attempts != 1 {
			t.Fatalf("handed-off delivery %+v", row)
		}
		if a := e.attemptRows(c.EventID); len(a) != 1 || a[0].code == nil || *a[0].code != http.StatusOK {
			t.Fatalf("attempt log %+v", a)
		}
	}
	testenv.Eventually(t, patience, e.statusIs(retry, "delivered"), "the retry delivered")
	if row := e.delivery(retry); row.attempts != 2 {
		t.Fatalf("retry %+v, want attempt 2 recorded", row)
	}
	// every delivery is final (delivered, after its receipt): no receipt can be missing or come
	if n := len(rc.Deliveries()); n != 4 {
		t.Fatalf("%d receipts, want 4", n)
	}
}

// gatedReceiver answers every attempt 204 once open is called (also at the end of the test),
// holding them until then; running counts the attempts it holds and most the most at once.
func gatedReceiver(t *testing.T) (rc *testenv.Receiver, open func(), running, most *atomic.Int32) {
	t.Helper()
	gate := make(chan struct{})
	running, most = new(atomic.Int32), new(atomic.Int32)
	rc = testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true, Respond: func(n int, w http.ResponseWriter, r *http.Request) {
		now := running.Add(1)
		defer running.Add(-1)
		for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
		}
		<-gate
		w.WriteHeader(http.StatusNoContent)
	}})
	open = sync.OnceFunc(func() { close(gate) })
	t.Cleanup(open) // (before the receiver closes: cleanups run last first)
	return rc, open, running, most
}

// queueCounts returns the deliveries in flight for instance and those pending, unclaimed.
func (e *env) queueCounts(instance string) (claimed, pending int) {
	e.t.Helper()
	claimed = testenv.QueryValue[int](e.t, e.fix, `SELECT count(*) FROM delivery_queue WHERE status = 'in_flight' AND locked_by = $1`, instance)
	pending = testenv.QueryValue[int](e.t, e.fix, `SELECT count(*) FROM delivery_queue WHERE status = 'pending' AND locked_by IS NULL`)
	return claimed, pending
}

// waitingHandOffs returns how many hand-offs wait in d's memory.
func waitingHandOffs(d *Dispatcher) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.waitingN
}

// TestHandOffOverPerWebhookCapWaitsBounded: hand-offs over their webhook's cap wait in memory,
// still claimed, at most handoff_wait_per_webhook of them; the rest go back to the queue,
// unclaimed. Each is delivered once, without using up an attempt. Changed for issue 35,
// decision 3 (was TestHandOffOverPerWebhookCapGoesBackToQueue: every over-cap hand-off went back
// to the queue): each waiting one is durable in the queue under its lease, so it may wait in
// memory; the test asserts the bound (and TestHandOffWaitingSurvivesAKilledDispatcher the
// durability).
func TestHandOffOverPerWebhookCapWaitsBounded(t *testing.T) {
	e := newEnv(t)
	rc, open, _, most := gatedReceiver(t)
	e.webhook(rc.URL)
	cfg := e.config(rc)
	cfg.PerWebhook, cfg.HandOffWaitPerWebhook = 1, 2
	d, _ := e.start(cfg)

	n := reserve(t, d, 6)
	res := e.inbound(6, store.Claim{Instance: d.InstanceID(), Lease: d.Lease(), Max: n})
	if len(res.Claimed) != 6 {
		t.Fatalf("inbound %+v", res)
	}
	d.Deliver(n, jobsOf(res), false)
	// One attempt held by the receiver, two waiting in memory (claimed), three back in the queue.
	testenv.Eventually(t, patience, func() bool {
		claimed, pending := e.queueCounts(d.InstanceID())
		return rc.Count() == 1 && claimed == 3 && pending == 3
	}, "one attempt, two waiting claimed, three pending")
	if w := waitingHandOffs(d); w != 2 {
		t.Fatalf("%d hand-offs waiting in memory, want 2 (handoff_wait_per_webhook)", w)
	}
	open()
	for _, c := range res.Claimed {
		testenv.Eventually(t, patience, e.statusIs(c.EventID, "delivered"), "delivered")
		// None used up an attempt waiting or going back.
		if row := e.delivery(c.EventID); row.attempts != 1 || len(e.attemptRows(c.EventID)) != 1 {
			t.Fatalf("delivery %+v, attempts %+v", row, e.attemptRows(c.EventID))
		}
	}
	if n, m := len(rc.Deliveries()), most.Load(); n != 6 || m != 1 {
		t.Fatalf("%d receipts (want 6), %d at once (per_webhook 1)", n, m)
	}
	if w := waitingHandOffs(d); w != 0 {
		t.Fatalf("%d hand-offs still waiting", w)
	}
}

func TestShutdownWaitsForReservations(t *testing.T) {
	e := newEnv(t)
	rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true})
	e.webhook(rc.URL)
	d, stop := e.start(e.config(rc))
	n := reserve(t, d, 4)

	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	// Shutdown has begun once the loop has ended and no more slots are handed out.
	testenv.Eventually(t, patience, func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return !d.running
	}, "the claim loop to end")
	if got := d.Reserve(1); got != 0 {
		t.Fatalf("reserved %d slots while stopping", got)
	}
	select {
	case <-stopped:
		t.Fatal("Run returned with slots still reserved")
	default:
	}
	d.Deliver(n, nil, false)
	select {
	case <-stopped:
	case <-time.After(patience):
		t.Fatal("Run did not return after the reservation was given back")
	}
}

// TestHandOffOverPerOrgCapWaitsBounded: deliveries handed over by the inbound handler count
// against their org's cap like claimed ones: with per_org 1, an org's three webhooks get their
// event one at a time, without using up an attempt. Changed for issue 35, decision 3 (was
// TestHandOffOverPerOrgCapGoesBackToQueue: the two over the cap went back to the queue): over
// the cap they may wait in memory, bounded in all by handoff_wait (1 here, per webhook
// unbounded): one waits, claimed, the other goes back to the queue, unclaimed.
func TestHandOffOverPerOrgCapWaitsBounded(t *testing.T) {
	e := newEnv(t)
	rc, open, _, most := gatedReceiver(t)
	for range 3 {
		e.webhook(rc.URL)
	}
	cfg := e.config(rc)
	cfg.PerOrg, cfg.HandOffWait = 1, 1
	d, _ := e.start(cfg)

	n := reserve(t, d, 3)
	res := e.inbound(1, store.Claim{Instance: d.InstanceID(), Lease: d.Lease(), Max: n})
	if len(res.Claimed) != 3 {
		t.Fatalf("inbound %+v", res)
	}
	d.Deliver(n, jobsOf(res), false)
	testenv.Eventually(t, patience, func() bool {
		claimed, pending := e.queueCounts(d.InstanceID())
		return rc.Count() == 1 && claimed == 2 && pending == 1
	}, "one attempt, one waiting claimed, one pending")
	if w := waitingHandOffs(d); w != 1 {
		t.Fatalf("%d hand-offs waiting in memory, want 1 (handoff_wait)", w)
	}
	open()
	testenv.Eventually(t, patience, func() bool {
		return testenv.QueryValue[int](t, e.fix, `SELECT count(*) FROM deliveries WHERE status = 'delivered'`) == 3
	}, "3 deliveries delivered")
	attempts := testenv.QueryValue[int](t, e.fix, `SELECT count(*) FROM delivery_attempts`)
	if m := most.Load(); m != 1 || attempts != 3 {
		t.Fatalf("%d attempts at once to the org (per_org 1), %d attempts recorded (want 3)", m, attempts)
	}
}

// TestHandOffWaitingSurvivesAKilledDispatcher (issue 35, decision 3): hand-offs waiting in a
// dispatcher's memory are claimed in the queue under their lease, so a dispatcher that dies
// while they wait loses none: once the lease has passed (by the clock), another dispatcher
// takes them over and delivers each, as attempt 1; those beyond the bound were back in the
// queue at once and are delivered without waiting for the lease.
func TestHandOffWaitingSurvivesAKilledDispatcher(t *testing.T) {
	e := newEnv(t)
	clk := e.useClock()
	t0 := clk.Now()
	rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true})
	e.webhook(rc.URL)

	// The dying instance: its claiming loop never runs (as if it were gone) and its webhook is
	// at its cap (as if its attempts hung); only its result writer runs, which hands the
	// deliveries beyond the bound back. Then it dies: nothing it holds is handed back.
	cfg := e.config(rc)
	cfg.PerWebhook, cfg.HandOffWaitPerWebhook = 1, 3
	cfg.InstanceID = "killed-" + uuid.NewString()[:6]
	dead, err := New(e.pool, e.st.WebhookSecret, cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dead.mu.Lock()
	dead.running, dead.attemptCtx, dead.caughtUp = true, ctx, true
	dead.mu.Unlock()
	writerDone := make(chan struct{})
	go func() { defer close(writerDone); dead.writeResults() }()

	n := dead.Reserve(5)
	res := e.inbound(5, store.Claim{Instance: dead.InstanceID(), Lease: dead.Lease(), Max: n})
	if n != 5 || len(res.Claimed) != 5 {
		t.Fatalf("reserved %d, inbound %+v", n, res)
	}
	dead.mu.Lock()
	dead.perHook[res.Claimed[0].WebhookID] = cfg.PerWebhook // its attempts hang
	dead.mu.Unlock()
	dead.Deliver(n, jobsOf(res), false)
	testenv.Eventually(t, patience, func() bool {
		claimed, pending := e.queueCounts(dead.InstanceID())
		return claimed == 3 && pending == 2
	}, "three waiting (claimed), two back in the queue")
	if w := waitingHandOffs(dead); w != 3 {
		t.Fatalf("%d hand-offs waiting in memory, want 3", w)
	}
	// It dies: its writer stops (nothing more is recorded or handed back by it).
	dead.mu.Lock()
	dead.running = false
	dead.mu.Unlock()
	close(dead.results)
	<-writerDone

	// Another instance delivers the two in the queue at once, the three others once their lease
	// has passed.
	other, _ := e.start(e.config(rc))
	// (recorded, before the clock moves: a lease of theirs still running would pass too)
	testenv.Eventually(t, patience, func() bool {
		return testenv.QueryValue[int](t, e.fix, `SELECT count(*) FROM deliveries WHERE status = 'delivered'`) == 2
	}, "the two in the queue delivered")
	caughtUp(t, other)
	if claimed, _ := e.queueCounts(dead.InstanceID()); claimed != 3 || rc.Count() != 2 {
		t.Fatalf("%d still claimed by the dead instance (want 3 until their lease ends), %d receipts (want 2)", claimed, rc.Count())
	}
	clk.Set(t0.Add(dead.Lease() + time.Second))
	for _, c := range res.Claimed {
		testenv.Eventually(t, patience, e.statusIs(c.EventID, "delivered"), "delivered after the lease")
		if at := e.attemptRows(c.EventID); len(at) != 1 || at[0].attempt != 1 {
			t.Fatalf("attempt log %+v, want attempt 1 only", at)
		}
	}
	if n := len(rc.Deliveries()); n != 5 {
		t.Fatalf("%d receipts, want 5", n)
	}
}
