package store_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/store"
)

func TestStoreEventsMatching(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	orgA, _ := s.CreateOrg(ctx, "a")
	orgB, _ := s.CreateOrg(ctx, "b")
	connected := func(org uuid.UUID, pnid string) store.Channel {
		c, err := s.CreateChannel(ctx, org, "c"+pnid, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.ConnectChannel(ctx, c.ID, store.Connection{PhoneNumberID: pnid, WabaID: "w", UpstreamToken: "t"}); err != nil {
			t.Fatal(err)
		}
		return c
	}
	c1, c2 := connected(orgA.ID, "111"), connected(orgA.ID, "222")
	connected(orgB.ID, "333")
	hook := func(org uuid.UUID, events []string, channels ...uuid.UUID) uuid.UUID {
		w, _, err := s.CreateWebhook(ctx, org, store.NewWebhook{Name: "w", URL: "https://h.example.com", Events: events, ChannelIDs: channels})
		if err != nil {
			t.Fatal(err)
		}
		return w.ID
	}
	all := hook(orgA.ID, []string{"messages", "message_status"})
	onlyStatus := hook(orgA.ID, []string{"message_status"})
	onlyC2 := hook(orgA.ID, []string{"messages", "message_status"}, c2.ID)
	paused := hook(orgA.ID, []string{"messages"})
	if _, err := s.SetWebhookStatus(ctx, orgA.ID, paused, "paused"); err != nil {
		t.Fatal(err)
	}
	other := hook(orgB.ID, []string{"messages", "message_status"})

	item := func(typ, pnid, key string) store.IncomingItem {
		return store.IncomingItem{Type: typ, PhoneNumberID: pnid, DedupeKey: key, Data: json.RawMessage(`{"message": {"id":"` + key + `", "z":1,"a":2}}`)}
	}
	batch := []store.IncomingItem{
		item("messages", "111", "m:1"), item("messages", "111", "m:2"), item("messages", "222", "m:3"),
		item("message_status", "111", "s:1:sent"), item("message_status", "222", "s:1:delivered"),
		item("messages", "999", "m:unknown"),
	}
	res, err := s.StoreEvents(ctx, batch, store.Claim{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Events != 5 || res.Unknown != 1 || res.Duplicates != 0 || res.ByType["messages"] != 3 || res.ByType["message_status"] != 2 {
		t.Fatalf("result %+v", res)
	}
	count := func(webhook uuid.UUID) int {
		var n int
		s.Pool().QueryRow(ctx, `SELECT count(*) FROM deliveries WHERE webhook_id = $1`, webhook).Scan(&n)
		return n
	}
	for name, c := range map[string]struct {
		id   uuid.UUID
		want int
	}{"org scope": {all, 5}, "status only": {onlyStatus, 2}, "channel c2": {onlyC2, 2}, "paused (held)": {paused, 3}, "other org": {other, 0}} {
		if got := count(c.id); got != c.want {
			t.Errorf("%s: %d deliveries, want %d", name, got, c.want)
		}
	}
	if res.Deliveries != 12 {
		t.Errorf("deliveries = %d, want 12", res.Deliveries)
	}
	// the stored payload is the event, with the upstream object byte for byte as sent (key
	// order and whitespace kept)
	var payload string
	s.Pool().QueryRow(ctx, `SELECT convert_from(payload, 'UTF8') FROM events WHERE dedupe_key = 'm:1'`).Scan(&payload)
	var ev store.Event
	if err := json.Unmarshal([]byte(payload), &ev); err != nil || ev.Type != "messages" || ev.ChannelID != c1.ID || ev.PhoneNumberID != "111" ||
		string(ev.Data) != `{"message": {"id":"m:1", "z":1,"a":2}}` {
		t.Fatalf("payload %s: %+v %v", payload, ev, err)
	}
	// the upstream re-sends the same batch: nothing new
	res, err = s.StoreEvents(ctx, batch, store.Claim{})
	if err != nil || res.Events != 0 || res.Duplicates != 5 || res.Deliveries != 0 {
		t.Fatalf("re-send: %+v %v", res, err)
	}
}

// storeWithChannel returns a store with one org and one active channel on phone number id "1".
func storeWithChannel(t *testing.T) (*store.Store, store.Org) {
	t.Helper()
	s := newStore(t)
	ctx := context.Background()
	org, _ := s.CreateOrg(ctx, "o")
	c, _ := s.CreateChannel(ctx, org.ID, "c", time.Hour)
	if err := s.ConnectChannel(ctx, c.ID, store.Connection{PhoneNumberID: "1", WabaID: "w", UpstreamToken: "t"}); err != nil {
		t.Fatal(err)
	}
	return s, org
}

func TestPruneEvents(t *testing.T) {
	s, org := storeWithChannel(t)
	ctx := context.Background()
	if _, _, err := s.CreateWebhook(ctx, org.ID, store.NewWebhook{Name: "w", URL: "https://h.example.com", Events: []string{"messages"}}); err != nil {
		t.Fatal(err)
	}
	var items []store.IncomingItem
	for i := 0; i < 4; i++ {
		items = append(items, store.IncomingItem{Type: "messages", PhoneNumberID: "1", DedupeKey: "m" + string(rune('a'+i)), Data: json.RawMessage(`{}`)})
	}
	if _, err := s.StoreEvents(ctx, items, store.Claim{}); err != nil {
		t.Fatal(err)
	}
	pool := s.Pool()
	// two old and finished, one old but still pending, one recent and finished
	pool.Exec(ctx, `UPDATE events SET created_at = now() - interval '40 days' WHERE dedupe_key IN ('ma', 'mb', 'mc')`)
	pool.Exec(ctx, `UPDATE deliveries SET status = 'delivered' WHERE event_id IN (SELECT id FROM events WHERE dedupe_key IN ('ma', 'md'))`)
	pool.Exec(ctx, `UPDATE deliveries SET status = 'failed' WHERE event_id IN (SELECT id FROM events WHERE dedupe_key = 'mb')`)
	// one attempt for every delivery
	pool.Exec(ctx, `INSERT INTO delivery_attempts (id, delivery_id, attempt, started_at, duration_ms)
		SELECT gen_random_uuid(), id, 1, now(), 1 FROM deliveries`)
	n, err := s.PruneEvents(ctx, time.Now().Add(-30*24*time.Hour), 1000)
	if err != nil || n != 2 {
		t.Fatalf("pruned %d, %v; want 2", n, err)
	}
	var left []string
	rows, _ := pool.Query(ctx, `SELECT dedupe_key FROM events ORDER BY dedupe_key`)
	for rows.Next() {
		var k string
		rows.Scan(&k)
		left = append(left, k)
	}
	var deliveries, attempts, orphans int
	pool.QueryRow(ctx, `SELECT count(*) FROM deliveries`).Scan(&deliveries)
	pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.id = a.delivery_id))
		FROM delivery_attempts a`).Scan(&attempts, &orphans)
	if strings.Join(left, ",") != "mc,md" || deliveries != 2 || attempts != 2 || orphans != 0 {
		t.Fatalf("left events %v, %d deliveries, %d attempts (%d orphaned)", left, deliveries, attempts, orphans)
	}
}

// TestDeleteWebhookCancelsDeliveries: a deleted webhook's deliveries (pending ones included)
// and their attempts go with it; another webhook's stay.
func TestDeleteWebhookCancelsDeliveries(t *testing.T) {
	s, org := storeWithChannel(t)
	ctx := context.Background()
	var hooks []uuid.UUID
	for range 2 {
		w, _, err := s.CreateWebhook(ctx, org.ID, store.NewWebhook{Name: "w", URL: "https://h.example.com", Events: []string{"messages"}})
		if err != nil {
			t.Fatal(err)
		}
		hooks = append(hooks, w.ID)
	}
	items := []store.IncomingItem{
		{Type: "messages", PhoneNumberID: "1", DedupeKey: "ma", Data: json.RawMessage(`{}`)},
		{Type: "messages", PhoneNumberID: "1", DedupeKey: "mb", Data: json.RawMessage(`{}`)},
	}
	if res, err := s.StoreEvents(ctx, items, store.Claim{}); err != nil || res.Deliveries != 4 {
		t.Fatalf("stored %+v, %v", res, err)
	}
	pool := s.Pool()
	if _, err := pool.Exec(ctx, `INSERT INTO delivery_attempts (id, delivery_id, attempt, started_at, duration_ms)
		SELECT gen_random_uuid(), id, 1, now(), 1 FROM deliveries`); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteWebhook(ctx, org.ID, hooks[0]); err != nil {
		t.Fatal(err)
	}
	count := func(sql string, args ...any) int {
		var n int
		if err := pool.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := count(`SELECT count(*) FROM deliveries WHERE webhook_id = $1`, hooks[0]); n != 0 {
		t.Fatalf("%d deliveries of the deleted webhook left", n)
	}
	if n := count(`SELECT count(*) FROM deliveries WHERE webhook_id = $1 AND status = 'pending'`, hooks[1]); n != 2 {
		t.Fatalf("the other webhook has %d pending deliveries, want 2", n)
	}
	if n := count(`SELECT count(*) FROM delivery_attempts a WHERE NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.id = a.delivery_id)`); n != 0 {
		t.Fatalf("%d attempts of deleted deliveries left", n)
	}
	if n := count(`SELECT count(*) FROM delivery_attempts`); n != 2 {
		t.Fatalf("%d attempts left, want the other webhook's 2", n)
	}
}
