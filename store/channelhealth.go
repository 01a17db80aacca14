// Number health (DESIGN §5c): what the upstream says of each connected number, when to read it
// next, the reads' outcomes, the channel_health events of the changes and their history
// (migration 024 describes the tables).

package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// EventChannelHealth announces a change of a known value of a channel's number health (DESIGN
// §5c "Number health"): data {"health", "previous", "changed", "upstream"} (ChannelHealthData).
const EventChannelHealth = "channel_health"

// HealthPromptDelay is how long after the first account webhook of a business account its
// channels' health is read: the webhooks that follow within it join that one read (DESIGN:
// within 60 s, repeated webhooks coalesced). It leaves the worker's poll and a slow upstream
// answer room inside the 60 s.
const HealthPromptDelay = 30 * time.Second

// Health fields, in the order a channel_health event's "changed" lists them.
const (
	HealthQualityRating  = "quality_rating"
	HealthMessagingLimit = "messaging_limit"
	HealthThroughput     = "throughput"
	HealthNameStatus     = "name_status"
)

// HealthFields are the health fields in the order "changed" lists them.
var HealthFields = []string{HealthQualityRating, HealthMessagingLimit, HealthThroughput, HealthNameStatus}

// Quality ratings the upstream gives (quality_rating); the store keeps any string verbatim.
const (
	QualityGreen  = "GREEN"
	QualityYellow = "YELLOW"
	QualityRed    = "RED"
)

// ChannelHealth is what the upstream says of a channel's number: its strings verbatim, each nil
// until known, and when it was last read (nil: never).
type ChannelHealth struct {
	QualityRating  *string
	MessagingLimit *string
	Throughput     *string
	NameStatus     *string
	CheckedAt      *time.Time
}

// healthJSON is the JSON form of a ChannelHealth in events and in the history.
type healthJSON struct {
	QualityRating  *string `json:"quality_rating"`
	MessagingLimit *string `json:"messaging_limit"`
	Throughput     *string `json:"throughput"`
	NameStatus     *string `json:"name_status"`
	CheckedAt      *string `json:"checked_at"`
}

// MarshalJSON writes {"quality_rating", "messaging_limit", "throughput", "name_status",
// "checked_at"} with nulls for what is unknown; checked_at in RFC 3339 (UTC, milliseconds).
func (h ChannelHealth) MarshalJSON() ([]byte, error) {
	j := healthJSON{QualityRating: h.QualityRating, MessagingLimit: h.MessagingLimit, Throughput: h.Throughput, NameStatus: h.NameStatus}
	if h.CheckedAt != nil {
		s := h.CheckedAt.UTC().Format(eventTimeFormat)
		j.CheckedAt = &s
	}
	return json.Marshal(j)
}

// UnmarshalJSON reads what MarshalJSON writes.
func (h *ChannelHealth) UnmarshalJSON(b []byte) error {
	var j healthJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*h = ChannelHealth{QualityRating: j.QualityRating, MessagingLimit: j.MessagingLimit, Throughput: j.Throughput, NameStatus: j.NameStatus}
	if j.CheckedAt != nil {
		t, err := time.Parse(time.RFC3339Nano, *j.CheckedAt)
		if err != nil {
			return err
		}
		h.CheckedAt = &t
	}
	return nil
}

// field returns the value of one of HealthFields.
func (h *ChannelHealth) field(name string) **string {
	switch name {
	case HealthQualityRating:
		return &h.QualityRating
	case HealthMessagingLimit:
		return &h.MessagingLimit
	case HealthThroughput:
		return &h.Throughput
	default:
		return &h.NameStatus
	}
}

// AtRisk reports whether the number's quality is YELLOW or RED (the dashboard's filter).
func (h ChannelHealth) AtRisk() bool {
	return h.QualityRating != nil && (*h.QualityRating == QualityYellow || *h.QualityRating == QualityRed)
}

// mergeHealth returns the health after a read that answered got (nil fields: the upstream did
// not say) over previous: a field the answer lacks keeps its known value. changed lists the
// fields whose known value changed (in HealthFields order); a field becoming known is no change,
// so the first fill after a connect announces nothing.
func mergeHealth(previous, got ChannelHealth) (next ChannelHealth, changed []string) {
	next = previous
	for _, f := range HealthFields {
		v := *got.field(f)
		if v == nil {
			continue
		}
		old := *previous.field(f)
		if old != nil && *old != *v {
			changed = append(changed, f)
		}
		s := *v
		*next.field(f) = &s
	}
	return next, changed
}

