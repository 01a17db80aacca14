package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/wabarelay/wabarelay/usage"
)

// Usage by pricing category (DESIGN §5c "Usage by pricing category"; migration 026). Every
// outgoing message is counted once, in the bucket of its pricing: the UTC day of its first priced
// status, its channel, the pricing's category and type, and the recipient's country. A message's
// current bucket is kept on its messages row; every intake batch that prices a message or
// changes its bucket appends signed deltas to usage_deltas (-1 for the bucket left, +1 for the
// one entered, summed per bucket) in its own transaction — the messages upsert for the rows it
// creates (messagesUpsertPricedSQL), usageSQL for the others —, and the maintenance loop folds
// them into usage_daily (FoldUsage). A read sums usage_daily and the deltas not folded yet
// (Usage).

// Pricing is a status's pricing object (value.statuses[].pricing) as usage counts it.
type Pricing struct {
	// Billable is true when the upstream said "billable": true (or "true").
	Billable bool
	// PricingModel is the upstream's pricing_model (PMP; CBP before 2025-07), verbatim ("" when
	// absent). Not a usage bucket.
	PricingModel string
	// Category is the upstream's category, verbatim (marketing, utility, authentication,
	// service, …); UnknownPricing when absent, empty or not text.
	Category string
	// Type is the upstream's type, verbatim (regular, free_customer_service,
	// free_entry_point, …); UnknownPricing when absent, empty or not text.
	Type string
}

// UnknownPricing is the category or type of a pricing object that carries none (or one that
// is not text): such a status is still counted, under this name.
const UnknownPricing = "unknown"

// maxPricingLen bounds a pricing value kept (bytes): upstream values are short words; a longer
// one is cut, never refused.
const maxPricingLen = 64

// parsePricing reads a status's pricing: nil when raw is absent or not a JSON object (a status
// without pricing is not priced). Any object is a pricing, whatever its fields hold: a field of
// the wrong type reads as absent.
func parsePricing(raw json.RawMessage) *Pricing {
	if !bytes.HasPrefix(bytes.TrimLeft(raw, " \t\r\n"), []byte("{")) {
		return nil
	}
	var f struct {
		Billable     json.RawMessage `json:"billable"`
		PricingModel json.RawMessage `json:"pricing_model"`
		Category     json.RawMessage `json:"category"`
		Type         json.RawMessage `json:"type"`
	}
	if json.Unmarshal(raw, &f) != nil {
		return nil
	}
	b := bytes.TrimSpace(f.Billable)
	return &Pricing{
		Billable:     string(b) == "true" || string(b) == `"true"`,
		PricingModel: pricingValue(f.PricingModel, ""),
		Category:     pricingValue(f.Category, UnknownPricing),
		Type:         pricingValue(f.Type, UnknownPricing),
	}
}

// pricingValue is a pricing field's text, cut to maxPricingLen bytes; absent when it is no
// text (or empty) is the value given.
func pricingValue(raw json.RawMessage, absent string) string {
	s := jsonString(raw)
	if s == "" || !IsText(s) {
		return absent
	}
	return truncateText(s, maxPricingLen)
}

// usageDayPast and usageDayAhead bound the upstream timestamp a priced status's day is taken
// from: the upstream re-sends a status for up to 7 days; a timestamp outside these bounds is
// garbage or a skewed clock, and the status's arrival gives the day instead.
const (
	usageDayPast  = DedupeWindow + 24*time.Hour
	usageDayAhead = time.Hour
)

// usageBucket is the day and country that item i's priced status (in.statuses[i].Pricing set)
// is counted under: the day of its upstream timestamp, or of its arrival when that is out of
// bounds; the recipient's country.
func (in *inboundBatch) usageBucket(i int) (time.Time, string) {
	st := in.statuses[i]
	at := st.Timestamp
	if at.IsZero() || at.Before(in.now.Add(-usageDayPast)) || at.After(in.now.Add(usageDayAhead)) {
		at = in.now
	}
	return day(at), usage.Country(st.Recipient)
}

