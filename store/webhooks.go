package store

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Webhook statuses, scopes and event kinds.
const (
	WebhookActive = "active"
	WebhookPaused = "paused"

	ScopeOrg      = "org"
	ScopeChannels = "channels"

	EventMessages      = "messages"
	EventMessageStatus = "message_status"
	// EventChannelStatus announces a change of a channel's state (store/channelevents.go).
	EventChannelStatus = "channel_status"
	// EventTemplateStatus is the upstream's template status change, one event per channel of
	// the business account.
	EventTemplateStatus = "message_template_status_update"
)

// EventKinds are the event kinds a webhook may subscribe to, in the order the API names them.
var EventKinds = []string{EventMessages, EventMessageStatus, EventChannelStatus, EventTemplateStatus, EventChannelHealth}

// SecretPrefix starts every webhook signing secret.
const SecretPrefix = "whsec_"

// Webhook is a webhook configuration. ChannelIDs is empty (not nil) for org scope.
type Webhook struct {
	ID         uuid.UUID
	OrgID      uuid.UUID
	Name       string
	URL        string
	Events     []string
	Status     string
	Scope      string
	ChannelIDs []uuid.UUID
	CreatedAt  time.Time
	// Ordering is OrderingNone or OrderingConversation.
	Ordering string
	// Health is the receiver's health (store/health.go); PausedReason is PausedFailing for a
	// webhook paused automatically, nil otherwise.
	Health       WebhookHealth
	PausedReason *string
	// PreviousSecretExpiresAt is when the secret replaced by the last rotation stops signing
	// deliveries (RotateWebhookSecret); nil when there is none or its grace is over.
	PreviousSecretExpiresAt *time.Time
}

// NewWebhook is the input of CreateWebhook. An empty ChannelIDs means org scope.
type NewWebhook struct {
	Name       string
	URL        string
	Events     []string
	ChannelIDs []uuid.UUID
	// MaxPerOrg, when positive, is the most webhooks the org may have: when it has that many
	// already, nothing is created and CreateWebhook returns ErrWebhookLimit. 0 means no cap.
	MaxPerOrg int
	// Ordering is OrderingNone (also when empty) or OrderingConversation.
	Ordering string
}

// ErrWebhookLimit is returned by CreateWebhook when the org already has NewWebhook.MaxPerOrg
// webhooks.
var ErrWebhookLimit = errors.New("webhook limit reached")

// lockOrg takes org's row lock for a capped creation, so that the count and the insert that
// follow cannot interleave with another capped creation for the org: concurrent creations queue
// on the lock and each counts what the one before it committed (read committed takes a new
// snapshot per statement). FOR NO KEY UPDATE does not conflict with the FOR KEY SHARE locks that
// foreign keys take, so inserts that reference the org elsewhere (channels, deliveries) are
// not held up. An unknown org gives ErrOrgNotFound.
func lockOrg(ctx context.Context, tx pgx.Tx, orgID uuid.UUID) error {
	var one int
	err := tx.QueryRow(ctx, `SELECT 1 FROM orgs WHERE id = $1 FOR NO KEY UPDATE`, orgID).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrOrgNotFound
	}
	return err
}

// NewWebhookSecret returns a fresh signing secret: "whsec_" + base64 of 32 random bytes.
func NewWebhookSecret() string {
	return SecretPrefix + base64.StdEncoding.EncodeToString(randomBytes(32))
}

func webhookSecretAAD(id uuid.UUID) string { return "webhooks.secret:" + id.String() }

// webhookColumns returns the columns scanWebhook reads from a webhook row w. now is the number
// of the statement's parameter that holds the store's time (nowArg): a rotation's grace shows
// while it ends after that time. The channel ids come from webhook_channels, keeping only
// channels that still exist.
func webhookColumns(now int) string {
	return `w.id, w.org_id, w.name, w.url, w.events, w.status, w.scope, w.created_at,
	COALESCE((SELECT array_agg(wc.channel_id ORDER BY wc.created_at, wc.channel_id)
	          FROM webhook_channels wc WHERE wc.webhook_id = w.id), '{}'), w.ordering,
	CASE WHEN w.previous_secret_enc IS NOT NULL AND w.previous_secret_expires_at > ` + nowSQL(now) + `
	     THEN w.previous_secret_expires_at END,
	` + healthColumns
}

