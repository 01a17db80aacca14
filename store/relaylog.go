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

// The relay log (migrations 020 and 021): relay_log holds one row per relay call on the send
// path and per refusal of one, written in batches by relaylog.Writer. It is the only record of
// the relay's side of a message (messages holds what the statuses say; the timeline's reads join
// the two, store/timeline.go). This file holds relay_log's writes and its per-channel counts, and
// the retention of messages.

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

// WriteRelayLog writes a batch of relay calls into relay_log with one COPY, nothing else (the
// log's whole cost on the database: a heap row and two index entries per call, bench/README.md
// "Issue 20: relay log on and off"). A day without a partition has it created, and the batch is
// tried once more. The writer then calls SettleMessages.
//
// Every value goes to pgx as a pgtype value behind a pointer into a buffer reused per row or
// per batch: no value is boxed or converted per call (uuid.UUID as a driver.Valuer costs a
// string, its parse and an error per value; bench/README "Issue 21: the relay's CPU in Caddy").
func (s *Store) WriteRelayLog(ctx context.Context, calls []RelayCall) error {
	if len(calls) == 0 {
		return nil
	}
	write := func(tx pgx.Tx) error {
		_, err := tx.CopyFrom(ctx, pgx.Identifier{"relay_log"}, relayLogColumns, newRelayLogRows(calls))
		return err
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

// RelayPendingFor is how long a messages row waits for its relay call's time (relay_pending,
// migration 021): a status can come before the log row of its send, which the writer writes
// within its interval (relaylog.DefaultInterval). A message sent around the relay, or with the
// log off, never gets one: its row keeps its status's arrival and is let go (settleMessagesSQL,
// Maintain).
const RelayPendingFor = 30 * time.Second

// SettleMessages gives the messages rows waiting for their relay call's time (relay_pending: their
// first status came before the call's log row) that time once relay_log has the call, and lets
// go of those that waited longer than RelayPendingFor (settleMessagesSQL: one probe of a partial
// index that is empty unless statuses outran their sends' log rows). The relay log's writer calls
// it after each batch, and once more an interval later for the statuses stored while it wrote.
// Apart from the batch's transaction, so that a failure here never costs the batch.
func (s *Store) SettleMessages(ctx context.Context) error {
	if _, err := s.pool.Exec(ctx, settleMessagesSQL, RelayPendingFor.Milliseconds()); err != nil {
		return fmt.Errorf("settle messages: %w", err)
	}
	return nil
}

// letGoPendingMessages stops the messages rows created before before from waiting for their
// relay call's time (Maintain: with the relay log off, no writer settles them).
func (s *Store) letGoPendingMessages(ctx context.Context, before time.Time) error {
	_, err := s.pool.Exec(ctx, `UPDATE messages SET relay_pending = NULL WHERE relay_pending AND created_at < $1`, before)
	return err
}

// settleMessagesSQL gives each messages row waiting for its relay call's time (relay_pending)
// that time as created_at once relay_log has the call, and lets go of the rows that waited
// longer than $1 ms. Rows an intake transaction holds are skipped, not waited for: the next
// settle takes them.
const settleMessagesSQL = `
	WITH p AS (
		SELECT wamid, channel_id, created_at FROM messages WHERE relay_pending
		ORDER BY wamid FOR NO KEY UPDATE SKIP LOCKED
	), f AS (
		SELECT p.wamid, p.created_at,
		       (SELECT CASE WHEN r.channel_id = p.channel_id THEN r.at END FROM relay_log r -- (by wamid alone: messagesUpsertSQL)
		        WHERE r.wamid = p.wamid AND NOT r.replayed
		          AND r.at >= p.created_at - interval '` + relayLookBack + `' AND r.at <= p.created_at + interval '1 minute'
		        ORDER BY r.at LIMIT 1) AS at
		FROM p
	)
	UPDATE messages m SET created_at = coalesce(f.at, m.created_at), relay_pending = NULL
	FROM f WHERE m.wamid = f.wamid AND (f.at IS NOT NULL OR f.created_at < now() - $1 * interval '1 millisecond')`

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