// healthColumn is the channel's health as one json array (channelColumns): a row subquery
// would make every statement on channels name the table; this one reads by primary key.
const healthColumn = `(SELECT json_build_array(h.quality_rating, h.messaging_limit, h.throughput, h.name_status, h.checked_at)
		FROM channel_health h WHERE h.channel_id = channels.id)`

// scanHealth decodes healthColumn (nil: the channel has no health row).
func scanHealth(raw []byte) (ChannelHealth, error) {
	var h ChannelHealth
	if raw == nil {
		return h, nil
	}
	var a [5]*string
	if err := json.Unmarshal(raw, &a); err != nil {
		return h, fmt.Errorf("health: %w", err)
	}
	h.QualityRating, h.MessagingLimit, h.Throughput, h.NameStatus = a[0], a[1], a[2], a[3]
	if a[4] != nil {
		t, err := time.Parse(time.RFC3339Nano, *a[4])
		if err != nil {
			return h, fmt.Errorf("health: checked_at: %w", err)
		}
		h.CheckedAt = &t
	}
	return h, nil
}

// promptHealthAtConnect asks, in the transaction of a connection, for a read of the channel's
// health at once (the first fill after a connect, or the read after a reconnect).
func (s *Store) promptHealthAtConnect(ctx context.Context, tx pgx.Tx, id uuid.UUID) error {
	_, err := tx.Exec(ctx, `
		INSERT INTO channel_health (channel_id, prompt_due_at, prompt_seq) VALUES ($1, coalesce($2::timestamptz, now()), 1)
		ON CONFLICT (channel_id) DO UPDATE SET prompt_due_at = EXCLUDED.prompt_due_at, prompt_upstream = NULL,
			prompt_seq = channel_health.prompt_seq + 1, failures = 0`, id, s.nowArg())
	if err != nil {
		return fmt.Errorf("health read at connect: %w", err)
	}
	return nil
}

// PromptHealth asks for a read of the health of every channel of business account wabaID after
// an account webhook (field, value: the change as the upstream sent it). The read falls due
// HealthPromptDelay after the first webhook; later ones before it only replace the change the
// read will name (its event's "upstream": the latest). A prompt that lands while a read is in
// flight makes that read's completion ask for another. It returns how many channels it asked
// for (0 for an account no channel has).
func (s *Store) PromptHealth(ctx context.Context, wabaID, field string, value json.RawMessage) (int, error) {
	if !IsText(wabaID) {
		return 0, nil // no channel's account (and not a text Postgres takes)
	}
	f, _ := json.Marshal(field)
	if !json.Valid(value) {
		value = json.RawMessage("null")
	} else if !utf8.Valid(value) {
		// (Postgres takes only UTF-8 text: the upstream's bytes, their invalid sequences replaced)
		value = bytes.ToValidUTF8(value, []byte("\uFFFD"))
	}
	upstream := `{"field":` + string(f) + `,"value":` + string(value) + `}`
	tag, err := s.pool.Exec(ctx, `
		UPDATE channel_health h SET prompt_due_at = coalesce(h.prompt_due_at, coalesce($2::timestamptz, now()) + $3::interval),
			prompt_upstream = $4::json, prompt_seq = h.prompt_seq + 1
		FROM channels c WHERE c.id = h.channel_id AND c.waba_id = $1`, wabaID, s.nowArg(), HealthPromptDelay, upstream)
	if err != nil {
		return 0, fmt.Errorf("prompt health reads: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// nextRefresh is the SQL of a channel_health row's next periodic read after the time now (an
// SQL expression), every refresh seconds ($ parameter refresh, float8; 0: off, NULL) at the
// row's own phase (refresh_offset), so that channels connected together are spread over the
// interval.
func nextRefresh(now, refresh string) string {
	return `CASE WHEN ` + refresh + ` > 0 THEN to_timestamp((floor(extract(epoch FROM ` + now + `)::float8 / ` + refresh +
		` - refresh_offset) + 1 + refresh_offset) * ` + refresh + `) END`
}

// seconds is d as the float8 seconds nextRefresh takes.
func seconds(d time.Duration) float64 { return d.Seconds() }

// ScheduleHealth gives every connected channel a health row and its periodic read under the
// interval refresh (0: off): a row without one, or due later than one interval from now (the
// interval was shortened), gets its next phase; with refresh off the periodic reads are
// dropped. The health worker calls it at start; any number of instances may.
func (s *Store) ScheduleHealth(ctx context.Context, refresh time.Duration) error {
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `
			INSERT INTO channel_health (channel_id)
			SELECT c.id FROM channels c
			WHERE c.phone_number_id IS NOT NULL AND c.upstream_token_enc IS NOT NULL
				AND NOT EXISTS (SELECT 1 FROM channel_health h WHERE h.channel_id = c.id)
			ON CONFLICT (channel_id) DO NOTHING`); err != nil {
			return err
		}
		now := `coalesce($1::timestamptz, now())`
		_, err := tx.Exec(ctx, `
			UPDATE channel_health SET refresh_due_at = `+nextRefresh(now, "$2::float8")+`
			WHERE ($2::float8 > 0 AND (refresh_due_at IS NULL OR refresh_due_at > `+now+` + $2::float8 * interval '1 second'))
				OR ($2::float8 = 0 AND refresh_due_at IS NOT NULL)`, s.nowArg(), seconds(refresh))
		return err
	})
	if err != nil {
		return fmt.Errorf("schedule health reads: %w", err)
	}
	return nil
}

