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

// An ordered webhook's queued rows of one conversation (migration 022): the head — the row
// that goes next — is pending, in flight or held (a "live" row); the rows behind it are
// 'waiting', in no index a claim reads (delivery_queue_due holds pending rows only). A claim
// therefore sees one row per conversation, however long the conversation's backlog: an org
// cannot slow other orgs' claims by piling deliveries up behind a head that is in flight.
//
// A new row of a conversation is queued waiting when the conversation has a row already
// (queueStatusSQL); when its last live row leaves the queue (delivered, failed for good, or
// failed as held too long), the first waiting row is promoted (promoteSQL). Concurrent writers
// of one conversation are kept consistent by locks, not by a single statement's snapshot: a
// new waiting row key-share-locks the row it queues behind, so that the row cannot be deleted
// until the new one is committed; a deletion (Queue.Record, FailHeld) takes the
// conversation's advisory lock (conversationLockSQL) before it deletes and promotes in a
// later statement of its transaction, which sees every row committed before its delete
// returned.

// claimableSQL is the ordering rule of a queue row q, for claimSQL and claimProbesSQL: a row
// with no conversation (its webhook's ordering was none when it was created) is always
// claimable; a row of a conversation waits while another live row of the conversation is in
// flight, or is earlier in inbound order (created_at, event_id, delivery_id). Its waiting rows
// are not read: one probe of delivery_queue_conversation_live, which holds a conversation's
// one or two live rows, evaluated only for rows of ordered webhooks. (Two live rows exist only
// when two intake transactions queued the conversation's first row concurrently.)
const claimableSQL = `(q.conversation IS NULL OR NOT EXISTS (
	SELECT 1 FROM delivery_queue o WHERE o.webhook_id = q.webhook_id AND o.conversation = q.conversation
	AND o.status <> 'waiting' AND o.delivery_id <> q.delivery_id
	AND (o.status = 'in_flight' OR (o.created_at, o.event_id, o.delivery_id) < (q.created_at, q.event_id, q.delivery_id))))`

// queueStatusSQL returns the SQL expression of a new queue row's status: 'waiting' when the row
// has a conversation (conv, of webhook) and either an earlier row of the same statement has it
// too (rank, the row's place among them, counted from 1) or the queue holds a row of it — then
// the newest such row is key-share-locked, so that it stays until this row is committed and the
// deletion that ends the conversation's live rows sees this one and promotes it —, else live
// (the expression live: pending, held or in flight).
func queueStatusSQL(webhook, conv, rank, live string) string {
	return `CASE WHEN ` + conv + ` IS NOT NULL AND (` + rank + ` > 1 OR EXISTS (
		SELECT 1 FROM delivery_queue o WHERE o.webhook_id = ` + webhook + ` AND o.conversation = ` + conv + `
		ORDER BY o.created_at DESC, o.event_id DESC, o.delivery_id DESC LIMIT 1 FOR KEY SHARE)) THEN 'waiting' ELSE ` + live + ` END`
}

// conversationLockSQL takes the transaction-scoped advisory locks of conversations ($1, keys of
// ConversationKey), in key order: deletions of one conversation's rows (and their promotions)
// run one at a time. The key is the conversation alone: two webhooks' deliveries of a
// conversation share it, which only serialises their deletions.
const conversationLockSQL = `SELECT count(pg_advisory_xact_lock(k)) FROM (SELECT DISTINCT k FROM unnest($1::bigint[]) AS k ORDER BY k) x`

// lockConversationsSQL returns a CTE, "locked", that takes the conversation locks
// (conversationLockSQL's) of keys (an SQL bigint[]: the conversations of the items whose org has
// a webhook with ordering "conversation"), in key order, and yields the keys it locked. The
// intake takes them in its events insert, so that its next statement, which hands the first
// delivery of a conversation with nothing queued to an ordered webhook (storeDeliveriesSQL),
// looks at the conversation under its lock: no other intake can queue a row of it, nor a
// completion promote one, between that look and the intake's commit. The CTE is materialized
// (its function is volatile) and read to its end by the statement.
func lockConversationsSQL(keys string) string {
	return `locked AS MATERIALIZED (
		SELECT x.k, pg_advisory_xact_lock(x.k) FROM (SELECT DISTINCT k FROM unnest(` + keys + `::bigint[]) AS k ORDER BY k) x
	)`
}

