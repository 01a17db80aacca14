package store

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// DeliveriesNotifyChannel is the Postgres channel announcing new due deliveries.
const DeliveriesNotifyChannel = "wabarelay_deliveries"

// IncomingItem is one upstream message or status to turn into an event.
type IncomingItem struct {
	// Type is the event type: "messages" or "message_status".
	Type string
	// PhoneNumberID routes the item to its channel.
	PhoneNumberID string
	// DedupeKey identifies the upstream item and state; a repeat is dropped.
	DedupeKey string
	// Data is the event's data object, stored verbatim.
	Data json.RawMessage
	// ObjectIDs are upstream object ids (media) the item hands to its channel; they are
	// recorded with the events, so the relay's scope admits them from then on.
	ObjectIDs []string
}

// IntakeResult counts what StoreEvents did with a batch.
type IntakeResult struct {
	Events     int // new events stored
	Duplicates int // items already stored earlier (upstream re-sends)
	Unknown    int // items for numbers no channel has
	Deliveries int // deliveries created
	// Queued counts deliveries created pending for active webhooks (due now, not claimed).
	Queued int
	// Claimed are the deliveries created already claimed (see Claim).
	Claimed []ClaimedDelivery
	// ByType counts new events per type.
	ByType map[string]int
	// ObjectChannels are the channels handed new objects (media ids) by the batch: a caller
	// holding their relay scope in memory reloads them.
	ObjectChannels []uuid.UUID
}

// Claim asks StoreEvents to insert up to Max of the new deliveries to active webhooks already
// claimed by Instance for Lease (status in_flight, attempts 0 — attempts are counted when their
// outcome is recorded —, as a dispatcher's claim leaves them) and to return them, so that the
// intake's own dispatcher can start them at once. The zero Claim claims nothing.
type Claim struct {
	Instance string
	Lease    time.Duration
	Max      int
}

// ClaimedDelivery is a delivery StoreEvents inserted already claimed.
type ClaimedDelivery struct {
	ID, EventID, WebhookID uuid.UUID
	URL                    string
	Payload                []byte // the event JSON, as stored
}

// EncodeEvent returns the JSON delivered to webhooks for an event (see Event), with data
// (the upstream's objects) kept byte for byte: not re-encoded, so not HTML-escaped, not
// normalised, whatever bytes it holds.
func EncodeEvent(id uuid.UUID, typ, createdAt string, channelID uuid.UUID, phoneNumberID string, data json.RawMessage) []byte {
	pn, _ := json.Marshal(phoneNumberID) // text: it routed the item to a channel
	b := make([]byte, 0, 160+len(typ)+len(pn)+len(data))
	b = append(b, `{"id":"`...)
	b = append(b, id.String()...)
	b = append(b, `","type":"`...)
	b = append(b, typ...)
	b = append(b, `","created_at":"`...)
	b = append(b, createdAt...)
	b = append(b, `","channel_id":"`...)
	b = append(b, channelID.String()...)
	b = append(b, `","phone_number_id":`...)
	b = append(b, pn...)
	b = append(b, `,"data":`...)
	b = append(b, data...)
	return append(b, '}')
}

// Event is the JSON delivered to webhooks.
type Event struct {
	ID            uuid.UUID       `json:"id"`
	Type          string          `json:"type"`
	CreatedAt     string          `json:"created_at"`
	ChannelID     uuid.UUID       `json:"channel_id"`
	PhoneNumberID string          `json:"phone_number_id"`
	Data          json.RawMessage `json:"data"`
}

