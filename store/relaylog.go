package store

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// The relay log (migrations 020, 021 and 023): relay_log holds one row per relay call on the
// send path that went upstream or was replayed, written in batches by relaylog.Writer. It is the
// only record of the relay's side of a message (messages holds what the statuses say; the
// timeline's reads join the two, store/timeline.go). The relay's own refusals, and the calls of
// a channel beyond its bound of rows a second, are counted instead (relay_counts: one row per
// channel, second, outcome and status), and every call is counted per channel and minute for the
// dashboard's chart (relay_minutes). This file holds those writes and the chart's read, and the
// retention of messages.

// RelayCall is one row of the relay log (relay.Call in the store's terms), or a count of calls.
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
	// IdempotencyKey, Recipient and WAMID are "" when absent; values that are not text, a key
	// over MaxIdempotencyKeyLen bytes, a recipient RecipientRecorded refuses and a wamid over
	// MaxWAMIDLen bytes are not stored.
	IdempotencyKey string
	Replayed       bool
	Recipient      string
	WAMID          string
	// Calls is 0 for one call that is a row of relay_log of its own, when its outcome keeps one
	// (KeepsRow). A call whose outcome does not (a refusal), and Calls > 0 (that many calls of one
	// channel, second, outcome and status, folded by the writer), are counted in relay_counts
	// instead: their At is taken to the second, and only the channel, org, outcome and status
	// are kept.
	Calls int
}

// Caps on what a relay_log row stores: a value over its cap is not stored (NULL).
const (
	// MaxRecipientLen caps the recipient ("to") stored: a phone number has at most 15 digits
	// (E.164); 24 bytes leave room for a "+", spaces, dashes and parentheses. A longer "to" is
	// no number, and is not recorded (but a business-scoped user id: RecipientRecorded).
	MaxRecipientLen = 24
	// MaxIdempotencyKeyLen caps the idempotency key stored: the relay refuses longer keys (422).
	MaxIdempotencyKeyLen = 255
	// maxBSUIDLen caps a business-scoped user id taken as a recipient: "user." and 64 hex
	// digits (the upstream's planned usernames; docs/relay.md "Relay log").
	maxBSUIDLen = 69
)

// RecipientRecorded reports whether a send's "to" is recorded: one of at most MaxRecipientLen
// bytes (a phone number, however written), or a business-scoped user id ("user.…", at most 69
// bytes). Any other is left out of the log.
func RecipientRecorded(to string) bool {
	return len(to) <= MaxRecipientLen || len(to) <= maxBSUIDLen && strings.HasPrefix(to, "user.")
}

// KeepsRow reports whether a call with this outcome (relay.Outcome) is a row of relay_log of its
// own: the calls that went upstream (ok, upstream_4xx, upstream_5xx, upstream_error) and those
// answered from the idempotency store (replayed) — the calls the rate limit counts. Every other
// outcome is one of the relay's own refusals, which cost the caller nothing against its limit:
// they are counted (relay_counts), never written one by one — except window_closed, the relay's
// answer in the upstream's place (code 131047, DESIGN §5c), which keeps its row and error code.
func KeepsRow(outcome string) bool {
	switch outcome {
	case "ok", "upstream_4xx", "upstream_5xx", "upstream_error", "replayed", "window_closed":
		return true
	}
	return false
}

// relayLogColumns are relay_log's columns in the order WriteRelayLog copies them.
var relayLogColumns = []string{"at", "org_id", "channel_id", "status", "outcome", "error_code", "error_subcode",
	"latency_us", "idempotency_key", "replayed", "recipient", "wamid"}

