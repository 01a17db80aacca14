package store_test

import (
	"context"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/store"
)

// TestWriteRelayLog: a batch goes into relay_log as given (absent values NULL, values that are
// not text left out), and nowhere else: messages is the statuses' (migration 021), so a row a
// status made stays as it was and no row is made for a send. A missing day partition is
// created and the batch written.
func TestWriteRelayLog(t *testing.T) {
	f := testenv.NewStore(t)
	s := f.Store
	ctx := context.Background()
	org, ch := uuid.New(), uuid.New()
	now := time.Now().UTC().Truncate(time.Microsecond)
	// Today's partition missing (the partition manager behind): the write makes it.
	f.Exec(t, `DROP TABLE IF EXISTS relay_log_p`+now.Format("20060102"))

	call := func(at time.Time, status int, outcome, key, to, wamid string, replayed bool) store.RelayCall {
		return store.RelayCall{At: at, OrgID: org, ChannelID: ch, Status: status, Outcome: outcome, Latency: 1500 * time.Microsecond,
			IdempotencyKey: key, Recipient: to, WAMID: wamid, Replayed: replayed}
	}
	// A status arrived before the relay's batch (the inbound path's row).
	f.Exec(t, `INSERT INTO messages (wamid, org_id, channel_id, recipient, created_at, status, status_rank)
		VALUES ('wamid.S', $1, $2, '', $3, 'delivered', 2)`, org, ch, now.Add(time.Minute))
	batch := []store.RelayCall{
		call(now, 200, "ok", "k1", "1555", "wamid.A", false),
		call(now.Add(time.Second), 200, "replayed", "k1", "1555", "wamid.A", true), // merged into A's row
		call(now, 200, "ok", "", "1666", "wamid.S", false),
		call(now, 400, "upstream_4xx", "k\x00bad", "to\xff", "", false),
		{At: now, OrgID: org, ChannelID: ch, Status: 400, Outcome: "upstream_4xx", ErrorCode: 131047, ErrorSubcode: 2494010},
	}
	if err := s.WriteRelayLog(ctx, batch); err != nil {
		t.Fatal(err)
	}
	if n := f.Count(t, "relay_log"); n != len(batch) {
		t.Fatalf("%d relay_log rows, want %d", n, len(batch))
	}
	type logRow struct {
		Status         int
		Outcome        string
		Code, Subcode  *int
		Latency        int
		Key, To, WAMID *string
		Replayed       bool
	}
	rows, err := f.Pool.Query(ctx, `SELECT status, outcome, error_code, error_subcode, latency_us, idempotency_key, recipient, wamid, replayed
		FROM relay_log WHERE channel_id = $1 AND org_id = $2 ORDER BY at, replayed, wamid NULLS LAST, error_code NULLS FIRST`, ch, org)
	if err != nil {
		t.Fatal(err)
	}
	var got []logRow
	for rows.Next() {
		var r logRow
		if err := rows.Scan(&r.Status, &r.Outcome, &r.Code, &r.Subcode, &r.Latency, &r.Key, &r.To, &r.WAMID, &r.Replayed); err != nil {
			t.Fatal(err)
		}
		got = append(got, r)
	}
	p := func(s string) *string { return &s }
	i := func(n int) *int { return &n }
	want := []logRow{
		{200, "ok", nil, nil, 1500, p("k1"), p("1555"), p("wamid.A"), false},
		{200, "ok", nil, nil, 1500, nil, p("1666"), p("wamid.S"), false},
		{400, "upstream_4xx", nil, nil, 1500, nil, nil, nil, false},
		{400, "upstream_4xx", i(131047), i(2494010), 0, nil, nil, nil, false},
		{200, "replayed", nil, nil, 1500, p("k1"), p("1555"), p("wamid.A"), true},
	}
	if !reflect.DeepEqual(got, want) {
		j := func(v any) string { b, _ := json.Marshal(v); return string(b) }
		t.Fatalf("relay_log rows:\n got %s\nwant %s", j(got), j(want))
	}

	var statusRow string
	if err := f.Pool.QueryRow(ctx, `SELECT format('%s %s %s %s', status, status_rank, recipient, created_at = $1)
		FROM messages WHERE wamid = 'wamid.S'`, now.Add(time.Minute)).Scan(&statusRow); err != nil {
		t.Fatal(err)
	}
	if statusRow != "delivered 2  t" {
		t.Fatalf("the status's row changed: %q", statusRow)
	}
	if n := f.Count(t, "messages"); n != 1 {
		t.Fatalf("%d messages rows, want the status's alone", n)
	}
	// The hash index finds a message's calls by wamid.
	if n := testenv.QueryValue[int](t, f, `SELECT count(*) FROM relay_log WHERE wamid = 'wamid.A'`); n != 2 {
		t.Fatalf("%d calls of wamid.A, want the call and its replay", n)
	}
}

