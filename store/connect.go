// The connect flow's writes: a completed Embedded Signup, an operator's connection, and the
// upstream's rejection of a channel's token.

package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Connection is the outcome of a completed connection (Embedded Signup).
type Connection struct {
	PhoneNumberID      string
	WabaID             string
	DisplayPhoneNumber string
	VerifiedName       string
	UpstreamToken      string
}

// ConnectChannel stores a connection unconditionally (operator tools and tests): the channel
// becomes active with its number, business account and encrypted upstream token; its connect
// link closes and any upstream disconnection is cleared. The channel token is kept. The connect
// flow uses CompleteConnection. A change of state is announced by a channel_status event
// (connected, or reconnected) stored in the same transaction.
func (s *Store) ConnectChannel(ctx context.Context, id uuid.UUID, c Connection) error {
	n, err := s.connect(ctx, id, c, "")
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		return ErrNumberInUse
	}
	if err != nil {
		return fmt.Errorf("connect channel: %w", err)
	}
	if n == 0 {
		return ErrChannelNotFound
	}
	return nil
}

// connectSet activates a channel with number $2, account $3, display number $4, verified name
// $5 and sealed upstream token $6, closing its link (ConnectChannel, CompleteConnection).
const connectSet = `status = 'active', inactive_reason = NULL, phone_number_id = $2, waba_id = $3,
		display_phone_number = NULLIF($4, ''), verified_name = NULLIF($5, ''), upstream_token_enc = $6,
		connected_at = now(), token_expires_at = NULL, upstream_disconnected_at = NULL, updated_at = now()`

// connect activates channel id with connection c where the channel also meets cond (a
// condition on its row before the update; "" for none), and records the channel_status event
// of the change, and asks for a read of the number's health, in one transaction. It returns how many channels it updated (0 or 1).
func (s *Store) connect(ctx context.Context, id uuid.UUID, c Connection, cond string) (int, error) {
	where := `channels.id = $1`
	if cond != "" {
		where += ` AND ` + cond
	}
	var n int
	err := s.changeChannels(ctx, func(tx pgx.Tx) error {
		var err error
		n, err = s.transition(ctx, tx, where, connectSet, connectReason,
			id, c.PhoneNumberID, c.WabaID, c.DisplayPhoneNumber, c.VerifiedName, s.box.SealString(c.UpstreamToken, upstreamTokenAAD(id)))
		if err != nil || n == 0 {
			return err
		}
		// the number's health is read at once (store/channelhealth.go)
		return s.promptHealthAtConnect(ctx, tx, id)
	})
	return n, err
}

// ErrLinkClosed is returned by CompleteConnection when the channel's connect link is no
// longer open (expired, used by a concurrent completion, or the channel is gone).
var ErrLinkClosed = errors.New("connect link is closed")

// ErrOtherNumber is returned by CompleteConnection when the channel is already tied to another
// number or business account (a reconnect must use the same ones).
var ErrOtherNumber = errors.New("channel is tied to another number")

// CompleteConnection stores a completed Embedded Signup like ConnectChannel, but only if, at the
// moment of writing, the channel's link is still open, an operator has not deactivated it, and
// it is not tied to another number or business account: the upstream calls that precede it
// take seconds, and a concurrent completion or an operator's deactivation landing meanwhile
// must win. It returns ErrLinkClosed, ErrOperatorDeactivated, ErrOtherNumber or ErrNumberInUse
// when the write does not happen.
func (s *Store) CompleteConnection(ctx context.Context, id uuid.UUID, c Connection) error {
	n, err := s.connect(ctx, id, c, `token_expires_at > now() AND inactive_reason IS DISTINCT FROM 'operator'
		  AND (phone_number_id IS NULL OR phone_number_id = $2) AND (waba_id IS NULL OR waba_id = $3)`)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		return ErrNumberInUse
	}
	if err != nil {
		return fmt.Errorf("complete connection: %w", err)
	}
	if n == 1 {
		return nil
	}
	// Why not: read the channel as it is now.
	var open, operator, other bool
	err = s.pool.QueryRow(ctx, `
		SELECT coalesce(token_expires_at > now(), false), inactive_reason IS NOT DISTINCT FROM 'operator',
			(phone_number_id IS NOT NULL AND phone_number_id <> $2) OR (waba_id IS NOT NULL AND waba_id <> $3)
		FROM channels WHERE id = $1`, id, c.PhoneNumberID, c.WabaID).Scan(&open, &operator, &other)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return ErrLinkClosed
	case err != nil:
		return fmt.Errorf("complete connection: %w", err)
	case operator:
		return ErrOperatorDeactivated
	case other:
		return ErrOtherNumber
	default:
		return ErrLinkClosed
	}
}

// ErrNumberInUse is returned by ConnectChannel when another channel has the phone number.
var ErrNumberInUse = errors.New("phone number is connected to another channel")

// MarkUpstreamDisconnected records that the upstream rejected the channel's access token. The
// first time is kept, and only that one, when the channel was active, is announced by a
// channel_status event (upstream_disconnected, reason upstream_token_invalid), stored in the
// same transaction: a token that dies is announced once, however many calls meet it.
func (s *Store) MarkUpstreamDisconnected(ctx context.Context, id uuid.UUID) error {
	err := s.changeChannels(ctx, func(tx pgx.Tx) error {
		_, err := s.transition(ctx, tx, `id = $1 AND upstream_disconnected_at IS NULL`,
			`upstream_disconnected_at = now(), updated_at = now()`, because(ReasonUpstreamTokenInvalid), id)
		return err
	})
	if err != nil {
		return fmt.Errorf("mark upstream disconnected: %w", err)
	}
	return nil
}
