package store

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// The relay log (migration 020): relay_log holds one row per relay call on the send path and
// per refusal of one, written in batches by relaylog.Writer; messages gets the relay's side of
// every message a logged call sent (the inbound path owns its status). This file holds every
// query of relay_log and the relay's queries of messages.

// RelayCall is one row of the relay log: relay.Call in the store's terms.
type RelayCall struct {
	At        time.Time
	OrgID     uuid.UUID
	ChannelID uuid.UUID
	// Status is the status answered to the caller.
	Status int
	// Outcome is the relay's outcome of the call (relay.Outcome).
	Outcome string
	// ErrorCode and ErrorSubcode are the upstream's error code and subcode (0: none).
	ErrorCode, ErrorSubcode int
	Latency                 time.Duration
	// IdempotencyKey, Recipient and WAMID are "" when absent; values that are not text are not
	// stored.
	IdempotencyKey string
	Replayed       bool
	Recipient      string
	WAMID          string
}

// relayLogColumns are relay_log's columns in the order WriteRelayLog copies them.
var relayLogColumns = []string{"at", "org_id", "channel_id", "status", "outcome", "error_code", "error_subcode",
	"latency_us", "idempotency_key", "replayed", "recipient", "wamid"}

// WriteRelayLog writes a batch of relay calls in one transaction: the calls into relay_log (one
// COPY) and, for every call that carries a wamid, its message's relay fields into messages (one
// multi-row upsert; see upsertRelayMessages). A day without a partition has it created, and
// the batch is tried once more.
//
// Every value goes to pgx as a pgtype value behind a pointer into a buffer reused per row or
// per batch: no value is boxed or converted per call (uuid.UUID as a driver.Valuer costs a
// string, its parse and an error per value; bench/README "Issue 21: the relay's CPU in Caddy").
func (s *Store) WriteRelayLog(ctx context.Context, calls []RelayCall) error {
	if len(calls) == 0 {
		return nil
	}
	write := func(tx pgx.Tx) error {
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{"relay_log"}, relayLogColumns, newRelayLogRows(calls)); err != nil {
			return err
		}
		return upsertRelayMessages(ctx, tx, calls)
	}
	err := s.inTx(ctx, write)
	if isMissingPartition(err) {
		// The partition manager is behind (or the clock jumped): make the days and retry once.
		now := s.now()
		if err = s.EnsurePartitions(ctx, now.AddDate(0, 0, -1), now.AddDate(0, 0, PartitionsAhead)); err == nil {
			err = s.inTx(ctx, write)
		}
	}
	if err != nil {
		return fmt.Errorf("write relay log: %w", err)
	}
	return nil
}

// relayLogRows is a pgx.CopyFromSource of calls as relay_log rows, in relayLogColumns' order.
// Values returns the same slice for every row: pointers to the current row's fields, which pgx
// encodes before it asks for the next row.
type relayLogRows struct {
	calls []RelayCall
	i     int
	row   struct {
		at                             pgtype.Timestamptz
		org, channel                   pgtype.UUID
		status, code, subcode, latency pgtype.Int4
		outcome, key, recipient, wamid pgtype.Text
		replayed                       pgtype.Bool
	}
	values []any
}

func newRelayLogRows(calls []RelayCall) *relayLogRows {
	r := &relayLogRows{calls: calls, i: -1}
	w := &r.row
	r.values = []any{&w.at, &w.org, &w.channel, &w.status, &w.outcome, &w.code, &w.subcode,
		&w.latency, &w.key, &w.replayed, &w.recipient, &w.wamid}
	return r
}

// Next implements pgx.CopyFromSource.
func (r *relayLogRows) Next() bool {
	r.i++
	if r.i >= len(r.calls) {
		return false
	}
	c, w := &r.calls[r.i], &r.row
	w.at = pgtype.Timestamptz{Time: c.At, Valid: true}
	w.org, w.channel = pgUUID(c.OrgID), pgUUID(c.ChannelID)
	w.status = pgtype.Int4{Int32: int32(c.Status), Valid: true}
	w.outcome = pgtype.Text{String: c.Outcome, Valid: true}
	w.code, w.subcode = pgNullInt(c.ErrorCode), pgNullInt(c.ErrorSubcode)
	w.latency = pgtype.Int4{Int32: latencyUS(c.Latency), Valid: true}
	w.key, w.recipient, w.wamid = pgNullText(c.IdempotencyKey), pgNullText(c.Recipient), pgNullText(c.WAMID)
	w.replayed = pgtype.Bool{Bool: c.Replayed, Valid: true}
	return true
}