// TestSendsPerMinute: a channel's calls counted per minute by class, minutes with calls only,
// oldest first, from since on; another org's channel id gives nothing.
func TestSendsPerMinute(t *testing.T) {
	f := testenv.NewStore(t)
	s := f.Store
	ctx := context.Background()
	org, ch, other := uuid.New(), uuid.New(), uuid.New()
	m0 := time.Now().UTC().Truncate(time.Minute).Add(-10 * time.Minute)
	var calls []store.RelayCall
	add := func(minute, sec, status int, outcome string, chID uuid.UUID) {
		calls = append(calls, store.RelayCall{At: m0.Add(time.Duration(minute)*time.Minute + time.Duration(sec)*time.Second),
			OrgID: org, ChannelID: chID, Status: status, Outcome: outcome})
	}
	add(0, 1, 200, "ok", ch)
	add(0, 59, 200, "replayed", ch)
	add(0, 5, 429, "rate_limited", ch)
	add(0, 6, 429, "upstream_4xx", ch)   // the upstream's 429: rate limited too
	add(0, 7, 400, "upstream_4xx", ch)   // upstream errors
	add(0, 8, 500, "replayed", ch)       // a replayed upstream error
	add(0, 9, 504, "upstream_error", ch) //
	add(0, 10, 403, "inactive", ch)      // refusals
	add(0, 11, 422, "idempotency_conflict", ch)
	add(0, 12, 503, "disconnected", ch)
	add(3, 0, 200, "ok", ch)
	add(3, 30, 200, "ok", other) // another channel
	add(-5, 0, 200, "ok", ch)    // before since
	if err := s.WriteRelayLog(ctx, calls); err != nil {
		t.Fatal(err)
	}
	got, err := s.SendsPerMinute(ctx, org, ch, m0)
	if err != nil {
		t.Fatal(err)
	}
	want := []store.SendMinute{
		{Minute: m0, OK: 2, UpstreamError: 3, RateLimited: 2, Refused: 3},
		{Minute: m0.Add(3 * time.Minute), OK: 1},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("sends per minute:\n got %+v\nwant %+v", got, want)
	}
	if got, err := s.SendsPerMinute(ctx, uuid.New(), ch, m0); err != nil || len(got) != 0 {
		t.Fatalf("another org: %+v %v", got, err)
	}
}