// WriteRelayLog writes a batch of relay calls in one transaction: the calls that keep rows
// (KeepsRow, Calls 0) into relay_log with one COPY (a heap row and one or two partial index
// entries per send, besides its wamid's: bench/README.md, "Figures behind the defaults (relay
// admission)"); the others added to relay_counts, one row per channel, second, outcome and
// status; and every call added to relay_minutes, one row per channel and minute (two upserts of
// a few rows each, sent as one batch). A day without a partition has it created, and the batch
// is tried once more. The writer then calls SettleMessages.
//
// Every value goes to pgx as a pgtype value behind a pointer into a buffer reused per row or
// per batch: no value is boxed or converted per call (uuid.UUID as a driver.Valuer costs a
// string, its parse and an error per value; bench/README.md, "Figures behind the defaults (relay
// admission)").
func (s *Store) WriteRelayLog(ctx context.Context, calls []RelayCall) error {
	if len(calls) == 0 {
		return nil
	}
	rows, counts, minutes := splitRelayCalls(calls)
	write := func(tx pgx.Tx) error {
		if len(rows) > 0 {
			if _, err := tx.CopyFrom(ctx, pgx.Identifier{"relay_log"}, relayLogColumns, newRelayLogRows(rows)); err != nil {
				return err
			}
		}
		b := &pgx.Batch{}
		if len(counts) > 0 {
			b.Queue(relayCountsUpsertSQL, counts.args()...)
		}
		b.Queue(relayMinutesUpsertSQL, minutes.args()...)
		return tx.SendBatch(ctx, b).Close()
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

// relayCountsUpsertSQL adds counted calls to relay_counts: $1… one row per channel, second,
// outcome and status (distinct), in key order so that concurrent batches lock rows in one order.
const relayCountsUpsertSQL = `
	INSERT INTO relay_counts AS c (at, org_id, channel_id, outcome, status, calls)
	SELECT * FROM unnest($1::timestamptz[], $2::uuid[], $3::uuid[], $4::text[], $5::int[], $6::int[])
	ORDER BY 3, 1, 4, 5
	ON CONFLICT (channel_id, at, outcome, status) DO UPDATE SET calls = c.calls + excluded.calls`

// relayMinutesUpsertSQL adds calls to relay_minutes: $1… one row per channel and minute
// (distinct), in key order.
const relayMinutesUpsertSQL = `
	INSERT INTO relay_minutes AS m (minute, org_id, channel_id, ok, upstream_error, rate_limited, refused)
	SELECT * FROM unnest($1::timestamptz[], $2::uuid[], $3::uuid[], $4::int[], $5::int[], $6::int[], $7::int[])
	ORDER BY 3, 1
	ON CONFLICT (channel_id, minute) DO UPDATE
	SET ok = m.ok + excluded.ok, upstream_error = m.upstream_error + excluded.upstream_error,
	    rate_limited = m.rate_limited + excluded.rate_limited, refused = m.refused + excluded.refused`

// relayCountKey is the primary key of a row of relay_counts.
type relayCountKey struct {
	at      time.Time
	channel uuid.UUID
	outcome string
	status  int
}

// relayMinuteKey is the primary key of a row of relay_minutes.
type relayMinuteKey struct {
	minute  time.Time
	channel uuid.UUID
}

// relayCount is a row of relay_counts: its org (a channel's calls are one org's; the first
// call's is kept) and calls.
type relayCount struct {
	org   uuid.UUID
	calls int
}

// relayCounts are a batch's counted calls, by relay_counts row.
type relayCounts map[relayCountKey]*relayCount

func (c relayCounts) args() []any {
	ats, orgs, chs := make([]time.Time, 0, len(c)), make([]uuid.UUID, 0, len(c)), make([]uuid.UUID, 0, len(c))
	outcomes, statuses, calls := make([]string, 0, len(c)), make([]int32, 0, len(c)), make([]int32, 0, len(c))
	for k, n := range c {
		ats, orgs, chs = append(ats, k.at), append(orgs, n.org), append(chs, k.channel)
		outcomes, statuses, calls = append(outcomes, k.outcome), append(statuses, int32(k.status)), append(calls, clampInt32(n.calls))
	}
	return []any{ats, orgs, chs, outcomes, statuses, calls}
}

// relayMinute is a row of relay_minutes: its org (the first call's) and its calls by class
// (SendMinute's, in its order).
type relayMinute struct {
	org   uuid.UUID
	calls [4]int
}

// relayMinutes are a batch's calls by relay_minutes row.
type relayMinutes map[relayMinuteKey]*relayMinute

func (m relayMinutes) args() []any {
	minutes, orgs, chs := make([]time.Time, 0, len(m)), make([]uuid.UUID, 0, len(m)), make([]uuid.UUID, 0, len(m))
	var classes [4][]int32
	for k, n := range m {
		minutes, orgs, chs = append(minutes, k.minute), append(orgs, n.org), append(chs, k.channel)
		for i := range classes {
			classes[i] = append(classes[i], clampInt32(n.calls[i]))
		}
	}
	return []any{minutes, orgs, chs, classes[0], classes[1], classes[2], classes[3]}
}

// The classes of the per-minute chart (SendMinute's fields, relay_minutes' columns).
const (
	classOK = iota
	classUpstreamError
	classRateLimited
	classRefused
)

// sendClass returns the chart's class of a call (see SendMinute).
func sendClass(status int, outcome string) int {
	switch {
	case status == 429:
		return classRateLimited
	case outcome == "ok" || outcome == "replayed" && status < 400:
		return classOK
	case outcome == "upstream_4xx" || outcome == "upstream_5xx" || outcome == "upstream_error" || outcome == "replayed":
		return classUpstreamError
	}
	return classRefused
}

// splitRelayCalls sorts a batch into the calls that are rows of relay_log, the counted ones by
// relay_counts row, and every call by relay_minutes row and class.
func splitRelayCalls(calls []RelayCall) (rows []RelayCall, counts relayCounts, minutes relayMinutes) {
	minutes = relayMinutes{}
	for i := range calls {
		c := &calls[i]
		n := 1
		if c.Calls > 0 || !KeepsRow(c.Outcome) {
			n = max(c.Calls, 1)
			if counts == nil {
				counts = relayCounts{}
			}
			k := relayCountKey{c.At.UTC().Truncate(time.Second), c.ChannelID, c.Outcome, c.Status}
			r := counts[k]
			if r == nil {
				r = &relayCount{org: c.OrgID}
				counts[k] = r
			}
			r.calls += n
		} else {
			rows = append(rows, *c)
		}
		k := relayMinuteKey{c.At.UTC().Truncate(time.Minute), c.ChannelID}
		m := minutes[k]
		if m == nil {
			m = &relayMinute{org: c.OrgID}
			minutes[k] = m
		}
		m.calls[sendClass(c.Status, c.Outcome)] += n
	}
	return rows, counts, minutes
}

// clampInt32 is n capped to an int column.
func clampInt32(n int) int32 { return int32(min(n, math.MaxInt32)) }

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
	if len(c.IdempotencyKey) > MaxIdempotencyKeyLen {
		w.key = pgtype.Text{}
	}
	if !RecipientRecorded(c.Recipient) {
		w.recipient = pgtype.Text{}
	}
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

// SendsPerMinute returns the relay calls of one channel of org since since's minute, counted per
// minute by outcome class: only minutes with calls, oldest first (SendsPerBucket of a minute).
func (s *Store) SendsPerMinute(ctx context.Context, orgID, channelID uuid.UUID, since time.Time) ([]SendMinute, error) {
	return s.SendsPerBucket(ctx, orgID, channelID, since, time.Minute)
}

// SendsPerBucket returns the relay calls of one channel of org since since's minute, counted per
// bucket of time (a whole number of minutes, aligned on the Unix epoch; SendMinute.Minute is the
// bucket's start) by outcome class: only buckets with calls, oldest first. A channel of another
// org has none. One query over relay_minutes (migration 023), which the relay log's writer adds
// every call to: one row per minute, 1,440 for a day and 10,080 for a week, whatever the
// channel's traffic.
func (s *Store) SendsPerBucket(ctx context.Context, orgID, channelID uuid.UUID, since time.Time, bucket time.Duration) ([]SendMinute, error) {
	if bucket < time.Minute {
		bucket = time.Minute
	}
	rows, err := queryGuarded(ctx, s.pool, `
		SELECT to_timestamp(floor(extract(epoch FROM minute) / $4) * $4),
		       sum(ok)::int, sum(upstream_error)::int, sum(rate_limited)::int, sum(refused)::int
		FROM relay_minutes
		WHERE channel_id = $2 AND minute >= $3 AND org_id = $1 AND ok + upstream_error + rate_limited + refused > 0
		GROUP BY 1 ORDER BY 1`, orgID, channelID, since.UTC().Truncate(time.Minute), bucket.Seconds())
	if err != nil {
		return nil, fmt.Errorf("sends per minute: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (SendMinute, error) {
		var m SendMinute
		err := r.Scan(&m.Minute, &m.OK, &m.UpstreamError, &m.RateLimited, &m.Refused)
		m.Minute = m.Minute.UTC()
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
