package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// MaxReplayEvents is the most events one Replay queues: a window holding more is refused
// (ErrReplayTooLarge) and nothing is queued.
const MaxReplayEvents = 100000

// MaxReplayWindow is the longest window (Until − Since) a replay may cover.
const MaxReplayWindow = 7 * 24 * time.Hour

// ErrReplayTooLarge is returned by Replay when the window holds more than MaxReplayEvents
// events for the webhook.
var ErrReplayTooLarge = errors.New("replay window holds too many events")

// MaxReplayBacklog is the most deliveries a webhook may have queued (any state) after a replay:
// a replay that would queue more is refused (ErrReplayBacklog) and queues nothing. Live events
// are never refused by it: it bounds what replays can pile up, not what the intake delivers.
const MaxReplayBacklog = 200000

// ErrReplayBacklog is returned by Replay when the webhook's queued deliveries and the replay's
// would exceed MaxReplayBacklog.
var ErrReplayBacklog = errors.New("replay would exceed the webhook's queued deliveries limit")

// Replay selects the stored events to send again to one webhook.
type Replay struct {
	// Since and Until bound the events' created_at: Since ≤ created_at < Until.
	Since, Until time.Time
	// ChannelIDs, when not empty, narrows the webhook's scope to these channels of the org (a
	// channel outside the scope adds nothing). An id that is no channel of the org gives
	// ErrChannelsNotInOrg.
	ChannelIDs []uuid.UUID
	// Types, when not empty, narrows the webhook's events (kinds) to these.
	Types []string
}

