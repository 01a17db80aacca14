-- The conversation key on the event itself (ordering and replay).
--
-- StoreEvents writes store.ConversationKey (phone number and customer) on every event, so that a
-- replay (store/replay.go) to a webhook with ordering 'conversation' gives its deliveries the same
-- key as live ones and they go out in order too. A new nullable column without a default: no
-- rewrite of the history partitions; events stored before this migration have NULL and replay
-- unordered.
ALTER TABLE events ADD COLUMN conversation bigint;
