package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Bounds of a secret rotation's grace (RotateWebhookSecret): the API's "grace_seconds", the
// CLI's --grace and the dashboard's button all take these.
const (
	// DefaultSecretGrace is how long the replaced secret keeps signing unless told otherwise.
	DefaultSecretGrace = 24 * time.Hour
	// MaxSecretGrace is the longest grace a rotation may give.
	MaxSecretGrace = 7 * 24 * time.Hour
)

// ErrSecretGrace is returned by RotateWebhookSecret for a grace outside 0..MaxSecretGrace.
var ErrSecretGrace = errors.New("secret rotation grace out of range")

func webhookPreviousSecretAAD(id uuid.UUID) string { return "webhooks.previous_secret:" + id.String() }

// RotateWebhookSecret gives one of the org's webhooks a new signing secret and returns the
// webhook and the new secret (stored encrypted, never returned again). The secret it replaces
// keeps signing every attempt, beside the new one, for grace (0 to MaxSecretGrace; 0: not at
// all) from the store's time; a previous secret still in the grace of an earlier rotation ends
// at once. An unknown webhook, or another org's, gives ErrWebhookNotFound.
func (s *Store) RotateWebhookSecret(ctx context.Context, orgID, id uuid.UUID, grace time.Duration) (Webhook, string, error) {
	return s.rotateWebhookSecret(ctx, &orgID, id, grace)
}

// RotateAnyWebhookSecret is RotateWebhookSecret for the operator: the webhook of any org.
func (s *Store) RotateAnyWebhookSecret(ctx context.Context, id uuid.UUID, grace time.Duration) (Webhook, string, error) {
	return s.rotateWebhookSecret(ctx, nil, id, grace)
}

// rotateWebhookSecret rotates webhook id's secret; orgID, when not nil, must be its org.
func (s *Store) rotateWebhookSecret(ctx context.Context, orgID *uuid.UUID, id uuid.UUID, grace time.Duration) (Webhook, string, error) {
	if grace < 0 || grace > MaxSecretGrace {
		return Webhook{}, "", ErrSecretGrace
	}
	secret := NewWebhookSecret()
	var w Webhook
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var enc []byte
		err := tx.QueryRow(ctx, `SELECT secret_enc FROM webhooks WHERE id = $1 AND ($2::uuid IS NULL OR org_id = $2) FOR NO KEY UPDATE`,
			id, orgID).Scan(&enc)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrWebhookNotFound
		}
		if err != nil {
			return err
		}
		var prev []byte // NULL: no grace, the old secret is dropped
		if grace > 0 {
			old, err := s.box.OpenString(enc, webhookSecretAAD(id))
			if err != nil {
				return fmt.Errorf("decrypt current secret: %w", err)
			}
			prev = s.box.SealString(old, webhookPreviousSecretAAD(id))
		}
		w, err = scanWebhook(tx.QueryRow(ctx, `
			WITH u AS (
				UPDATE webhooks SET secret_enc = $2, previous_secret_enc = $3,
				       previous_secret_expires_at = coalesce($5::timestamptz, now()) + $4 * interval '1 microsecond', updated_at = now()
				WHERE id = $1 RETURNING *)
			SELECT `+webhookColumns(5)+` FROM u w`,
			id, s.box.SealString(secret, webhookSecretAAD(id)), prev, grace.Microseconds(), s.nowArg()))
		return err
	})
	if errors.Is(err, ErrWebhookNotFound) {
		return Webhook{}, "", err
	}
	if err != nil {
		return Webhook{}, "", fmt.Errorf("rotate webhook secret: %w", err)
	}
	return w, secret, nil
}

// PreviousWebhookSecret returns, decrypted, the secret a webhook's last rotation replaced and
// the time it stops signing, while that time is ahead of the store's; otherwise "" and the zero
// time (for the dispatcher, which signs with it beside WebhookSecret's).
func (s *Store) PreviousWebhookSecret(ctx context.Context, id uuid.UUID) (string, time.Time, error) {
	var enc []byte
	var until time.Time
	err := s.pool.QueryRow(ctx, `
		SELECT previous_secret_enc, previous_secret_expires_at FROM webhooks
		WHERE id = $1 AND previous_secret_enc IS NOT NULL AND previous_secret_expires_at > coalesce($2::timestamptz, now())`,
		id, s.nowArg()).Scan(&enc, &until)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", time.Time{}, nil
	}
	if err != nil {
		return "", time.Time{}, fmt.Errorf("previous webhook secret: %w", err)
	}
	secret, err := s.box.OpenString(enc, webhookPreviousSecretAAD(id))
	if err != nil {
		return "", time.Time{}, fmt.Errorf("webhook %s: decrypt previous secret: %w", id, err)
	}
	return secret, until, nil
}
