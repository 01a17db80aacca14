package store_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestMigrateConcurrentAndTwice: eight processes' worth of connections migrate one empty
// database at once; all succeed, the schema is complete, and running again changes nothing.
func TestMigrateConcurrentAndTwice(t *testing.T) {
	srv := testenv.StartPostgres(t)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, srv.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE empty"); err != nil {
		t.Fatal(err)
	}
	_ = admin.Close(ctx)
	dsn := srv.DSN("empty")

	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- store.MigrateDSN(ctx, dsn)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent migrate: %v", err)
		}
	}
	if err := store.MigrateDSN(ctx, dsn); err != nil {
		t.Fatalf("second migrate: %v", err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	current, latest, err := store.SchemaVersion(ctx, conn)
	if err != nil || current != latest || latest < 2 {
		t.Fatalf("schema version %d of %d: %v", current, latest, err)
	}
	for _, table := range []string{"orgs", "api_keys", "channels", "webhooks", "webhook_channels", "events", "deliveries", "delivery_attempts", "delivery_queue"} {
		var n int
		if err := conn.QueryRow(ctx, fmt.Sprintf("SELECT count(*) FROM %s", table)).Scan(&n); err != nil {
			t.Fatalf("table %s: %v", table, err)
		}
	}
}

func TestMigrationsHashStable(t *testing.T) {
	if a, b := store.MigrationsHash(), store.MigrationsHash(); a != b || len(a) != 16 {
		t.Fatalf("MigrationsHash = %q, %q", a, b)
	}
}

// TestMigration011KeepsHistoryAndQueue: a database with events, deliveries in every state and
// attempts, migrated to the partitioned history (011), keeps every row; its live deliveries are
// in the queue (a paused webhook's held), its finished ones only in the log; the old rows sit in
// one partition without a lower bound, and the days after it take new rows.
func TestMigration011KeepsHistoryAndQueue(t *testing.T) {
	srv := testenv.StartPostgres(t)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, srv.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE old"); err != nil {
		t.Fatal(err)
	}
	_ = admin.Close(ctx)
	conn, err := pgx.Connect(ctx, srv.DSN("old"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	if err := store.MigrateTo(ctx, conn, 10); err != nil {
		t.Fatal(err)
	}
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := conn.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	org, active, paused := uuid.New(), uuid.New(), uuid.New()
	exec(`INSERT INTO orgs (id, name) VALUES ($1, 'o')`, org)
	for _, w := range []struct {
		id     uuid.UUID
		status string
	}{{active, "active"}, {paused, "paused"}} {
		exec(`INSERT INTO webhooks (id, org_id, name, url, events, scope, secret_enc, status) VALUES ($1, $2, 'w', 'https://h.example.com', '{messages}', 'org', '\x00', $3)`,
			w.id, org, w.status)
	}
	// event k, two days ago, with one delivery in the given state
	type old struct {
		key, status string
		hook        uuid.UUID
	}
	olds := []old{{"done", "delivered", active}, {"retry", "pending", active}, {"held", "pending", paused}, {"flying", "in_flight", active}, {"gave-up", "failed", active}}
	for i, o := range olds {
		ev, del := uuid.New(), uuid.New()
		exec(`INSERT INTO events (id, org_id, channel_id, type, dedupe_key, payload, created_at) VALUES ($1, $2, $3, 'messages', $4, '{}', now() - interval '2 days')`,
			ev, org, uuid.New(), o.key)
		exec(`INSERT INTO deliveries (id, event_id, webhook_id, status, attempts, locked_by, locked_until, created_at)
			VALUES ($1, $2, $3, $4, $5, CASE WHEN $4 = 'in_flight' THEN 'gone' END, CASE WHEN $4 = 'in_flight' THEN now() END, now() - interval '2 days')`,
			del, ev, o.hook, o.status, i%2)
		exec(`INSERT INTO delivery_attempts (id, delivery_id, attempt, started_at, duration_ms) VALUES ($1, $2, 1, now() - interval '2 days', 5)`, uuid.New(), del)
	}

	if err := store.Migrate(ctx, conn); err != nil {
		t.Fatal(err)
	}
	count := func(sql string) int {
		t.Helper()
		var n int
		if err := conn.QueryRow(ctx, sql).Scan(&n); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return n
	}
	if e, d, a := count(`SELECT count(*) FROM events`), count(`SELECT count(*) FROM deliveries`), count(`SELECT count(*) FROM delivery_attempts`); e != 5 || d != 5 || a != 5 {
		t.Fatalf("after 011: %d events, %d deliveries, %d attempts; want 5 each", e, d, a)
	}
	var queue string
	if err := conn.QueryRow(ctx, `SELECT string_agg(e.dedupe_key || '=' || q.status, ',' ORDER BY e.dedupe_key)
		FROM delivery_queue q JOIN events e ON e.id = q.event_id`).Scan(&queue); err != nil {
		t.Fatal(err)
	}
	if queue != "flying=in_flight,held=held,retry=pending" {
		t.Fatalf("queue after 011: %s", queue)
	}
	var log string
	if err := conn.QueryRow(ctx, `SELECT string_agg(e.dedupe_key || '=' || d.status, ',' ORDER BY e.dedupe_key)
		FROM deliveries d JOIN events e ON e.id = d.event_id AND e.created_at = d.created_at`).Scan(&log); err != nil {
		t.Fatal(err)
	}
	if log != "done=delivered,flying=pending,gave-up=failed,held=pending,retry=pending" {
		t.Fatalf("delivery log after 011: %s", log)
	}
	// the old rows' partition has no lower bound and is named after its last day (two days ago);
	// today's partition was made after it and takes new rows
	oldDay := time.Now().UTC().AddDate(0, 0, -2).Format("20060102")
	if n := count(`SELECT count(*) FROM pg_class c WHERE c.relname = 'events_p` + oldDay + `' AND pg_get_expr(c.relpartbound, c.oid) LIKE '%MINVALUE%'`); n != 1 {
		t.Fatalf("no open partition events_p%s", oldDay)
	}
	exec(`INSERT INTO events (id, org_id, channel_id, type, dedupe_key, payload) VALUES ($1, $2, $3, 'messages', 'new', '{}')`, uuid.New(), org, uuid.New())
	if n := count(`SELECT count(*) FROM events_p` + time.Now().UTC().Format("20060102")); n != 1 {
		t.Fatalf("today's partition holds %d events, want the new one", n)
	}
}

// oldDatabase returns a connection to, and a fixture on, a database of a throwaway server
// migrated up to version (the schema of an earlier release).
func oldDatabase(t *testing.T, version int32) (*pgx.Conn, *testenv.Fixture) {
	t.Helper()
	srv := testenv.StartPostgres(t)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, srv.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE old"); err != nil {
		t.Fatal(err)
	}
	_ = admin.Close(ctx)
	conn, err := pgx.Connect(ctx, srv.DSN("old"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	if err := store.MigrateTo(ctx, conn, version); err != nil {
		t.Fatal(err)
	}
	return conn, testenv.NewStore(t, &testenv.StoreOpts{DSN: srv.DSN("old")})
}

// TestMigration012KeepsDuplicatesRecognised: events stored before migration 012 with keys
// longer than MaxDedupeKeyLen (up to what the index took: a few kilobytes), with short keys and
// with the digests of keys that are not text — today and two days ago — are still recognised
// as duplicates of the same items posted after it; short keys are unchanged.
func TestMigration012KeepsDuplicatesRecognised(t *testing.T) {
	ctx := context.Background()
	conn, f := oldDatabase(t, 11)
	s := f.Store
	now := time.Now().UTC()
	if err := s.EnsurePartitions(ctx, now.AddDate(0, 0, -3), now.AddDate(0, 0, 1)); err != nil {
		t.Fatal(err)
	}
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := conn.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%.200s: %v", sql, err)
		}
	}
	org, ch := uuid.New(), uuid.New()
	exec(`INSERT INTO orgs (id, name) VALUES ($1, 'o')`, org)
	exec(`INSERT INTO channels (id, org_id, name, status, channel_token_hash, channel_token_enc, phone_number_id, waba_id)
		VALUES ($1, $2, 'c', 'active', '\x01', '\x01', '1', 'w')`, ch, org)
	nul := sha256.Sum256([]byte("m:\x00"))
	// as the inbound handler stored them before 012 (non-text keys: their digest; others: as they are)
	type old struct {
		item, stored string
		daysAgo      int
	}
	olds := []old{
		{"m:short", "m:short", 0},
		{"m:" + hugeText(1000), "", 0},
		{"s:" + hugeText(2000) + ":read", "", 2},
		{"m:" + hugeText(store.MaxDedupeKeyLen-2), "", 2},
		{"m:\x00", "h:" + hex.EncodeToString(nul[:]), 2},
	}
	for _, o := range olds {
		if o.stored == "" {
			o.stored = o.item
		}
		exec(`INSERT INTO events (id, org_id, channel_id, type, dedupe_key, payload, created_at)
			VALUES ($1, $2, $3, 'messages', $4, '\x7b7d', now() - $5 * interval '1 day')`, uuid.New(), org, ch, o.stored, o.daysAgo)
	}

	if err := store.Migrate(ctx, conn); err != nil {
		t.Fatal(err)
	}
	var items []store.IncomingItem
	for _, o := range olds {
		items = append(items, store.IncomingItem{Type: "messages", PhoneNumberID: "1", DedupeKey: o.item, Data: json.RawMessage(`{}`)})
	}
	res, err := s.StoreEvents(ctx, items, store.Claim{})
	if err != nil || res.Events != 0 || res.Duplicates != len(olds) {
		t.Fatalf("items stored before 012 posted again: %+v %v, want %d duplicates", res, err, len(olds))
	}
	// the keys longer than MaxDedupeKeyLen became digests of their bytes; the others are as they were
	digest := func(k string) string { d := sha256.Sum256([]byte(k)); return "h:" + hex.EncodeToString(d[:]) }
	want := []string{"m:short", digest(olds[1].item), digest(olds[2].item), olds[3].item, olds[4].stored}
	slices.Sort(want)
	rows, _ := conn.Query(ctx, `SELECT dedupe_key FROM events ORDER BY dedupe_key COLLATE "C"`)
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || !slices.Equal(keys, want) {
		t.Fatalf("keys after 012: %.100q (%v), want %.100q", keys, err, want)
	}
}

// TestMigration021MovesTheRelaySide: after 021 the messages rows the relay log's writer made
// keep their statuses, their recipients become digits (phone numbers only), the relay's columns
// are gone, and each message's relay call is read from relay_log, where it always was.
func TestMigration021MovesTheRelaySide(t *testing.T) {
	ctx := context.Background()
	conn, f := oldDatabase(t, 20)
	org, ch := f.Org(t).ID, uuid.New()
	at := time.Now().UTC().Add(-time.Minute).Truncate(time.Microsecond)
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := conn.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%.200s: %v", sql, err)
		}
	}
	if err := f.Store.EnsurePartitions(ctx, at, at); err != nil {
		t.Fatal(err)
	}
	// as 020's writer left them: a relay_log row and a messages row per send
	for _, m := range []struct{ wamid, to, status string }{{"wamid.P", "+1 555-0100", "read"}, {"wamid.N", "alice", "accepted"}} {
		exec(`INSERT INTO relay_log (at, org_id, channel_id, status, outcome, latency_us, idempotency_key, recipient, wamid)
			VALUES ($1, $2, $3, 200, 'ok', 1500, 'key-' || $4, $5, $4)`, at, org, ch, m.wamid, m.to)
		exec(`INSERT INTO messages (wamid, org_id, channel_id, recipient, created_at, status, status_rank, idempotency_key, relay_at, relay_status, relay_latency_us)
			VALUES ($1, $2, $3, $4, $5, $6, 0, 'key-' || $1, $5, 200, 1500)`, m.wamid, org, ch, m.to, at, m.status)
	}
	if err := store.Migrate(ctx, conn); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	rows, _ := conn.Query(ctx, `SELECT wamid, recipient || ' ' || status FROM messages`)
	var w, v string
	_, err := pgx.ForEachRow(rows, []any{&w, &v}, func() error { got[w] = v; return nil })
	if err != nil || got["wamid.P"] != "15550100 read" || got["wamid.N"] != "alice accepted" {
		t.Fatalf("rows after 021: %v %v", got, err)
	}
	if n := testenv.QueryValue[int](t, f, `SELECT count(*) FROM information_schema.columns WHERE table_name = 'messages'
		AND column_name IN ('idempotency_key', 'relay_at', 'relay_status', 'relay_latency_us', 'relay_replayed')`); n != 0 {
		t.Fatalf("%d relay columns left in messages", n)
	}
	tl, err := f.Store.MessageTimeline(ctx, org, "wamid.P")
	if err != nil || tl.Status != "read" || tl.To == nil || *tl.To != "+1 555-0100" || tl.Relay == nil || !tl.Relay.At.Equal(at) ||
		tl.Relay.IdempotencyKey == nil || *tl.Relay.IdempotencyKey != "key-wamid.P" || tl.Relay.LatencyUS != 1500 {
		t.Fatalf("timeline after 021: %+v %v", tl, err)
	}
}
