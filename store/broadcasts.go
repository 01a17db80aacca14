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

// BroadcastSend is one claimed send of a broadcast: its recipient is 'sending' under a lease,
// committed before the claim returned, so the send is made at most once.
type BroadcastSend struct {
	BroadcastID, OrgID, ChannelID uuid.UUID
	// Seq is the recipient's position; Attempt its attempts with this one (the outcome applies
	// only to this attempt).
	Seq, Attempt int
	To           string
	// Body is the JSON of the template message to POST to the channel's /messages.
	Body []byte
	// NextSendAt is the broadcast's pace gate after this send: its next send is not before.
	NextSendAt time.Time
}

// Outcome kinds of a broadcast send (BroadcastOutcome.Kind).
const (
	// OutcomeAccepted: the upstream accepted the message (WAMID; At: the call's start).
	OutcomeAccepted = "accepted"
	// OutcomeRetry: a retryable error (130429, 131056, 5xx, a network error before sending):
	// queued again at RetryAt, or failed with ErrorCode/ErrorTitle when this was the
	// MaxBroadcastAttempts-th attempt or the retry would be later than BroadcastRetryFor after
	// the first.
	OutcomeRetry = "retry"
	// OutcomeFailed: the upstream refused the message (ErrorCode, ErrorTitle).
	OutcomeFailed = "failed"
	// OutcomeUnknown: the send may have been made (timeout, cut answer): never sent again.
	OutcomeUnknown = "unknown"
	// OutcomeRequeue: not sent (the shared limit was full): queued again at RetryAt, the
	// attempt not counted.
	OutcomeRequeue = "requeue"
	// OutcomeDisconnected: the upstream rejected the channel's token: the recipient queued
	// again (attempt not counted) and the broadcast paused, upstream_disconnected.
	OutcomeDisconnected = "disconnected"
	// OutcomeCancel: the channel is not active: the broadcast is cancelled, this recipient
	// with its other unsent ones (attempt not counted).
	OutcomeCancel = "cancel"
)

// Retry bounds of a broadcast recipient (DESIGN §5c: at most 6 attempts within 24 h).
const (
	MaxBroadcastAttempts = 6
	BroadcastRetryFor    = 24 * time.Hour
)

// BroadcastOutcome is what became of a claimed send.
type BroadcastOutcome struct {
	Kind       string
	WAMID      string
	At         time.Time // accepted: the relay call's start (zero: now)
	RetryAt    time.Time // retry, requeue, disconnected: when the recipient is due again (zero: now)
	ErrorCode  int
	ErrorTitle string
}

// ClaimBroadcastSend claims the next send of a due broadcast, in one transaction: the
// broadcast whose pace gate (next_send_at) has come, locked (FOR UPDATE SKIP LOCKED: the row
// lock serialises the gate across instances), its gate moved on by 60 s / rate (from now if it
// fell behind by more than that, so a backlog never bursts), and its first due queued
// recipient written 'sending' with attempts + 1 and a lease of lease. A due broadcast with no
// due recipient is completed when none is queued or sending, else its gate is moved to its
// next due recipient (or lease end), and the next due broadcast is tried. A scheduled
// broadcast starts sending at its start.
//
// With no send due, send is nil and wake is the earliest gate of the broadcasts that may send
// (zero: none); a wake not after now means another claimer holds a due broadcast: claim again
// shortly.
func (s *Store) ClaimBroadcastSend(ctx context.Context, lease time.Duration) (send *BroadcastSend, wake time.Time, err error) {
	// Each round that sends nothing completes or defers a due broadcast: bounded by the number
	// of due broadcasts, and by this in case of a bug.
	for range 100 {
		var more bool
		err := s.inTx(ctx, func(tx pgx.Tx) error {
			send, more = nil, false
			var err error
			send, more, err = s.claimBroadcastSend(ctx, tx, lease)
			return err
		})
		if err != nil {
			return nil, time.Time{}, fmt.Errorf("claim broadcast send: %w", err)
		}
		if send != nil {
			return send, time.Time{}, nil
		}
		if !more {
			break
		}
	}
	var w *time.Time
	if err := s.pool.QueryRow(ctx, `SELECT min(next_send_at) FROM broadcasts WHERE status IN ('scheduled', 'sending')`).Scan(&w); err != nil {
		return nil, time.Time{}, fmt.Errorf("claim broadcast send: wake: %w", err)
	}
	if w != nil {
		wake = *w
	}
	return nil, wake, nil
}

