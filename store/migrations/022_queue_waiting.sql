-- Ordered conversations wait outside the claims' index (one org's ordered backlog
-- stopped every org's claims).
--
-- Until now every queued row of an ordered webhook was 'pending', and the claim applied the
-- ordering rule row by row: while a conversation's head was in flight, each later row of it was
-- due but not claimable, and every claim read all of them (1k blocked rows: 2,003 rows read per
-- claim; 100k: 413 ms per claim, under a 10 s statement timeout shared by every org).
--
-- Now only a conversation's head is in the claims' index. A delivery of an ordered webhook is
-- queued 'waiting' when its conversation already has a row in the queue (store/events.go,
-- store/replay.go, store/deliveries.go: queueStatusSQL); 'waiting' rows are in no index the
-- claims read (delivery_queue_due is over pending rows). When a conversation's last live row
-- (pending, in flight or held) leaves the queue, the first waiting row of it is promoted to
-- pending, or held if its webhook is paused (store/ordering.go: promoteSQL). The claim's ordering
-- rule now reads the conversation's live rows only (delivery_queue_conversation_live): one or two
-- index entries, whatever the backlog.
ALTER TABLE delivery_queue DROP CONSTRAINT delivery_queue_status_check;
ALTER TABLE delivery_queue ADD CONSTRAINT delivery_queue_status_check
	CHECK (status IN ('pending', 'in_flight', 'held', 'waiting'));

-- A conversation's live rows: the ordering rule's probes (claimableSQL) and promotion's test.
CREATE INDEX delivery_queue_conversation_live ON delivery_queue (webhook_id, conversation, created_at, event_id, delivery_id)
	WHERE conversation IS NOT NULL AND status <> 'waiting';
DROP INDEX delivery_queue_conversation_flight;

-- The queued rows behind each conversation's first row wait.
UPDATE delivery_queue q SET status = 'waiting'
WHERE q.conversation IS NOT NULL AND q.status IN ('pending', 'held')
  AND EXISTS (SELECT 1 FROM delivery_queue o WHERE o.webhook_id = q.webhook_id AND o.conversation = q.conversation
              AND (o.status = 'in_flight' OR (o.created_at, o.event_id, o.delivery_id) < (q.created_at, q.event_id, q.delivery_id)));

-- A webhook's queued deliveries by event: a replay queues no second delivery of an event that
-- has one queued for the webhook, and counts the webhook's queued deliveries against
-- store.MaxReplayBacklog (store/replay.go).
CREATE INDEX delivery_queue_event ON delivery_queue (webhook_id, event_id);

-- Webhooks deleted whose deliveries are still to be removed (store.DeleteWebhook marks,
-- store.SweepDeletedWebhooks removes them in batches): a webhook with a large backlog is
-- deleted at once, its rows afterwards. No claim, list or metric reads a deleted webhook's rows
-- meanwhile: they all join webhooks.
CREATE TABLE deleted_webhooks (
	id         uuid PRIMARY KEY,
	deleted_at timestamptz NOT NULL DEFAULT now()
);
