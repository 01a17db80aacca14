-- Event kinds (DESIGN §5b "Event kinds"): besides the upstream's messages and statuses, events
-- announce a channel's state changes (channel_status, written in the same transaction as the
-- change: store/channelevents.go) and the upstream's template status changes
-- (message_template_status_update, one event per channel of the business account).
--
-- Only the events' type check changes. Migration 011 created it while the old table still held
-- the name events_type_check, so its name is Postgres's choice: it is found by its column. Every
-- stored row has one of the two older kinds, which the new check admits, so it is added NOT
-- VALID: no scan of the history.
DO $$
DECLARE
	c name;
BEGIN
	FOR c IN SELECT con.conname FROM pg_constraint con
		JOIN pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = ANY (con.conkey)
		WHERE con.conrelid = 'events'::regclass AND con.contype = 'c' AND a.attname = 'type'
	LOOP
		EXECUTE format('ALTER TABLE events DROP CONSTRAINT %I', c);
	END LOOP;
END $$;
ALTER TABLE events ADD CONSTRAINT events_type_check
	CHECK (type IN ('messages', 'message_status', 'channel_status', 'message_template_status_update')) NOT VALID;