// Values implements pgx.CopyFromSource.
func (r *relayLogRows) Values() ([]any, error) { return r.values, nil }

// Err implements pgx.CopyFromSource.
func (r *relayLogRows) Err() error { return nil }

// upsertRelayMessages records the relay's side of the messages the calls sent: a message's row
// is created by its first call (or by its first status, through the inbound path, which owns
// status, status_rank and error_*); the call's time, status, latency, recipient and key are set
// once, by the first call that reaches the row (relay_at still NULL); a replayed call marks it
// relay_replayed. Calls of one wamid in the batch are merged first (one row may be updated only
// once per statement): the first one's fields, replayed if any was.
func upsertRelayMessages(ctx context.Context, tx pgx.Tx, calls []RelayCall) error {
	var (
		wamids, keys, recipients pgArray[pgtype.Text]
		orgs, channels           pgArray[pgtype.UUID]
		ats                      pgArray[pgtype.Timestamptz]
		statuses, latencies      pgArray[pgtype.Int4]
		replayed                 pgArray[pgtype.Bool]
		seen                     map[string]int
	)
	for i := range calls {
		c := &calls[i]
		w := pgNullText(c.WAMID)
		if !w.Valid {
			continue
		}
		if i, ok := seen[w.String]; ok {
			replayed[i].Bool = replayed[i].Bool || c.Replayed
			continue
		}
		if seen == nil {
			n := len(calls) - i // at most this many wamids
			seen = make(map[string]int, n)
			wamids, keys, recipients = make(pgArray[pgtype.Text], 0, n), make(pgArray[pgtype.Text], 0, n), make(pgArray[pgtype.Text], 0, n)
			orgs, channels, ats = make(pgArray[pgtype.UUID], 0, n), make(pgArray[pgtype.UUID], 0, n), make(pgArray[pgtype.Timestamptz], 0, n)
			statuses, latencies, replayed = make(pgArray[pgtype.Int4], 0, n), make(pgArray[pgtype.Int4], 0, n), make(pgArray[pgtype.Bool], 0, n)
		}
		seen[w.String] = len(wamids)
		recipient := ""
		if IsText(c.Recipient) {
			recipient = c.Recipient
		}
		wamids, keys = append(wamids, w), append(keys, pgNullText(c.IdempotencyKey))
		recipients = append(recipients, pgtype.Text{String: recipient, Valid: true})
		orgs, channels = append(orgs, pgUUID(c.OrgID)), append(channels, pgUUID(c.ChannelID))
		ats = append(ats, pgtype.Timestamptz{Time: c.At, Valid: true})
		statuses = append(statuses, pgtype.Int4{Int32: int32(c.Status), Valid: true})
		latencies = append(latencies, pgtype.Int4{Int32: latencyUS(c.Latency), Valid: true})
		replayed = append(replayed, pgtype.Bool{Bool: c.Replayed, Valid: true})
	}
	if len(wamids) == 0 {
		return nil
	}
	_, err := tx.Exec(ctx, `
		INSERT INTO messages AS m (wamid, org_id, channel_id, recipient, created_at, idempotency_key,
		                           relay_at, relay_status, relay_latency_us, relay_replayed)
		SELECT w, o, c, r, a, k, a, st, l, rp
		FROM unnest($1::text[], $2::uuid[], $3::uuid[], $4::text[], $5::timestamptz[], $6::text[],
		            $7::int[], $8::int[], $9::bool[]) AS x(w, o, c, r, a, k, st, l, rp)
		ON CONFLICT (wamid) DO UPDATE SET
			created_at       = CASE WHEN m.relay_at IS NULL THEN excluded.created_at ELSE m.created_at END,
			recipient        = CASE WHEN m.relay_at IS NULL AND excluded.recipient <> '' THEN excluded.recipient ELSE m.recipient END,
			idempotency_key  = CASE WHEN m.relay_at IS NULL THEN coalesce(excluded.idempotency_key, m.idempotency_key) ELSE m.idempotency_key END,
			relay_status     = CASE WHEN m.relay_at IS NULL THEN excluded.relay_status ELSE m.relay_status END,
			relay_latency_us = CASE WHEN m.relay_at IS NULL THEN excluded.relay_latency_us ELSE m.relay_latency_us END,
			relay_at         = coalesce(m.relay_at, excluded.relay_at),
			relay_replayed   = m.relay_replayed OR excluded.relay_replayed`,
		wamids, orgs, channels, recipients, ats, keys, statuses, latencies, replayed)
	if err != nil {
		return fmt.Errorf("messages: %w", err)
	}
	return nil
}

