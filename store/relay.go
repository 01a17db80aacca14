package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// RelayChannel is what the relay needs to serve a channel token.
type RelayChannel struct {
	ID            uuid.UUID
	OrgID         uuid.UUID
	Status        string
	PhoneNumberID string
	WabaID        string
	// UpstreamToken is the decrypted upstream access token ("" until connected).
	UpstreamToken string
	// Disconnected is set when the upstream rejected UpstreamToken (error code 190).
	Disconnected bool
}

func upstreamTokenAAD(id uuid.UUID) string { return "channels.upstream_token:" + id.String() }

// RelayChannelByToken returns the relay view of the channel whose token is token, or
// ErrChannelNotFound.
func (s *Store) RelayChannelByToken(ctx context.Context, token string) (RelayChannel, error) {
	var c RelayChannel
	var pnid, waba *string
	var tokenEnc []byte
	var disconnectedAt *time.Time
	err := s.pool.QueryRow(ctx, `
		SELECT id, org_id, status, phone_number_id, waba_id, upstream_token_enc, upstream_disconnected_at
		FROM channels WHERE channel_token_hash = $1`, TokenHash(token)).
		Scan(&c.ID, &c.OrgID, &c.Status, &pnid, &waba, &tokenEnc, &disconnectedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return RelayChannel{}, ErrChannelNotFound
	}
	if err != nil {
		return RelayChannel{}, fmt.Errorf("relay channel: %w", err)
	}
	if pnid != nil {
		c.PhoneNumberID = *pnid
	}
	if waba != nil {
		c.WabaID = *waba
	}
	c.Disconnected = disconnectedAt != nil
	if tokenEnc != nil {
		if c.UpstreamToken, err = s.box.OpenString(tokenEnc, upstreamTokenAAD(c.ID)); err != nil {
			return RelayChannel{}, fmt.Errorf("channel %s: decrypt upstream token: %w", c.ID, err)
		}
	}
	return c, nil
}

// Connection is the outcome of a completed connection (Embedded Signup).
type Connection struct {
	PhoneNumberID      string
	WabaID             string
	DisplayPhoneNumber string
	VerifiedName       string
	UpstreamToken      string
}

// ConnectChannel stores a completed connection: the channel becomes active with its number,
// business account and encrypted upstream token; its connect link closes and any upstream
// disconnection is cleared. The channel token is kept.
func (s *Store) ConnectChannel(ctx context.Context, id uuid.UUID, c Connection) error {
	tag, err := s.pool.Exec(ctx, `
		UPDATE channels SET status = 'active', inactive_reason = NULL, phone_number_id = $2, waba_id = $3,
			display_phone_number = NULLIF($4, ''), verified_name = NULLIF($5, ''), upstream_token_enc = $6,
			connected_at = now(), token_expires_at = NULL, upstream_disconnected_at = NULL, updated_at = now()
		WHERE id = $1`,
		id, c.PhoneNumberID, c.WabaID, c.DisplayPhoneNumber, c.VerifiedName, s.box.SealString(c.UpstreamToken, upstreamTokenAAD(id)))
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		return ErrNumberInUse
	}
	if err != nil {
		return fmt.Errorf("connect channel: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return ErrChannelNotFound
	}
	return nil
}

// ErrNumberInUse is returned by ConnectChannel when another channel has the phone number.
var ErrNumberInUse = errors.New("phone number is connected to another channel")

// MarkUpstreamDisconnected records that the upstream rejected the channel's access token. The
// first time is kept.
func (s *Store) MarkUpstreamDisconnected(ctx context.Context, id uuid.UUID) error {
	_, err := s.pool.Exec(ctx, `
		UPDATE channels SET upstream_disconnected_at = now(), updated_at = now()
		WHERE id = $1 AND upstream_disconnected_at IS NULL`, id)
	if err != nil {
		return fmt.Errorf("mark upstream disconnected: %w", err)
	}
	return nil
}

// AddChannelObjects records upstream object ids (templates, media) handed to a channel.
func (s *Store) AddChannelObjects(ctx context.Context, id uuid.UUID, objectIDs []string) error {
	if len(objectIDs) == 0 {
		return nil
	}
	_, err := s.pool.Exec(ctx, `
		INSERT INTO channel_objects (channel_id, object_id) SELECT $1, unnest($2::text[])
		ON CONFLICT DO NOTHING`, id, objectIDs)
	if err != nil && !isForeignKeyViolation(err) { // the channel was deleted meanwhile
		return fmt.Errorf("add channel objects: %w", err)
	}
	return nil
}

