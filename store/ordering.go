package store

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Webhook orderings (Webhook.Ordering): how a webhook's deliveries of one conversation go out.
const (
	// OrderingNone, the default: deliveries go out in parallel (up to per_webhook), each on its
	// own schedule.
	OrderingNone = "none"
	// OrderingConversation: the webhook's deliveries of one conversation (ConversationKey) go
	// out one at a time in inbound order; the next starts once the one before it is delivered or
	// has failed for good. Other conversations go on in parallel.
	OrderingConversation = "conversation"
)

// ConversationKey returns the conversation of an event of channel phoneNumberID with customer
// (the wa_id: a message's "from", a status's "recipient_id"; "" for events about the channel
// itself, which form one conversation per channel). It is a 64-bit FNV-1a hash: stored in 8
// bytes and indexed cheaply, whatever the upstream's ids hold; two conversations that collide
// are merely delivered one after the other. Written on the queue rows of ordered webhooks
// only (migration 016).
func ConversationKey(phoneNumberID, customer string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(phoneNumberID))
	if customer != "" {
		_, _ = h.Write([]byte{0}) // (a channel's own conversation: no separator, no customer)
		_, _ = h.Write([]byte(customer))
	}
	return int64(h.Sum64())
}

// claimableSQL is the ordering rule of a queue row q, for claimSQL: a row with no conversation
// (its webhook's ordering was none when it was created) is always claimable; a row of a
// conversation waits while an earlier row of the conversation (inbound order: created_at,
// event_id, delivery_id; any state: pending, in flight or held) is in the queue, or while
// another of its rows is in flight (one whose place was taken by a retried earlier one). Two
// index probes (delivery_queue_conversation, delivery_queue_conversation_flight), evaluated
// only for rows of ordered webhooks.
const claimableSQL = `(q.conversation IS NULL OR (
	NOT EXISTS (SELECT 1 FROM delivery_queue o WHERE o.webhook_id = q.webhook_id AND o.conversation = q.conversation
	            AND (o.created_at, o.event_id, o.delivery_id) < (q.created_at, q.event_id, q.delivery_id))
	AND NOT EXISTS (SELECT 1 FROM delivery_queue o WHERE o.webhook_id = q.webhook_id AND o.conversation = q.conversation
	                AND o.status = 'in_flight' AND o.delivery_id <> q.delivery_id)))`

// ErrBadOrdering is returned for an ordering other than OrderingNone and OrderingConversation.
var ErrBadOrdering = errors.New("unknown webhook ordering")

// SetWebhookOrdering sets an org's webhook's ordering and returns it. The change applies to the
// deliveries created after it: the queued ones keep the order they were created with.
func (s *Store) SetWebhookOrdering(ctx context.Context, orgID, id uuid.UUID, ordering string) (Webhook, error) {
	if ordering != OrderingNone && ordering != OrderingConversation {
		return Webhook{}, ErrBadOrdering
	}
	w, err := scanWebhook(s.pool.QueryRow(ctx, `
		WITH u AS (UPDATE webhooks SET ordering = $3, updated_at = now() WHERE id = $1 AND org_id = $2 RETURNING *)
		SELECT `+webhookColumns+` FROM u w`, id, orgID, ordering))
	if errors.Is(err, pgx.ErrNoRows) {
		return Webhook{}, ErrWebhookNotFound
	}
	if err != nil {
		return Webhook{}, fmt.Errorf("set webhook ordering: %w", err)
	}
	return w, nil
}