// HealthRead is a claimed health read (ClaimHealthReads). Finish it with RecordHealthRead,
// SkipHealthRead or FailHealthRead.
type HealthRead struct {
	ChannelID     uuid.UUID
	OrgID         uuid.UUID
	PhoneNumberID string
	// UpstreamToken is the channel's upstream access token (decrypted).
	UpstreamToken string
	// Readable: the channel is active, connected and its token is not known dead; otherwise
	// the read is skipped (SkipHealthRead).
	Readable bool
	// Upstream is the account webhook change that prompted the read ({"field", "value"},
	// verbatim), nil when none did (a connect, a periodic read).
	Upstream json.RawMessage

	claimedAt time.Time
	lease     time.Duration
}

// ClaimHealthReads claims up to n channels whose health read is due, with FOR UPDATE SKIP
// LOCKED: the due times of each are moved lease ahead in the claim, so that no other instance
// reads the channel meanwhile, and a claim whose instance died is read again after lease.
func (s *Store) ClaimHealthReads(ctx context.Context, n int, lease time.Duration) ([]HealthRead, error) {
	rows, err := s.pool.Query(ctx, `
		WITH due AS (
			SELECT channel_id FROM channel_health
			WHERE due_at <= coalesce($1::timestamptz, now())
			ORDER BY due_at LIMIT $2 FOR UPDATE SKIP LOCKED)
		UPDATE channel_health h SET claimed_at = coalesce($1::timestamptz, now()), claimed_seq = h.prompt_seq,
			prompt_due_at = CASE WHEN h.prompt_due_at <= coalesce($1::timestamptz, now()) THEN coalesce($1::timestamptz, now()) + $3::interval ELSE h.prompt_due_at END,
			refresh_due_at = CASE WHEN h.refresh_due_at <= coalesce($1::timestamptz, now()) THEN coalesce($1::timestamptz, now()) + $3::interval ELSE h.refresh_due_at END
		FROM due JOIN channels c ON c.id = due.channel_id
		WHERE h.channel_id = due.channel_id
		RETURNING h.channel_id, c.org_id, c.phone_number_id, c.status = 'active' AND c.upstream_disconnected_at IS NULL,
			c.upstream_token_enc, h.prompt_upstream::text, h.claimed_at`, s.nowArg(), n, lease)
	if err != nil {
		return nil, fmt.Errorf("claim health reads: %w", err)
	}
	reads, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (HealthRead, error) {
		var h HealthRead
		var pnid, upstream *string
		var tokenEnc []byte
		if err := r.Scan(&h.ChannelID, &h.OrgID, &pnid, &h.Readable, &tokenEnc, &upstream, &h.claimedAt); err != nil {
			return h, err
		}
		if pnid != nil {
			h.PhoneNumberID = *pnid
		}
		if upstream != nil {
			h.Upstream = json.RawMessage(*upstream)
		}
		h.lease = lease
		h.Readable = h.Readable && pnid != nil && tokenEnc != nil
		if h.Readable {
			token, err := s.box.OpenString(tokenEnc, upstreamTokenAAD(h.ChannelID))
			if err != nil {
				return h, fmt.Errorf("channel %s: decrypt upstream token: %w", h.ChannelID, err)
			}
			h.UpstreamToken = token
		}
		return h, nil
	})
	if err != nil {
		return nil, fmt.Errorf("claim health reads: %w", err)
	}
	return reads, nil
}

