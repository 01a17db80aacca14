-- The relay's side of a message lives in relay_log alone, so that the relay log costs the relay
-- little. Until now the relay log's writer also upserted one messages row per send (its
-- recipient, key and relay_* fields), which cost the write path a heap row, a speculative
-- insertion and six index entries per send — most of the log's cost (bench/README.md, "Figures
-- behind the defaults (relay admission)"). Now:
--
-- * relay_log is the record of every send: the writer COPYs it and nothing else. A hash index on
--   wamid finds a message's relay call (equality only, smaller and cheaper to insert into than a
--   B-tree over random text). It is created on every partition, present and future.
-- * messages is the record of the statuses: a message's row is created by its first status
--   (StoreEvents), as it already was for messages sent around the relay, with the status's
--   recipient_id. The relay's fields are read from relay_log when a timeline or a list is read
--   (store/timeline.go); a send the upstream has not reported on yet is listed from relay_log
--   as "accepted" for its first ten minutes (store.UnreportedWindow), and found by its wamid
--   after that.
--
-- * A message's created_at stays the relay call's time, to the microsecond, so that the list
--   keeps the order of the sends: its first status takes the time from relay_log by wamid. A
--   status that comes before its send's log row (the log is written in batches, up to a second
--   later) creates the row at the status's arrival with relay_pending set; the relay log's
--   writer then gives it the call's time right after the batch that writes the call
--   (store.SettleMessages). A row whose call never comes (a message sent
--   around the relay, or the log off) is let go after store.RelayPendingFor.
--
-- Nothing is lost: every relay call the dropped columns described is in relay_log.
CREATE INDEX relay_log_wamid ON relay_log USING hash (wamid) WHERE wamid IS NOT NULL;

DROP INDEX messages_channel_key;
ALTER TABLE messages
	DROP COLUMN idempotency_key,
	DROP COLUMN relay_at,
	DROP COLUMN relay_status,
	DROP COLUMN relay_latency_us,
	DROP COLUMN relay_replayed,
	ADD COLUMN relay_pending boolean; -- true: created_at awaits the relay call's time (NULL otherwise)
CREATE INDEX messages_relay_pending ON messages (created_at) WHERE relay_pending;

-- A recipient in messages is a number's digits, as a status's recipient_id has it (the list's
-- "to" filter compares digits); the rows the relay log's writer made held the caller's "to" as
-- written ("+1 555-0100").
UPDATE messages SET recipient = regexp_replace(recipient, '[^0-9]', '', 'g')
WHERE recipient ~ '[^0-9]' AND recipient ~ '^[0-9 +().-]*[0-9][0-9 +().-]*$';