// TestRetentionRelayLog: the retention drops the relay log's old days with the other history
// and deletes old messages, in batches, keeping the recent ones.
func TestRetentionRelayLog(t *testing.T) {
	f := testenv.NewStore(t)
	s := f.Store
	ctx := context.Background()
	org, ch := uuid.New(), uuid.New()
	now := time.Now().UTC()
	old := now.AddDate(0, 0, -40)
	if err := s.EnsurePartitions(ctx, old, old); err != nil {
		t.Fatal(err)
	}
	if err := s.WriteRelayLog(ctx, []store.RelayCall{
		{At: old, OrgID: org, ChannelID: ch, Status: 200, Outcome: "ok", WAMID: "wamid.old"},
		{At: now, OrgID: org, ChannelID: ch, Status: 200, Outcome: "ok", WAMID: "wamid.new"},
	}); err != nil {
		t.Fatal(err)
	}
	// The messages rows their statuses made: more old ones than one delete takes.
	f.Exec(t, `INSERT INTO messages (wamid, org_id, channel_id, created_at)
		SELECT 'wamid.o' || g, $1, $2, $3 FROM generate_series(1, 12000) g`, org, ch, old)
	f.Exec(t, `INSERT INTO messages (wamid, org_id, channel_id, created_at) VALUES ('wamid.new', $1, $2, $3)`, org, ch, now)
	oldPartition := "relay_log_p" + old.Format("20060102")
	if !testenv.QueryValue[bool](t, f, `SELECT to_regclass($1) IS NOT NULL`, oldPartition) {
		t.Fatalf("no partition %s", oldPartition)
	}
	s.Maintain(ctx, store.RetentionPolicy{}, nil)
	if testenv.QueryValue[bool](t, f, `SELECT to_regclass($1) IS NOT NULL`, oldPartition) {
		t.Fatalf("partition %s kept past the retention", oldPartition)
	}
	if n := f.Count(t, "relay_log"); n != 1 {
		t.Fatalf("%d relay_log rows left, want today's 1", n)
	}
	if n := f.Count(t, "messages"); n != 1 || f.CountWhere(t, "messages", "wamid", "wamid.new") != 1 {
		t.Fatalf("%d messages left, want wamid.new alone", n)
	}
	ahead := "relay_log_p" + now.AddDate(0, 0, store.PartitionsAhead).Format("20060102")
	if !testenv.QueryValue[bool](t, f, `SELECT to_regclass($1) IS NOT NULL`, ahead) {
		t.Fatalf("no partition %s ahead", ahead)
	}
}

// TestWriteRelayLogCounts: the relay's refusals, and calls the writer folded
// (Calls > 0), are counted in relay_counts — one row per channel, second, outcome and status,
// added to by later batches —, never written to relay_log one by one; every call is counted per
// minute in relay_minutes; a row's recipient over MaxRecipientLen and key over
// MaxIdempotencyKeyLen are not stored.
func TestWriteRelayLogCounts(t *testing.T) {
	f := testenv.NewStore(t)
	s := f.Store
	ctx := context.Background()
	org, ch := uuid.New(), uuid.New()
	sec := time.Now().UTC().Truncate(time.Second)
	long := strings.Repeat("k", store.MaxIdempotencyKeyLen)
	batch := []store.RelayCall{
		// a send: a row, its 255-byte key kept, its 25-byte "to" not
		{At: sec, OrgID: org, ChannelID: ch, Status: 200, Outcome: "ok", IdempotencyKey: long,
			Recipient: strings.Repeat("1", store.MaxRecipientLen+1), WAMID: "wamid.C1"},
		{At: sec.Add(time.Millisecond), OrgID: org, ChannelID: ch, Status: 200, Outcome: "ok", IdempotencyKey: long + "x",
			Recipient: "+1 (555) 123-4567", WAMID: "wamid.C2"},
	}
	for i := range 500 { // refusals in one second, with the longest key and "to": counted
		batch = append(batch, store.RelayCall{At: sec.Add(time.Duration(i) * time.Millisecond), OrgID: org, ChannelID: ch,
			Status: 429, Outcome: "rate_limited", IdempotencyKey: long, Recipient: strings.Repeat("9", 256)})
	}
	batch = append(batch,
		store.RelayCall{At: sec, OrgID: org, ChannelID: ch, Status: 403, Outcome: "inactive"},
		store.RelayCall{At: sec.Add(time.Second), OrgID: org, ChannelID: ch, Status: 422, Outcome: "invalid_request"},
		// calls folded by the writer beyond its per-channel bound: counted with their outcome
		store.RelayCall{At: sec, OrgID: org, ChannelID: ch, Status: 200, Outcome: "ok", Calls: 40})
	if err := s.WriteRelayLog(ctx, batch); err != nil {
		t.Fatal(err)
	}
	// A later batch (another instance's, or the next interval's) adds to the same rows.
	if err := s.WriteRelayLog(ctx, []store.RelayCall{
		{At: sec.Add(999 * time.Millisecond), OrgID: org, ChannelID: ch, Status: 429, Outcome: "rate_limited", Calls: 7},
	}); err != nil {
		t.Fatal(err)
	}

	if n := f.Count(t, "relay_log"); n != 2 {
		t.Fatalf("%d relay_log rows, want the 2 sends", n)
	}
	var kept []string
	rows, err := f.Pool.Query(ctx, `SELECT wamid || ' key=' || coalesce(length(idempotency_key)::text, 'null') || ' to=' || coalesce(recipient, 'null')
		FROM relay_log ORDER BY at`)
	if err != nil {
		t.Fatal(err)
	}
	if kept, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if want := []string{"wamid.C1 key=255 to=null", "wamid.C2 key=null to=+1 (555) 123-4567"}; !slices.Equal(kept, want) {
		t.Fatalf("relay_log rows %q, want %q", kept, want)
	}
	rows, err = f.Pool.Query(ctx, `SELECT format('%s %s %s %s', at - $2, outcome, status, calls)
		FROM relay_counts WHERE channel_id = $1 AND org_id = $3 ORDER BY at, outcome, status`, ch, sec, org)
	if err != nil {
		t.Fatal(err)
	}
	counts, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"00:00:00 inactive 403 1", "00:00:00 ok 200 40", "00:00:00 rate_limited 429 507", "00:00:01 invalid_request 422 1"}
	if !slices.Equal(counts, want) {
		t.Fatalf("relay_counts:\n got %q\nwant %q", counts, want)
	}
	got, err := s.SendsPerMinute(ctx, org, ch, sec.Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	total := store.SendMinute{}
	for _, m := range got {
		total.OK, total.RateLimited, total.Refused = total.OK+m.OK, total.RateLimited+m.RateLimited, total.Refused+m.Refused
	}
	if total.OK != 42 || total.RateLimited != 507 || total.Refused != 2 || len(got) > 2 {
		t.Fatalf("sends per minute %+v, want 42 ok, 507 rate limited, 2 refused", got)
	}
}