// Replay queues one new delivery to one of the org's webhooks for every stored event in the
// window that the webhook's scope (the org, or its channels) and events cover — also events
// stored before the webhook existed — and returns how many. Each delivery carries its event as
// stored (same id, same payload), so receivers recognise a repeat by its webhook-id; its log
// and queue rows are the event's day's, like any delivery of the event, and it is pending, or
// held if the webhook is paused. Events of channels deleted since are not replayed: the scope
// is the channels that exist.
//
// A replay is idempotent per webhook: an event that has a delivery to the webhook in the
// queue already (pending, in flight, held or waiting) is not queued again, so replaying a
// window again and again adds nothing while its deliveries are queued. The webhook's queued
// deliveries after the replay may not exceed MaxReplayBacklog (ErrReplayBacklog).
//
// The counts and the inserts are one statement (one snapshot): a window holding more than
// MaxReplayEvents events gives ErrReplayTooLarge and queues nothing. The webhook's row is
// locked for the transaction (FOR NO KEY UPDATE), so concurrent replays to one webhook run one
// after the other (each sees the other's deliveries), and a pause, resume or deletion waits
// for the replay and then applies to its deliveries too. Unknown webhook: ErrWebhookNotFound.
func (s *Store) Replay(ctx context.Context, orgID, webhookID uuid.UUID, r Replay) (int, error) {
	var window, queued, backlog int
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var status, scope string
		var kinds []string
		err := tx.QueryRow(ctx, `SELECT status, scope, events FROM webhooks WHERE id = $1 AND org_id = $2 FOR NO KEY UPDATE`,
			webhookID, orgID).Scan(&status, &scope, &kinds)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrWebhookNotFound
		}
		if err != nil {
			return err
		}
		if len(r.ChannelIDs) > 0 {
			var found int
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM channels WHERE org_id = $1 AND id = ANY($2)`,
				orgID, r.ChannelIDs).Scan(&found); err != nil {
				return err
			}
			if found != len(r.ChannelIDs) {
				return ErrChannelsNotInOrg
			}
		}
		if len(r.Types) > 0 {
			kinds = slices.DeleteFunc(kinds, func(k string) bool { return !slices.Contains(r.Types, k) })
		}
		// The channels in scope, by id: the events are found through each day's (channel_id,
		// dedupe_key) index, reading no other org's events.
		rows, err := tx.Query(ctx, `
			SELECT c.id FROM channels c
			WHERE c.org_id = $1 AND ($2 = 'org' OR c.id IN (SELECT wc.channel_id FROM webhook_channels wc WHERE wc.webhook_id = $3))
			  AND (coalesce(cardinality($4::uuid[]), 0) = 0 OR c.id = ANY($4))`, orgID, scope, webhookID, r.ChannelIDs)
		if err != nil {
			return err
		}
		channels, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		if err != nil || len(channels) == 0 || len(kinds) == 0 {
			return err
		}
		queueStatus := "pending"
		if status != WebhookActive {
			queueStatus = "held"
		}
		err = tx.QueryRow(ctx, `
			WITH m AS (
				SELECT e.id, e.created_at, e.conversation,
				       EXISTS (SELECT 1 FROM delivery_queue q WHERE q.webhook_id = $7 AND q.event_id = e.id) AS queued
				FROM events e
				WHERE e.channel_id = ANY($1::uuid[]) AND e.org_id = $2 AND e.type = ANY($3::text[])
				  AND e.created_at >= $4::timestamptz AND e.created_at < $5::timestamptz
				LIMIT $6
			), c AS (
				-- the window's events, and those of them with no delivery to the webhook queued
				SELECT count(*) AS n, count(*) FILTER (WHERE NOT m.queued) AS fresh FROM m
			), b AS (
				-- the webhook's queued deliveries, counted up to the limit (delivery_queue_event)
				SELECT count(*) AS n FROM (SELECT 1 FROM delivery_queue q WHERE q.webhook_id = $7 LIMIT $10) x
			), n AS (
				-- nothing when the window holds too many, or the webhook's queue would hold too many;
				-- an ordered webhook's replays carry the event's conversation, as live deliveries do
				SELECT m.id AS event_id, m.created_at, $7::uuid AS webhook_id, `+newDeliveryIDSQL("$8")+` AS id, o.conv,
				       row_number() OVER (PARTITION BY o.conv ORDER BY m.created_at, m.id) AS conv_rank
				FROM m CROSS JOIN LATERAL (SELECT CASE WHEN (SELECT w.ordering FROM webhooks w WHERE w.id = $7) = 'conversation'
				                                  THEN m.conversation END AS conv) o
				WHERE NOT m.queued AND (SELECT c.n FROM c) < $6 AND (SELECT c.fresh FROM c) + (SELECT b.n FROM b) <= $10
			), log AS (
				`+insertDeliveryLog+`
				SELECT n.id, n.event_id, n.webhook_id, 'pending', 0, n.created_at, $8, n.conv FROM n ORDER BY n.created_at, n.event_id
			), q AS (
				`+insertDeliveryQueue+`
				SELECT n.id, n.created_at, n.event_id, n.webhook_id, `+queueStatusSQL("n.webhook_id", "n.conv", "n.conv_rank", "$9::text")+`,
				       $8, NULL, NULL, n.conv
				FROM n ORDER BY n.created_at, n.event_id
			)
			SELECT c.n, c.fresh, b.n FROM c, b`,
			pgx.QueryExecModeCacheDescribe, channels, orgID, kinds, r.Since, r.Until, MaxReplayEvents+1, webhookID,
			s.now().UTC(), queueStatus, MaxReplayBacklog+1).Scan(&window, &queued, &backlog)
		switch {
		case err != nil:
			return err
		case window > MaxReplayEvents:
			return ErrReplayTooLarge
		case queued+backlog > MaxReplayBacklog:
			return ErrReplayBacklog
		case queued > 0 && queueStatus == "pending":
			return notifyDeliveries(ctx, tx)
		}
		return nil
	})
	switch {
	case errors.Is(err, ErrWebhookNotFound), errors.Is(err, ErrChannelsNotInOrg), errors.Is(err, ErrReplayTooLarge),
		errors.Is(err, ErrReplayBacklog):
		return 0, err
	case err != nil:
		return 0, fmt.Errorf("replay: %w", err)
	}
	return queued, nil
}