// applyUsage counts the priced statuses among the stored events (ids in stored) in the usage
// (usageSQL): it runs after applyStatuses, in the intake's transaction, whose messages upsert has
// already created or locked every message row it touches. The messages in created are left
// out: the upsert made their rows, in their buckets, and appended their deltas itself
// (messagesUpsertPricedSQL).
func (in *inboundBatch) applyUsage(ctx context.Context, tx pgx.Tx, stored []uuid.UUID, created map[string]bool) error {
	index := make(map[uuid.UUID]int, len(in.ids))
	for i, id := range in.ids {
		if st := in.statuses[i]; st != nil && st.Pricing != nil {
			index[id] = i
		}
	}
	if len(index) == 0 {
		return nil
	}
	var wamids, cats, types, countries []string
	var chs []uuid.UUID
	var ranks []int32
	var days []time.Time
	var billable []bool
	for _, id := range stored {
		i, ok := index[id]
		if !ok || in.wamids[i] == nil || created[*in.wamids[i]] {
			continue
		}
		st := in.statuses[i]
		rank, ok := StatusRank(st.Status)
		if !ok {
			continue // (a status that moves no message: no row to count it on)
		}
		d, country := in.usageBucket(i)
		wamids, chs, ranks = append(wamids, *in.wamids[i]), append(chs, in.chIDs[i]), append(ranks, int32(rank))
		days, cats, types = append(days, d), append(cats, st.Pricing.Category), append(types, st.Pricing.Type)
		billable, countries = append(billable, st.Pricing.Billable), append(countries, country)
	}
	if len(wamids) == 0 {
		return nil
	}
	// On a generic plan (execGeneric): planned per call, its CTEs cost the intake more in the
	// planner than in running (BenchmarkPricedStatus). The guard then holds for the rest of the
	// transaction, whose last statement (the deliveries) runs under it anyway.
	_, err := execGeneric(ctx, tx, usageSQL, wamids, chs, ranks, days, cats, types, billable, countries)
	if err != nil {
		return fmt.Errorf("usage: %w", err)
	}
	return nil
}

// usageSQL moves the messages of a batch's priced statuses into their buckets, and appends the
// deltas of every move. Per message (of the status's channel): the batch's priced status of the
// highest rank gives the pricing, the later one in the batch among equals; it replaces the
// message's pricing unless that came from a status of a higher rank (a late "sent" does not
// undo what "delivered" said). Its day is the earliest of its priced statuses' days, so far.
// Its country is the status's, unless the status's recipient placed it nowhere and an earlier
// one did. A message whose bucket and billable stay as they were gets no delta (a re-priced
// status saying the same, a duplicate). Deltas are summed per bucket, inserted in bucket order.
const usageSQL = `
	WITH v AS (
		SELECT DISTINCT ON (u.wamid) u.wamid, u.ch, u.rank, u.category, u.ptype, u.billable, u.country,
		       min(u.day) OVER (PARTITION BY u.wamid) AS day
		FROM unnest($1::text[], $2::uuid[], $3::smallint[], $4::date[], $5::text[], $6::text[], $7::boolean[], $8::text[])
		     WITH ORDINALITY AS u(wamid, ch, rank, day, category, ptype, billable, country, ord)
		ORDER BY u.wamid, u.rank DESC, u.ord DESC
	), o AS (
		SELECT m.wamid, m.org_id, m.channel_id,
		       m.usage_day AS old_day, m.usage_category AS old_cat, m.usage_type AS old_type,
		       m.usage_country AS old_country, m.usage_billable AS old_billable, m.usage_rank AS old_rank,
		       least(m.usage_day, v.day) AS day,
		       m.usage_rank IS NULL OR v.rank >= m.usage_rank AS newer,
		       v.rank, v.category, v.ptype, v.billable,
		       CASE WHEN v.country = 'ZZ' AND m.usage_country IS NOT NULL THEN m.usage_country ELSE v.country END AS country
		FROM v JOIN messages m ON m.wamid = v.wamid AND m.channel_id = v.ch
	), n AS (
		SELECT o.wamid, o.org_id, o.channel_id, o.old_day, o.old_cat, o.old_type, o.old_country, o.old_billable, o.old_rank,
		       o.day AS new_day,
		       CASE WHEN o.newer THEN o.category ELSE o.old_cat END AS new_cat,
		       CASE WHEN o.newer THEN o.ptype ELSE o.old_type END AS new_type,
		       CASE WHEN o.newer THEN o.country ELSE o.old_country END AS new_country,
		       CASE WHEN o.newer THEN o.billable ELSE o.old_billable END AS new_billable,
		       greatest(o.old_rank, o.rank) AS new_rank
		FROM o
	), c AS (
		SELECT n.*, (n.old_day, n.old_cat, n.old_type, n.old_country, n.old_billable)
		            IS DISTINCT FROM (n.new_day, n.new_cat, n.new_type, n.new_country, n.new_billable) AS moved
		FROM n
		WHERE (n.old_day, n.old_cat, n.old_type, n.old_country, n.old_billable, n.old_rank)
		      IS DISTINCT FROM (n.new_day, n.new_cat, n.new_type, n.new_country, n.new_billable, n.new_rank)
	), u AS (
		UPDATE messages m
		SET usage_day = c.new_day, usage_category = c.new_cat, usage_type = c.new_type,
		    usage_country = c.new_country, usage_billable = c.new_billable, usage_rank = c.new_rank
		FROM c WHERE m.wamid = c.wamid
	)
	-- one delta per bucket, not one per message and side: a batch's messages mostly move
	-- between the same few buckets, and FoldUsage and Usage only sum the rows (fewer rows to
	-- write and fold; the statement's CPU about the same, BenchmarkPricedStatus); a bucket the
	-- batch's moves leave even (a message moved out, another in) gets none
	INSERT INTO usage_deltas (org_id, day, channel_id, category, pricing_type, country, messages, billable)
	SELECT c.org_id, d.day, c.channel_id, d.category, d.ptype, d.country, sum(d.n), sum(d.b)
	FROM c CROSS JOIN LATERAL (VALUES
		(c.old_day, c.old_cat, c.old_type, c.old_country, -1, CASE WHEN c.old_billable THEN -1 ELSE 0 END),
		(c.new_day, c.new_cat, c.new_type, c.new_country, 1, CASE WHEN c.new_billable THEN 1 ELSE 0 END)
	) AS d(day, category, ptype, country, n, b)
	WHERE c.moved AND d.day IS NOT NULL
	GROUP BY c.org_id, d.day, c.channel_id, d.category, d.ptype, d.country
	HAVING sum(d.n) <> 0 OR sum(d.b) <> 0
	ORDER BY 1, 2, 3, 4, 5, 6`

