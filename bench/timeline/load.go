package main

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wabarelay/wabarelay/bench/internal/benchkit"
	"github.com/wabarelay/wabarelay/store"
)

// world is the generated data's handles.
type world struct {
	st       *store.Store
	pool     *pgxpool.Pool
	org      uuid.UUID
	channels []uuid.UUID
}

// fill generates the data (see the package comment).
func (w *world) fill(ctx context.Context, rows, chunk, nch, eventsEvery int) error {
	start := time.Now()
	org, err := w.st.CreateOrg(ctx, "bench")
	if err != nil {
		return err
	}
	w.org = org.ID
	for i := range nch {
		c, err := w.st.CreateChannel(ctx, w.org, fmt.Sprint("channel ", i), time.Hour)
		if err != nil {
			return err
		}
		pn := fmt.Sprint("10654035", 1000000+i)
		if err := w.st.ConnectChannel(ctx, c.ID, store.Connection{PhoneNumberID: pn, WabaID: "waba", DisplayPhoneNumber: "+1 555 " + pn, UpstreamToken: "t"}); err != nil {
			return err
		}
		w.channels = append(w.channels, c.ID)
	}
	hook, _, err := w.st.CreateWebhook(ctx, w.org, store.NewWebhook{Name: "w", URL: "https://h.example.com", Events: []string{"message_status"}})
	if err != nil {
		return err
	}
	now := time.Now().UTC()
	if err := w.st.EnsurePartitions(ctx, now.AddDate(0, 0, -31), now.AddDate(0, 0, store.PartitionsAhead)); err != nil {
		return err
	}
	// Row i: channel (85% the first), created (30 days ago … now, i = 0 the newest), recipient,
	// status, key. The same expressions for both tables.
	const common = `
		WITH g AS (
			SELECT i, 'wamid.HBgL' || md5(i::text) AS wamid,
			       CASE WHEN i % 20 < 17 OR $3::int = 1 THEN ($2::uuid[])[1] ELSE ($2::uuid[])[2 + i % ($3::int - 1)] END AS ch,
			       $4::timestamptz - (i::float8 / $5::float8) * interval '30 days' AS at,
			       '1555' || lpad(((i::bigint * 7919) % 200000)::text, 7, '0') AS recipient,
			       (i::bigint * 31) % 100 AS p,
			       CASE WHEN i % 2 = 0 THEN 'key-' || md5('k' || i) END AS key
			FROM generate_series($6::bigint, $7::bigint - 1) i
		)`
	for lo := 0; lo < rows; lo += chunk {
		hi := min(rows, lo+chunk)
		if _, err := w.pool.Exec(ctx, common+`
			INSERT INTO messages (wamid, org_id, channel_id, recipient, created_at, status, status_rank, status_at, error_code, error_title)
			SELECT wamid, $1, ch, recipient, at, s.status, s.rank, at + interval '5 seconds',
			       CASE WHEN s.status = 'failed' THEN 131026 END, CASE WHEN s.status = 'failed' THEN 'Message undeliverable.' END
			FROM g, LATERAL (SELECT CASE WHEN p < 10 THEN 'accepted' WHEN p < 20 THEN 'sent' WHEN p < 45 THEN 'delivered' WHEN p < 95 THEN 'read' ELSE 'failed' END AS status) s0,
			     LATERAL (SELECT s0.status, array_position(ARRAY['accepted','sent','delivered','read','failed'], s0.status) - 1 AS rank) s
			WHERE s.status <> 'accepted'`,
			w.org, w.channels, nch, now, rows, lo, hi); err != nil {
			return fmt.Errorf("messages: %w", err)
		}
		if _, err := w.pool.Exec(ctx, common+`
			INSERT INTO relay_log (at, org_id, channel_id, status, outcome, latency_us, idempotency_key, replayed, recipient, wamid)
			SELECT at, $1, ch, 200, 'sent', 80000 + (i % 50000), key, false, recipient, wamid FROM g`,
			w.org, w.channels, nch, now, rows, lo, hi); err != nil {
			return fmt.Errorf("relay_log: %w", err)
		}
		if _, err := w.pool.Exec(ctx, common+`, e AS (
			INSERT INTO events (id, org_id, channel_id, type, dedupe_key, payload, created_at, wamid)
			SELECT gen_random_uuid(), $1, ch, 'message_status', 's:' || wamid || ':' || st, convert_to(
			         '{"id":"x","type":"message_status","created_at":"x","channel_id":"' || ch || '","phone_number_id":"1","data":{"status":{"id":"' ||
			         wamid || '","status":"' || st || '","timestamp":"' || extract(epoch FROM at)::bigint + k || '","recipient_id":"' || recipient ||
			         '","pricing":{"billable":true,"pricing_model":"PMP","category":"utility"}}}}', 'UTF8'),
			       at + k * interval '1 second', wamid
			FROM g, unnest(ARRAY['sent','delivered','read'], ARRAY[1, 2, 3]) AS s(st, k)
			WHERE i % $8 = 0 AND at + k * interval '1 second' < $4::timestamptz
			RETURNING id, created_at
		)
		INSERT INTO deliveries (id, event_id, webhook_id, status, attempts, created_at, updated_at)
		SELECT gen_random_uuid(), e.id, $9, 'delivered', 1, e.created_at, e.created_at FROM e`,
			w.org, w.channels, nch, now, rows, lo, hi, eventsEvery, hook.ID); err != nil {
			return fmt.Errorf("events: %w", err)
		}
		benchkit.Logf("rows %d–%d written (%s)", lo, hi, time.Since(start).Round(time.Second))
	}
	if _, err := w.pool.Exec(ctx, `ANALYZE`); err != nil {
		return err
	}
	var sizes string
	if err := w.pool.QueryRow(ctx, `SELECT string_agg(t || ' ' || pg_size_pretty(s), ', ') FROM (
		SELECT 'messages' t, pg_total_relation_size('messages') s
		UNION ALL SELECT 'relay_log', sum(pg_total_relation_size(c.oid)) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'relay_log'::regclass
		UNION ALL SELECT 'events', sum(pg_total_relation_size(c.oid)) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'events'::regclass
		UNION ALL SELECT 'deliveries', sum(pg_total_relation_size(c.oid)) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'deliveries'::regclass) x`).Scan(&sizes); err != nil {
		return err
	}
	var nm, nr, ne, nd int64
	if err := w.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM messages), (SELECT count(*) FROM relay_log), (SELECT count(*) FROM events), (SELECT count(*) FROM deliveries)`).
		Scan(&nm, &nr, &ne, &nd); err != nil {
		return err
	}
	benchkit.Logf("filled in %s: messages %d, relay_log %d, events %d, deliveries %d; %s", time.Since(start).Round(time.Second), nm, nr, ne, nd, sizes)
	return nil
}

// query is one measured read: run i uses the i-th of its drawn parameters.
type query struct {
	name string
	run  func(ctx context.Context, st *store.Store, i int) error
}

// queries draws each query's parameters from the data (of the big channel) and returns them.
func (w *world) queries(ctx context.Context) ([]query, error) {
	big := w.channels[0]
	draw := func(sql string) ([]string, error) {
		rows, err := w.pool.Query(ctx, sql, big)
		if err != nil {
			return nil, err
		}
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err == nil && len(out) == 0 {
			err = fmt.Errorf("nothing drawn: %s", sql)
		}
		return out, err
	}
	sample := ` FROM messages TABLESAMPLE SYSTEM (1) WHERE channel_id = $1`
	recipients, err := draw(`SELECT recipient` + sample + ` LIMIT 1000`)
	if err != nil {
		return nil, err
	}
	// keys of the last day's sends: the search looks for keys that far back (the idempotency
	// window)
	keys, err := draw(`SELECT idempotency_key FROM relay_log TABLESAMPLE SYSTEM (10) WHERE channel_id = $1
		AND idempotency_key IS NOT NULL AND at > now() - interval '23 hours' LIMIT 1000`)
	if err != nil {
		return nil, err
	}
	wamids, err := draw(`SELECT wamid` + sample + ` LIMIT 1000`)
	if err != nil {
		return nil, err
	}
	// cursors deep in the list (the 5,000th newest and beyond) and messages with events
	cursors, err := draw(`SELECT wamid FROM messages WHERE channel_id = $1 ORDER BY created_at DESC, wamid DESC OFFSET 5000 LIMIT 1000`)
	if err != nil {
		return nil, err
	}
	withEvents, err := draw(`SELECT m.wamid FROM messages m TABLESAMPLE SYSTEM (1) WHERE m.channel_id = $1 AND m.status <> 'accepted'
		AND EXISTS (SELECT 1 FROM events e WHERE e.wamid = m.wamid) LIMIT 1000`)
	if err != nil {
		return nil, err
	}
	pick := func(s []string, i int) string { return s[i%len(s)] }
	list := func(f func(i int) store.MessageFilter) func(context.Context, *store.Store, int) error {
		return func(ctx context.Context, st *store.Store, i int) error {
			mf := f(i)
			mf.Limit = 51 // a page of 50 and the look-ahead, as the API asks
			_, err := st.ListMessages(ctx, w.org, big, mf)
			return err
		}
	}
	return []query{
		{"list", list(func(int) store.MessageFilter { return store.MessageFilter{} })},
		{"list, page after 5,000", list(func(i int) store.MessageFilter { return store.MessageFilter{After: pick(cursors, i)} })},
		{"list by status (failed)", list(func(int) store.MessageFilter { return store.MessageFilter{Status: "failed"} })},
		{"list by status (sent)", list(func(int) store.MessageFilter { return store.MessageFilter{Status: "sent"} })},
		{"list by status (accepted)", list(func(int) store.MessageFilter { return store.MessageFilter{Status: "accepted"} })},
		{"list by recipient", list(func(i int) store.MessageFilter { return store.MessageFilter{To: pick(recipients, i)} })},
		{"list by recipient + status", list(func(i int) store.MessageFilter { return store.MessageFilter{To: pick(recipients, i), Status: "read"} })},
		{"search (idempotency key)", list(func(i int) store.MessageFilter { return store.MessageFilter{Search: pick(keys, i)} })},
		{"search (recipient)", list(func(i int) store.MessageFilter { return store.MessageFilter{Search: pick(recipients, i)} })},
		{"search (wamid)", list(func(i int) store.MessageFilter { return store.MessageFilter{Search: pick(wamids, i)} })},
		{"timeline", func(ctx context.Context, st *store.Store, i int) error {
			t, err := st.MessageTimeline(ctx, w.org, pick(withEvents, i))
			if err == nil && (len(t.Statuses) == 0 || len(t.Deliveries) == 0) {
				err = fmt.Errorf("timeline of %s: %d statuses, %d deliveries", t.WAMID, len(t.Statuses), len(t.Deliveries))
			}
			return err
		}},
	}, nil
}
