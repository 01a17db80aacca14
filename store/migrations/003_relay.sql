-- Objects (template ids, media ids) a channel has been handed through the relay or its events.
-- The relay lets a channel token reach its own phone number, its business account, and these.
CREATE TABLE channel_objects (
	channel_id uuid NOT NULL REFERENCES channels (id) ON DELETE CASCADE,
	object_id  text NOT NULL,
	created_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (channel_id, object_id)
);
