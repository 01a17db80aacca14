-- Number health (DESIGN §5c): what the upstream says of each connected number — quality rating,
-- messaging limit, throughput level, display name status — read with the channel's own token, and
-- when to read it next.
--
-- channel_health is its own table, not columns of channels: every write to channels is announced
-- on wabarelay_channels and flushes that channel from every instance's relay cache, and the health
-- worker writes each connected channel's row a few times a day (more after account webhooks).
--
-- A read falls due for two reasons, each with its own due time:
-- * prompt_due_at: a read asked for — at connect and reconnect (due at once), or after one of the
--   four account webhooks of the channel's business account (due HealthPromptDelay after the first
--   one: the webhooks that follow within that window join the same read). prompt_upstream is the
--   webhook change that prompted it ({"field", "value"}, as the upstream sent it: json, not
--   jsonb, keeps its text), null for a connect; prompt_seq counts prompts, so that a prompt that
--   lands while a read is in flight (after its claim) is not lost: the read's completion sees
--   prompt_seq > claimed_seq and asks for one more read.
-- * refresh_due_at: the periodic read (wabarelay { health_refresh }), at the channel's own phase
--   in the interval (refresh_offset, a fraction drawn once per row), so that many channels
--   connected together are still spread over the interval. NULL when the periodic read is off.
-- due_at is the earlier of the two (NULL: nothing due); the worker claims rows whose due_at has
-- passed and whose claim (claimed_until) is not running, with FOR UPDATE SKIP LOCKED, so that
-- two instances never read the same channel at once. A failed read (not a dead token) is tried
-- again after a back-off (failures).
CREATE TABLE channel_health (
	channel_id      uuid PRIMARY KEY REFERENCES channels (id) ON DELETE CASCADE,
	-- the upstream's strings, verbatim; NULL until known
	quality_rating  text,
	messaging_limit text,
	throughput      text,
	name_status     text,
	checked_at      timestamptz,
	prompt_due_at   timestamptz,
	prompt_upstream json,
	prompt_seq      bigint NOT NULL DEFAULT 0,
	refresh_due_at  timestamptz,
	refresh_offset  double precision NOT NULL DEFAULT random(),
	due_at          timestamptz GENERATED ALWAYS AS (LEAST(prompt_due_at, refresh_due_at)) STORED,
	claimed_at      timestamptz,
	claimed_until   timestamptz,
	claimed_seq     bigint NOT NULL DEFAULT 0,
	failures        int NOT NULL DEFAULT 0
);
CREATE INDEX channel_health_due ON channel_health (due_at) WHERE due_at IS NOT NULL;

-- The changes of known values, one row per read that changed one (the channel_health events'
-- data: health, previous, changed, upstream), for the dashboard's history. Deleted with the
-- channel, and by the retention (store.Store.Maintain) like the messages.
CREATE TABLE channel_health_changes (
	id         uuid PRIMARY KEY,
	channel_id uuid NOT NULL REFERENCES channels (id) ON DELETE CASCADE,
	at         timestamptz NOT NULL,
	changed    text[] NOT NULL,
	health     json NOT NULL,
	previous   json NOT NULL,
	upstream   json
);
CREATE INDEX channel_health_changes_channel ON channel_health_changes (channel_id, at DESC, id DESC);
CREATE INDEX channel_health_changes_at ON channel_health_changes (at);

-- The channels connected before this migration: rows with nothing due yet; the worker's start
-- (store.Store.ScheduleHealth) gives each its periodic read, spread over the interval.
INSERT INTO channel_health (channel_id)
SELECT id FROM channels WHERE phone_number_id IS NOT NULL AND upstream_token_enc IS NOT NULL;

-- The new event kind channel_health (migration 015 explains the check and NOT VALID).
ALTER TABLE events DROP CONSTRAINT events_type_check;
ALTER TABLE events ADD CONSTRAINT events_type_check
	CHECK (type IN ('messages', 'message_status', 'channel_status', 'message_template_status_update', 'channel_health')) NOT VALID;