// StoreEvents stores a batch of upstream items as events, with one delivery per matching
// webhook (active or paused, of the channel's org, subscribed to the event type, with org scope
// or the channel assigned), in one transaction, and announces the deliveries left pending.
// Up to claim.Max deliveries to active webhooks are created already claimed (see Claim).
// Items for unknown numbers are counted and dropped; items already stored are counted as
// duplicates.
func (s *Store) StoreEvents(ctx context.Context, items []IncomingItem, claim Claim) (IntakeResult, error) {
	res := IntakeResult{ByType: map[string]int{}}
	if len(items) == 0 {
		return res, nil
	}
	numbers := make([]string, 0, len(items))
	for _, it := range items {
		if IsText(it.PhoneNumberID) { // an id that is not text is no channel's number
			numbers = append(numbers, it.PhoneNumberID)
		}
	}
	type channelRef struct{ id, org uuid.UUID }
	channels := map[string]channelRef{}
	rows, err := s.pool.Query(ctx, `SELECT phone_number_id, id, org_id FROM channels WHERE phone_number_id = ANY($1)`, numbers)
	if err != nil {
		return res, fmt.Errorf("store events: channels: %w", err)
	}
	for rows.Next() {
		var pn string
		var c channelRef
		if err := rows.Scan(&pn, &c.id, &c.org); err != nil {
			rows.Close()
			return res, fmt.Errorf("store events: channels: %w", err)
		}
		channels[pn] = c
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return res, fmt.Errorf("store events: channels: %w", err)
	}

	now := s.now().UTC()
	created := now.Format("2006-01-02T15:04:05.000Z07:00")
	var ids, chIDs, orgIDs []uuid.UUID
	var types, keys []string
	var payloads [][]byte
	var objChannels []uuid.UUID
	var objIDs []string
	for _, it := range items {
		c, ok := channels[it.PhoneNumberID]
		if !ok {
			res.Unknown++
			continue
		}
		id := newID()
		ids, chIDs, orgIDs = append(ids, id), append(chIDs, c.id), append(orgIDs, c.org)
		types, keys = append(types, it.Type), append(keys, textKey(it.DedupeKey))
		payloads = append(payloads, EncodeEvent(id, it.Type, created, c.id, it.PhoneNumberID, it.Data))
		for _, o := range textOnly(it.ObjectIDs) {
			objChannels, objIDs = append(objChannels, c.id), append(objIDs, o)
		}
	}
	if len(ids) == 0 {
		return res, nil
	}
	payloadOf := make(map[uuid.UUID][]byte, len(ids))
	for i, id := range ids {
		payloadOf[id] = payloads[i]
	}
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `
			INSERT INTO events (id, org_id, channel_id, type, dedupe_key, payload, created_at)
			SELECT u.id, u.org, u.ch, u.typ, u.key, u.payload, $7::timestamptz
			FROM unnest($1::uuid[], $2::uuid[], $3::uuid[], $4::text[], $5::text[], $6::bytea[]) AS u(id, org, ch, typ, key, payload)
			ON CONFLICT (channel_id, dedupe_key) DO NOTHING
			RETURNING id, type`, ids, orgIDs, chIDs, types, keys, payloads, now)
		if err != nil {
			return err
		}
		var stored []uuid.UUID
		for rows.Next() {
			var id uuid.UUID
			var typ string
			if err := rows.Scan(&id, &typ); err != nil {
				rows.Close()
				return err
			}
			stored = append(stored, id)
			res.ByType[typ]++
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		res.Events = len(stored)
		res.Duplicates = len(ids) - len(stored)
		if len(stored) == 0 {
			return nil
		}
		if len(objIDs) > 0 {
			// Re-sent items' objects are already recorded; the conflict clause covers them.
			if _, err := tx.Exec(ctx, `
				INSERT INTO channel_objects (channel_id, object_id)
				SELECT * FROM unnest($1::uuid[], $2::text[]) ON CONFLICT DO NOTHING`, objChannels, objIDs); err != nil {
				return err
			}
			res.ObjectChannels = slices.Compact(slices.SortedFunc(slices.Values(objChannels), func(a, b uuid.UUID) int {
				return bytes.Compare(a[:], b[:])
			}))
		}
		rows, err = tx.Query(ctx, `
			WITH m AS (
				SELECT e.id AS event_id, w.id AS webhook_id, w.status = 'active' AS active
				FROM events e
				JOIN webhooks w ON w.org_id = e.org_id AND e.type = ANY (w.events)
				WHERE e.id = ANY ($1)
				  AND (w.scope = 'org' OR EXISTS (SELECT 1 FROM webhook_channels wc WHERE wc.webhook_id = w.id AND wc.channel_id = e.channel_id))
			), n AS (
				SELECT m.*, m.active AND row_number() OVER (PARTITION BY m.active ORDER BY m.event_id, m.webhook_id) <= $3 AS claimed
				FROM m
			), ins AS (
				INSERT INTO deliveries (id, event_id, webhook_id, status, attempts, next_attempt_at, locked_by, locked_until, created_at)
				SELECT gen_random_uuid(), n.event_id, n.webhook_id,
				       CASE WHEN n.claimed THEN 'in_flight' ELSE 'pending' END, 0, $2,
				       CASE WHEN n.claimed THEN $4 END, CASE WHEN n.claimed THEN now() + $5 * interval '1 millisecond' END, $2
				FROM n ORDER BY n.event_id, n.webhook_id
				RETURNING id, event_id, webhook_id, status
			)
			SELECT ins.id, ins.event_id, ins.webhook_id, ins.status = 'in_flight', w.status = 'active', w.url
			FROM ins JOIN webhooks w ON w.id = ins.webhook_id`,
			// Planned for each call: a cached generic plan made while the tables were small or
			// unanalysed keeps scanning them whole.
			pgx.QueryExecModeCacheDescribe, stored, now, claim.Max, claim.Instance, claim.Lease.Milliseconds())
		if err != nil {
			return err
		}
		for rows.Next() {
			var d ClaimedDelivery
			var claimed, active bool
			if err := rows.Scan(&d.ID, &d.EventID, &d.WebhookID, &claimed, &active, &d.URL); err != nil {
				rows.Close()
				return err
			}
			res.Deliveries++
			switch {
			case claimed:
				d.Payload = payloadOf[d.EventID]
				res.Claimed = append(res.Claimed, d)
			case active:
				res.Queued++
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if res.Deliveries > len(res.Claimed) {
			_, err = tx.Exec(ctx, `SELECT pg_notify($1, '')`, DeliveriesNotifyChannel)
		}
		return err
	})
	if err != nil {
		return IntakeResult{}, fmt.Errorf("store events: %w", err)
	}
	return res, nil
}