// settledSchedule is the SET list that ends a read (RecordHealthRead, SkipHealthRead): the prompt is
// done unless another one landed after the claim (then a read falls due HealthPromptDelay from
// now), and the periodic read moves to the row's next phase ($2: now, $3: refresh seconds, $4:
// the delay).
var settledSchedule = `claimed_at = NULL, failures = 0,
	prompt_due_at = CASE WHEN prompt_seq > claimed_seq THEN coalesce($2::timestamptz, now()) + $4::interval END,
	prompt_upstream = CASE WHEN prompt_seq > claimed_seq THEN prompt_upstream END,
	refresh_due_at = ` + nextRefresh("coalesce($2::timestamptz, now())", "$3::float8")

// HealthReadOutcome is what RecordHealthRead did.
type HealthReadOutcome struct {
	// Health and Previous are the channel's health after and before the read.
	Health, Previous ChannelHealth
	// Changed lists the fields whose known value changed (a channel_health event was stored).
	Changed []string
	// Stale: the claim had been taken over (its lease ran out); nothing was written.
	Stale bool
}

// ChannelHealthData is the data of a channel_health event (keys in this order).
type ChannelHealthData struct {
	Health   ChannelHealth   `json:"health"`
	Previous ChannelHealth   `json:"previous"`
	Changed  []string        `json:"changed"`
	Upstream json.RawMessage `json:"upstream"`
}

// RecordHealthRead stores what the upstream answered for a claimed read (got: nil fields the answer
// lacked, which keep their known values), with checked_at now, and schedules the next reads
// (refresh: the periodic interval, 0 off). When a known value changed, one channel_health event
// for the webhooks that cover the channel and subscribe to the kind, and a row of the history,
// are stored in the same transaction.
func (s *Store) RecordHealthRead(ctx context.Context, r HealthRead, got ChannelHealth, refresh time.Duration) (HealthReadOutcome, error) {
	var out HealthReadOutcome
	err := s.changeChannels(ctx, func(tx pgx.Tx) error {
		out = HealthReadOutcome{}
		var claimedAt *time.Time
		var raw []byte
		err := tx.QueryRow(ctx, `
			SELECT json_build_array(quality_rating, messaging_limit, throughput, name_status, checked_at), claimed_at
			FROM channel_health WHERE channel_id = $1 FOR UPDATE`, r.ChannelID).Scan(&raw, &claimedAt)
		if errors.Is(err, pgx.ErrNoRows) || err == nil && (claimedAt == nil || !claimedAt.Equal(r.claimedAt)) {
			out.Stale = true // the channel is gone, or another claim owns the read now
			return nil
		}
		if err != nil {
			return err
		}
		if out.Previous, err = scanHealth(raw); err != nil {
			return err
		}
		now := s.now().UTC().Truncate(time.Microsecond)
		out.Health, out.Changed = mergeHealth(out.Previous, got)
		out.Health.CheckedAt = &now
		h := out.Health
		if _, err := tx.Exec(ctx, `
			UPDATE channel_health SET quality_rating = $5, messaging_limit = $6, throughput = $7, name_status = $8,
				checked_at = $9, `+settledSchedule+`
			WHERE channel_id = $1`, r.ChannelID, s.nowArg(), seconds(refresh), HealthPromptDelay,
			h.QualityRating, h.MessagingLimit, h.Throughput, h.NameStatus, now); err != nil {
			return err
		}
		if len(out.Changed) == 0 {
			return nil
		}
		return s.recordHealthChange(ctx, tx, r, ChannelHealthData{Health: out.Health, Previous: out.Previous, Changed: out.Changed, Upstream: r.Upstream})
	})
	if err != nil {
		return HealthReadOutcome{}, fmt.Errorf("record health: %w", err)
	}
	return out, nil
}

