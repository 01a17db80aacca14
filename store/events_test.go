package store_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/wabarelay/wabarelay/internal/clock"
	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

func TestStoreEventsMatching(t *testing.T) {
	f := testenv.NewStore(t)
	s := f.Store
	ctx := context.Background()
	orgA, orgB := f.Org(t, &testenv.OrgOpts{Name: "a"}), f.Org(t, &testenv.OrgOpts{Name: "b"})
	connected := func(org uuid.UUID, pnid string) store.Channel {
		return f.Channel(t, org, &testenv.ChannelOpts{Name: "c" + pnid,
			Connection: &store.Connection{PhoneNumberID: pnid, WabaID: "w", UpstreamToken: "t"}})
	}
	c1, c2 := connected(orgA.ID, "111"), connected(orgA.ID, "222")
	connected(orgB.ID, "333")
	hook := func(org uuid.UUID, events []string, channels ...uuid.UUID) uuid.UUID {
		w, _ := f.Webhook(t, org, "https://h.example.com", &testenv.WebhookOpts{Events: events, ChannelIDs: channels})
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
		if err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM deliveries WHERE webhook_id = $1`, webhook).Scan(&n); err != nil {
			t.Fatal(err)
		}
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
	if err := s.Pool().QueryRow(ctx, `SELECT convert_from(payload, 'UTF8') FROM events WHERE dedupe_key = 'm:1'`).Scan(&payload); err != nil {
		t.Fatal(err)
	}
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

// storeWithChannel returns a fixture with one org and one active channel on phone number id "1".
func storeWithChannel(t *testing.T) (*testenv.Fixture, store.Org) {
	t.Helper()
	f := testenv.NewStore(t)
	org := f.Org(t)
	f.Channel(t, org.ID, &testenv.ChannelOpts{Connection: &store.Connection{PhoneNumberID: "1", WabaID: "w", UpstreamToken: "t"}})
	return f, org
}

// storeOn stores one message item with the store's clock at day (and the upstream timestamp
// sent, if given).
func storeOn(t *testing.T, s *store.Store, day time.Time, key string, sent ...time.Time) store.InboundResult {
	t.Helper()
	ctx := context.Background()
	if err := s.EnsurePartitions(ctx, day, day); err != nil {
		t.Fatal(err)
	}
	s.SetClock(clock.NewStub(day))
	defer s.SetClock(nil)
	it := store.IncomingItem{Type: "messages", PhoneNumberID: "1", DedupeKey: key, Data: json.RawMessage(`{}`)}
	if len(sent) > 0 {
		it.Sent = sent[0]
	}
	res, err := s.StoreEvents(ctx, []store.IncomingItem{it}, store.Claim{})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// finish ends the live deliveries of the event with key as the dispatcher would: out of the
// queue, final status in the log, one attempt logged (made at the delivery's creation, or at
// attempted if set).
func finish(t *testing.T, s *store.Store, key, status string, attempted ...time.Time) {
	t.Helper()
	ctx := context.Background()
	var at *time.Time
	if len(attempted) > 0 {
		at = &attempted[0]
	}
	if _, err := s.Pool().Exec(ctx, `
		WITH q AS (DELETE FROM delivery_queue q USING events e WHERE e.id = q.event_id AND e.dedupe_key = $1
		           RETURNING q.delivery_id, q.created_at),
		     l AS (UPDATE deliveries d SET status = $2, attempts = 1 FROM q WHERE d.id = q.delivery_id)
		INSERT INTO delivery_attempts (id, delivery_id, attempt, started_at, duration_ms)
		SELECT gen_random_uuid(), q.delivery_id, 1, coalesce($3, q.created_at), 1 FROM q`, key, status, at); err != nil {
		t.Fatal(err)
	}
}

// TestRetentionDropsPartitions: the retention drops whole days (events, deliveries and attempts
// partitions), not rows, and keeps a day while one of its deliveries is still live.
func TestRetentionDropsPartitions(t *testing.T) {
	f, org := storeWithChannel(t)
	s := f.Store
	ctx := context.Background()
	f.Webhook(t, org.ID, "https://h.example.com")
	now := time.Now().UTC()
	// (the days ahead, as the app keeps them, also when the test database is from yesterday)
	if err := s.EnsurePartitions(ctx, now, now.AddDate(0, 0, store.PartitionsAhead)); err != nil {
		t.Fatal(err)
	}
	old := now.AddDate(0, 0, -40)
	for _, k := range []string{"ma", "mb", "mc"} {
		if res := storeOn(t, s, old, k); res.Events != 1 || res.Deliveries != 1 {
			t.Fatalf("stored %+v 40 days ago", res)
		}
	}
	storeOn(t, s, now, "md")
	finish(t, s, "ma", "delivered")
	finish(t, s, "mb", "failed")
	finish(t, s, "md", "delivered")
	oldDay := old.Format("20060102")
	pool := s.Pool()
	count := func(sql string) int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, sql).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	partitionsOf := func(day string) int {
		return count(`SELECT count(*) FROM pg_class WHERE relname IN ('events_p` + day + `', 'deliveries_p` + day + `', 'delivery_attempts_p` + day + `')`)
	}
	if n := partitionsOf(oldDay); n != 3 {
		t.Fatalf("%d partitions of %s, want 3", n, oldDay)
	}

	// mc is still pending: its day's events and deliveries stay, the attempts go.
	dropped, kept, err := s.DropPartitions(ctx, now.AddDate(0, 0, -30))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(dropped, "delivery_attempts_p"+oldDay) || slices.Contains(dropped, "events_p"+oldDay) ||
		slices.Contains(dropped, "deliveries_p"+oldDay) || len(kept) == 0 {
		t.Fatalf("with a live delivery: dropped %v, kept %v", dropped, kept)
	}
	if n := count(`SELECT count(*) FROM events WHERE type <> 'channel_status'`); n != 4 {
		t.Fatalf("%d events after the first retention run, want 4", n)
	}

	finish(t, s, "mc", "delivered", now) // a late attempt: its log row is in today's partition
	dropped, kept, err = s.DropPartitions(ctx, now.AddDate(0, 0, -30))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(dropped, "events_p"+oldDay) || !slices.Contains(dropped, "deliveries_p"+oldDay) || len(kept) != 0 {
		t.Fatalf("dropped %v, kept %v", dropped, kept)
	}
	if n := partitionsOf(oldDay); n != 0 {
		t.Fatalf("%d partitions of %s left", n, oldDay)
	}
	rows, _ := pool.Query(ctx, `SELECT dedupe_key FROM events WHERE type <> 'channel_status' ORDER BY dedupe_key`)
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	// (attempts are partitioned by the time they were made: mc's stays until its own day goes)
	if strings.Join(left, ",") != "md" || count(`SELECT count(*) FROM deliveries`) != 1 || count(`SELECT count(*) FROM delivery_attempts`) != 2 {
		t.Fatalf("left events %v, %d deliveries, %d attempts", left, count(`SELECT count(*) FROM deliveries`), count(`SELECT count(*) FROM delivery_attempts`))
	}
	// today's partitions and the ones ahead are untouched
	if n := partitionsOf(now.Format("20060102")); n != 3 {
		t.Fatalf("%d partitions of today", n)
	}
	if n := partitionsOf(now.AddDate(0, 0, store.PartitionsAhead).Format("20060102")); n != 3 {
		t.Fatalf("%d partitions %d days ahead", n, store.PartitionsAhead)
	}
}

// TestDuplicatesAcrossDays: an upstream re-send is recognised within the dedupe window even when
// the original is in an earlier day's partition; past the window it is a new event.
func TestDuplicatesAcrossDays(t *testing.T) {
	f, _ := storeWithChannel(t)
	s := f.Store
	now := time.Now().UTC()
	storeOn(t, s, now.AddDate(0, 0, -6), "recent")
	storeOn(t, s, now.AddDate(0, 0, -9), "old")
	if res := storeOn(t, s, now, "recent"); res.Events != 0 || res.Duplicates != 1 {
		t.Fatalf("re-send of a 6-day-old item: %+v, want a duplicate", res)
	}
	// with its upstream timestamp, the look-up starts on the day it was sent
	storeOn(t, s, now.AddDate(0, 0, -3), "timed", now.AddDate(0, 0, -3).Add(-time.Minute))
	if res := storeOn(t, s, now, "timed", now.AddDate(0, 0, -3).Add(-time.Minute)); res.Events != 0 || res.Duplicates != 1 {
		t.Fatalf("re-send of a 3-day-old item with its timestamp: %+v, want a duplicate", res)
	}
	if res := storeOn(t, s, now, "old"); res.Events != 1 {
		t.Fatalf("re-send of a 9-day-old item: %+v, want a new event (past the %v window)", res, store.DedupeWindow)
	}
	if res := storeOn(t, s, now, "old"); res.Duplicates != 1 {
		t.Fatalf("second re-send today: %+v, want a duplicate", res)
	}
}

// TestInboundCreatesMissingPartition: storing events on a day with no partition (the partition
// manager is behind) creates it and stores the events.
func TestInboundCreatesMissingPartition(t *testing.T) {
	f, _ := storeWithChannel(t)
	s := f.Store
	ahead := time.Now().UTC().AddDate(0, 0, store.PartitionsAhead+2)
	s.SetClock(clock.NewStub(ahead))
	defer s.SetClock(nil)
	res, err := s.StoreEvents(context.Background(), []store.IncomingItem{{Type: "messages", PhoneNumberID: "1", DedupeKey: "x", Data: json.RawMessage(`{}`)}}, store.Claim{})
	if err != nil || res.Events != 1 {
		t.Fatalf("stored %+v, %v", res, err)
	}
	name := "events_p" + ahead.Format("20060102")
	if ok, at := testenv.QueryValue[bool](t, f, `SELECT to_regclass($1) IS NOT NULL`, name),
		testenv.QueryValue[time.Time](t, f, `SELECT created_at FROM events WHERE dedupe_key = 'x'`); !ok || !at.Equal(ahead.Truncate(time.Microsecond)) {
		t.Fatalf("partition %s made: %v; event stored at %v, want the store's clock's %v", name, ok, at, ahead)
	}
}

// TestHeldDeliveriesFailAfterMaxHold: a paused webhook's deliveries are held apart from the
// queue's pending rows, go back to pending on resume, and fail with a reason in the delivery
// log once older than the hold limit.
func TestHeldDeliveriesFailAfterMaxHold(t *testing.T) {
	f, org := storeWithChannel(t)
	s := f.Store
	ctx := context.Background()
	w, _ := f.Webhook(t, org.ID, "https://h.example.com")
	pool := s.Pool()
	statuses := func() string {
		t.Helper()
		var st string
		if err := pool.QueryRow(ctx, `SELECT coalesce(string_agg(status, ',' ORDER BY created_at, status), '') FROM delivery_queue`).Scan(&st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	storeOn(t, s, time.Now().UTC().AddDate(0, 0, -9), "a")
	if _, err := s.SetWebhookStatus(ctx, org.ID, w.ID, store.WebhookPaused); err != nil {
		t.Fatal(err)
	}
	storeOn(t, s, time.Now().UTC(), "b")
	if st := statuses(); st != "held,held" {
		t.Fatalf("queue after pause and new events: %q, want both held", st)
	}
	if _, err := s.SetWebhookStatus(ctx, org.ID, w.ID, store.WebhookActive); err != nil {
		t.Fatal(err)
	}
	if st := statuses(); st != "pending,pending" {
		t.Fatalf("queue after resume: %q", st)
	}
	if _, err := s.SetWebhookStatus(ctx, org.ID, w.ID, store.WebhookPaused); err != nil {
		t.Fatal(err)
	}
	n, err := s.FailHeld(ctx, time.Now().AddDate(0, 0, -7), "held too long")
	if err != nil || n != 1 {
		t.Fatalf("failed %d held deliveries, %v; want 1", n, err)
	}
	ds, _, err := s.ListDeliveries(ctx, org.ID, w.ID, store.DeliveryPage{Limit: 10})
	if err != nil || len(ds) != 2 {
		t.Fatalf("%d deliveries, %v", len(ds), err)
	}
	if ds[0].Status != "failed" || ds[0].LastError == nil || *ds[0].LastError != "held too long" || ds[1].Status != "pending" {
		t.Fatalf("deliveries %+v / %+v", ds[0], ds[1])
	}
	if st := statuses(); st != "held" {
		t.Fatalf("queue: %q, want the recent one held", st)
	}
}

// TestDeleteWebhookCancelsDeliveries: a deleted webhook's deliveries (pending ones included)
// and their attempts go with it; another webhook's stay.
func TestDeleteWebhookCancelsDeliveries(t *testing.T) {
	f, org := storeWithChannel(t)
	s := f.Store
	ctx := context.Background()
	var hooks []uuid.UUID
	for range 2 {
		w, _ := f.Webhook(t, org.ID, "https://h.example.com")
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
	// the delete marks the webhook; its rows are claimed by no one and swept afterwards
	c, err := store.NewQueue(pool).Claim(ctx, store.QueueClaim{Instance: "i", Lease: time.Minute, Limit: 10, PerWebhook: 10})
	if err != nil || len(c.Deliveries) != 2 || c.Deliveries[0].WebhookID != hooks[1] || c.Deliveries[1].WebhookID != hooks[1] {
		t.Fatalf("claim after the delete: %+v %v, want the other webhook's 2", c.Deliveries, err)
	}
	if err := store.NewQueue(pool).Release(ctx, "i", []store.Handback{{ID: c.Deliveries[0].ID, Claim: c.Deliveries[0].Claim},
		{ID: c.Deliveries[1].ID, Claim: c.Deliveries[1].Claim}}); err != nil {
		t.Fatal(err)
	}
	if n, err := s.SweepDeletedWebhooks(ctx); err != nil || n != 2 {
		t.Fatalf("sweep: %d %v, want the 2 deliveries", n, err)
	}
	if n := count(`SELECT count(*) FROM deleted_webhooks`); n != 0 {
		t.Fatalf("%d webhooks still marked after the sweep", n)
	}
	if n := count(`SELECT count(*) FROM deliveries WHERE webhook_id = $1`, hooks[0]); n != 0 {
		t.Fatalf("%d deliveries of the deleted webhook left", n)
	}
	if n := count(`SELECT count(*) FROM delivery_queue WHERE webhook_id = $1`, hooks[0]); n != 0 {
		t.Fatalf("%d queued deliveries of the deleted webhook left", n)
	}
	if n := count(`SELECT count(*) FROM delivery_queue WHERE webhook_id = $1 AND status = 'pending'`, hooks[1]); n != 2 {
		t.Fatalf("the other webhook has %d queued deliveries, want 2", n)
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

// hugeText returns n incompressible bytes of text (random letters and digits): a repeated
// character would be compressed below the index row limit and hide the problem.
func hugeText(n int) string {
	const abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, n)
	rand.Read(b)
	for i := range b {
		b[i] = abc[int(b[i])%len(abc)]
	}
	return string(b)
}

// TestStoreEventsHugeIdentifiers: upstream identifiers of any length — 256 KiB, 1 MiB, and just
// around the limits — are stored and recognised when re-sent (also from an earlier day's
// partition), never refused by an index; the keys stored are at most MaxDedupeKeyLen bytes;
// object ids longer than MaxObjectIDLen are not recorded for the scope (counted), shorter ones
// are; a huge number is no channel's.
func TestStoreEventsHugeIdentifiers(t *testing.T) {
	f, _ := storeWithChannel(t)
	s := f.Store
	ctx := context.Background()
	now := time.Now().UTC()
	keys := []string{
		"m:" + hugeText(256<<10), "m:" + hugeText(1<<20), "s:" + hugeText(256<<10) + ":" + hugeText(1<<20),
		"m:" + hugeText(store.MaxDedupeKeyLen-2), "m:" + hugeText(store.MaxDedupeKeyLen-1), "m:" + hugeText(3000),
		"m:\x00" + hugeText(1<<20), "m:" + hugeText(1<<20) + "\xff",
	}
	okID, longID := hugeText(store.MaxObjectIDLen), hugeText(store.MaxObjectIDLen+1)
	items := func() []store.IncomingItem {
		var its []store.IncomingItem
		for i, k := range keys {
			it := store.IncomingItem{Type: "messages", PhoneNumberID: "1", DedupeKey: k,
				Data: json.RawMessage(`{"message":{"id":"` + hugeText(1<<20) + `"}}`)}
			if i == 0 {
				it.ObjectIDs = []string{"media1", okID, longID, hugeText(1 << 20)}
			}
			its = append(its, it)
		}
		return append(its, store.IncomingItem{Type: "messages", PhoneNumberID: hugeText(1 << 20), DedupeKey: "m:x", Data: json.RawMessage(`{}`)})
	}
	res, err := s.StoreEvents(ctx, items(), store.Claim{})
	if err != nil {
		t.Fatalf("huge identifiers refused: %v", err)
	}
	if res.Events != len(keys) || res.Duplicates != 0 || res.Unknown != 1 || res.SkippedObjectIDs != 2 {
		t.Fatalf("first post: %+v, want %d events, 1 unknown, 2 object ids skipped", res, len(keys))
	}
	if res, err = s.StoreEvents(ctx, items(), store.Claim{}); err != nil || res.Events != 0 || res.Duplicates != len(keys) {
		t.Fatalf("re-post: %+v %v, want %d duplicates", res, err, len(keys))
	}
	var longest, n int
	if err := s.Pool().QueryRow(ctx, `SELECT max(octet_length(dedupe_key)), count(*) FROM events WHERE type <> 'channel_status'`).Scan(&longest, &n); err != nil {
		t.Fatal(err)
	}
	if longest > store.MaxDedupeKeyLen || n != len(keys) {
		t.Fatalf("%d events, longest key %d bytes; want %d events, keys of at most %d bytes", n, longest, len(keys), store.MaxDedupeKeyLen)
	}
	rows, _ := s.Pool().Query(ctx, `SELECT object_id FROM channel_objects ORDER BY octet_length(object_id)`)
	objects, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || !slices.Equal(objects, []string{"media1", okID}) {
		t.Fatalf("objects recorded: %d (%v), want media1 and the %d-byte id", len(objects), err, store.MaxObjectIDLen)
	}
	// a re-send on a later day is found in the earlier partition
	for _, k := range keys[:3] {
		if res := storeOn(t, s, now.AddDate(0, 0, 1), k); res.Events != 0 || res.Duplicates != 1 {
			t.Fatalf("re-send of a %d-byte key the next day: %+v, want a duplicate", len(k), res)
		}
	}
}

// TestHandOffOnlyWithoutOwnBacklog: StoreEvents hands a new delivery to its instance (Claim) only
// when its webhook has no due first attempt waiting in the queue, so a new event never overtakes
// an older due first attempt of its webhook; another webhook's backlog does not keep a webhook
// from the hand-off (before, one queued delivery anywhere turned the hand-off off for everyone).
// A due retry does not keep it either (issue 35, decision 2: only unordered webhooks take
// hand-offs, and their retries are out of order by nature; before, any due row did).
func TestHandOffOnlyWithoutOwnBacklog(t *testing.T) {
	f, org := storeWithChannel(t)
	s := f.Store
	ctx := context.Background()
	busy, _ := f.Webhook(t, org.ID, "https://a.example.com", &testenv.WebhookOpts{Name: "busy"})
	item := func(key string) []store.IncomingItem {
		return []store.IncomingItem{{Type: "messages", PhoneNumberID: "1", DedupeKey: key, Data: json.RawMessage(`{}`)}}
	}
	// The busy webhook gets a due delivery in the queue (no claim).
	if res, err := s.StoreEvents(ctx, item("old"), store.Claim{}); err != nil || res.Queued != 1 {
		t.Fatalf("stored %+v, %v", res, err)
	}
	idle, _ := f.Webhook(t, org.ID, "https://b.example.com", &testenv.WebhookOpts{Name: "idle"})
	claim := store.Claim{Instance: "i1", Lease: time.Minute, Max: 8}
	res, err := s.StoreEvents(ctx, item("new"), claim)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Claimed) != 1 || res.Claimed[0].WebhookID != idle.ID || res.Queued != 1 {
		t.Fatalf("hand-off %+v: want only the idle webhook's delivery claimed, the busy one's queued behind its backlog", res)
	}
	// The busy webhook's queued deliveries become due retries (their first attempts failed): the
	// next new delivery of the webhook is handed off beside them.
	if _, err := s.Pool().Exec(ctx, `UPDATE delivery_queue SET attempts = 1 WHERE webhook_id = $1`, busy.ID); err != nil {
		t.Fatal(err)
	}
	if res, err = s.StoreEvents(ctx, item("beside a retry"), claim); err != nil || len(res.Claimed) != 2 || res.Queued != 0 {
		t.Fatalf("hand-off beside a due retry: %+v, %v; want both webhooks' deliveries claimed", res, err)
	}
	if n := testenv.QueryValue[int](t, f, `SELECT count(*) FROM delivery_queue WHERE webhook_id = $1 AND status = 'pending' AND attempts = 1`, busy.ID); n != 2 {
		t.Fatalf("%d due retries left in the queue, want 2 (untouched)", n)
	}
	// Once the busy webhook's backlog is gone (its deliveries taken), it takes hand-offs again.
	if _, err := s.Pool().Exec(ctx, `DELETE FROM delivery_queue WHERE webhook_id = $1`, busy.ID); err != nil {
		t.Fatal(err)
	}
	if res, err = s.StoreEvents(ctx, item("later"), claim); err != nil || len(res.Claimed) != 2 || res.Queued != 0 {
		t.Fatalf("hand-off after the backlog: %+v, %v", res, err)
	}
}

// TestDeliveryIDsAreUUIDv7: delivery ids are UUIDv7 like every other id, their time the
// delivery's creation (the store's clock), so that they sort by time.
func TestDeliveryIDsAreUUIDv7(t *testing.T) {
	f, org := storeWithChannel(t)
	s := f.Store
	ctx := context.Background()
	for range 2 {
		f.Webhook(t, org.ID, "https://h.example.com")
	}
	at := time.Now().UTC().AddDate(0, 0, -2).Truncate(time.Millisecond).Add(123 * time.Millisecond)
	storeOn(t, s, at, "m:v7")
	rows, err := s.Pool().Query(ctx, `SELECT id, created_at FROM deliveries`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var id uuid.UUID
		var created time.Time
		if err := rows.Scan(&id, &created); err != nil {
			t.Fatal(err)
		}
		sec, nsec := id.Time().UnixTime()
		if id.Version() != 7 || id.Variant() != uuid.RFC4122 || time.Unix(sec, nsec).UnixMilli() != created.UnixMilli() ||
			created.UnixMilli() != at.UnixMilli() {
			t.Fatalf("delivery id %s (version %d, time %v) created %v, want a UUIDv7 of %v", id, id.Version(), time.Unix(sec, nsec).UTC(), created, at)
		}
		n++
	}
	if err := rows.Err(); err != nil || n != 2 {
		t.Fatalf("%d deliveries (%v), want 2", n, err)
	}
}
