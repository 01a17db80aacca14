package testenv_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// TestAgeQueue: AgeQueue moves every time the queue decides by an hour back — a delivery's due
// time, a lease (which another instance then takes over), a failing webhook's next probe and
// failing_since, a rotation's grace — leaves the creation times, and wakes the listening
// dispatchers.
func TestAgeQueue(t *testing.T) {
	ctx := context.Background()
	f := testenv.NewStore(t)
	org := f.Org(t)
	conn := f.Connection()
	f.Channel(t, org.ID, &testenv.ChannelOpts{Connection: conn})
	w, _ := f.Webhook(t, org.ID, "https://h.example.com")
	item := func(k string) store.IncomingItem {
		return store.IncomingItem{Type: "messages", PhoneNumberID: conn.PhoneNumberID, DedupeKey: k, Data: json.RawMessage(`{}`)}
	}
	if _, err := f.Store.StoreEvents(ctx, []store.IncomingItem{item("a"), item("b")}, store.Claim{}); err != nil {
		t.Fatal(err)
	}
	q := store.NewQueue(f.Pool)
	c, err := q.Claim(ctx, store.QueueClaim{Instance: "a", Lease: time.Minute, Limit: 1, PerWebhook: 10})
	if err != nil || len(c.Deliveries) != 1 {
		t.Fatalf("claim: %+v %v", c, err)
	}
	if _, _, err := f.Store.RotateWebhookSecret(ctx, org.ID, w.ID, time.Hour); err != nil {
		t.Fatal(err)
	}
	f.Exec(t, `UPDATE webhooks SET failing_since = now(), next_probe_at = now() + interval '30 seconds', probe_interval_ms = 30000 WHERE id = $1`, w.ID)
	const times = `SELECT array_agg(t ORDER BY k) FROM (
		SELECT 'due ' || delivery_id AS k, next_attempt_at AS t FROM delivery_queue
		UNION ALL SELECT 'lease ' || delivery_id, locked_until FROM delivery_queue WHERE locked_until IS NOT NULL
		UNION ALL SELECT 'probe', next_probe_at FROM webhooks
		UNION ALL SELECT 'since', failing_since FROM webhooks
		UNION ALL SELECT 'grace', previous_secret_expires_at FROM webhooks
		UNION ALL SELECT 'created ' || delivery_id, created_at FROM delivery_queue) x`
	before := testenv.QueryValue[[]time.Time](t, f, times)
	created := testenv.QueryValue[[]time.Time](t, f, `SELECT array_agg(created_at ORDER BY delivery_id) FROM delivery_queue`)

	listener, err := pgx.Connect(ctx, f.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = listener.Close(ctx) }()
	if _, err := listener.Exec(ctx, "LISTEN "+store.DeliveriesNotifyChannel); err != nil {
		t.Fatal(err)
	}

	f.AgeQueue(t, time.Hour)
	after := testenv.QueryValue[[]time.Time](t, f, times)
	if len(after) != len(before) || len(before) != 8 {
		t.Fatalf("%d times before, %d after, want 8", len(before), len(after))
	}
	moved := 0
	for i := range before {
		switch d := before[i].Sub(after[i]); d {
		case time.Hour:
			moved++
		case 0:
		default:
			t.Fatalf("a time moved by %v", d)
		}
	}
	if moved != 6 {
		t.Fatalf("%d times moved an hour back, want 6 (all but the creation times)", moved)
	}
	if got := testenv.QueryValue[[]time.Time](t, f, `SELECT array_agg(created_at ORDER BY delivery_id) FROM delivery_queue`); !got[0].Equal(created[0]) || !got[1].Equal(created[1]) {
		t.Fatalf("creation times moved: %v, were %v", got, created)
	}
	wait, cancel := context.WithTimeout(ctx, testenv.Patience)
	defer cancel()
	if n, err := listener.WaitForNotification(wait); err != nil || n.Channel != store.DeliveriesNotifyChannel {
		t.Fatalf("no wake-up: %+v %v", n, err)
	}
	// an hour on, the probe is due and the lease of a minute over: another instance probes with
	// the delivery whose lease ended
	if p, err := q.ClaimProbes(ctx, "b", time.Minute, 10); err != nil || len(p) != 1 || p[0].ID != c.Deliveries[0].ID {
		t.Fatalf("probes an hour on: %+v %v, want the expired lease's delivery", p, err)
	}
}
