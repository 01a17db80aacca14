-- Ordering per conversation (DESIGN §5b "Ordering").
--
-- A webhook's `ordering` is 'none' (the default: deliveries go out in parallel, as before) or
-- 'conversation': its deliveries of one conversation — one phone number and one customer —
-- go out one at a time in intake order. The intake (store.StoreEvents) writes the delivery's
-- conversation key (a 64-bit hash, store.ConversationKey) on its queue row and log row for
-- ordered webhooks only; NULL everywhere else, so the `none` path writes and indexes nothing
-- more than before (a NULL costs a bit of the null bitmap). The log row keeps it so that a
-- manual retry or recover puts the delivery back in its conversation.
--
-- The claim (store/queue.go) skips a row of a conversation while an earlier row of it (by
-- created_at, event_id, delivery_id: intake order) is queued in any state, or another of its
-- rows is in flight. Both look-ups are index probes: delivery_queue_conversation finds the
-- earlier rows, delivery_queue_conversation_flight the rows in flight. New columns without a
-- default and partial indexes over NULL-free rows: no table rewrite, empty indexes at first.
ALTER TABLE webhooks ADD COLUMN ordering text NOT NULL DEFAULT 'none' CHECK (ordering IN ('none', 'conversation'));
ALTER TABLE delivery_queue ADD COLUMN conversation bigint;
ALTER TABLE deliveries ADD COLUMN conversation bigint;
CREATE INDEX delivery_queue_conversation ON delivery_queue (webhook_id, conversation, created_at, event_id, delivery_id)
	WHERE conversation IS NOT NULL;
CREATE INDEX delivery_queue_conversation_flight ON delivery_queue (webhook_id, conversation)
	WHERE conversation IS NOT NULL AND status = 'in_flight';