// TestMigration023CountsTheLastDay: migration 023 counts the chart's minutes of the last day
// from the rows relay_log has (refusals included, written one by one before it), into a
// partition without a lower bound up to tomorrow; the writer's counts add to them, and the days
// after are made as usual.
func TestMigration023CountsTheLastDay(t *testing.T) {
	ctx := context.Background()
	conn, f := oldDatabase(t, 22)
	org, ch := f.Org(t).ID, uuid.New()
	now := time.Now().UTC()
	at := now.Add(-time.Minute).Truncate(time.Minute).Add(7 * time.Second)
	old := now.AddDate(0, 0, -2)
	if err := f.Store.EnsurePartitions(ctx, old, now); err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct {
		at      time.Time
		status  int
		outcome string
		n       int
	}{{at, 200, "ok", 2}, {at, 429, "rate_limited", 3}, {at, 403, "inactive", 1}, {at, 400, "upstream_4xx", 1}, {old, 200, "ok", 5}} {
		if _, err := conn.Exec(ctx, `INSERT INTO relay_log (at, org_id, channel_id, status, outcome, latency_us)
			SELECT $1, $2, $3, $4, $5, 10 FROM generate_series(1, $6::int)`, r.at, org, ch, r.status, r.outcome, r.n); err != nil {
			t.Fatal(err)
		}
	}
	if err := store.Migrate(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if err := f.Store.WriteRelayLog(ctx, []store.RelayCall{{At: at, OrgID: org, ChannelID: ch, Status: 429, Outcome: "rate_limited"}}); err != nil {
		t.Fatal(err)
	}
	got, err := f.Store.SendsPerMinute(ctx, org, ch, old)
	if err != nil {
		t.Fatal(err)
	}
	want := []store.SendMinute{{Minute: at.Truncate(time.Minute), OK: 2, UpstreamError: 1, RateLimited: 4, Refused: 1}}
	if !slices.Equal(got, want) {
		t.Fatalf("sends per minute after 023:\n got %+v\nwant %+v", got, want)
	}
	tomorrow := "relay_minutes_p" + now.AddDate(0, 0, 1).Format("20060102")
	if !testenv.QueryValue[bool](t, f, `SELECT to_regclass($1) IS NOT NULL`, tomorrow) {
		t.Fatalf("no partition %s after the migration's", tomorrow)
	}
}