func scanWebhook(row pgx.Row) (Webhook, error) {
	var w Webhook
	var interval *int64
	err := row.Scan(append([]any{&w.ID, &w.OrgID, &w.Name, &w.URL, &w.Events, &w.Status, &w.Scope, &w.CreatedAt, &w.ChannelIDs, &w.Ordering,
		&w.PreviousSecretExpiresAt}, healthDest(&w, &interval)...)...)
	if interval != nil {
		w.Health.ProbeInterval = time.Duration(*interval) * time.Millisecond
	}
	if w.ChannelIDs == nil {
		w.ChannelIDs = []uuid.UUID{}
	}
	return w, err
}

// CreateWebhook creates a webhook config and returns it with its signing secret, which is
// stored encrypted and never returned again. Channel ids that are not channels of the org give
// ErrChannelsNotInOrg and nothing is created; so does reaching in.MaxPerOrg (ErrWebhookLimit),
// which holds under concurrent creations.
func (s *Store) CreateWebhook(ctx context.Context, orgID uuid.UUID, in NewWebhook) (Webhook, string, error) {
	id := newID()
	secret := NewWebhookSecret()
	scope := ScopeOrg
	if len(in.ChannelIDs) > 0 {
		scope = ScopeChannels
	}
	ordering := in.Ordering
	if ordering == "" {
		ordering = OrderingNone
	}
	var w Webhook
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		if in.MaxPerOrg > 0 {
			if err := lockOrg(ctx, tx, orgID); err != nil {
				return err
			}
			var n int
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM webhooks WHERE org_id = $1`, orgID).Scan(&n); err != nil {
				return err
			}
			if n >= in.MaxPerOrg {
				return ErrWebhookLimit
			}
		}
		if len(in.ChannelIDs) > 0 {
			var found int
			// FOR SHARE keeps the channels from being deleted before the assignment commits.
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM (SELECT id FROM channels WHERE org_id = $1 AND id = ANY($2) FOR SHARE) c`,
				orgID, in.ChannelIDs).Scan(&found); err != nil {
				return err
			}
			if found != len(in.ChannelIDs) {
				return ErrChannelsNotInOrg
			}
		}
		if _, err := tx.Exec(ctx, `
			INSERT INTO webhooks (id, org_id, name, url, events, status, scope, secret_enc, ordering)
			VALUES ($1, $2, $3, $4, $5, 'active', $6, $7, $8)`,
			id, orgID, in.Name, in.URL, in.Events, scope, s.box.SealString(secret, webhookSecretAAD(id)), ordering); err != nil {
			return err
		}
		if len(in.ChannelIDs) > 0 {
			if _, err := tx.Exec(ctx, `
				INSERT INTO webhook_channels (webhook_id, channel_id)
				SELECT $1, unnest($2::uuid[])`, id, in.ChannelIDs); err != nil {
				return err
			}
		}
		var err error
		w, err = scanWebhook(tx.QueryRow(ctx, `SELECT `+webhookColumns(2)+` FROM webhooks w WHERE w.id = $1`, id, s.nowArg()))
		return err
	})
	switch {
	case errors.Is(err, ErrChannelsNotInOrg), errors.Is(err, ErrWebhookLimit), errors.Is(err, ErrOrgNotFound):
		return Webhook{}, "", err
	case isForeignKeyViolation(err):
		return Webhook{}, "", ErrOrgNotFound
	case err != nil:
		return Webhook{}, "", fmt.Errorf("create webhook: %w", err)
	}
	return w, secret, nil
}

// ListWebhooks returns the org's webhooks ordered by (created_at, id).
func (s *Store) ListWebhooks(ctx context.Context, orgID uuid.UUID) ([]Webhook, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+webhookColumns(2)+` FROM webhooks w WHERE w.org_id = $1 ORDER BY w.created_at, w.id`,
		orgID, s.nowArg())
	if err != nil {
		return nil, fmt.Errorf("list webhooks: %w", err)
	}
	ws, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Webhook, error) { return scanWebhook(r) })
	if err != nil {
		return nil, fmt.Errorf("list webhooks: %w", err)
	}
	return ws, nil
}

// GetWebhook returns one of the org's webhooks, or ErrWebhookNotFound.
func (s *Store) GetWebhook(ctx context.Context, orgID, id uuid.UUID) (Webhook, error) {
	w, err := scanWebhook(s.pool.QueryRow(ctx, `SELECT `+webhookColumns(3)+` FROM webhooks w WHERE w.id = $1 AND w.org_id = $2`, id, orgID, s.nowArg()))
	if errors.Is(err, pgx.ErrNoRows) {
		return Webhook{}, ErrWebhookNotFound
	}
	if err != nil {
		return Webhook{}, fmt.Errorf("get webhook: %w", err)
	}
	return w, nil
}

