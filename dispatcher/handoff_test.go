package dispatcher

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

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

func TestHandOffDeliversWithoutClaim(t *testing.T) {
	e := newEnv(t)
	rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true})
	_, secret := e.webhook(rc.URL)
	cfg := e.config(rc)
	cfg.PollInterval = time.Hour // only the start-up claim: anything delivered later was handed off
	d, _ := e.start(cfg)

	n := reserve(t, d, 10)
	if n != 10 {
		t.Fatalf("reserved %d of 10 free slots", n)
	}
	// Two slots fewer than deliveries: two go out directly, the third waits in the queue.
	res := e.inbound(3, store.Claim{Instance: d.InstanceID(), Lease: d.Lease(), Max: 2})
	if len(res.Claimed) != 2 || res.Queued != 1 || res.Deliveries != 3 {
		t.Fatalf("inbound %+v", res)
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

	// The queued one is announced (NOTIFY) and claimed; the two handed off need nothing more.
	testenv.Eventually(t, patience, func() bool { return len(rc.Deliveries()) == 3 }, "three receipts")
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
	// every delivery is final (delivered, after its receipt): no receipt can be missing or come
	if n := len(rc.Deliveries()); n != 3 {
		t.Fatalf("%d receipts, want 3", n)
	}
}

func TestHandOffOverPerWebhookCapGoesBackToQueue(t *testing.T) {
	e := newEnv(t)
	rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true, Respond: func(n int, w http.ResponseWriter, r *http.Request) {
		time.Sleep(100 * time.Millisecond)
		w.WriteHeader(http.StatusNoContent)
	}})
	e.webhook(rc.URL)
	cfg := e.config(rc)
	cfg.PerWebhook = 1
	d, _ := e.start(cfg)

	n := reserve(t, d, 3)
	res := e.inbound(3, store.Claim{Instance: d.InstanceID(), Lease: d.Lease(), Max: n})
	if len(res.Claimed) != 3 {
		t.Fatalf("inbound %+v", res)
	}
	d.Deliver(n, jobsOf(res), false)
	for _, c := range res.Claimed {
		testenv.Eventually(t, patience, e.statusIs(c.EventID, "delivered"), "delivered")
		// The two over the cap were handed back without using up an attempt.
		if row := e.delivery(c.EventID); row.attempts != 1 || len(e.attemptRows(c.EventID)) != 1 {
			t.Fatalf("delivery %+v, attempts %+v", row, e.attemptRows(c.EventID))
		}
	}
	if n := len(rc.Deliveries()); n != 3 {
		t.Fatalf("%d receipts, want 3", n)
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

// TestHandOffOverPerOrgCapGoesBackToQueue: deliveries handed over by the inbound handler count against
// their org's cap like claimed ones: with per_org 1, an org's three webhooks get their event one
// at a time, the two over the cap through the queue, without using up an attempt.
func TestHandOffOverPerOrgCapGoesBackToQueue(t *testing.T) {
	e := newEnv(t)
	var running, most atomic.Int32
	rc := testenv.NewReceiver(t, &testenv.ReceiverOpts{TLS: true, Respond: func(n int, w http.ResponseWriter, r *http.Request) {
		now := running.Add(1)
		defer running.Add(-1)
		for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
		}
		time.Sleep(100 * time.Millisecond)
		w.WriteHeader(http.StatusNoContent)
	}})
	for range 3 {
		e.webhook(rc.URL)
	}
	cfg := e.config(rc)
	cfg.PerOrg = 1
	d, _ := e.start(cfg)

	n := reserve(t, d, 3)
	res := e.inbound(1, store.Claim{Instance: d.InstanceID(), Lease: d.Lease(), Max: n})
	if len(res.Claimed) != 3 {
		t.Fatalf("inbound %+v", res)
	}
	d.Deliver(n, jobsOf(res), false)
	testenv.Eventually(t, patience, func() bool {
		var delivered int
		if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM deliveries WHERE status = 'delivered'`).Scan(&delivered); err != nil {
			t.Fatal(err)
		}
		return delivered == 3
	}, "3 deliveries delivered")
	var attempts int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM delivery_attempts`).Scan(&attempts); err != nil {
		t.Fatal(err)
	}
	if m := most.Load(); m != 1 || attempts != 3 {
		t.Fatalf("%d attempts at once to the org (per_org 1), %d attempts recorded (want 3)", m, attempts)
	}
}