// recordHealthChange stores, in tx, the history row and the channel_health event of a change.
func (s *Store) recordHealthChange(ctx context.Context, tx pgx.Tx, r HealthRead, d ChannelHealthData) error {
	health, _ := json.Marshal(d.Health)
	previous, _ := json.Marshal(d.Previous)
	changed, _ := json.Marshal(d.Changed)
	up := []byte("null")
	if d.Upstream != nil {
		up = d.Upstream
	}
	// built by hand: json.Marshal would compact the upstream's value, which is kept verbatim
	data := make([]byte, 0, 64+len(health)+len(previous)+len(changed)+len(up))
	data = append(append(append(data, `{"health":`...), health...), `,"previous":`...)
	data = append(append(append(data, previous...), `,"changed":`...), changed...)
	data = append(append(append(data, `,"upstream":`...), up...), '}')
	var upstream *string
	if d.Upstream != nil {
		u := string(d.Upstream)
		upstream = &u
	}
	now := s.now().UTC()
	if _, err := tx.Exec(ctx, `
		INSERT INTO channel_health_changes (id, channel_id, at, changed, health, previous, upstream)
		VALUES ($1, $2, $3, $4, $5::json, $6::json, $7::json)`,
		newID(), r.ChannelID, now, d.Changed, string(health), string(previous), upstream); err != nil {
		return err
	}
	in := inboundBatch{now: now, lookback: day(now)} // keys are new: no look-up in earlier days
	id := newID()
	pn, _ := json.Marshal(r.PhoneNumberID)
	in.ids, in.chIDs, in.orgIDs = []uuid.UUID{id}, []uuid.UUID{r.ChannelID}, []uuid.UUID{r.OrgID}
	in.types, in.keys = []string{EventChannelHealth}, []string{"h:" + id.String()}
	// the channel's own conversation, as its channel_status events
	in.convs = []int64{ConversationKey(r.PhoneNumberID, "")}
	in.payloads = [][]byte{encodeEvent(id, EventChannelHealth, now.Format(eventTimeFormat), r.ChannelID, pn, data)}
	var res InboundResult
	res.ByType = map[string]int{}
	if err := in.store(ctx, tx, &res); err != nil {
		return fmt.Errorf("channel health event: %w", err)
	}
	return nil
}

// SkipHealthRead ends a claimed read that was not made (the channel is not readable) or that met a
// dead token (the caller records that with MarkUpstreamDisconnected): nothing is stored, the
// prompt is done and the periodic read moves to its next phase.
func (s *Store) SkipHealthRead(ctx context.Context, r HealthRead, refresh time.Duration) error {
	_, err := s.pool.Exec(ctx, `UPDATE channel_health SET `+settledSchedule+` WHERE channel_id = $1 AND claimed_at = $5`,
		r.ChannelID, s.nowArg(), seconds(refresh), HealthPromptDelay, r.claimedAt)
	if err != nil {
		return fmt.Errorf("skip health read: %w", err)
	}
	return nil
}

// Back-off of failed health reads: a minute, doubling with each failure in a row, at most an
// hour.
const (
	healthRetryFirst = time.Minute
	healthRetryMax   = time.Hour
)

// HealthRetryDelay is how long after its failures-th failure in a row (1, 2, …) a read is
// tried again.
func HealthRetryDelay(failures int) time.Duration {
	d := healthRetryFirst
	for i := 1; i < failures && d < healthRetryMax; i++ {
		d *= 2
	}
	return min(d, healthRetryMax)
}