// WebhookSecret returns the decrypted signing secret of a webhook (for the dispatcher).
func (s *Store) WebhookSecret(ctx context.Context, id uuid.UUID) (string, error) {
	var enc []byte
	err := s.pool.QueryRow(ctx, `SELECT secret_enc FROM webhooks WHERE id = $1`, id).Scan(&enc)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", ErrWebhookNotFound
	}
	if err != nil {
		return "", fmt.Errorf("webhook secret: %w", err)
	}
	secret, err := s.box.OpenString(enc, webhookSecretAAD(id))
	if err != nil {
		return "", fmt.Errorf("webhook %s: decrypt secret: %w", id, err)
	}
	return secret, nil
}

// SetWebhookStatus sets an org's webhook to active or paused and returns it. Its queued
// deliveries follow in the same transaction: pausing holds the pending ones (they leave the
// claims' index, their schedule waits), resuming makes the held ones pending again and wakes
// the dispatchers. Resuming also resets the webhook's health (ok, no failures counted) and
// clears paused_reason; a pause by its owner has no paused_reason.
func (s *Store) SetWebhookStatus(ctx context.Context, orgID, id uuid.UUID, status string) (Webhook, error) {
	var w Webhook
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var err error
		w, err = s.setWebhookStatus(ctx, tx, orgID, id, status)
		return err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return Webhook{}, ErrWebhookNotFound
	}
	if err != nil {
		return Webhook{}, fmt.Errorf("set webhook status: %w", err)
	}
	return w, nil
}

// setWebhookStatus is SetWebhookStatus in tx. The webhook's row is locked FOR UPDATE before it
// changes, so that a queue writer deciding between held and pending meanwhile waits for the
// commit and reads the new status (heldWhenPausedSQL); the queue rows waiting their turn then
// follow it: pending ones held on a pause, held ones pending (and the dispatchers notified) on a
// resume.
func (s *Store) setWebhookStatus(ctx context.Context, tx pgx.Tx, orgID, id uuid.UUID, status string) (Webhook, error) {
	if _, err := tx.Exec(ctx, `SELECT 1 FROM webhooks WHERE id = $1 AND org_id = $2 FOR UPDATE`, id, orgID); err != nil {
		return Webhook{}, err
	}
	w, err := scanWebhook(tx.QueryRow(ctx, `
		WITH u AS (UPDATE webhooks SET status = $3, updated_at = now(), paused_reason = NULL,`+resetHealth+`
		           WHERE id = $1 AND org_id = $2 RETURNING *)
		SELECT `+webhookColumns(4)+` FROM u w`, id, orgID, status, s.nowArg()))
	if err != nil {
		return Webhook{}, err
	}
	from, to := "pending", "held"
	if status == WebhookActive {
		from, to = to, from
	}
	tag, err := tx.Exec(ctx, `UPDATE delivery_queue SET status = $3 WHERE webhook_id = $1 AND status = $2`, id, from, to)
	if err == nil && to == "pending" && tag.RowsAffected() > 0 {
		err = notifyDeliveries(ctx, tx)
	}
	return w, err
}

// DeleteWebhook deletes one of the org's webhooks with its assignments. Its deliveries, queued
// or logged, and their attempts go with it, afterwards: the webhook is marked in
// deleted_webhooks in the same transaction and SweepDeletedWebhooks removes them in batches
// (the maintenance runs it), so that deleting a webhook with millions of deliveries does not
// hold the request. Meanwhile nothing reads them: claims, lists and metrics join webhooks. No
// foreign key does this (migrations 005, 006, 011); an inbound post that raced the delete and
// still queued a delivery for it leaves a queue row that DropOrphanedQueue removes.
func (s *Store) DeleteWebhook(ctx context.Context, orgID, id uuid.UUID) error {
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `DELETE FROM webhooks WHERE id = $1 AND org_id = $2`, id, orgID)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return ErrWebhookNotFound
		}
		_, err = tx.Exec(ctx, `INSERT INTO deleted_webhooks (id) VALUES ($1) ON CONFLICT DO NOTHING`, id)
		return err
	})
	if err != nil && !errors.Is(err, ErrWebhookNotFound) {
		return fmt.Errorf("delete webhook: %w", err)
	}
	return err
}

// SweepBatch is how many rows of one table SweepDeletedWebhooks removes per statement.
const SweepBatch = 10000

