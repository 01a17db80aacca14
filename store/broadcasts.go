package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Broadcast statuses (DESIGN §5c "Broadcasts").
const (
	BroadcastScheduled = "scheduled"
	BroadcastSending   = "sending"
	BroadcastPaused    = "paused"
	BroadcastCompleted = "completed"
	BroadcastCancelled = "cancelled"
)

// Why a broadcast is paused (Broadcast.PausedReason).
const (
	PausedOperator             = "operator"
	PausedUpstreamDisconnected = "upstream_disconnected"
)

// Stored statuses of a broadcast recipient. The API shows an accepted recipient with its
// message's status instead (accepted, sent, delivered, read, failed).
const (
	RecipientQueued    = "queued"
	RecipientSending   = "sending"
	RecipientAccepted  = "accepted"
	RecipientFailed    = "failed"
	RecipientUnknown   = "unknown"
	RecipientCancelled = "cancelled"
)

// Errors of the broadcast methods.
var (
	ErrBroadcastNotFound = errors.New("broadcast not found")
	ErrChannelNotActive  = errors.New("channel is not active")
)

// BroadcastStateError is returned when a broadcast's status does not allow the action asked
// (pause, resume, cancel). Status is the broadcast's current status.
type BroadcastStateError struct{ Status string }

func (e *BroadcastStateError) Error() string { return "broadcast is " + e.Status }

// Broadcast is a paced send of one template to a list of recipients.
type Broadcast struct {
	ID, OrgID, ChannelID uuid.UUID
	Name                 string
	// Template is {"name", "language": {"code"}, "components"?} as the caller gave it.
	Template      json.RawMessage
	Status        string
	PausedReason  string // "": none (not paused)
	CreatedAt     time.Time
	StartAt       time.Time
	RatePerMinute int
	Counts        BroadcastCounts
}

// BroadcastCounts are a broadcast's recipients by status, read when the broadcast is read:
// Queued counts those waiting or in flight; Accepted, Sent, Delivered and Read the accepted
// sends by their message's status (the webhooks' statuses move them); Failed the recipients
// that failed and the sends whose message failed; Unknown the sends whose outcome a crash hid.
// Cancelled recipients (the unsent of a cancelled broadcast) are counted in Total only.
type BroadcastCounts struct {
	Total, Queued, Accepted, Sent, Delivered, Read, Failed, Unknown int
}

// NewBroadcast is a broadcast to create. The caller validates it and deduplicates the
// recipients (keeping the first of each number).
type NewBroadcast struct {
	Name          string
	Template      json.RawMessage
	StartAt       time.Time
	RatePerMinute int
	Recipients    []NewRecipient
}

// NewRecipient is a recipient of a new broadcast: To is the number's digits; Components, if
// set, replace the template's components for this recipient.
type NewRecipient struct {
	To         string
	Components json.RawMessage
}

// BroadcastRecipient is a recipient as the API shows it: Status is the stored status, except
// that an accepted recipient has its message's status; ErrorCode and ErrorTitle are the
// recipient's failure or its message's.
type BroadcastRecipient struct {
	Seq        int
	To         string
	Status     string
	WAMID      string
	ErrorCode  int
	ErrorTitle string
	Attempts   int
}

// broadcastColumns are the columns scanBroadcast reads, with the counts (broadcastCountsSQL)
// of the broadcasts row b.
const broadcastColumns = `b.id, b.org_id, b.channel_id, b.name, b.template, b.status, coalesce(b.paused_reason, ''),
	b.created_at, b.start_at, b.rate_per_minute, b.total,
	rc.queued, rc.failed, rc.unknown, rc.unaccepted, mc.accepted, mc.sent, mc.delivered, mc.read, mc.failed`

