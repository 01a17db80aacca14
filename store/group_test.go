package store_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// TestStoreEventsGroup: posts stored in one group get each their own result, as if stored one
// after the other: an item two posts carry is stored once (the other post counts it a
// duplicate), an item stored before is a duplicate, unknown numbers and object channels are
// counted per post, and each post's hand-off claims at most its own Max of its own events.
func TestStoreEventsGroup(t *testing.T) {
	f, org := storeWithChannel(t)
	s := f.Store
	ctx := context.Background()
	f.Webhook(t, org.ID, "https://a.example.com", &testenv.WebhookOpts{Name: "a"})
	f.Webhook(t, org.ID, "https://b.example.com", &testenv.WebhookOpts{Name: "b"})
	item := func(key string, objects ...string) store.IncomingItem {
		return store.IncomingItem{Type: "messages", PhoneNumberID: "1", DedupeKey: key, Data: json.RawMessage(`{}`), ObjectIDs: objects}
	}
	if res, err := s.StoreEvents(ctx, []store.IncomingItem{item("before")}, store.Claim{}); err != nil || res.Events != 1 {
		t.Fatalf("stored %+v, %v", res, err)
	}
	if _, err := s.Pool().Exec(ctx, `DELETE FROM delivery_queue`); err != nil { // (no backlog: hand-offs allowed)
		t.Fatal(err)
	}
	claim := func(n int) store.Claim { return store.Claim{Instance: "i1", Lease: time.Minute, Max: n} }
	unknown := store.IncomingItem{Type: "messages", PhoneNumberID: "999", DedupeKey: "u", Data: json.RawMessage(`{}`)}
	posts := []store.Post{
		{Items: []store.IncomingItem{item("a1", "media-1"), item("shared")}, Claim: claim(1)},
		{Items: []store.IncomingItem{item("shared"), item("before"), item("b1"), unknown}, Claim: claim(3)},
		{Items: []store.IncomingItem{item("before")}, Claim: claim(8)},
		{Items: []store.IncomingItem{item("c1")}},
	}
	res, err := s.StoreEventsGroup(ctx, posts)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct{ events, dups, unknown, claimed, queued, deliveries, objects int }{
		{2, 0, 0, 1, 3, 4, 1}, // 4 deliveries (2 events × 2 webhooks), 1 claimed, 3 queued
		{1, 2, 1, 2, 0, 2, 0}, // b1 only: both its deliveries claimed (Max 3)
		{0, 1, 0, 0, 0, 0, 0},
		{1, 0, 0, 0, 2, 2, 0}, // no claim: queued
	}
	for i, w := range want {
		r := res[i]
		if r.Events != w.events || r.Duplicates != w.dups || r.Unknown != w.unknown || len(r.Claimed) != w.claimed ||
			r.Queued != w.queued || r.Deliveries != w.deliveries || len(r.ObjectChannels) != w.objects || r.ByType["messages"] != w.events {
			t.Errorf("post %d: %+v, want %+v", i, r, w)
		}
	}
	// each post's claimed deliveries are of its own events
	own := map[uuid.UUID]int{}
	for i, r := range res {
		for _, d := range r.Claimed {
			own[d.EventID] = i
		}
	}
	var n int
	if err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM events WHERE type = 'messages'`).Scan(&n); err != nil || n != 5 {
		t.Fatalf("%d events stored (%v), want 5", n, err)
	}
	rows, err := s.Pool().Query(ctx, `SELECT id, dedupe_key FROM events WHERE type = 'messages'`)
	if err != nil {
		t.Fatal(err)
	}
	keyOf := map[uuid.UUID]string{}
	var id uuid.UUID
	var k string
	if _, err := pgx.ForEachRow(rows, []any{&id, &k}, func() error { keyOf[id] = k; return nil }); err != nil {
		t.Fatal(err)
	}
	for id, post := range own {
		if k := keyOf[id]; (post == 0) != (k == "a1" || k == "shared") || (post == 1) != (k == "b1") {
			t.Errorf("post %d claimed a delivery of event %q", post, k)
		}
	}

	// claims of different instances cannot share a transaction
	if _, err := s.StoreEventsGroup(ctx, []store.Post{
		{Items: []store.IncomingItem{item("x")}, Claim: claim(1)},
		{Items: []store.IncomingItem{item("y")}, Claim: store.Claim{Instance: "i2", Lease: time.Minute, Max: 1}},
	}); err == nil {
		t.Fatal("claims of two instances in one group: no error")
	}
}