// usageFoldLockKey is the pg_try_advisory_xact_lock key of FoldUsage: one fold at a time across
// instances (another instance's fold in progress: this one folds nothing).
const usageFoldLockKey int64 = 0x7762_7573_6167_0001 // "wbusag"

// FoldUsage folds the usage deltas written so far into the daily rollup (usage_daily), in one
// statement: the deltas it deletes are the ones it adds, so a read (Usage), which sums both, sees
// the same totals before, during and after. Deltas of transactions still open are left for the
// next fold. It returns how many deltas it folded. The maintenance loop calls it (Maintain).
func (s *Store) FoldUsage(ctx context.Context) (int64, error) {
	var n int64
	err := s.pool.QueryRow(ctx, `
		WITH l AS (
			SELECT pg_try_advisory_xact_lock($1) AS ok
		), d AS (
			DELETE FROM usage_deltas WHERE (SELECT ok FROM l)
			RETURNING org_id, day, channel_id, category, pricing_type, country, messages, billable
		), s AS (
			SELECT org_id, day, channel_id, category, pricing_type, country,
			       sum(messages) AS messages, sum(billable) AS billable, count(*) AS deltas
			FROM d GROUP BY 1, 2, 3, 4, 5, 6
		), i AS (
			INSERT INTO usage_daily AS r (org_id, day, channel_id, category, pricing_type, country, messages, billable)
			SELECT org_id, day, channel_id, category, pricing_type, country, messages, billable FROM s
			WHERE messages <> 0 OR billable <> 0
			ORDER BY 1, 2, 3, 4, 5, 6
			ON CONFLICT (org_id, day, channel_id, category, pricing_type, country) DO UPDATE
			SET messages = r.messages + excluded.messages, billable = r.billable + excluded.billable
		)
		SELECT coalesce(sum(deltas), 0)::bigint FROM s`, usageFoldLockKey).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("fold usage: %w", err)
	}
	return n, nil
}

// UsageRow is one bucket of an org's usage: how many outgoing messages were counted on a UTC
// day, of a channel, under a pricing category and type, to a recipient country, and how many
// of them billable.
type UsageRow struct {
	Day                            time.Time // UTC midnight
	ChannelID                      uuid.UUID
	Category, PricingType, Country string
	Messages, Billable             int64
}

