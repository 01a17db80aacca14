-- The customer-service window (DESIGN §5c "Customer-service window"): intake records, per
-- channel and customer (wa_id, digits only), the newest upstream timestamp of an incoming
-- message, never moved back by a late webhook (store/contacts.go). One row per customer a
-- channel ever heard from; intake upserts it in the events' transaction, in (channel_id, wa_id)
-- order, and announces the rows it moved on wabarelay_contacts (the relays' window sets).
CREATE TABLE contacts (
	channel_id      uuid NOT NULL REFERENCES channels (id) ON DELETE CASCADE,
	wa_id           text NOT NULL,
	last_inbound_at timestamptz NOT NULL,
	PRIMARY KEY (channel_id, wa_id)
);
-- The relay loads a channel's open windows (the contacts of the last 24 hours, newest first,
-- bounded) through this index: never the channel's whole history.
CREATE INDEX contacts_recent ON contacts (channel_id, last_inbound_at);

-- Since when intake has kept this record for the channel: a channel connected before this
-- migration was receiving messages that no row recorded, so "nothing received from that
-- customer" means something only from here on (docs/decisions.md, "The window's receiving
-- time"). Existing channels take the migration's time, new ones their creation's.
ALTER TABLE channels ADD COLUMN contacts_since timestamptz NOT NULL DEFAULT now();
