package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/wabarelay/wabarelay/window"
)

// The customer-service window's facts (DESIGN §5c "Customer-service window"; migration 025):
// per channel and customer, the newest upstream timestamp of an incoming message, kept by
// intake in the events' transaction; read by the management API (ContactWindow) and loaded
// by the relays (WindowSnapshot), which keep it current from the notifications intake sends
// (ContactsNotifyChannel). The rule itself is window.Decide.

// ContactsNotifyChannel is the Postgres channel on which intake announces the contacts whose
// last incoming message it moved forward: payloads of lines "<channel id> <wa_id> <unix µs>"
// (ParseContactsNotification), at most contactsPerNotify lines each.
const ContactsNotifyChannel = "wabarelay_contacts"

// contactsPerNotify is the most contacts one notification names (a payload is at most 8,000
// bytes; a line is at most 36 + 1 + 32 + 1 + 20 bytes).
const contactsPerNotify = 64

// contactBatch is what a StoreEvents batch records of its incoming messages: parallel arrays
// of channel, customer and upstream timestamp, one entry per message item of a known channel.
type contactBatch struct {
	chs   []uuid.UUID
	waIDs []string
	ats   []time.Time
}

// add records item it, routed to channel ch, when it is an incoming message from a customer
// with a wa_id (digits only) and an upstream timestamp. A timestamp later than now (the
// upstream's clock ahead, or garbage) is recorded as now: a window is never opened beyond 24
// hours from the intake's own time.
func (b *contactBatch) add(ch uuid.UUID, it *IncomingItem, now time.Time) {
	if it.Type != EventMessages || it.Sent.IsZero() || !window.ValidWAID(it.Customer) {
		return
	}
	at := it.Sent
	if at.After(now) {
		at = now
	}
	b.chs, b.waIDs, b.ats = append(b.chs, ch), append(b.waIDs, it.Customer), append(b.ats, at)
}

// queue queues the upsert of the batch's contacts (contactsUpsertSQL) in pb and says whether it
// did: nothing to do for a batch without incoming messages.
func (b *contactBatch) queue(pb *pgx.Batch) bool {
	if len(b.chs) == 0 {
		return false
	}
	pb.Queue(contactsUpsertSQL, b.chs, b.waIDs, b.ats)
	return true
}

// store upserts the batch's contacts in tx in one statement (contactsUpsertSQL): nothing to
// do for a batch without incoming messages.
func (b *contactBatch) store(ctx context.Context, tx pgx.Tx) error {
	if len(b.chs) == 0 {
		return nil
	}
	if _, err := tx.Exec(ctx, contactsUpsertSQL, b.chs, b.waIDs, b.ats); err != nil {
		return fmt.Errorf("contacts: %w", err)
	}
	return nil
}

// contactsUpsertSQL records the newest incoming timestamp per channel and customer: one row per
// (channel, wa_id) of the batch (its newest timestamp), inserted or moved forward only — a late
// webhook's older timestamp leaves the row alone (no write, no notification). Rows go in
// (channel_id, wa_id) order, so that concurrent posts lock them in one order. The rows it moved
// are announced on ContactsNotifyChannel (delivered at commit), contactsPerNotify per
// notification.
var contactsUpsertSQL = `
	WITH v AS (
		SELECT u.ch, u.wa, max(u.at) AS at
		FROM unnest($1::uuid[], $2::text[], $3::timestamptz[]) AS u(ch, wa, at)
		GROUP BY u.ch, u.wa
	), up AS (
		INSERT INTO contacts AS c (channel_id, wa_id, last_inbound_at)
		SELECT v.ch, v.wa, v.at FROM v ORDER BY v.ch, v.wa
		ON CONFLICT (channel_id, wa_id) DO UPDATE SET last_inbound_at = greatest(c.last_inbound_at, excluded.last_inbound_at)
		WHERE c.last_inbound_at < excluded.last_inbound_at
		RETURNING c.channel_id, c.wa_id, c.last_inbound_at
	), n AS (
		SELECT up.channel_id::text || ' ' || up.wa_id || ' ' ||
		       (extract(epoch FROM up.last_inbound_at) * 1000000)::bigint AS line,
		       (row_number() OVER () - 1) / ` + strconv.Itoa(contactsPerNotify) + ` AS chunk
		FROM up
	)
	SELECT pg_notify('` + ContactsNotifyChannel + `', p.payload)
	FROM (SELECT string_agg(n.line, E'\n') AS payload FROM n GROUP BY n.chunk) p`

// ContactUpdate is one line of a ContactsNotifyChannel notification: a customer's newest
// incoming message, as stored.
type ContactUpdate struct {
	ChannelID     uuid.UUID
	WAID          string
	LastInboundAt time.Time
}

