-- Relay scope (DESIGN §5 "Relay scope"): a channel token reaches its own number and business
-- account, template ids from answers of its own …/message_templates calls, media ids from
-- answers of its own …/media uploads and media ids in its own events — nothing else.
--
-- Before this migration the ids of every successful GET answer's data[] were admitted, e.g. the
-- sibling phone numbers listed by GET /<waba_id>/phone_numbers. Those rows cannot be told apart
-- from template ids, so every row is dropped and the media ids of stored events are admitted
-- again; template ids come back with the channel's next template listing.
ALTER TABLE channel_objects ADD COLUMN kind text NOT NULL DEFAULT 'media' CHECK (kind IN ('template', 'media'));
DELETE FROM channel_objects;
INSERT INTO channel_objects (channel_id, object_id, kind, created_at)
SELECT e.channel_id, (x.m -> (x.m ->> 'type')) ->> 'id', 'media', e.created_at
FROM events e, LATERAL (SELECT e.payload -> 'data' -> 'message' AS m) x
WHERE e.type = 'messages'
  AND x.m ->> 'type' IN ('image', 'audio', 'video', 'document', 'sticker')
  AND (x.m -> (x.m ->> 'type')) ->> 'id' IS NOT NULL
  AND EXISTS (SELECT 1 FROM channels c WHERE c.id = e.channel_id)
ON CONFLICT DO NOTHING;
-- Media ids expire upstream after 30 days; the app prunes them by age.
CREATE INDEX channel_objects_media_age ON channel_objects (created_at) WHERE kind = 'media';

-- Every instance keeps each channel's objects in memory with the channel: a new object is
-- announced like any other change of the channel, so every instance reloads it.
CREATE FUNCTION wabarelay_channel_objects_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_notify('wabarelay_channels', c::text) FROM (SELECT DISTINCT channel_id AS c FROM added) s;
	RETURN NULL;
END $$;
CREATE TRIGGER channel_objects_notify AFTER INSERT ON channel_objects REFERENCING NEW TABLE AS added
	FOR EACH STATEMENT EXECUTE FUNCTION wabarelay_channel_objects_notify();
