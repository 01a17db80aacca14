-- Every message traceable (DESIGN §5b "Message timeline" and "Tracing").
--
-- relay_log: one row per relay call on the send path (POST …/messages) and per refusal of one,
-- written off the request path in batches (relaylog.Writer). Partitioned by UTC day like the
-- delivery history (store/partitions.go creates the days ahead and the retention drops them).
-- Calls whose token names no channel are not logged (nothing to scope them to): metrics count
-- them.
CREATE TABLE relay_log (
	at              timestamptz NOT NULL,
	org_id          uuid NOT NULL,
	-- no foreign key: the log outlives the channel
	channel_id      uuid NOT NULL,
	-- the status answered to the caller (the upstream's, or the relay's own refusal)
	status          int NOT NULL,
	-- relay.Outcome of the call
	outcome         text NOT NULL,
	-- the upstream's error.code / error.error_subcode when it answered an error
	error_code      int,
	error_subcode   int,
	latency_us      int NOT NULL,
	idempotency_key text,
	replayed        boolean NOT NULL DEFAULT false,
	-- the body's "to"
	recipient       text,
	-- messages[0].id of a successful answer
	wamid           text
) PARTITION BY RANGE (at);
CREATE INDEX relay_log_channel ON relay_log (channel_id, at);

-- messages: one row per outgoing message (wamid), with its latest upstream status. Written by
-- the relay log's writer for every send the upstream accepted (the relay call's fields), and
-- by the inbound path for every status the upstream reports (whichever comes first creates the
-- row: a status can arrive before the log's batch is written, and messages sent around the
-- relay get a row from their statuses alone). status only moves forward: its rank
-- (accepted 0 < sent 1 < delivered 2 < read 3 < failed 4) must grow; failed is final.
-- Incoming messages are not here: their timeline is read from events (events.wamid).
-- Not partitioned (a status finds its row by wamid alone); the retention deletes by created_at.
CREATE TABLE messages (
	wamid            text PRIMARY KEY,
	org_id           uuid NOT NULL,
	channel_id       uuid NOT NULL,
	recipient        text NOT NULL DEFAULT '',
	-- the relay call's time, or the arrival of the first status for a message sent around it
	created_at       timestamptz NOT NULL DEFAULT now(),
	status           text NOT NULL DEFAULT 'accepted'
	                 CHECK (status IN ('accepted', 'sent', 'delivered', 'read', 'failed')),
	status_rank      smallint NOT NULL DEFAULT 0,
	-- the upstream timestamp of the latest status
	status_at        timestamptz,
	-- errors[0] of a failed status
	error_code       int,
	error_title      text,
	idempotency_key  text,
	-- the relay call that sent it (NULL: not seen by the relay, or its log row was dropped)
	relay_at         timestamptz,
	relay_status     int,
	relay_latency_us int,
	-- a retry of the call was answered from the idempotency store
	relay_replayed   boolean NOT NULL DEFAULT false
);
-- The list's order is (created_at DESC, wamid DESC): each index holds it whole, so a page of any
-- channel, filtered or not, is read in order and stops at its limit (no sort of the channel).
CREATE INDEX messages_channel ON messages (channel_id, created_at DESC, wamid DESC);
CREATE INDEX messages_channel_status ON messages (channel_id, status, created_at DESC, wamid DESC);
CREATE INDEX messages_channel_recipient ON messages (channel_id, recipient, created_at DESC, wamid DESC);
CREATE INDEX messages_channel_key ON messages (channel_id, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX messages_created ON messages (created_at);

-- events.wamid: the upstream message id an event is about (a message's id, a status's id), so
-- that a message's timeline finds its events and their deliveries. events.traceparent: the W3C
-- traceparent of the intake request that stored the event, when tracing is on; delivery
-- attempts continue its trace. Nullable without default: no rewrite of the history. The index
-- is created on every partition, present and future.
ALTER TABLE events ADD COLUMN wamid text;
ALTER TABLE events ADD COLUMN traceparent text;
CREATE INDEX events_wamid ON events (wamid) WHERE wamid IS NOT NULL;