// pgArray is a one-dimensional array parameter whose elements pgx encodes through pointers
// (T is a pgtype value: *T implements its codec's valuer), so that no element is boxed.
type pgArray[T any] []T

// Dimensions implements pgtype.ArrayGetter.
func (a pgArray[T]) Dimensions() []pgtype.ArrayDimension {
	return []pgtype.ArrayDimension{{Length: int32(len(a)), LowerBound: 1}}
}

// Index implements pgtype.ArrayGetter.
func (a pgArray[T]) Index(i int) any { return &a[i] }

// IndexType implements pgtype.ArrayGetter.
func (a pgArray[T]) IndexType() any { return new(T) }

func pgUUID(id uuid.UUID) pgtype.UUID { return pgtype.UUID{Bytes: id, Valid: true} }

// pgNullInt is NULL for 0, else n: an optional int column's value.
func pgNullInt(n int) pgtype.Int4 { return pgtype.Int4{Int32: int32(n), Valid: n != 0} }

// pgNullText is nullText as a pgtype value (NULL where nullText is nil).
func pgNullText(s string) pgtype.Text {
	if p := nullText(s); p != nil {
		return pgtype.Text{String: *p, Valid: true}
	}
	return pgtype.Text{}
}

// SendMinute is one minute of a channel's relay calls by outcome class (SendsPerMinute).
type SendMinute struct {
	// Minute is the minute's start (UTC).
	Minute time.Time
	// OK: answered below 400 by the upstream, or a replay of such an answer.
	OK int
	// UpstreamError: other answers from or about the upstream (its 4xx and 5xx, unreachable,
	// timed out, cut short) and replays of them, 429s aside.
	UpstreamError int
	// RateLimited: every 429 (the relay's rate limit or the upstream's).
	RateLimited int
	// Refused: the relay's own other refusals (inactive, disconnected, bad body, key conflicts,
	// idempotency store down).
	Refused int
}

// SendsPerMinute returns the relay calls of one channel of org since since, counted per
// minute by outcome class: only minutes with calls, oldest first. A channel of another org has
// none.
func (s *Store) SendsPerMinute(ctx context.Context, orgID, channelID uuid.UUID, since time.Time) ([]SendMinute, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT date_trunc('minute', at),
		       count(*) FILTER (WHERE status <> 429 AND (outcome = 'ok' OR outcome = 'replayed' AND status < 400)),
		       count(*) FILTER (WHERE status <> 429 AND (outcome IN ('upstream_4xx', 'upstream_5xx', 'upstream_error')
		                                                 OR outcome = 'replayed' AND status >= 400)),
		       count(*) FILTER (WHERE status = 429),
		       count(*)
		FROM relay_log
		WHERE channel_id = $2 AND org_id = $1 AND at >= $3
		GROUP BY 1 ORDER BY 1`, orgID, channelID, since)
	if err != nil {
		return nil, fmt.Errorf("sends per minute: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (SendMinute, error) {
		var m SendMinute
		var total int
		err := r.Scan(&m.Minute, &m.OK, &m.UpstreamError, &m.RateLimited, &total)
		m.Minute = m.Minute.UTC()
		m.Refused = total - m.OK - m.UpstreamError - m.RateLimited
		return m, err
	})
	if err != nil {
		return nil, fmt.Errorf("sends per minute: %w", err)
	}
	return out, nil
}

// pruneMessagesBatch is how many messages rows one statement of PruneMessages deletes.
const pruneMessagesBatch = 5000

// PruneMessages deletes the messages created before cutoff (the retention), in batches of
// pruneMessagesBatch rows so that no statement holds many locks or runs long; it returns how
// many it deleted.
func (s *Store) PruneMessages(ctx context.Context, cutoff time.Time) (int64, error) {
	var total int64
	for {
		tag, err := s.pool.Exec(ctx, `
			DELETE FROM messages WHERE wamid IN (
				SELECT wamid FROM messages WHERE created_at < $1 LIMIT $2)`, cutoff, pruneMessagesBatch)
		if err != nil {
			return total, fmt.Errorf("prune messages: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < pruneMessagesBatch {
			return total, nil
		}
	}
}

// latencyUS is d in whole microseconds, capped to the int column.
func latencyUS(d time.Duration) int32 {
	us := d.Microseconds()
	if us > math.MaxInt32 {
		return math.MaxInt32
	}
	return int32(max(us, 0))
}