// claimBroadcastSend is one round of ClaimBroadcastSend in tx: a send, or none and whether
// a broadcast was completed or deferred (another may be due).
func (s *Store) claimBroadcastSend(ctx context.Context, tx pgx.Tx, lease time.Duration) (*BroadcastSend, bool, error) {
	now := s.nowArg()
	send := &BroadcastSend{}
	var template []byte
	err := tx.QueryRow(ctx, `
		SELECT id, org_id, channel_id, template FROM broadcasts
		WHERE status IN ('scheduled', 'sending') AND next_send_at <= `+nowSQL(1)+`
		ORDER BY next_send_at LIMIT 1 FOR UPDATE SKIP LOCKED`, now).Scan(&send.BroadcastID, &send.OrgID, &send.ChannelID, &template)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	// The broadcast row is locked: no other claimer takes its recipients (a claim locks the
	// broadcast first), so the recipient's lock is taken without contention.
	var components []byte
	err = tx.QueryRow(ctx, `
		WITH r AS (
			SELECT broadcast_id, seq FROM broadcast_recipients
			WHERE broadcast_id = $1 AND status = 'queued' AND next_attempt_at <= `+nowSQL(2)+`
			ORDER BY next_attempt_at, seq LIMIT 1 FOR UPDATE SKIP LOCKED
		)
		UPDATE broadcast_recipients x SET status = 'sending', attempts = x.attempts + 1,
			locked_until = `+nowSQL(2)+` + $3 * interval '1 microsecond',
			first_attempt_at = coalesce(x.first_attempt_at, `+nowSQL(2)+`)
		FROM r WHERE x.broadcast_id = r.broadcast_id AND x.seq = r.seq
		RETURNING x.seq, x.attempts, x.wa_to, x.components`, send.BroadcastID, now, lease.Microseconds()).
		Scan(&send.Seq, &send.Attempt, &send.To, &components)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, true, s.deferBroadcast(ctx, tx, send.BroadcastID)
	}
	if err != nil {
		return nil, false, err
	}
	if err := tx.QueryRow(ctx, `
		UPDATE broadcasts SET status = 'sending',
			next_send_at = CASE WHEN next_send_at < `+nowSQL(2)+` - interval '60 seconds' / rate_per_minute THEN `+nowSQL(2)+`
			                    ELSE next_send_at END + interval '60 seconds' / rate_per_minute
		WHERE id = $1 RETURNING next_send_at`, send.BroadcastID, now).Scan(&send.NextSendAt); err != nil {
		return nil, false, err
	}
	if send.Body, err = broadcastBody(send.To, template, components); err != nil {
		return nil, false, fmt.Errorf("broadcast %s recipient %d: %w", send.BroadcastID, send.Seq, err)
	}
	return send, false, nil
}

// inFlightRecheck is how soon a due broadcast whose only unsettled recipients are being sent is
// looked at again: their outcomes (usually within a second) may complete it. Its gate used to
// wait for their leases to end (2 min): a broadcast whose last send had landed stayed "sending"
// that long (seen in a loaded CI run).
const inFlightRecheck = time.Second

// deferBroadcast handles a due broadcast (locked) with no due recipient: its expired leases
// end (unknown, as ExpireBroadcastLeases would), then it is completed when none of its
// recipients is queued or sending, else its gate waits for the first of its queued recipients
// to be due or of its leases to end, and at most inFlightRecheck while a send is in flight (an
// outcome's retry brings it back sooner: finishRequeued).
func (s *Store) deferBroadcast(ctx context.Context, tx pgx.Tx, id uuid.UUID) error {
	_, err := tx.Exec(ctx, `
		WITH x AS (
			UPDATE broadcast_recipients SET status = 'unknown', locked_until = NULL
			WHERE broadcast_id = $1 AND status = 'sending' AND locked_until < `+nowSQL(2)+`
		), w AS (
			SELECT (SELECT min(next_attempt_at) FROM broadcast_recipients WHERE broadcast_id = $1 AND status = 'queued') AS q,
			       (SELECT min(locked_until) FROM broadcast_recipients
			        WHERE broadcast_id = $1 AND status = 'sending' AND locked_until >= `+nowSQL(2)+`) AS l
		)
		UPDATE broadcasts b SET
			status = CASE WHEN w.q IS NULL AND w.l IS NULL THEN 'completed' ELSE b.status END,
			finished_at = CASE WHEN w.q IS NULL AND w.l IS NULL THEN `+nowSQL(2)+` END,
			next_send_at = greatest(b.next_send_at, least(w.q, w.l,
				CASE WHEN w.l IS NOT NULL THEN `+nowSQL(2)+` + $3 * interval '1 microsecond' END))
		FROM w WHERE b.id = $1`, id, s.nowArg(), inFlightRecheck.Microseconds())
	return err
}