// ParseContactsNotification reads a ContactsNotifyChannel payload; lines it cannot read are
// skipped.
func ParseContactsNotification(payload string) []ContactUpdate {
	out := make([]ContactUpdate, 0, strings.Count(payload, "\n")+1)
	for line := range strings.SplitSeq(payload, "\n") {
		ch, rest, ok1 := strings.Cut(line, " ")
		wa, us, ok2 := strings.Cut(rest, " ")
		if !ok1 || !ok2 {
			continue
		}
		id, err := uuid.Parse(ch)
		n, err2 := strconv.ParseInt(us, 10, 64)
		if err != nil || err2 != nil || !window.ValidWAID(wa) {
			continue
		}
		out = append(out, ContactUpdate{ChannelID: id, WAID: wa, LastInboundAt: time.UnixMicro(n).UTC()})
	}
	return out
}

// receivingSinceSQL is since when the channel c has been receiving its customers' messages
// without interruption, as far as the record goes (NULL: it is not): an active channel, from
// its latest connection (every activation is a connection: connected_at) or from when intake
// began recording its contacts (migration 025), whichever is later (docs/decisions.md, "The
// window's receiving time").
const receivingSinceSQL = `CASE WHEN c.status = 'active' AND c.connected_at IS NOT NULL
	THEN greatest(c.connected_at, c.contacts_since) END`

// ContactWindow is what the store knows of one customer's window on one channel.
type ContactWindow struct {
	// LastInboundAt is the upstream timestamp of the customer's newest incoming message; zero
	// when none was received.
	LastInboundAt time.Time
	// ReceivingSince is since when the channel has been receiving without interruption; zero
	// when it is not (see window.Decide).
	ReceivingSince time.Time
	// At is the store's time of the read (its clock): the now to decide the window at.
	At time.Time
}

// ContactWindow returns the window facts of customer waID (digits, window.ValidWAID) on the
// org's channel, or ErrChannelNotFound for a channel that is not the org's (or is gone).
func (s *Store) ContactWindow(ctx context.Context, orgID, channelID uuid.UUID, waID string) (ContactWindow, error) {
	var last, since *time.Time
	err := s.pool.QueryRow(ctx, `
		SELECT `+receivingSinceSQL+`,
		       (SELECT k.last_inbound_at FROM contacts k WHERE k.channel_id = c.id AND k.wa_id = $3)
		FROM channels c WHERE c.id = $2 AND c.org_id = $1`, orgID, channelID, waID).Scan(&since, &last)
	if errors.Is(err, pgx.ErrNoRows) {
		return ContactWindow{}, ErrChannelNotFound
	}
	if err != nil {
		return ContactWindow{}, fmt.Errorf("contact window: %w", err)
	}
	w := ContactWindow{At: s.now()}
	if last != nil {
		w.LastInboundAt = last.UTC()
	}
	if since != nil {
		w.ReceivingSince = since.UTC()
	}
	return w, nil
}

// WindowSnapshot is a channel's open windows as the relay loads them (Store.WindowSnapshot).
// The channel's receiving time comes with the relay's view of the channel
// (RelayChannel.ReceivingSince), which its cache reloads on every change of the channel.
type WindowSnapshot struct {
	// Open holds the customers whose newest incoming message is later than the snapshot's
	// since, with its timestamp: at most the limit asked, the newest.
	Open map[string]time.Time
	// Truncated: the channel has more such customers than the limit; those left out are not
	// in Open.
	Truncated bool
}

// WindowSnapshot returns the customers who wrote to the channel after since (the start of the
// windows still open), newest first, at most limit of them (read through contacts_recent: never
// the channel's older contacts); ErrChannelNotFound when the channel is gone.
func (s *Store) WindowSnapshot(ctx context.Context, channelID uuid.UUID, since time.Time, limit int) (WindowSnapshot, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT k.wa_id, k.last_inbound_at
		FROM channels c
		LEFT JOIN LATERAL (
			SELECT k.wa_id, k.last_inbound_at FROM contacts k
			WHERE k.channel_id = c.id AND k.last_inbound_at > $2
			ORDER BY k.last_inbound_at DESC LIMIT $3) k ON true
		WHERE c.id = $1`, channelID, since, limit+1)
	if err != nil {
		return WindowSnapshot{}, fmt.Errorf("window snapshot: %w", err)
	}
	defer rows.Close()
	snap := WindowSnapshot{Open: map[string]time.Time{}}
	found := false
	for rows.Next() {
		var at *time.Time
		var wa *string
		if err := rows.Scan(&wa, &at); err != nil {
			return WindowSnapshot{}, fmt.Errorf("window snapshot: %w", err)
		}
		found = true
		if wa == nil || at == nil {
			continue
		}
		if len(snap.Open) == limit {
			snap.Truncated = true
			continue
		}
		snap.Open[*wa] = at.UTC()
	}
	if err := rows.Err(); err != nil {
		return WindowSnapshot{}, fmt.Errorf("window snapshot: %w", err)
	}
	if !found {
		return WindowSnapshot{}, ErrChannelNotFound
	}
	return snap, nil
}
