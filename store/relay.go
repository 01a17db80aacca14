package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
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
	// Objects are the upstream object ids handed to the channel (its templates and media),
	// never another channel's phone number or business account id. Loaded with the channel, so
	// the relay decides scope from memory.
	Objects *ObjectSet
	// ReceivingSince is since when the channel has been receiving its customers' messages
	// without interruption (zero: it is not), for the customer-service window (store/contacts.go).
	ReceivingSince time.Time
}

// Kinds of channel objects (channel_objects.kind).
const (
	ObjectTemplate = "template"
	ObjectMedia    = "media"
)

// ObjectSet is a set of object ids, safe for concurrent use.
type ObjectSet struct {
	mu  sync.RWMutex
	ids map[string]struct{}
}

// NewObjectSet returns a set holding ids.
func NewObjectSet(ids ...string) *ObjectSet {
	s := &ObjectSet{ids: make(map[string]struct{}, len(ids))}
	s.Add(ids...)
	return s
}

// Has reports whether id is in the set. A nil set is empty.
func (s *ObjectSet) Has(id string) bool {
	if s == nil {
		return false
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	_, ok := s.ids[id]
	return ok
}

// Add adds ids to the set.
func (s *ObjectSet) Add(ids ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		s.ids[id] = struct{}{}
	}
}

// Len returns the number of ids in the set.
func (s *ObjectSet) Len() int {
	if s == nil {
		return 0
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.ids)
}

func upstreamTokenAAD(id uuid.UUID) string { return "channels.upstream_token:" + id.String() }

// RelayChannelByToken returns the relay view of the channel whose token is token, or
// ErrChannelNotFound.
func (s *Store) RelayChannelByToken(ctx context.Context, token string) (RelayChannel, error) {
	return s.relayChannel(ctx, "c.channel_token_hash = $1", TokenHash(token))
}

// RelayChannelByID returns the relay view of the channel id, or ErrChannelNotFound: for work
// the relay does on a channel's behalf with no caller's token (broadcasts).
func (s *Store) RelayChannelByID(ctx context.Context, id uuid.UUID) (RelayChannel, error) {
	return s.relayChannel(ctx, "c.id = $1", id)
}

// relayChannel loads the relay view of the one channel that where (a condition on c with one
// parameter, arg) selects.
func (s *Store) relayChannel(ctx context.Context, where string, arg any) (RelayChannel, error) {
	var c RelayChannel
	var pnid, waba *string
	var tokenEnc []byte
	var disconnectedAt *time.Time
	var objects []string
	var receiving *time.Time
	// The channel's objects come with it, minus any id that is another channel's number or
	// business account (an object admitted before that channel connected).
	err := s.pool.QueryRow(ctx, `
		SELECT c.id, c.org_id, c.status, c.phone_number_id, c.waba_id, c.upstream_token_enc, c.upstream_disconnected_at,
			ARRAY(SELECT o.object_id FROM channel_objects o WHERE o.channel_id = c.id
				AND NOT EXISTS (SELECT 1 FROM channels x WHERE x.id <> c.id AND (x.phone_number_id = o.object_id OR x.waba_id = o.object_id))),
			`+receivingSinceSQL+`
		FROM channels c WHERE `+where, arg).
		Scan(&c.ID, &c.OrgID, &c.Status, &pnid, &waba, &tokenEnc, &disconnectedAt, &objects, &receiving)
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
	if receiving != nil {
		c.ReceivingSince = receiving.UTC()
	}
	c.Objects = NewObjectSet(objects...)
	if tokenEnc != nil {
		if c.UpstreamToken, err = s.box.OpenString(tokenEnc, upstreamTokenAAD(c.ID)); err != nil {
			return RelayChannel{}, fmt.Errorf("channel %s: decrypt upstream token: %w", c.ID, err)
		}
	}
	return c, nil
}

// AdmitChannelObjects records upstream object ids of kind (ObjectTemplate, ObjectMedia) handed
// to a channel through the relay and returns those admitted: every id except the phone number
// and business account ids of other channels. Rows of a deleted channel are not written.
func (s *Store) AdmitChannelObjects(ctx context.Context, id uuid.UUID, kind string, objectIDs []string) ([]string, error) {
	if objectIDs = recordableObjectIDs(objectIDs); len(objectIDs) == 0 {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, `
		WITH ok AS (
			SELECT DISTINCT o FROM unnest($3::text[]) o
			WHERE NOT EXISTS (SELECT 1 FROM channels x WHERE x.id <> $1 AND (x.phone_number_id = o OR x.waba_id = o))
		), ins AS (
			INSERT INTO channel_objects (channel_id, object_id, kind)
			SELECT $1, o, $2 FROM ok WHERE EXISTS (SELECT 1 FROM channels WHERE id = $1)
			ON CONFLICT DO NOTHING
		)
		SELECT o FROM ok`, id, kind, objectIDs)
	if err != nil {
		return nil, fmt.Errorf("admit channel objects: %w", err)
	}
	admitted, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if isForeignKeyViolation(err) { // the channel was deleted meanwhile
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("admit channel objects: %w", err)
	}
	return admitted, nil
}

// PruneMediaObjects forgets media ids recorded before cutoff (the upstream keeps media 30
// days) and returns how many were removed.
func (s *Store) PruneMediaObjects(ctx context.Context, cutoff time.Time) (int64, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM channel_objects WHERE kind = 'media' AND created_at < $1`, cutoff)
	if err != nil {
		return 0, fmt.Errorf("prune media objects: %w", err)
	}
	return tag.RowsAffected(), nil
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
		UPDATE channels SET token_expires_at = now() + $3::interval, updated_at = now(),
			-- the operator reopening a channel it deactivated lets its owner complete the link
			inactive_reason = CASE WHEN $4 AND inactive_reason = 'operator' THEN NULL ELSE inactive_reason END
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
// whether a channel was changed; the change is announced by a channel_status event (reason
// number_removed) stored in the same transaction.
func (s *Store) DeactivateByDisplayNumber(ctx context.Context, wabaID, phoneNumber string) (bool, error) {
	if !IsText(wabaID) || !IsText(phoneNumber) {
		return false, nil // no channel's account or number
	}
	var n int
	err := s.changeChannels(ctx, func(tx pgx.Tx) error {
		var err error
		n, err = s.transition(ctx, tx, `waba_id = $1 AND status <> 'inactive' AND regexp_replace($2, '[^0-9]', '', 'g') <> ''
		  AND regexp_replace(display_phone_number, '[^0-9]', '', 'g') = regexp_replace($2, '[^0-9]', '', 'g')`,
			`status = 'inactive', inactive_reason = 'upstream', updated_at = now()`, because(ReasonNumberRemoved), wabaID, phoneNumber)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("deactivate by display number: %w", err)
	}
	return n > 0, nil
}