// SweepDeletedWebhooks removes the deliveries of deleted webhooks (see DeleteWebhook): queue
// rows, delivery log rows and their attempts, at most SweepBatch rows of a table per statement,
// each statement its own transaction, until none is left or ctx ends. A webhook with nothing
// left is unmarked. It returns the deliveries removed.
func (s *Store) SweepDeletedWebhooks(ctx context.Context) (int, error) {
	total := 0
	for ctx.Err() == nil {
		var ids []uuid.UUID
		rows, err := s.pool.Query(ctx, `SELECT id FROM deleted_webhooks ORDER BY deleted_at LIMIT 100`)
		if err == nil {
			ids, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		}
		if err != nil {
			return total, fmt.Errorf("sweep deleted webhooks: %w", err)
		}
		if len(ids) == 0 {
			return total, nil
		}
		for _, id := range ids {
			tag, err := s.pool.Exec(ctx, `DELETE FROM delivery_queue WHERE delivery_id IN (
				SELECT delivery_id FROM delivery_queue WHERE webhook_id = $1 LIMIT $2)`, id, SweepBatch)
			if err != nil {
				return total, fmt.Errorf("sweep deleted webhook's queue: %w", err)
			}
			var n int
			err = s.pool.QueryRow(ctx, `
				WITH d AS (
					DELETE FROM deliveries d USING (SELECT id, created_at FROM deliveries WHERE webhook_id = $1 LIMIT $2) x
					WHERE d.id = x.id AND d.created_at = x.created_at RETURNING d.id
				), a AS (
					DELETE FROM delivery_attempts a USING d WHERE a.delivery_id = d.id
				)
				SELECT count(*) FROM d`, id, SweepBatch).Scan(&n)
			if err != nil {
				return total, fmt.Errorf("sweep deleted webhook's deliveries: %w", err)
			}
			total += n
			if tag.RowsAffected() == 0 && n == 0 {
				if _, err := s.pool.Exec(ctx, `DELETE FROM deleted_webhooks WHERE id = $1`, id); err != nil {
					return total, fmt.Errorf("sweep deleted webhooks: %w", err)
				}
			}
		}
	}
	return total, ctx.Err()
}

// lockAssignmentPair locks the org's webhook and channel for an assignment change and returns
// the webhook's scope. The webhook is checked first: an unknown webhook is reported as such
// even when the channel is unknown too.
func lockAssignmentPair(ctx context.Context, tx pgx.Tx, orgID, webhookID, channelID uuid.UUID) (string, error) {
	var scope string
	err := tx.QueryRow(ctx, `SELECT scope FROM webhooks WHERE id = $1 AND org_id = $2 FOR UPDATE`, webhookID, orgID).Scan(&scope)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", ErrWebhookNotFound
	}
	if err != nil {
		return "", err
	}
	var one int
	err = tx.QueryRow(ctx, `SELECT 1 FROM channels WHERE id = $1 AND org_id = $2 FOR SHARE`, channelID, orgID).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", ErrChannelNotFound
	}
	return scope, err
}

// AssignChannel attaches a channel to a channels-scoped webhook. Repeats are no-ops, and so is
// any assignment on an org-scoped webhook (its scope already covers every channel).
func (s *Store) AssignChannel(ctx context.Context, orgID, webhookID, channelID uuid.UUID) error {
	return s.changeAssignment(ctx, orgID, webhookID, channelID,
		`INSERT INTO webhook_channels (webhook_id, channel_id) VALUES ($1, $2) ON CONFLICT DO NOTHING`)
}

// UnassignChannel detaches a channel from a webhook. Removing a channel that is not attached,
// or any removal on an org-scoped webhook, is a no-op. A channels-scoped webhook keeps its
// scope when its last channel is removed (it then receives nothing).
func (s *Store) UnassignChannel(ctx context.Context, orgID, webhookID, channelID uuid.UUID) error {
	return s.changeAssignment(ctx, orgID, webhookID, channelID,
		`DELETE FROM webhook_channels WHERE webhook_id = $1 AND channel_id = $2`)
}

func (s *Store) changeAssignment(ctx context.Context, orgID, webhookID, channelID uuid.UUID, stmt string) error {
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		scope, err := lockAssignmentPair(ctx, tx, orgID, webhookID, channelID)
		if err != nil || scope == ScopeOrg {
			return err
		}
		_, err = tx.Exec(ctx, stmt, webhookID, channelID)
		return err
	})
	if errors.Is(err, ErrWebhookNotFound) || errors.Is(err, ErrChannelNotFound) {
		return err
	}
	if err != nil {
		return fmt.Errorf("change webhook assignment: %w", err)
	}
	return nil
}