// broadcastCountsSQL joins the counts of the broadcasts row b: the recipients that are not
// accepted, by stored status (an index-only scan of broadcast_recipients_status over those
// statuses, which are few once a broadcast has run), and the broadcast's messages by status
// (messages_broadcast). The accepted recipients are the total less the others, so that a
// message the retention deleted still counts as accepted.
const broadcastCountsSQL = `
	CROSS JOIN LATERAL (
		SELECT count(*) FILTER (WHERE r.status IN ('queued', 'sending')) AS queued,
		       count(*) FILTER (WHERE r.status = 'failed') AS failed,
		       count(*) FILTER (WHERE r.status = 'unknown') AS unknown,
		       count(*) AS unaccepted
		FROM broadcast_recipients r
		WHERE r.broadcast_id = b.id AND r.status IN ('queued', 'sending', 'failed', 'unknown', 'cancelled')
	) rc
	CROSS JOIN LATERAL (
		SELECT count(*) FILTER (WHERE m.status = 'accepted') AS accepted,
		       count(*) FILTER (WHERE m.status = 'sent') AS sent,
		       count(*) FILTER (WHERE m.status = 'delivered') AS delivered,
		       count(*) FILTER (WHERE m.status = 'read') AS read,
		       count(*) FILTER (WHERE m.status = 'failed') AS failed
		FROM messages m WHERE m.broadcast_id = b.id
	) mc`

func scanBroadcast(row pgx.Row) (Broadcast, error) {
	var b Broadcast
	var template []byte
	var unaccepted, msgAccepted, msgFailed int
	c := &b.Counts
	if err := row.Scan(&b.ID, &b.OrgID, &b.ChannelID, &b.Name, &template, &b.Status, &b.PausedReason,
		&b.CreatedAt, &b.StartAt, &b.RatePerMinute, &c.Total,
		&c.Queued, &c.Failed, &c.Unknown, &unaccepted, &msgAccepted, &c.Sent, &c.Delivered, &c.Read, &msgFailed); err != nil {
		return Broadcast{}, err
	}
	b.Template = template
	// The accepted recipients whose message moved on are counted by their message's status;
	// the rest (accepted, or their message gone) as accepted.
	c.Accepted = max(0, c.Total-unaccepted-c.Sent-c.Delivered-c.Read-msgFailed)
	c.Failed += msgFailed
	return b, nil
}

// CreateBroadcast creates a broadcast of one of the org's channels with its recipients, in
// one transaction (the recipients by COPY). The channel must be active and connected, with an
// upstream that has not rejected its token: else ErrChannelNotActive; another org's or no
// channel: ErrChannelNotFound. The broadcast is sending at once when StartAt is not in the
// future, else scheduled.
func (s *Store) CreateBroadcast(ctx context.Context, orgID, channelID uuid.UUID, nb NewBroadcast) (Broadcast, error) {
	id := newID()
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		// KEY SHARE: a DeleteChannel running at once (FOR UPDATE) waits for this broadcast to be
		// created and then cancels it, or goes first and this finds no channel.
		var usable bool
		if err := tx.QueryRow(ctx, `
			SELECT status = 'active' AND phone_number_id IS NOT NULL AND upstream_disconnected_at IS NULL
			FROM channels WHERE id = $1 AND org_id = $2 FOR KEY SHARE`, channelID, orgID).Scan(&usable); err != nil {
			return err
		}
		if !usable {
			return ErrChannelNotActive
		}
		if _, err := tx.Exec(ctx, `
			INSERT INTO broadcasts (id, org_id, channel_id, name, template, status, created_at, start_at, rate_per_minute, next_send_at, total)
			SELECT $1, $2, $3, $4, $5, CASE WHEN $6 > n THEN 'scheduled' ELSE 'sending' END, n, $6, $7, greatest($6, n), $8
			FROM (SELECT `+nowSQL(9)+` AS n) n`,
			id, orgID, channelID, nb.Name, []byte(nb.Template), nb.StartAt, nb.RatePerMinute, len(nb.Recipients), s.nowArg()); err != nil {
			return err
		}
		_, err := tx.CopyFrom(ctx, pgx.Identifier{"broadcast_recipients"},
			[]string{"broadcast_id", "seq", "wa_to", "components", "status", "next_attempt_at"},
			&recipientRows{id: id, list: nb.Recipients, at: nb.StartAt})
		return err
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Broadcast{}, ErrChannelNotFound
	case errors.Is(err, ErrChannelNotActive):
		return Broadcast{}, ErrChannelNotActive
	case err != nil:
		return Broadcast{}, fmt.Errorf("create broadcast: %w", err)
	}
	return s.GetBroadcast(ctx, orgID, id)
}

// recipientRows is a pgx.CopyFromSource of a new broadcast's recipients, queued at its start.
type recipientRows struct {
	id   uuid.UUID
	list []NewRecipient
	at   time.Time
	i    int
}