// DeactivateByWaba marks every channel of a business account inactive because the account was
// removed or banned upstream. It returns how many channels changed.
func (s *Store) DeactivateByWaba(ctx context.Context, wabaID string) (int, error) {
	if !IsText(wabaID) {
		return 0, nil // no channel's account
	}
	tag, err := s.pool.Exec(ctx, `
		UPDATE channels SET status = 'inactive', inactive_reason = 'upstream', updated_at = now()
		WHERE waba_id = $1 AND status <> 'inactive'`, wabaID)
	if err != nil {
		return 0, fmt.Errorf("deactivate by waba: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// PruneEvents deletes events created before cutoff whose deliveries are all finished
// (delivered, failed or cancelled, or of a webhook that no longer exists), with their
// deliveries and attempts, at most limit events per call. It returns how many events it
// deleted. Events still being delivered are kept.
func (s *Store) PruneEvents(ctx context.Context, cutoff time.Time, limit int) (int, error) {
	// No foreign keys cascade here (migrations 005, 006): the statement deletes the events'
	// deliveries and attempts itself.
	var n int
	err := s.pool.QueryRow(ctx, `
		WITH e AS (
			DELETE FROM events WHERE id IN (
				SELECT e.id FROM events e
				WHERE e.created_at < $1
				  AND NOT EXISTS (SELECT 1 FROM deliveries d JOIN webhooks w ON w.id = d.webhook_id
				                  WHERE d.event_id = e.id AND d.status IN ('pending', 'in_flight'))
				ORDER BY e.created_at LIMIT $2)
			RETURNING id
		), d AS (
			DELETE FROM deliveries d USING e WHERE d.event_id = e.id RETURNING d.id
		), a AS (
			DELETE FROM delivery_attempts a USING d WHERE a.delivery_id = d.id
		)
		SELECT count(*) FROM e`, cutoff, limit).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("prune events: %w", err)
	}
	return n, nil
}