// promoteSQL promotes the first waiting row (inbound order) of each conversation given
// ($1 webhook ids, $2 conversations) that has no live row left: to pending, or held if its
// webhook is paused. It returns how many became pending. It must run in the transaction that
// deleted the conversation's rows, after their statement and under conversationLockSQL.
var promoteSQL = `
WITH c AS (
	SELECT DISTINCT c.webhook_id, c.conversation FROM unnest($1::uuid[], $2::bigint[]) AS c(webhook_id, conversation)
	WHERE NOT EXISTS (SELECT 1 FROM delivery_queue o WHERE o.webhook_id = c.webhook_id AND o.conversation = c.conversation
	                  AND o.status <> 'waiting')
	  AND EXISTS (SELECT 1 FROM webhooks w WHERE w.id = c.webhook_id) -- (a deleted webhook's rows stay as they are)
), p AS (
	UPDATE delivery_queue q
	SET status = ` + heldWhenPausedSQL("c.webhook_id") + `
	FROM c
	WHERE q.delivery_id = (SELECT o.delivery_id FROM delivery_queue o
	                       WHERE o.webhook_id = c.webhook_id AND o.conversation = c.conversation AND o.status = 'waiting'
	                       ORDER BY o.created_at, o.event_id, o.delivery_id LIMIT 1)
	RETURNING q.status
)
SELECT count(*) FILTER (WHERE status = 'pending') FROM p`

// conversations reads rows of (webhook id, conversation or NULL, count): the conversations
// (rows with one) and the sum of the counts.
func conversations(rows pgx.Rows) (hooks []uuid.UUID, convs []int64, n int, err error) {
	defer rows.Close()
	for rows.Next() {
		var h uuid.UUID
		var c *int64
		var k int
		if err := rows.Scan(&h, &c, &k); err != nil {
			return nil, nil, 0, err
		}
		n += k
		if c != nil {
			hooks, convs = append(hooks, h), append(convs, *c)
		}
	}
	return hooks, convs, n, rows.Err()
}

// promote runs promoteSQL in tx for the conversations of webhooks (parallel slices) and
// announces the deliveries it made due.
func promote(ctx context.Context, tx pgx.Tx, webhooks []uuid.UUID, convs []int64) error {
	if len(convs) == 0 {
		return nil
	}
	var due int
	if err := tx.QueryRow(ctx, promoteSQL, webhooks, convs).Scan(&due); err != nil {
		return fmt.Errorf("promote waiting deliveries: %w", err)
	}
	if due > 0 {
		return notifyDeliveries(ctx, tx)
	}
	return nil
}

// strandedSQL finds up to $1 conversations that have waiting rows but no live row: none is left
// by the product itself (see claimableSQL), but an older release, still running during a
// rolling upgrade to migration 022, ends heads without promoting what waits behind them. One
// pass over the waiting rows, a probe of delivery_queue_conversation_live per conversation.
const strandedSQL = `
SELECT c.webhook_id, c.conversation, 1 FROM (
	SELECT DISTINCT q.webhook_id, q.conversation FROM delivery_queue q WHERE q.status = 'waiting'
) c
WHERE NOT EXISTS (SELECT 1 FROM delivery_queue o WHERE o.webhook_id = c.webhook_id AND o.conversation = c.conversation
                  AND o.status <> 'waiting')
LIMIT $1`

// PromoteStranded promotes the first waiting row of every conversation that has no live row
// (see strandedSQL), under the conversations' locks, and returns how many conversations it
// found. The maintenance runs it.
func (s *Store) PromoteStranded(ctx context.Context) (int, error) {
	var n int
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, strandedSQL, 10000)
		if err != nil {
			return err
		}
		hooks, convs, _, err := conversations(rows)
		if err != nil || len(convs) == 0 {
			return err
		}
		n = len(convs)
		if _, err := tx.Exec(ctx, conversationLockSQL, convs); err != nil {
			return err
		}
		return promote(ctx, tx, hooks, convs)
	})
	if err != nil {
		return 0, fmt.Errorf("promote stranded conversations: %w", err)
	}
	return n, nil
}

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
		SELECT `+webhookColumns(4)+` FROM u w`, id, orgID, ordering, s.nowArg()))
	if errors.Is(err, pgx.ErrNoRows) {
		return Webhook{}, ErrWebhookNotFound
	}
	if err != nil {
		return Webhook{}, fmt.Errorf("set webhook ordering: %w", err)
	}
	return w, nil
}