func (r *recipientRows) Next() bool { r.i++; return r.i <= len(r.list) }
func (r *recipientRows) Err() error { return nil }
func (r *recipientRows) Values() ([]any, error) {
	n := r.list[r.i-1]
	var comps any // nil: NULL
	if len(n.Components) > 0 {
		comps = []byte(n.Components)
	}
	return []any{r.id, r.i, n.To, comps, RecipientQueued, r.at}, nil
}

// GetBroadcast returns one of the org's broadcasts with its counts, or ErrBroadcastNotFound.
func (s *Store) GetBroadcast(ctx context.Context, orgID, id uuid.UUID) (Broadcast, error) {
	b, err := scanBroadcast(s.pool.QueryRow(ctx, `SELECT `+broadcastColumns+` FROM broadcasts b `+broadcastCountsSQL+`
		WHERE b.id = $1 AND b.org_id = $2`, id, orgID))
	if errors.Is(err, pgx.ErrNoRows) {
		return Broadcast{}, ErrBroadcastNotFound
	}
	if err != nil {
		return Broadcast{}, fmt.Errorf("get broadcast: %w", err)
	}
	return b, nil
}

// ListBroadcasts returns up to limit (≤ 0: all) of the broadcasts of one of the org's channels,
// newest first, with their counts; ErrChannelNotFound if the channel is not the org's.
func (s *Store) ListBroadcasts(ctx context.Context, orgID, channelID uuid.UUID, limit int) ([]Broadcast, error) {
	var lim *int // NULL: no limit
	if limit > 0 {
		lim = &limit
	}
	var found bool
	if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM channels WHERE id = $1 AND org_id = $2)`, channelID, orgID).Scan(&found); err != nil {
		return nil, fmt.Errorf("list broadcasts: %w", err)
	}
	if !found {
		return nil, ErrChannelNotFound
	}
	rows, err := s.pool.Query(ctx, `
		SELECT `+broadcastColumns+`
		FROM (SELECT * FROM broadcasts WHERE channel_id = $1 AND org_id = $2 ORDER BY created_at DESC, id DESC LIMIT $3) b
		`+broadcastCountsSQL+`
		ORDER BY b.created_at DESC, b.id DESC`, channelID, orgID, lim)
	if err != nil {
		return nil, fmt.Errorf("list broadcasts: %w", err)
	}
	bs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Broadcast, error) { return scanBroadcast(r) })
	if err != nil {
		return nil, fmt.Errorf("list broadcasts: %w", err)
	}
	return bs, nil
}

// recipientStatusSQL is the status the API shows of the recipient r, whose message (by its
// wamid) is m: the stored status, except the message's for an accepted recipient.
const recipientStatusSQL = `CASE WHEN r.status = 'accepted' THEN coalesce(m.status, 'accepted') ELSE r.status END`

// BroadcastRecipients returns up to limit recipients of one of the org's broadcasts after seq
// afterSeq (0: from the first), in list order, with the status the API shows
// (BroadcastRecipient); status, if not "", keeps only those shown with that status.
// ErrBroadcastNotFound if the broadcast is not the org's.
func (s *Store) BroadcastRecipients(ctx context.Context, orgID, id uuid.UUID, status string, afterSeq, limit int) ([]BroadcastRecipient, error) {
	var found bool
	if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM broadcasts WHERE id = $1 AND org_id = $2)`, id, orgID).Scan(&found); err != nil {
		return nil, fmt.Errorf("broadcast recipients: %w", err)
	}
	if !found {
		return nil, ErrBroadcastNotFound
	}
	// The stored statuses a shown status comes from: the page is read in seq order from
	// broadcast_recipients_status (or the primary key) up to its limit.
	var stored []string
	switch status {
	case "":
	case "accepted", "sent", "delivered", "read":
		stored = []string{RecipientAccepted}
	case "failed":
		stored = []string{RecipientFailed, RecipientAccepted}
	default:
		stored = []string{status}
	}
	rows, err := s.pool.Query(ctx, `
		SELECT r.seq, r.wa_to, `+recipientStatusSQL+`, coalesce(r.wamid, ''),
		       coalesce(r.error_code, m.error_code, 0), coalesce(r.error_title, m.error_title, ''), r.attempts
		FROM broadcast_recipients r
		LEFT JOIN messages m ON r.status = 'accepted' AND m.wamid = r.wamid
		WHERE r.broadcast_id = $1 AND r.seq > $2 AND ($3::text[] IS NULL OR r.status = ANY ($3))
		  AND ($4 = '' OR `+recipientStatusSQL+` = $4)
		ORDER BY r.seq LIMIT $5`, id, afterSeq, stored, status, limit)
	if err != nil {
		return nil, fmt.Errorf("broadcast recipients: %w", err)
	}
	rs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (BroadcastRecipient, error) {
		var r BroadcastRecipient
		err := row.Scan(&r.Seq, &r.To, &r.Status, &r.WAMID, &r.ErrorCode, &r.ErrorTitle, &r.Attempts)
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("broadcast recipients: %w", err)
	}
	return rs, nil
}