// broadcastBody is the /messages JSON of a template message to to: the broadcast's template
// with the recipient's own components, if any, in place of the template's.
func broadcastBody(to string, template, components []byte) ([]byte, error) {
	if len(components) > 0 {
		var t map[string]json.RawMessage
		if err := json.Unmarshal(template, &t); err != nil {
			return nil, fmt.Errorf("template: %w", err)
		}
		t["components"] = components
		var err error
		if template, err = json.Marshal(t); err != nil {
			return nil, fmt.Errorf("template: %w", err)
		}
	}
	return json.Marshal(struct {
		MessagingProduct string          `json:"messaging_product"`
		RecipientType    string          `json:"recipient_type"`
		To               string          `json:"to"`
		Type             string          `json:"type"`
		Template         json.RawMessage `json:"template"`
	}{"whatsapp", "individual", to, "template", template})
}

// recipientOfSendSQL picks the recipient of a send (broadcast $1, seq $2) as long as it is
// still that attempt's ($3): 'sending', or 'unknown' when the lease ended before the outcome
// came (the outcome still lands: unknown is only never sent again).
const recipientOfSendSQL = `broadcast_id = $1 AND seq = $2 AND attempts = $3 AND status IN ('sending', 'unknown')`

// FinishBroadcastSend records the outcome of a claimed send (the outcome kinds above). An
// outcome for a recipient that is no longer at that attempt (already finished) changes
// nothing. An accepted send also gets its messages row, with the broadcast's id (the row its
// statuses then move); the relay log's settle gives it the relay call's time.
func (s *Store) FinishBroadcastSend(ctx context.Context, send *BroadcastSend, o BroadcastOutcome) error {
	var err error
	switch o.Kind {
	case OutcomeAccepted:
		if o.WAMID == "" {
			return fmt.Errorf("finish broadcast send: accepted without a wamid")
		}
		err = s.inTx(ctx, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, `
				UPDATE broadcast_recipients SET status = 'accepted', wamid = $4, locked_until = NULL,
					error_code = NULL, error_title = NULL
				WHERE `+recipientOfSendSQL, send.BroadcastID, send.Seq, send.Attempt, o.WAMID)
			if err != nil || tag.RowsAffected() == 0 {
				return err
			}
			// (relay_pending: the call's log row may not be written yet; SettleMessages gives
			// the row its time, as for a message whose status came first)
			_, err = tx.Exec(ctx, `
				INSERT INTO messages AS m (wamid, org_id, channel_id, recipient, created_at, status, status_rank, relay_pending, broadcast_id)
				VALUES ($1, $2, $3, $4, coalesce($5, `+nowSQL(6)+`), 'accepted', 0, true, $7)
				ON CONFLICT (wamid) DO UPDATE SET broadcast_id = excluded.broadcast_id
				WHERE m.channel_id = excluded.channel_id`,
				o.WAMID, send.OrgID, send.ChannelID, send.To, timeOrNil(o.At), s.nowArg(), send.BroadcastID)
			return err
		})
	case OutcomeFailed, OutcomeUnknown:
		_, err = s.pool.Exec(ctx, `
			UPDATE broadcast_recipients SET status = $4, locked_until = NULL,
				error_code = nullif($5, 0), error_title = nullif($6, '')
			WHERE `+recipientOfSendSQL, send.BroadcastID, send.Seq, send.Attempt, o.Kind, o.ErrorCode, o.ErrorTitle)
	case OutcomeRetry, OutcomeRequeue, OutcomeDisconnected, OutcomeCancel:
		err = s.inTx(ctx, func(tx pgx.Tx) error { return s.finishRequeued(ctx, tx, send, o) })
	default:
		return fmt.Errorf("finish broadcast send: unknown outcome %q", o.Kind)
	}
	if err != nil {
		return fmt.Errorf("finish broadcast send %s/%d: %s: %w", send.BroadcastID, send.Seq, o.Kind, err)
	}
	return nil
}

func timeOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// finishRequeued records an outcome that may put the recipient back in the queue, or change
// the broadcast (retry, requeue, disconnected, cancel). The broadcast is locked first, as a
// claim and a cancel lock it, so that a requeued recipient never lands in a broadcast that has
// completed or been cancelled meanwhile.
func (s *Store) finishRequeued(ctx context.Context, tx pgx.Tx, send *BroadcastSend, o BroadcastOutcome) error {
	now := s.nowArg()
	var bstatus string
	if err := tx.QueryRow(ctx, `SELECT status FROM broadcasts WHERE id = $1 FOR UPDATE`, send.BroadcastID).Scan(&bstatus); err != nil {
		return err
	}
	var first *time.Time
	err := tx.QueryRow(ctx, `SELECT first_attempt_at FROM broadcast_recipients WHERE `+recipientOfSendSQL+` FOR UPDATE`,
		send.BroadcastID, send.Seq, send.Attempt).Scan(&first)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // no longer this attempt
	}
	if err != nil {
		return err
	}
	at := s.now()
	retryAt := o.RetryAt
	if retryAt.IsZero() || retryAt.Before(at) {
		retryAt = at
	}
	// What becomes of the recipient: status, whether the attempt counts.
	status, counted := RecipientQueued, true
	switch o.Kind {
	case OutcomeRetry:
		if send.Attempt >= MaxBroadcastAttempts || first != nil && retryAt.After(first.Add(BroadcastRetryFor)) {
			status = RecipientFailed
		} else if bstatus == BroadcastCompleted {
			// an outcome after the lease's end, of a broadcast that finished meanwhile: the
			// recipient is not sent again (completion is final)
			status = RecipientFailed
		}
	case OutcomeRequeue, OutcomeDisconnected:
		counted = false
		if bstatus == BroadcastCompleted {
			status = RecipientUnknown // (as the lease's end left it: nothing known more)
		}
	case OutcomeCancel:
		status, counted = RecipientCancelled, false
	}
	if status == RecipientQueued && bstatus == BroadcastCancelled {
		status = RecipientCancelled
	}
	if _, err := tx.Exec(ctx, `
		UPDATE broadcast_recipients SET status = $4, locked_until = NULL, next_attempt_at = $5,
			attempts = attempts - CASE WHEN $6 THEN 0 ELSE 1 END,
			first_attempt_at = CASE WHEN $6 OR attempts > 1 THEN first_attempt_at END,
			error_code = coalesce(nullif($7, 0), error_code), error_title = coalesce(nullif($8, ''), error_title)
		WHERE `+recipientOfSendSQL, send.BroadcastID, send.Seq, send.Attempt, status, retryAt, counted, o.ErrorCode, o.ErrorTitle); err != nil {
		return err
	}
	switch {
	case o.Kind == OutcomeCancel:
		if bstatus == BroadcastScheduled || bstatus == BroadcastSending || bstatus == BroadcastPaused {
			_, err = tx.Exec(ctx, cancelBroadcastsSQL+` WHERE id = $1 RETURNING id) `+cancelRecipientsSQL, send.BroadcastID, now)
		}
	case o.Kind == OutcomeDisconnected:
		if bstatus == BroadcastScheduled || bstatus == BroadcastSending {
			_, err = tx.Exec(ctx, `UPDATE broadcasts SET status = 'paused', paused_reason = 'upstream_disconnected' WHERE id = $1`, send.BroadcastID)
		}
	case status == RecipientQueued:
		// A broadcast deferred to a later time (deferBroadcast) comes back for the requeued
		// recipient; one on its pace keeps it: a gate the pace set is at most one interval
		// after its last claim, so never later than now plus an interval.
		_, err = tx.Exec(ctx, `
			UPDATE broadcasts SET next_send_at = least(next_send_at, greatest($2, `+nowSQL(3)+` + interval '60 seconds' / rate_per_minute))
			WHERE id = $1 AND status IN ('scheduled', 'sending')`, send.BroadcastID, retryAt, now)
	}
	return err
}

// ExpireBroadcastLeases ends the leases of the sends that outlived them without an outcome:
// those recipients become 'unknown' (the send may have been made), never claimed again. An
// outcome that comes later still lands (FinishBroadcastSend). It returns the number ended.
func (s *Store) ExpireBroadcastLeases(ctx context.Context) (int64, error) {
	tag, err := s.pool.Exec(ctx, `
		UPDATE broadcast_recipients SET status = 'unknown', locked_until = NULL
		WHERE status = 'sending' AND locked_until < `+nowSQL(1), s.nowArg())
	if err != nil {
		return 0, fmt.Errorf("expire broadcast leases: %w", err)
	}
	return tag.RowsAffected(), nil
}