// ChannelHasObject reports whether objectID was handed to the channel.
func (s *Store) ChannelHasObject(ctx context.Context, id uuid.UUID, objectID string) (bool, error) {
	var ok bool
	err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM channel_objects WHERE channel_id = $1 AND object_id = $2)`,
		id, objectID).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("channel object: %w", err)
	}
	return ok, nil
}

// ChannelPIN returns the channel's stored registration PIN ("" if none).
func (s *Store) ChannelPIN(ctx context.Context, id uuid.UUID) (string, error) {
	var enc []byte
	err := s.pool.QueryRow(ctx, `SELECT register_pin_enc FROM channels WHERE id = $1`, id).Scan(&enc)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", ErrChannelNotFound
	}
	if err != nil || enc == nil {
		return "", err
	}
	return s.box.OpenString(enc, registerPINAAD(id))
}

// SetChannelPIN stores the channel's registration PIN, encrypted.
func (s *Store) SetChannelPIN(ctx context.Context, id uuid.UUID, pin string) error {
	_, err := s.pool.Exec(ctx, `UPDATE channels SET register_pin_enc = $2 WHERE id = $1`, id, s.box.SealString(pin, registerPINAAD(id)))
	if err != nil {
		return fmt.Errorf("set channel pin: %w", err)
	}
	return nil
}

func registerPINAAD(id uuid.UUID) string { return "channels.register_pin:" + id.String() }

// ErrNotReconnectable is returned by ReopenLink for a channel that has nothing to reconnect
// (active with a live upstream token, or a pending link still open).
var ErrNotReconnectable = errors.New("channel cannot be reconnected")

// ErrOperatorDeactivated is returned by ReopenLink when an operator deactivated the channel:
// only an operator may reopen it.
var ErrOperatorDeactivated = errors.New("channel was deactivated by the operator")

// ReopenLink reopens the connect link of one of the org's channels for ttl: a pending channel
// whose link expired, or a channel whose upstream token died or whose number was removed
// upstream. operator is true for the operator's CLI, which may also reopen a channel it
// deactivated (and any other). The channel token is kept.
func (s *Store) ReopenLink(ctx context.Context, orgID *uuid.UUID, id uuid.UUID, ttl time.Duration, operator bool) (Channel, error) {
	c, err := s.scanChannel(s.pool.QueryRow(ctx, `
		UPDATE channels SET token_expires_at = now() + $3::interval, updated_at = now()
		WHERE id = $1 AND ($2::uuid IS NULL OR org_id = $2) AND (
			$4 OR (inactive_reason IS DISTINCT FROM 'operator' AND (
				(status = 'pending' AND (token_expires_at IS NULL OR token_expires_at <= now()))
				OR upstream_disconnected_at IS NOT NULL
				OR (status = 'inactive' AND inactive_reason = 'upstream'))))
		RETURNING `+channelColumns, id, orgID, ttl, operator))
	if errors.Is(err, pgx.ErrNoRows) {
		var cur Channel
		if orgID != nil {
			cur, err = s.GetChannel(ctx, *orgID, id)
		} else {
			err = ErrChannelNotFound
		}
		switch {
		case err != nil:
			return Channel{}, err
		case cur.Status == ChannelInactive && cur.InactiveReason != nil && *cur.InactiveReason == "operator":
			return Channel{}, ErrOperatorDeactivated
		default:
			return Channel{}, ErrNotReconnectable
		}
	}
	if err != nil {
		return Channel{}, fmt.Errorf("reopen link: %w", err)
	}
	return c, nil
}

// DeactivateByDisplayNumber marks the channel of business account wabaID whose display phone
// number has the digits of phoneNumber inactive because the number was removed upstream (the
// upstream's account_update PHONE_NUMBER_REMOVED names the number, not its id). It reports
// whether a channel was changed.
func (s *Store) DeactivateByDisplayNumber(ctx context.Context, wabaID, phoneNumber string) (bool, error) {
	tag, err := s.pool.Exec(ctx, `
		UPDATE channels SET status = 'inactive', inactive_reason = 'upstream', updated_at = now()
		WHERE waba_id = $1 AND status <> 'inactive' AND regexp_replace($2, '[^0-9]', '', 'g') <> ''
		  AND regexp_replace(display_phone_number, '[^0-9]', '', 'g') = regexp_replace($2, '[^0-9]', '', 'g')`,
		wabaID, phoneNumber)
	if err != nil {
		return false, fmt.Errorf("deactivate by display number: %w", err)
	}
	return tag.RowsAffected() > 0, nil
}