// PauseBroadcast pauses a scheduled or sending broadcast by operator action (paused_reason
// operator): no send is claimed for it until it is resumed. A send in flight finishes.
func (s *Store) PauseBroadcast(ctx context.Context, orgID, id uuid.UUID) (Broadcast, error) {
	return s.transitionBroadcast(ctx, orgID, id, "pause", []string{BroadcastScheduled, BroadcastSending},
		`UPDATE broadcasts SET status = 'paused', paused_reason = 'operator' WHERE id = $1`, id)
}

// ResumeBroadcast resumes a paused broadcast: scheduled again if its start is still ahead,
// else sending from now (its pace starts over).
func (s *Store) ResumeBroadcast(ctx context.Context, orgID, id uuid.UUID) (Broadcast, error) {
	return s.transitionBroadcast(ctx, orgID, id, "resume", []string{BroadcastPaused}, `
		UPDATE broadcasts SET paused_reason = NULL,
			status = CASE WHEN start_at > `+nowSQL(2)+` THEN 'scheduled' ELSE 'sending' END,
			next_send_at = greatest(start_at, `+nowSQL(2)+`)
		WHERE id = $1`, id, s.nowArg())
}

// CancelBroadcast cancels a scheduled, sending or paused broadcast: its queued recipients are
// cancelled (never sent); a send in flight finishes.
func (s *Store) CancelBroadcast(ctx context.Context, orgID, id uuid.UUID) (Broadcast, error) {
	return s.transitionBroadcast(ctx, orgID, id, "cancel", []string{BroadcastScheduled, BroadcastSending, BroadcastPaused},
		cancelBroadcastsSQL+` WHERE id = $1 RETURNING id) `+cancelRecipientsSQL, id, s.nowArg())
}

// cancelBroadcastsSQL and cancelRecipientsSQL cancel the broadcasts the condition appended
// to cancelBroadcastsSQL picks (with the time at $2) and their queued recipients, in one
// statement.
var (
	cancelBroadcastsSQL = `WITH c AS (UPDATE broadcasts SET status = 'cancelled', paused_reason = NULL,
		finished_at = ` + nowSQL(2) + `, next_send_at = ` + nowSQL(2)
	cancelRecipientsSQL = `UPDATE broadcast_recipients r SET status = 'cancelled'
		FROM c WHERE r.broadcast_id = c.id AND r.status = 'queued'`
)

// transitionBroadcast applies update (with args) to one of the org's broadcasts if its status is one of from, with the row locked; else
// *BroadcastStateError, or ErrBroadcastNotFound.
func (s *Store) transitionBroadcast(ctx context.Context, orgID, id uuid.UUID, action string, from []string, update string, args ...any) (Broadcast, error) {
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var status string
		if err := tx.QueryRow(ctx, `SELECT status FROM broadcasts WHERE id = $1 AND org_id = $2 FOR UPDATE`, id, orgID).Scan(&status); err != nil {
			return err
		}
		if !slices.Contains(from, status) {
			return &BroadcastStateError{Status: status}
		}
		_, err := tx.Exec(ctx, update, args...)
		return err
	})
	var state *BroadcastStateError
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Broadcast{}, ErrBroadcastNotFound
	case errors.As(err, &state):
		return Broadcast{}, state
	case err != nil:
		return Broadcast{}, fmt.Errorf("%s broadcast: %w", action, err)
	}
	return s.GetBroadcast(ctx, orgID, id)
}
