package store_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// TestResumeRacingQueueWritersLeavesNothingHeld: a queue writer that decides between held and
// pending while its webhook is being resumed — an attempt's outcome recorded, a claim handed
// back, a new event's delivery stored — waits for the resume's commit and writes pending. Before
// heldWhenPausedSQL such a writer read the webhook paused in its statement's snapshot and wrote
// held after the resume had released the held rows: the delivery stayed held on an active
// webhook, which nothing releases (and the maintenance fails held rows after max_hold).
func TestResumeRacingQueueWritersLeavesNothingHeld(t *testing.T) {
	e := newOrderingEnv(t)
	ctx := context.Background()
	// The plain webhook's deliveries of x1 and x2 are in flight (handed off) when it is paused
	// (and the ordered webhook's x1).
	e.want(e.store(10, "x1", "x2"), "ordered:x1", "plain:x1", "plain:x2")
	statusOf := func(name string) string {
		return testenv.QueryValue[string](t, e.f, `SELECT q.status FROM delivery_queue q JOIN events ev ON ev.id = q.event_id
			WHERE q.webhook_id = $1 AND convert_from(ev.payload, 'UTF8')::json->'data'->'message'->>'id' = $2`, e.plain, name)
	}
	// race pauses the plain webhook, then resumes it racing write (resumeRacing).
	race := func(what string, write func() error) {
		t.Helper()
		if _, err := e.f.Store.SetWebhookStatus(ctx, e.org, e.plain, store.WebhookPaused); err != nil {
			t.Fatal(err)
		}
		e.resumeRacing(what, write)
	}
	plainClaim := func(name string) store.ClaimedDelivery {
		t.Helper()
		for _, d := range e.claimed {
			if d.WebhookID == e.plain && e.names[d.EventID] == name {
				return d
			}
		}
		t.Fatalf("plain:%s is not claimed", name)
		return store.ClaimedDelivery{}
	}

	x1 := plainClaim("x1")
	race("an outcome recorded", func() error {
		_, err := e.q.Record(ctx, "i1", []store.Outcome{{Delivery: x1, Started: time.Now(), RetryIn: 0}})
		return err
	})
	if st := statusOf("x1"); st != "pending" {
		t.Fatalf("x1's retry recorded during the resume is %s, want pending", st)
	}
	x2 := plainClaim("x2")
	race("a claim handed back", func() error {
		return e.q.Release(ctx, "i1", []store.Handback{{ID: x2.ID, Claim: x2.Claim}})
	})
	if st := statusOf("x2"); st != "pending" {
		t.Fatalf("x2 handed back during the resume is %s, want pending", st)
	}
	race("an event stored", func() error {
		_, err := e.f.Store.StoreEvents(ctx, []store.IncomingItem{{Type: "messages", PhoneNumberID: "111", Customer: "y",
			DedupeKey: "m:y1", Data: json.RawMessage(`{"message":{"id":"y1","from":"y"}}`)}}, store.Claim{})
		return err
	})
	if st := statusOf("y1"); st != "pending" {
		t.Fatalf("y1 stored during the resume is %s, want pending", st)
	}
	if n := testenv.QueryValue[int](t, e.f, `SELECT count(*) FROM delivery_queue WHERE webhook_id = $1 AND status = 'held'`, e.plain); n != 0 {
		t.Fatalf("%d deliveries held on the resumed webhook", n)
	}
}

// TestHoldPausedPending: a delivery left pending on a paused webhook — what a retry, hand-back
// or new delivery written while the webhook was being paused leaves (its writer read the webhook
// active and took no lock; made here by hand, as the race would) — is held by the maintenance's
// HoldPausedPending, and an active webhook's pending rows are not touched. Racing a resume, the
// step waits for it and then leaves the resumed webhook's rows pending: nothing is held on an
// active webhook.
func TestHoldPausedPending(t *testing.T) {
	e := newOrderingEnv(t)
	ctx := context.Background()
	e.want(e.store(10, "x1", "x2"), "ordered:x1", "plain:x1", "plain:x2")
	// A pending row of the ordered (active) webhook, to be left alone.
	e.store(0, "y1")
	count := func(webhook any, status string) int {
		return testenv.QueryValue[int](t, e.f, `SELECT count(*) FROM delivery_queue WHERE webhook_id = $1 AND status = $2`, webhook, status)
	}
	activePending := count(e.ordered, "pending")
	if activePending == 0 {
		t.Fatal("the ordered webhook has no pending delivery to leave alone")
	}
	straggle := func() {
		t.Helper()
		if _, err := e.f.Store.SetWebhookStatus(ctx, e.org, e.plain, store.WebhookPaused); err != nil {
			t.Fatal(err)
		}
		if _, err := e.f.Pool.Exec(ctx, `UPDATE delivery_queue SET status = 'pending' WHERE webhook_id = $1 AND status IN ('held', 'in_flight')`, e.plain); err != nil {
			t.Fatal(err)
		}
		if count(e.plain, "pending") == 0 {
			t.Fatal("no pending straggler made")
		}
	}

	straggle()
	want := count(e.plain, "pending")
	n, err := e.f.Store.HoldPausedPending(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n != want || count(e.plain, "pending") != 0 || count(e.plain, "held") < want {
		t.Fatalf("held %d (want %d); the paused webhook has %d pending, %d held", n, want, count(e.plain, "pending"), count(e.plain, "held"))
	}
	if got := count(e.ordered, "pending"); got != activePending {
		t.Fatalf("the active webhook's pending rows went %d → %d", activePending, got)
	}

	// Racing a resume: the step waits for it, then holds nothing.
	straggle()
	var held int
	e.resumeRacing("HoldPausedPending", func() (err error) {
		held, err = e.f.Store.HoldPausedPending(ctx)
		return err
	})
	if held != 0 || count(e.plain, "held") != 0 {
		t.Fatalf("racing the resume: held %d, and %d held on the resumed webhook", held, count(e.plain, "held"))
	}
}

// resumeRacing resumes the plain webhook in a transaction left open while write runs, and
// commits the resume once write waits on a lock (or has finished: a writer that does not wait
// for the resume).
func (e *orderingEnv) resumeRacing(what string, write func() error) {
	t := e.t
	t.Helper()
	ctx := context.Background()
	tx, err := e.f.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after the commit: a no-op
	if _, err := e.f.Store.SetWebhookStatusIn(ctx, tx, e.org, e.plain, store.WebhookActive); err != nil {
		t.Fatal(err)
	}
	done, werr := make(chan struct{}), error(nil)
	go func() { defer close(done); werr = write() }()
	testenv.Eventually(t, 10*time.Second, func() bool {
		select {
		case <-done:
			return true
		default:
		}
		return testenv.QueryValue[int](t, e.f, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`) > 0
	}, "%s waiting on the resume or done", what)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	<-done
	if werr != nil {
		t.Fatalf("%s: %v", what, werr)
	}
}