// UsageFilter selects an org's usage: the UTC days from Since to Until, both included (their
// times of day are ignored), of one channel (ChannelID, uuid.Nil for all).
type UsageFilter struct {
	Since, Until time.Time
	ChannelID    uuid.UUID
}

// Usage returns an org's usage buckets of the filter's days, ordered by day, channel id,
// category, pricing type and country (bytewise), with no bucket whose counts are both 0 (every
// message moved out of it). The org's channels deleted since are included (the usage outlives
// them), unless a channel is asked for: then it must be a channel of the org
// (ErrChannelNotFound otherwise).
//
// It reads in one snapshot (a repeatable-read, read-only transaction: a fold is seen whole or not
// at all) the deltas not folded yet, summed per bucket (a few minutes' worth), then the rollup's
// rows in its primary key's order, which is the answer's: an index range scan streamed as it is
// read, merged with the deltas here. Summing both in SQL had Postgres hash and sort the whole
// window (189,000 rows for an org at 10 million messages a month: 0.3–1 s, bench/usage).
func (s *Store) Usage(ctx context.Context, org uuid.UUID, f UsageFilter) ([]UsageRow, error) {
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("usage: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) // (read only: nothing to undo)
	args := []any{org, day(f.Since), day(f.Until)}
	filter := ""
	if f.ChannelID != uuid.Nil {
		var ok bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM channels WHERE id = $1 AND org_id = $2)`, f.ChannelID, org).Scan(&ok); err != nil {
			return nil, fmt.Errorf("usage: %w", err)
		}
		if !ok {
			return nil, ErrChannelNotFound
		}
		args, filter = append(args, f.ChannelID), " AND channel_id = $4"
	}
	var in usageInterner
	deltas, err := in.collect(tx.Query(ctx, `
		SELECT day, channel_id, category, pricing_type, country, sum(messages)::bigint, sum(billable)::bigint
		FROM usage_deltas WHERE org_id = $1 AND day >= $2::date AND day <= $3::date`+filter+`
		GROUP BY day, channel_id, category, pricing_type, country
		ORDER BY day, channel_id, category, pricing_type, country`, args...))
	if err != nil {
		return nil, fmt.Errorf("usage: deltas: %w", err)
	}
	rollup, err := in.collect(tx.Query(ctx, `
		SELECT day, channel_id, category, pricing_type, country, messages, billable
		FROM usage_daily WHERE org_id = $1 AND day >= $2::date AND day <= $3::date`+filter+`
		ORDER BY day, channel_id, category, pricing_type, country`, args...))
	if err != nil {
		return nil, fmt.Errorf("usage: %w", err)
	}
	return mergeUsage(rollup, deltas), nil
}

// mergeUsage merges two lists of buckets in key order (each in that order, each key once), the
// counts of a key in both added up, the buckets whose counts are both 0 left out.
func mergeUsage(a, b []UsageRow) []UsageRow {
	out := make([]UsageRow, 0, len(a)+len(b))
	add := func(r UsageRow) {
		if r.Messages != 0 || r.Billable != 0 {
			out = append(out, r)
		}
	}
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case j == len(b):
			add(a[i])
			i++
		case i == len(a):
			add(b[j])
			j++
		default:
			switch c := compareUsageKeys(&a[i], &b[j]); {
			case c < 0:
				add(a[i])
				i++
			case c > 0:
				add(b[j])
				j++
			default:
				r := a[i]
				r.Messages += b[j].Messages
				r.Billable += b[j].Billable
				add(r)
				i, j = i+1, j+1
			}
		}
	}
	return out
}

// compareUsageKeys orders buckets as Postgres orders their key columns: day, channel id (its
// bytes), then the text columns bytewise (COLLATE "C").
func compareUsageKeys(a, b *UsageRow) int {
	if c := a.Day.Compare(b.Day); c != 0 {
		return c
	}
	if c := bytes.Compare(a.ChannelID[:], b.ChannelID[:]); c != 0 {
		return c
	}
	if c := strings.Compare(a.Category, b.Category); c != 0 {
		return c
	}
	if c := strings.Compare(a.PricingType, b.PricingType); c != 0 {
		return c
	}
	return strings.Compare(a.Country, b.Country)
}

// usageInterner shares the strings of the few categories, types and countries among the rows
// it reads (a window holds hundreds of thousands of rows and a few dozen distinct values).
type usageInterner map[string]string

func (in *usageInterner) intern(b []byte) string {
	if s, ok := (*in)[string(b)]; ok {
		return s
	}
	if *in == nil {
		*in = usageInterner{}
	}
	s := string(b)
	(*in)[s] = s
	return s
}

// collect reads usage rows (day, channel_id, category, pricing_type, country, messages,
// billable). A window can hold hundreds of thousands of rows: they are read into chunks and copied
// once into a slice of their number, rather than grown by append (which copies the rows read so
// far at every growth).
func (in *usageInterner) collect(rows pgx.Rows, err error) ([]UsageRow, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	const chunk = 4096
	var chunks [][]UsageRow
	var cat, typ, country pgtype.DriverBytes // (the row's own bytes, not copied: interned)
	var ch pgtype.UUID                       // (uuid.UUID would be scanned through its text)
	binary := usageBinary(rows.FieldDescriptions())
	n := 0
	for rows.Next() {
		if n%chunk == 0 {
			chunks = append(chunks, make([]UsageRow, 0, chunk))
		}
		u := &chunks[len(chunks)-1]
		*u = append(*u, UsageRow{})
		r := &(*u)[len(*u)-1]
		if binary && in.decode(rows.RawValues(), r) {
			n++
			continue
		}
		if err := rows.Scan(&r.Day, &ch, &cat, &typ, &country, &r.Messages, &r.Billable); err != nil {
			return nil, err
		}
		r.Day, r.ChannelID = r.Day.UTC(), ch.Bytes
		r.Category, r.PricingType, r.Country = in.intern(cat), in.intern(typ), in.intern(country)
		n++
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(chunks) == 1 {
		return chunks[0], nil
	}
	out := make([]UsageRow, 0, n)
	for _, c := range chunks {
		out = append(out, c...)
	}
	return out, nil
}

// usageBinary reports whether the usage rows' columns all come in Postgres's binary format (the
// texts in either) with the types decode reads (date, uuid, three texts, two integers): then each row is read from its
// raw bytes, without Scan's per-column conversions (a window holds up to hundreds of thousands of
// rows, bench/usage).
func usageBinary(fds []pgconn.FieldDescription) bool {
	want := [...]uint32{pgtype.DateOID, pgtype.UUIDOID, pgtype.TextOID, pgtype.TextOID, pgtype.TextOID}
	if len(fds) != 7 {
		return false
	}
	for i, fd := range fds {
		// (a text's bytes are the same in both formats: pgx asks for text columns as text)
		if fd.Format != pgtype.BinaryFormatCode && fd.DataTypeOID != pgtype.TextOID {
			return false
		}
		if i < len(want) && fd.DataTypeOID != want[i] {
			return false
		}
		if i >= len(want) && fd.DataTypeOID != pgtype.Int4OID && fd.DataTypeOID != pgtype.Int8OID {
			return false
		}
	}
	return true
}

// usageEpoch is day 0 of Postgres's binary date (2000-01-01).
var usageEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// decode reads a usage row from its binary column values (see usageBinary) into r; false when a
// value is not of the expected size (NULL, or a date out of range): the caller then scans it.
func (in *usageInterner) decode(v [][]byte, r *UsageRow) bool {
	if len(v[0]) != 4 || len(v[1]) != 16 || v[2] == nil || v[3] == nil || v[4] == nil {
		return false
	}
	days := int32(binary.BigEndian.Uint32(v[0]))
	if days == math.MaxInt32 || days == math.MinInt32 { // infinity
		return false
	}
	m, ok1 := usageInt(v[5])
	b, ok2 := usageInt(v[6])
	if !ok1 || !ok2 {
		return false
	}
	r.Day = usageEpoch.AddDate(0, 0, int(days))
	copy(r.ChannelID[:], v[1])
	r.Category, r.PricingType, r.Country = in.intern(v[2]), in.intern(v[3]), in.intern(v[4])
	r.Messages, r.Billable = m, b
	return true
}

// usageInt reads a binary int4 or int8.
func usageInt(v []byte) (int64, bool) {
	switch len(v) {
	case 4:
		return int64(int32(binary.BigEndian.Uint32(v))), true
	case 8:
		return int64(binary.BigEndian.Uint64(v)), true
	}
	return 0, false
}
