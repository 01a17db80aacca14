package store

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Channel statuses.
const (
	ChannelPending  = "pending"
	ChannelActive   = "active"
	ChannelInactive = "inactive"
)

// Channel is a WhatsApp Business number connected (or being connected) to an org.
type Channel struct {
	ID                 uuid.UUID
	OrgID              uuid.UUID
	Name               string
	Status             string
	ChannelToken       string // decrypted; the relay credential and connect-link token
	DisplayPhoneNumber *string
	PhoneNumberID      *string
	WabaID             *string
	ConnectedAt        *time.Time
	TokenExpiresAt     *time.Time
	// UpstreamDisconnectedAt is set when the upstream rejected the channel's access token
	// (error code 190); the relay refuses the channel until it is reconnected.
	UpstreamDisconnectedAt *time.Time
	// InactiveReason says why an inactive channel is inactive: "operator" or "upstream".
	InactiveReason *string
	CreatedAt      time.Time
	// Health is what the upstream says of the number (store/channelhealth.go): all nil until
	// the first read after the connection.
	Health ChannelHealth
}

// channelTokenBytes is the entropy of a channel token: 32 bytes, 43 URL-safe characters.
const channelTokenBytes = 32

// NewChannelToken returns a fresh random channel token.
func NewChannelToken() string {
	return base64.RawURLEncoding.EncodeToString(randomBytes(channelTokenBytes))
}

// ValidChannelToken reports whether s has the shape of a channel token (43 URL-safe base64
// characters), so that garbage is refused without a lookup.
func ValidChannelToken(s string) bool {
	if len(s) != base64.RawURLEncoding.EncodedLen(channelTokenBytes) {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// TokenHash is the lookup hash of a channel token.
func TokenHash(token string) []byte {
	sum := sha256.Sum256([]byte(token))
	return sum[:]
}

func channelTokenAAD(id uuid.UUID) string { return "channels.channel_token:" + id.String() }

const channelColumns = `id, org_id, name, status, channel_token_enc, display_phone_number, phone_number_id,
	waba_id, connected_at, token_expires_at, upstream_disconnected_at, inactive_reason, created_at, ` + healthColumn

func (s *Store) scanChannel(row pgx.Row) (Channel, error) {
	var c Channel
	var tokenEnc, health []byte
	if err := row.Scan(&c.ID, &c.OrgID, &c.Name, &c.Status, &tokenEnc, &c.DisplayPhoneNumber, &c.PhoneNumberID,
		&c.WabaID, &c.ConnectedAt, &c.TokenExpiresAt, &c.UpstreamDisconnectedAt, &c.InactiveReason, &c.CreatedAt, &health); err != nil {
		return Channel{}, err
	}
	var err error
	if c.Health, err = scanHealth(health); err != nil {
		return Channel{}, fmt.Errorf("channel %s: %w", c.ID, err)
	}
	if s.box == nil {
		return c, nil // a store without a key (operator commands that touch no secret)
	}
	token, err := s.box.OpenString(tokenEnc, channelTokenAAD(c.ID))
	if err != nil {
		return Channel{}, fmt.Errorf("channel %s: decrypt channel token: %w", c.ID, err)
	}
	c.ChannelToken = token
	return c, nil
}

func (s *Store) collectChannels(rows pgx.Rows) ([]Channel, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Channel, error) { return s.scanChannel(r) })
}

// CreateChannel creates a pending channel in org whose connect link expires after linkTTL.
func (s *Store) CreateChannel(ctx context.Context, orgID uuid.UUID, name string, linkTTL time.Duration) (Channel, error) {
	id := newID()
	token := NewChannelToken()
	c, err := s.scanChannel(s.pool.QueryRow(ctx, `
		INSERT INTO channels (id, org_id, name, status, channel_token_hash, channel_token_enc, token_expires_at)
		VALUES ($1, $2, $3, 'pending', $4, $5, now() + $6::interval)
		RETURNING `+channelColumns,
		id, orgID, name, TokenHash(token), s.box.SealString(token, channelTokenAAD(id)), linkTTL))
	if isForeignKeyViolation(err) {
		return Channel{}, ErrOrgNotFound
	}
	if err != nil {
		return Channel{}, fmt.Errorf("create channel: %w", err)
	}
	return c, nil
}

// ListChannels returns the org's channels ordered by (created_at, id).
func (s *Store) ListChannels(ctx context.Context, orgID uuid.UUID) ([]Channel, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+channelColumns+` FROM channels WHERE org_id = $1 ORDER BY created_at, id`, orgID)
	if err != nil {
		return nil, fmt.Errorf("list channels: %w", err)
	}
	cs, err := s.collectChannels(rows)
	if err != nil {
		return nil, fmt.Errorf("list channels: %w", err)
	}
	return cs, nil
}