// FailHealthRead ends a claimed read that failed (the upstream did not answer, or answered an error
// other than a dead token): what was due at the claim is tried again after the back-off
// (HealthRetryDelay); a prompt or periodic read due later keeps its time.
func (s *Store) FailHealthRead(ctx context.Context, r HealthRead) error {
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var failures int
		err := tx.QueryRow(ctx, `UPDATE channel_health SET failures = failures + 1 WHERE channel_id = $1 AND claimed_at = $2 RETURNING failures`,
			r.ChannelID, r.claimedAt).Scan(&failures)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // gone, or taken over
		}
		if err != nil {
			return err
		}
		// what was due at the claim was moved to claimed_at + lease there: it moves to the retry
		retry, claimed := `coalesce($2::timestamptz, now()) + $3::interval`, `$4::timestamptz + $5::interval`
		_, err = tx.Exec(ctx, `UPDATE channel_health SET claimed_at = NULL,
			prompt_due_at = CASE WHEN prompt_due_at = `+claimed+` THEN `+retry+` ELSE prompt_due_at END,
			refresh_due_at = CASE WHEN refresh_due_at = `+claimed+` THEN `+retry+` ELSE refresh_due_at END
			WHERE channel_id = $1`, r.ChannelID, s.nowArg(), HealthRetryDelay(failures), r.claimedAt, r.lease)
		return err
	})
	if err != nil {
		return fmt.Errorf("fail health read: %w", err)
	}
	return nil
}

// HealthChange is one change of a channel's health (the history the dashboard shows).
type HealthChange struct {
	At       time.Time
	Changed  []string
	Health   ChannelHealth
	Previous ChannelHealth
	// Upstream is the account webhook change that prompted the read, nil for none.
	Upstream json.RawMessage
}

// ChannelHealthChanges returns the latest limit changes of one of the org's channels' health,
// newest first, or ErrChannelNotFound.
func (s *Store) ChannelHealthChanges(ctx context.Context, orgID, channelID uuid.UUID, limit int) ([]HealthChange, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT x.at, x.changed, x.health::text, x.previous::text, x.upstream::text
		FROM channels c JOIN channel_health_changes x ON x.channel_id = c.id
		WHERE c.id = $1 AND c.org_id = $2
		ORDER BY x.at DESC, x.id DESC LIMIT $3`, channelID, orgID, limit)
	if err != nil {
		return nil, fmt.Errorf("channel health changes: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (HealthChange, error) {
		var c HealthChange
		var health, previous string
		var upstream *string
		if err := r.Scan(&c.At, &c.Changed, &health, &previous, &upstream); err != nil {
			return c, err
		}
		if err := json.Unmarshal([]byte(health), &c.Health); err != nil {
			return c, err
		}
		if err := json.Unmarshal([]byte(previous), &c.Previous); err != nil {
			return c, err
		}
		if upstream != nil {
			c.Upstream = json.RawMessage(*upstream)
		}
		return c, nil
	})
	if err != nil {
		return nil, fmt.Errorf("channel health changes: %w", err)
	}
	if len(out) == 0 {
		// none, or no such channel of the org
		var exists bool
		if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM channels WHERE id = $1 AND org_id = $2)`, channelID, orgID).Scan(&exists); err != nil {
			return nil, fmt.Errorf("channel health changes: %w", err)
		}
		if !exists {
			return nil, ErrChannelNotFound
		}
	}
	return out, nil
}

// PruneHealthChanges deletes the history of health changes older than cutoff (the retention);
// it returns how many rows it deleted.
func (s *Store) PruneHealthChanges(ctx context.Context, cutoff time.Time) (int64, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM channel_health_changes WHERE at < $1`, cutoff)
	if err != nil {
		return 0, fmt.Errorf("prune health changes: %w", err)
	}
	return tag.RowsAffected(), nil
}

// ChannelsByQuality counts the active channels by their known quality rating (the metric
// caddy_wabarelay_channels_by_quality); channels whose rating is unknown are not counted.
func (s *Store) ChannelsByQuality(ctx context.Context) (map[string]int, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT h.quality_rating, count(*) FROM channel_health h JOIN channels c ON c.id = h.channel_id
		WHERE c.status = 'active' AND h.quality_rating IS NOT NULL GROUP BY h.quality_rating`)
	if err != nil {
		return nil, fmt.Errorf("channels by quality: %w", err)
	}
	out := map[string]int{}
	var q string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&q, &n}, func() error { out[q] = n; return nil })
	if err != nil {
		return nil, fmt.Errorf("channels by quality: %w", err)
	}
	return out, nil
}