// GetChannel returns one of the org's channels, or ErrChannelNotFound.
func (s *Store) GetChannel(ctx context.Context, orgID, id uuid.UUID) (Channel, error) {
	c, err := s.scanChannel(s.pool.QueryRow(ctx, `SELECT `+channelColumns+` FROM channels WHERE id = $1 AND org_id = $2`, id, orgID))
	if errors.Is(err, pgx.ErrNoRows) {
		return Channel{}, ErrChannelNotFound
	}
	if err != nil {
		return Channel{}, fmt.Errorf("get channel: %w", err)
	}
	return c, nil
}

// ChannelByToken returns the channel whose token is token, or ErrChannelNotFound.
func (s *Store) ChannelByToken(ctx context.Context, token string) (Channel, error) {
	c, err := s.scanChannel(s.pool.QueryRow(ctx, `SELECT `+channelColumns+` FROM channels WHERE channel_token_hash = $1`, TokenHash(token)))
	if errors.Is(err, pgx.ErrNoRows) {
		return Channel{}, ErrChannelNotFound
	}
	if err != nil {
		return Channel{}, fmt.Errorf("channel by token: %w", err)
	}
	return c, nil
}

// DeletedChannel is what is left to clean up upstream after a channel was deleted.
type DeletedChannel struct {
	// WabaID and UpstreamToken are set when the channel was connected and no other channel
	// uses the same business account, i.e. when the app's subscription to it may be removed.
	WabaID        string
	UpstreamToken string
}

// DeleteChannel deletes one of the org's channels and its webhook assignments. An active
// channel is deleted only with force; otherwise ErrChannelActive. The channel's row is locked
// for the check and the delete, so a channel that becomes active concurrently is not deleted
// without force. Its channel_status event (deleted) is stored in the same transaction, before
// the delete, for the webhooks that cover the channel at that moment, and its scheduled,
// sending and paused broadcasts are cancelled (their queued recipients with them).
func (s *Store) DeleteChannel(ctx context.Context, orgID, id uuid.UUID, force bool) (DeletedChannel, error) {
	var waba *string
	var tokenEnc []byte
	var lastOfWaba bool
	err := s.changeChannels(ctx, func(tx pgx.Tx) error {
		var status string
		var pnid *string
		var disconnected bool
		if err := tx.QueryRow(ctx, `
			SELECT status, upstream_disconnected_at IS NOT NULL, phone_number_id, waba_id, upstream_token_enc
			FROM channels WHERE id = $1 AND org_id = $2 FOR UPDATE`, id, orgID).
			Scan(&status, &disconnected, &pnid, &waba, &tokenEnc); err != nil {
			return err
		}
		if status == ChannelActive && !force {
			return ErrChannelActive
		}
		if err := s.deletedChannelEvent(ctx, tx, orgID, id, pnid, status, disconnected); err != nil {
			return err
		}
		// The channel's broadcasts that may still send are cancelled with their queued
		// recipients (broadcasts have no foreign key to channels: they stay readable).
		if _, err := tx.Exec(ctx, cancelBroadcastsSQL+` WHERE channel_id = $1 AND status IN ('scheduled', 'sending', 'paused') RETURNING id) `+
			cancelRecipientsSQL, id, s.nowArg()); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `
			WITH d AS (DELETE FROM channels WHERE id = $1)
			SELECT NOT EXISTS (SELECT 1 FROM channels o WHERE o.waba_id = $2 AND o.id <> $1)`, id, waba).Scan(&lastOfWaba)
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return DeletedChannel{}, ErrChannelNotFound
	case errors.Is(err, ErrChannelActive):
		return DeletedChannel{}, ErrChannelActive
	case err != nil:
		return DeletedChannel{}, fmt.Errorf("delete channel: %w", err)
	}
	var d DeletedChannel
	if waba != nil && lastOfWaba && tokenEnc != nil {
		if token, err := s.box.OpenString(tokenEnc, upstreamTokenAAD(id)); err == nil {
			d = DeletedChannel{WabaID: *waba, UpstreamToken: token}
		}
	}
	return d, nil
}

// DeactivateChannel marks a channel inactive by operator action (any org). The relay refuses it
// from then on; only an operator reconnect reopens it. A change of state is announced by a
// channel_status event (reason operator) stored in the same transaction.
func (s *Store) DeactivateChannel(ctx context.Context, id uuid.UUID) (Channel, error) {
	var c Channel
	err := s.changeChannels(ctx, func(tx pgx.Tx) error {
		n, err := s.transition(ctx, tx, `id = $1`, `status = 'inactive', inactive_reason = 'operator', updated_at = now()`,
			because(ReasonOperator), id)
		if err != nil {
			return err
		}
		if n == 0 {
			return pgx.ErrNoRows
		}
		c, err = s.scanChannel(tx.QueryRow(ctx, `SELECT `+channelColumns+` FROM channels WHERE id = $1`, id))
		return err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return Channel{}, ErrChannelNotFound
	}
	if err != nil {
		return Channel{}, fmt.Errorf("deactivate channel: %w", err)
	}
	return c, nil
}
